"""Two runs of benchmarks/estimator_quality.py side by side: did a change to the search
or the estimator help, and where?

A change to the ranking is judged on every family set at once (the project's families,
the held-out-style ones, the five made after issue 31) and on the composition-neutral
error beside the batch's: a change that helps one set often costs another
(docs/findings/estimator-issue31.md). This reads two result files of the same command,
run before and after the change (a record under ``benchmarks/results/`` or a ``--json``
output), and prints each summary ratio of :func:`benchmarks.quality_summary.summarise`
before and after, then the cells whose selective / uniform ratio moved most::

    python -m benchmarks.quality_diff benchmarks/results/estimator_quality_unseen.json after.json

Only the cells both runs have are compared, so the two may use different methods (the
record's GRPO arm is not needed after). Ratios of point estimates: the intervals are
the benchmark's own output.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

from benchmarks.quality_summary import cell_ratio, summarise

Cell = tuple[str, int, str]


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The per-cell rows of a result file: a record (``{"figures": {"rows": ...}}``) or
    the benchmark's ``--json`` output (``{"rows": ...}``)."""
    data = json.loads(Path(path).read_text())
    figures = data.get("figures", data) if isinstance(data, dict) else None
    rows = figures.get("rows") if isinstance(figures, dict) else None
    if not isinstance(rows, list) or not rows:
        raise ValueError(f"{path}: no rows of benchmarks.estimator_quality (is it one of its result files?)")
    return rows


def _shared(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rows`` of the (family, budget, critic, method) both runs have."""
    keys = {(r["family"], r["budget"], r["critic"], r["method"]) for r in after}
    return [r for r in before if (r["family"], r["budget"], r["critic"], r["method"]) in keys]


def _summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def axis(key: str) -> list[Any]:
        return sorted({r[key] for r in rows}, key=str)

    return summarise(rows, axis("family"), sorted({r["budget"] for r in rows}), axis("critic"), axis("method"))


def ratios(rows: list[dict[str, Any]], key: str) -> dict[Cell, float]:
    """selective / uniform on ``key`` (``adv_mse``, ``neutral_mse``, ``target_mse``) per cell."""
    table = {(r["family"], r["budget"], r["critic"], r["method"]): r for r in rows}
    out = {}
    for (f, b, c, m), sel in table.items():
        uni = table.get((f, b, c, "uniform"))
        if m == "selective" and uni is not None and not (math.isnan(sel[key]) or math.isnan(uni[key])):
            out[(f, b, c)] = cell_ratio(sel[key], uni[key])
    return out


def compare(before: list[dict[str, Any]], after: list[dict[str, Any]], top: int = 8) -> dict[str, Any]:
    """The summaries of both runs on the cells they share, and the ``top`` cells whose
    selective / uniform batch ratio moved most (by the ratio of the two ratios)."""
    b_rows, a_rows = _shared(before, after), _shared(after, before)
    if not b_rows:
        raise ValueError("the two runs share no cell (family, budget, critic, method)")
    b_sum, a_sum = _summary(b_rows), _summary(a_rows)
    summary = {k: (b_sum[k]["median"], a_sum[k]["median"]) for k in b_sum if k in a_sum}
    moved = []
    b_adv, a_adv = ratios(b_rows, "adv_mse"), ratios(a_rows, "adv_mse")
    b_neu, a_neu = ratios(b_rows, "neutral_mse"), ratios(a_rows, "neutral_mse")
    for cell in b_adv.keys() & a_adv.keys():
        change = a_adv[cell] / b_adv[cell] if b_adv[cell] > 0 else math.inf
        moved.append((abs(math.log(change)) if 0 < change < math.inf else math.inf, cell))
    moved.sort(key=lambda x: (-x[0], x[1]))
    cells = [
        {
            "cell": f"{f}/{b}H/{c}",
            "batch": (b_adv[(f, b, c)], a_adv[(f, b, c)]),
            "neutral": (b_neu.get((f, b, c), math.nan), a_neu.get((f, b, c), math.nan)),
        }
        for _, (f, b, c) in moved[:top]
    ]
    above = {
        name: (sum(v > 1.1 for v in b.values()), sum(v > 1.1 for v in a.values()), len(b))
        for name, b, a in (("batch", b_adv, a_adv), ("neutral", b_neu, a_neu))
    }
    return {"summary": summary, "above_1_1": above, "moved": cells}


def render(result: dict[str, Any]) -> str:
    lines = ["summary (median over cells; before -> after)"]
    for key, (b, a) in result["summary"].items():
        lines.append(f"  {key:48s} {b:7.3f} -> {a:7.3f}")
    lines.append("selective / uniform above 1.1 (point estimates; before -> after, of the cells)")
    for name, (b, a, n) in result["above_1_1"].items():
        lines.append(f"  {name:48s} {b:7d} -> {a:7d} of {n}")
    lines.append("cells whose batch ratio moved most (batch; neutral)")
    for c in result["moved"]:
        (bb, ab), (bn, an) = c["batch"], c["neutral"]
        lines.append(f"  {c['cell']:30s} {bb:6.2f} -> {ab:6.2f};  {bn:6.2f} -> {an:6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="result file of the run before the change")
    ap.add_argument("after", help="result file of the same command after it")
    ap.add_argument("--top", type=int, default=8, help="cells that moved most to list")
    args = ap.parse_args(argv)
    try:
        result = compare(read_rows(args.before), read_rows(args.after), args.top)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
