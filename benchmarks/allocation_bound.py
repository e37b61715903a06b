"""How far can allocation alone go? Benchmark-only allocation rules beside uniform and selective.

Issue 31 asks the selective ranking to reach 0.8x uniform branching on the
composition-neutral error (``benchmarks.estimator_quality.neutral_mse``). This module
asks whether *any* allocation of the same continuation budget gets there on a family:
it adds rules that are not meant for the library, some reading the exact MDP, as
:class:`focus.priority.Priority` implementations the estimator benchmark runs like its
own methods (same phases, budget, waves, branch cap, estimator and critic; only the
ranking differs):

  depth_d<k>   a fixed depth profile: checkpoints at depth k first, then the depths
               nearest to it; within a depth the checkpoint with fewest branches
               (so "only depth k" until its checkpoints hold ``max_branches`` each)
  reach        on-policy reach d(s) of the checkpoint's state (exact, from the MDP)
               over (1 + branches): continuations spread in proportion to d(s), the
               weight the composition-neutral error gives a state's pairs
  sqrt_reach   the same with sqrt(d(s)) (the optimal spread of a fixed noise
               variance per state over pairs weighted by d(s) at equal cost)
  oracle_var   d(s)·Var(G | s)·(1/k − 1/(k+1)) per expected transition, k the
               checkpoint's children: the exact return variance of the state (what one
               more child averages away of V(s)), weighted as the metric weighs it
  decisive_depth  a depth profile at each task's own decisive depth (families with one)

The rules that read the MDP find a checkpoint's state from the search's trees, which a
:class:`WatchingCollector` hands them before every plan (scoring is not done ahead of
the barrier for them, so no ranking is built on trees they have not seen).

``main`` runs them beside uniform and selective and prints, per family x budget x
critic, each rule's composition-neutral error over uniform's (the mean over seeds of
each; the pairs are those uniform and selective both have, as in the benchmark),
the best rule and its batch-MSE ratio, and the share of the shared pairs' probability
mass each rule's batch covers (a rule is scored on the shared pairs it has).

    .venv/bin/python -m benchmarks.allocation_bound --seeds 6 --jobs 2 --json runs/allocation_bound.json
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from pydantic import PrivateAttr

from focus.collector import Collector
from focus.priority import NodeEvidence, Priority
from focus.search import SearchState
from focus.synthetic import TreeMDP
from focus.tree import Tree

DEPTHS = (0, 1, 2, 4, 8, 16)
#: The benchmark-only methods (``benchmarks.estimator_quality --methods`` accepts them).
BOUND_METHODS = (*(f"depth_d{d}" for d in DEPTHS), "reach", "sqrt_reach", "oracle_var", "decisive_depth")
FAMILIES = ("early_gate", "risky_bridge", "multi_key", "wide", "gauss_noise", "decisive", "heavy_tail", "truncated")


def return_variance(mdp: TreeMDP, values: Sequence[float], gamma: float) -> list[float]:
    """Var(G | s) of the on-policy discounted return from every state (second moment by
    backward induction, states numbered parents first)."""
    second = [0.0] * len(mdp.outcomes)
    for s in reversed(range(len(mdp.outcomes))):
        second[s] = sum(
            pa * sum(p * (r * r + 2 * gamma * r * values[n] + gamma * gamma * second[n]) for n, r, p in outs)
            for pa, outs in zip(mdp.probs[s], mdp.outcomes[s], strict=True)
        )
    return [max(m - v * v, 0.0) for m, v in zip(second, values, strict=True)]


class World:
    """What the oracle rules read: the MDPs, their reach and return variances, and the
    search's current trees (set by :class:`WatchingCollector`)."""

    def __init__(self, mdps: Sequence[TreeMDP], gamma: float) -> None:
        self.mdps = list(mdps)
        self.reach = [m.visits() for m in self.mdps]
        self.var = [return_variance(m, m.values(gamma), gamma) for m in self.mdps]
        self.trees: Sequence[Tree] = ()

    def state(self, ev: NodeEvidence) -> tuple[int, int]:
        """(task, MDP state) of the checkpoint ``ev`` views."""
        try:
            task, s = self.trees[ev.tree_index].states[ev.node_id].env_state
        except (IndexError, KeyError):
            raise RuntimeError(
                f"checkpoint {ev.node_id} of tree {ev.tree_index} is not in the trees the rule was shown "
                "(a ranking built before WatchingCollector.predict saw the state)"
            ) from None
        return int(task), int(s)


class DepthProfile(Priority):
    """Checkpoints at ``depth`` first, then by distance from it; fewest branches first
    within a depth (the branch count moves the score by less than one depth step)."""

    depth: int = 0

    def __call__(self, node: NodeEvidence) -> float:
        return -float(abs(node.depth - self.depth)) - 0.1 * (node.branches + node.pending)


class Oracle(Priority):
    """A rule that reads the exact MDP (:class:`World`, attached by :func:`attach`)."""

    _world: World | None = PrivateAttr(None)

    @property
    def world(self) -> World:
        if self._world is None:
            raise RuntimeError(f"{type(self).__name__} needs the MDPs: attach(search, World(...)) first")
        return self._world


class Reach(Oracle):
    """reach(s)^power / (1 + continuations started here): a greedy water-filling that
    spreads continuations in proportion to reach(s)^power."""

    power: float = 1.0

    def __call__(self, node: NodeEvidence) -> float:
        task, s = self.world.state(node)
        return float(self.world.reach[task][s] ** self.power / (1 + node.branches + node.pending))


class ReturnVariance(Oracle):
    """reach(s)·Var(G | s)·(1/k − 1/(k+1)) per expected transition, k the children
    (valid and pending, at least one)."""

    def __call__(self, node: NodeEvidence) -> float:
        task, s = self.world.state(node)
        k = max(node.m + node.pending, 1)
        gain = self.world.reach[task][s] * self.world.var[task][s] * (1 / k - 1 / (k + 1))
        return float(gain / max(node.expected_transitions, 1.0))


class DecisiveDepth(Oracle):
    """A depth profile at each task's own decisive depth (``TreeMDP.decisive``; the root
    where the family has none): the fixed profile a ranking would follow if it knew
    where each task's return is decided."""

    def __call__(self, node: NodeEvidence) -> float:
        at = max(self.world.mdps[node.tree_index].decisive, 0)
        return -float(abs(node.depth - at)) - 0.1 * (node.branches + node.pending)


def bound_search(method: str, phases: tuple[Any, ...]) -> Priority:
    """The search of a :data:`BOUND_METHODS` method with the benchmark's ``phases``."""
    if method.startswith("depth_d"):
        return DepthProfile(phases=phases, depth=int(method.removeprefix("depth_d")))
    if method == "reach":
        return Reach(phases=phases)
    if method == "sqrt_reach":
        return Reach(phases=phases, power=0.5)
    if method == "oracle_var":
        return ReturnVariance(phases=phases)
    if method == "decisive_depth":
        return DecisiveDepth(phases=phases)
    raise ValueError(f"unknown allocation rule {method!r} (known: {', '.join(BOUND_METHODS)})")


def attach(search: Priority, world: World) -> None:
    """Give an oracle rule its MDPs (nothing for the others). A private attribute: the
    copies the collector makes (``resolved``) share the same :class:`World`."""
    if isinstance(search, Oracle):
        search._world = world


class WatchingCollector(Collector):
    """A :class:`Collector` that shows the oracle rules the search's trees before every
    plan (``predict`` runs on the grafted state before the next wave is planned), and
    grafts without scoring or ranking ahead of the barrier, so every ranking is built
    after the trees were shown. Predictions and plans are those of a plain collector."""

    def __init__(self, world: World, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.world = world

    async def predict(self, state: SearchState) -> Any:
        self.world.trees = state.trees
        return await super().predict(state)

    async def land(self, state: SearchState, launched: Any, since: float | None = None, **_: Any) -> Any:
        return await super().land(state, launched, since=since, score_ahead=False, rank=False)


_CACHED: list[bool] = []


def run_cached(job: tuple[str, int, int, str, str, int]) -> dict[str, Any]:
    """``estimator_quality.run_one`` with each family's MDP construction cached in this
    process (an MDP is a frozen function of its seed; building wide's took 60% of a
    collection), for the jobs :func:`main` hands a worker in (family, seed) chunks."""
    import benchmarks.estimator_quality as eq

    if not _CACHED:
        for name, fam in eq.ALL_FAMILIES.items():
            eq.ALL_FAMILIES[name] = dataclasses.replace(fam, make=functools.lru_cache(maxsize=64)(fam.make))
        _CACHED.append(True)
    return eq.run_one(job)


def neutral_rows(raw: list[dict[str, Any]]) -> None:
    """Set ``neutral_mse`` and ``cover`` on every row and drop ``_pairs``: per (family,
    budget, critic, seed), the pairs uniform and selective both have; each row's error
    on those of them it has (``estimator_quality.neutral_mse``), and the share of their
    on-policy probability those cover."""
    from benchmarks.estimator_quality import neutral_mse

    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in raw:
        groups[(r["family"], r["budget"], r["critic"], r["seed"])].append(r)
    for rows in groups.values():
        base = [r for r in rows if r["method"] in ("uniform", "selective")] or rows
        shared = set(base[0]["_pairs"])
        for r in base[1:]:
            shared &= set(r["_pairs"])
        mass = sum(base[0]["_pairs"][k][2] for k in shared)
        common = set.intersection(*(set(r["_pairs"]) for r in rows))
        for r in rows:
            have = shared & set(r["_pairs"])
            r["neutral_mse"] = neutral_mse(r["_pairs"], have)
            r["neutral_all"] = neutral_mse(r["_pairs"], common)
            r["cover"] = sum(r["_pairs"][k][2] for k in have) / mass if mass > 0 else math.nan
    for r in raw:
        r.pop("_pairs", None)


def cells(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (family, budget, critic): each method's mean neutral error, batch MSE and cover
    over seeds, its ratios to uniform's, and the best method by neutral ratio."""
    by: dict[tuple[Any, ...], dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in raw:
        by[(r["family"], r["budget"], r["critic"])][r["method"]].append(r)
    out = []
    for (f, b, c), methods in by.items():
        mean = {
            m: {k: statistics.fmean(r[k] for r in rs) for k in ("neutral_mse", "neutral_all", "adv_mse", "cover")}
            for m, rs in methods.items()
        }
        uni = mean["uniform"]
        ratio = {m: v["neutral_mse"] / uni["neutral_mse"] for m, v in mean.items()}
        batch = {m: v["adv_mse"] / uni["adv_mse"] for m, v in mean.items()}
        every = {m: v["neutral_all"] / uni["neutral_all"] for m, v in mean.items()}
        best = min((m for m in ratio if m != "selective"), key=lambda m: ratio[m])
        out.append(
            {
                "family": f,
                "budget": b,
                "critic": c,
                "seeds": len(methods["uniform"]),
                "neutral": ratio,
                "batch": batch,
                "neutral_all": every,
                "cover": {m: v["cover"] for m, v in mean.items()},
                "best": best,
            }
        )
    return out


def print_cells(rows: list[dict[str, Any]], methods: list[str]) -> None:
    shown = [m for m in methods if m != "uniform"]
    print("| family | budget | critic | " + " | ".join(shown) + " | best (neutral / batch (on every rule's pairs)) |")
    print("| --- " * (4 + len(shown)) + "|")
    for r in rows:
        vals = " | ".join(f"{r['neutral'][m]:.2f}" for m in shown)
        bm = r["best"]
        print(
            f"| {r['family']} | {r['budget']}H | {r['critic']} | {vals} | "
            f"{bm} {r['neutral'][bm]:.2f} / {r['batch'][bm]:.2f} ({r['neutral_all'][bm]:.2f}) |"
        )
    print()
    print("| method | median neutral / uniform (noisy) | (constant) | median batch / uniform (noisy) | min cover |")
    print("| --- | --- | --- | --- | --- |")
    for m in shown:
        noisy = [r for r in rows if r["critic"].startswith("noise")]
        const = [r for r in rows if r["critic"] == "constant"]
        med = statistics.median(r["neutral"][m] for r in noisy) if noisy else math.nan
        medc = statistics.median(r["neutral"][m] for r in const) if const else math.nan
        medb = statistics.median(r["batch"][m] for r in noisy) if noisy else math.nan
        cover = min(r["cover"][m] for r in rows)
        print(f"| {m} | {med:.3f} | {medc:.3f} | {medb:.3f} | {cover:.3f} |")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--budgets", default="2,6")
    ap.add_argument("--critics", default="noise_1,noise_3,constant")
    ap.add_argument("--methods", default=",".join(("uniform", "selective", *BOUND_METHODS)))
    ap.add_argument("--seeds", type=int, default=6, help="seeds per cell (every budget)")
    ap.add_argument("--seed-start", type=int, default=0, help="first seed")
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--json", help="write the cells and raw rows here")
    args = ap.parse_args(argv)
    from benchmarks.estimator_quality import ALL_FAMILIES, CRITICS

    args.families, args.critics = args.families.split(","), args.critics.split(",")
    args.methods = args.methods.split(",")
    args.budget_list = [int(b) for b in args.budgets.split(",")]
    for flag, given, known in (
        ("--families", args.families, ALL_FAMILIES),
        ("--critics", args.critics, CRITICS),
        ("--methods", args.methods, ("uniform", "selective", *BOUND_METHODS)),
    ):
        unknown = [x for x in given if x not in known]
        if unknown:
            ap.error(f"{flag}: unknown {', '.join(unknown)}")
    if "uniform" not in args.methods or "selective" not in args.methods:
        ap.error("--methods must include uniform and selective (the shared pairs are theirs)")
    return args


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    seeds = range(args.seed_start, args.seed_start + args.seeds)
    # one chunk per (family, seed): a worker builds those MDPs once (run_cached)
    jobs = [
        (f, args.tasks, b, c, m, s)
        for f in args.families
        for s in seeds
        for b in args.budget_list
        for c in args.critics
        for m in args.methods
    ]
    chunk = len(args.budget_list) * len(args.critics) * len(args.methods)
    t0 = time.process_time()
    w0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            raw = list(pool.map(run_cached, jobs, chunksize=chunk))
    else:
        raw = [run_cached(j) for j in jobs]
    neutral_rows(raw)
    rows = cells(raw)
    print_cells(rows, args.methods)
    info = {"collections": len(jobs), "wall_s": round(time.perf_counter() - w0, 1), "seeds": args.seeds}
    info["main_cpu_s"] = round(time.process_time() - t0, 1)
    print(json.dumps(info))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"cells": rows, "info": info, "raw": raw}, fh, indent=1)
    return rows


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
