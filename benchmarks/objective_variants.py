"""Issue 31 (h31h): benchmarks.estimator_quality with Selective's ``objective`` variants
as extra methods (``selective_<name>``), read on the pairs grpo, uniform and selective
share; ``report PATH`` prints each variant's ratios against uniform from a ``--json``.

    .venv/bin/python -m benchmarks.objective_variants --families heavy_tail --budgets 6 --critics noise_1 --methods grpo,uniform,selective,selective_signal --seeds 2 --json out.json
    .venv/bin/python -m benchmarks.objective_variants report out.json

Kept at the commit that measured them; the variants were not adopted (docs/algorithm.md,
"Findings", "What a continuation's new segments count").
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from typing import Any

import benchmarks.estimator_quality as eq
from benchmarks.quality_summary import cells_above, mean_rows

VARIANTS = {
    "selective_existing": "existing",
    "selective_replaced": "replaced",
    "selective_head": "replaced_head",
    "selective_chain0": "displaced_chain",
    "selective_signal": "signal_head",
    "selective_sigall": "signal_all",
}
_ORIGINAL = eq.make_search


def make_search(method: str, evidence: int, transitions: int) -> Any:
    """The benchmark's search, with a variant's ``objective`` for ``selective_<name>``."""
    if method in VARIANTS:
        search, est = _ORIGINAL("selective", evidence, transitions)
        return search.model_copy(update={"objective": VARIANTS[method]}), est
    return _ORIGINAL(method, evidence, transitions)


def report(path: str) -> None:
    """Medians over cells of each selective method's ratio against uniform (and GRPO)."""
    with open(path) as fh:
        raw = json.load(fh)["raw"]
    rows = mean_rows(raw, sorted({r["seed"] for r in raw}))
    t = {(r["family"], r["budget"], r["critic"], r["method"]): r for r in rows}
    methods = sorted({r["method"] for r in rows if r["method"].startswith("selective")})
    cells = sorted({k[:3] for k in t})
    groups = {"noisy": lambda c: c.startswith("noise"), "constant": lambda c: c == "constant",
              "biased/early_late": lambda c: c in ("biased", "early_late"), "all": lambda c: True}  # fmt: skip
    for m in methods:

        def med(key: str, other: str, g: str, m: str = m) -> float:
            xs = [
                t[c + (m,)][key] / t[c + (other,)][key]
                for c in cells
                if groups[g](c[2]) and c + (m,) in t and c + (other,) in t
            ]
            return statistics.median(xs) if xs else math.nan

        neutral = " / ".join(f"{med('neutral_mse', 'uniform', g):.3f}" for g in groups)
        batch = " / ".join(f"{med('adv_mse', 'uniform', g):.3f}" for g in groups)
        above = cells_above(raw, m, "uniform", key="neutral_mse")
        print(
            f"{m}: neutral {neutral}; vs grpo {med('neutral_mse', 'grpo', 'noisy'):.3f}; batch {batch}; "
            f"targets {med('target_mse', 'uniform', 'noisy'):.3f}; neutral cells above 1.1 {len(above['above'])}"
        )


if __name__ == "__main__":
    if sys.argv[1:2] == ["report"]:
        report(sys.argv[2])
    else:
        eq.METHODS = eq.METHODS + tuple(VARIANTS)
        eq.make_search = make_search
        eq.main(sys.argv[1:])
