"""Rewards in another unit: does the batch change? (issue 31: generalise, never tune.)

A task scored in points, in dollars or in thousandths is the same task. The search ranks
checkpoints by variances and the estimator weighs the critic by them, and both are in
reward units squared, so with every reward times ``c`` (and so every value and every
critic's prediction) a collection should make the same plan and a batch whose
advantages are ``c`` times as large. This runs the estimator benchmark's families
(``benchmarks.estimator_quality``: the same collections, seeds and critics) with every
reward times each scale and compares each batch with the unscaled one: the same rows
(every actor row's state and action), and advantages within ``--rel`` of ``c`` times
the unscaled ones (the noise model is rounded to six significant digits). It prints one
line per collection that differs and a count; exit 1 if any differs.

    .venv/bin/python -m benchmarks.reward_units --quick
    .venv/bin/python -m benchmarks.reward_units   # 16 families x 5 critics x 2H, 6H x 2 seeds
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import statistics
import sys
import time
from collections.abc import Iterator
from typing import Any

from benchmarks import estimator_quality as eq
from focus.critic import ConstantCritic, Critic
from focus.synthetic import Family, TreeMDP

DEFAULT_CRITICS = ("exact", "noise_1", "constant", "biased", "stale")
#: Tasks per collection (the estimator benchmark's six).
N_TASKS = 6


def scaled(mdp: TreeMDP, c: float) -> TreeMDP:
    """``mdp`` with every reward times ``c``."""
    outcomes = tuple(tuple(tuple((n, r * c, p) for n, r, p in a) for a in s) for s in mdp.outcomes)
    return dataclasses.replace(mdp, outcomes=outcomes)


def scaled_family(fam: Family, c: float) -> Family:
    return Family(
        f"{fam.name}x{c:g}",
        lambda seed: scaled(fam.make(seed), c),
        fam.gamma,
        fam.horizon,
        fam.properties,
        fam.max_steps,
    )


_BENCH_CRITIC = eq.make_critic


def critic(name: str, mdps: list[TreeMDP], gamma: float, seed: int, reach: int | None = None) -> Critic:
    """The benchmark's critics, with the constant one not rounded to three decimals
    (rounding is a unit's choice: 0.123 and 123.456 are not the same constant)."""
    if name == "constant":
        return ConstantCritic(statistics.fmean(m.values(gamma)[0] for m in mdps))
    return _BENCH_CRITIC(name, mdps, gamma, seed, reach)


@contextlib.contextmanager
def scaled_families(families: list[str], scales: list[float]) -> Iterator[dict[tuple[str, float], str]]:
    """The benchmark's registry with each family at each scale (by name), and its
    unrounded constant critic, for the duration: both put back after."""
    added = {(f, c): scaled_family(eq.ALL_FAMILIES[f], c) for f in families for c in scales}
    eq.ALL_FAMILIES.update({fam.name: fam for fam in added.values()})
    eq.make_critic = critic
    try:
        yield {key: fam.name for key, fam in added.items()}
    finally:
        eq.make_critic = _BENCH_CRITIC
        for fam in added.values():
            eq.ALL_FAMILIES.pop(fam.name, None)


def rows(family: str, budget: int, critic_name: str, seed: int, method: str) -> list[tuple[Any, ...]]:
    """One collection's actor rows as (end of prompt, completion, advantage)."""
    batch, *_ = eq.collect((family, N_TASKS, budget, critic_name, method, seed))
    return [(r.prompt_ids[-8:], tuple(r.completion_ids), r.advantage) for r in batch.actor]


def compare(base: list[tuple[Any, ...]], other: list[tuple[Any, ...]], c: float, rel: float) -> str | None:
    """Why ``other`` (rewards times ``c``) is not ``base`` scaled; None if it is."""
    if [r[:2] for r in base] != [r[:2] for r in other]:
        return f"other rows ({len(other)} against {len(base)})"
    worst = max((abs(o[2] / c - b[2]) for b, o in zip(base, other, strict=True)), default=0.0)
    scale = max((abs(b[2]) for b in base), default=0.0)
    return None if worst <= rel * (1.0 + scale) else f"advantages differ by up to {worst:.3g} (largest {scale:.3g})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(eq.ALL_FAMILIES))
    ap.add_argument("--critics", default=",".join(DEFAULT_CRITICS))
    ap.add_argument("--budgets", default="2,6")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--scales", default="1000,7.3,0.001")
    ap.add_argument("--method", default="selective", choices=("selective", "uniform"))
    ap.add_argument("--rel", type=float, default=1e-4, help="tolerance on advantages, relative to the largest")
    ap.add_argument(
        "--quick", action="store_true", help="critical and multi_key, exact and stale critics, 2H, one seed"
    )
    args = ap.parse_args(argv)
    if args.quick:
        args.families, args.critics, args.budgets, args.seeds = "critical,multi_key", "exact,stale", "2", 1
    families, critics = args.families.split(","), args.critics.split(",")
    for name in (*families, *critics):
        if name not in eq.ALL_FAMILIES and name not in eq.CRITICS:
            ap.error(f"unknown family or critic {name!r}")
    scales = [float(s) for s in args.scales.split(",")]
    t0, n, differ = time.perf_counter(), 0, 0
    cells = [
        (f, k, int(b), s) for f in families for k in critics for b in args.budgets.split(",") for s in range(args.seeds)
    ]
    with scaled_families(families, scales) as names:
        for i, (fname, cname, budget, seed) in enumerate(cells):
            print(f"\r{i}/{len(cells)} cells", end="", file=sys.stderr, flush=True)
            base = rows(fname, budget, cname, seed, args.method)
            for c in scales:
                n += 1
                why = compare(base, rows(names[fname, c], budget, cname, seed, args.method), c, args.rel)
                if why:
                    differ += 1
                    print(f"{fname}/{budget}H/{cname} seed {seed}, rewards x{c:g}: {why}", flush=True)
    print("\r", end="", file=sys.stderr)
    print(f"{differ} of {n} collections differ from their unscaled batch ({time.perf_counter() - t0:.0f} s)")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
