"""Run :mod:`benchmarks.estimator_quality` with a variant of the noise fit switched on.

``noise_model``'s options that are measured and not adopted (``joint``, ``excess``:
docs/findings/estimator-issue31.md) have no flag in the benchmark; this driver binds
one in every module that calls the fit, then runs the benchmark with the arguments that
follow (worker processes are forked and keep the binding)::

    python -m benchmarks.noise_variant excess --families decisive --budgets 2 --seeds 1
"""

from __future__ import annotations

import functools
import sys

import focus.backups
import focus.calibration
import focus.estimation
import focus.noise
from benchmarks import estimator_quality

#: The variants, as keywords of :func:`focus.noise.noise_model` ("main": the defaults).
VARIANTS: dict[str, dict[str, bool]] = {"main": {}, "joint": {"joint": True}, "excess": {"excess": True}}


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in VARIANTS:
        sys.exit(f"usage: noise_variant {{{','.join(VARIANTS)}}} [estimator_quality args]")
    mods = (focus.backups, focus.calibration, focus.estimation)
    fit = functools.partial(focus.noise.noise_model, **VARIANTS[args[0]])
    for mod in mods:
        mod.noise_model = fit  # type: ignore[attr-defined]
    try:
        estimator_quality.main(args[1:])
    finally:  # (run in-process, by a test, the binding would outlive the run)
        for mod in mods:
            mod.noise_model = focus.noise.noise_model  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
