"""Run :mod:`benchmarks.estimator_quality` with a variant of the noise fit switched on.

``noise_model``'s options that are measured and not adopted (``joint``, ``excess``,
``probe``: docs/findings/estimator-issue31.md) have no flag in the benchmark; this driver
binds one in every module that calls the fit, then runs the benchmark with the arguments
that follow (worker processes are forked and keep the binding)::

    python -m benchmarks.noise_variant excess --families decisive --budgets 2 --seeds 1

A variant named in :data:`EXPLORE` also sets ``Selective.explore`` of the benchmark's
``selective`` method (the share of continuations placed by the hash, which ``probe`` reads).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import focus.backups
import focus.calibration
import focus.estimation
import focus.noise
from benchmarks import estimator_quality
from focus.priority import Selective

#: The variants, as keywords of :func:`focus.noise.noise_model` ("main": the defaults).
VARIANTS: dict[str, dict[str, Any]] = {
    "main": {},
    "joint": {"joint": True},
    "excess": {"excess": True},
    "probe": {"probe": 0.25},
    "probe_only": {"probe": 0.25, "probe_only": True},
    "probe100": {"probe": 1.0},
    "explore100": {},
}
#: ``Selective.explore`` of the benchmark's ``selective`` method, where a variant sets it.
EXPLORE: dict[str, float] = {"probe100": 1.0, "explore100": 1.0}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in VARIANTS:
        sys.exit(f"usage: noise_variant {{{','.join(VARIANTS)}}} [estimator_quality args]")
    mods = (focus.backups, focus.calibration, focus.estimation)
    fit = functools.partial(focus.noise.noise_model, **VARIANTS[args[0]])
    make = estimator_quality.make_search
    for mod in mods:
        mod.noise_model = fit  # type: ignore[attr-defined]
    if args[0] in EXPLORE:
        estimator_quality.make_search = functools.partial(_explore, make, EXPLORE[args[0]])  # type: ignore[assignment]
    try:
        estimator_quality.main(args[1:])
    finally:  # (run in-process, by a test, the binding would outlive the run)
        for mod in mods:
            mod.noise_model = focus.noise.noise_model  # type: ignore[attr-defined]
        estimator_quality.make_search = make  # type: ignore[assignment]


def _explore(make: Any, share: float, method: str, evidence: int, transitions: int) -> Any:
    """``make(method, ...)`` with the ``selective`` method's ``explore`` at ``share``."""
    search, est = make(method, evidence, transitions)
    if method == "selective" and isinstance(search, Selective):
        search = search.model_copy(update={"explore": share})
    return search, est


if __name__ == "__main__":
    main()
