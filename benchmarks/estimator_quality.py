"""Estimator quality on synthetic tree MDPs with exact values.

Every method runs the real Agent -> Collector -> Batch code path over
``focus.synthetic`` (an in-process Env and a Policy with known action probabilities),
with the same task-transition budget; the batch's advantages are compared, token by
token, with the exact advantages ``r + γV(s') − V(s)`` from dynamic programming.

Methods (each at every shape x budget x critic):
  grpo       independent rollouts from the root + GroupNormalized (centred, Dr. GRPO)
  node_mc    uniform branching + NodeMonteCarlo (VinePPO-style per-node MC values)
  uniform    uniform branching + DirectBranchTd
  selective  Selective priority + DirectBranchTd

Metrics: token-weighted MSE of the segment advantages against the exact ones, sign
agreement (tokens whose exact advantage is non-zero), critic-target MSE (weighted by
the target weights) against the exact state values.

    .venv/bin/python -m benchmarks.estimator_quality [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from typing import Any

from focus.agent import Agent
from focus.batch import Batch
from focus.collector import Collector
from focus.critic import ConstantCritic, Critic
from focus.env import Task
from focus.estimation import DirectBranchTd, Estimator, GroupNormalized, NodeMonteCarlo
from focus.execution import Execution
from focus.priority import Phase, Priority, Selective, Uniform
from focus.synthetic import (
    SHAPES,
    SyntheticCritic,
    SyntheticEnv,
    SyntheticPolicy,
    TreeMDP,
    read_state,
    synthetic_format,
)

HORIZON = {"uniform": 4, "critical": 6, "long": 12}
CRITICS = {"exact": 0.0, "noisy_0.1": 0.1, "noisy_0.25": 0.25, "constant": None}
METHODS = ("grpo", "node_mc", "uniform", "selective")
EVIDENCE = 2  # rollouts per task before branching
WAVE = 8
KAPPA = 1.0
ADAPTIVE = True  # κ(n) from the critic's reported uncertainty (--fixed-kappa turns it off)


def make_critic(name: str, mdps: list[TreeMDP], seed: int) -> Critic:
    noise = CRITICS[name]
    return ConstantCritic(0.5) if noise is None else SyntheticCritic(mdps, noise, seed=seed, report_std=True)


def make_search(method: str, budget: int) -> tuple[Priority, Estimator]:
    evidence = Phase("evidence", rollouts_per_task=EVIDENCE)
    if method == "grpo":
        search: Priority = Uniform(
            phases=(evidence, Phase("rollouts", transitions=budget, wave_size=WAVE, max_depth=0, max_branches=10**6))
        )
        return search, GroupNormalized(scale=False)
    cont = Phase("continue", transitions=budget, wave_size=WAVE, max_branches=6, max_depth=64)
    if method == "selective":
        return (
            Selective(phases=(evidence, cont), kappa=KAPPA, adaptive_kappa=ADAPTIVE),
            DirectBranchTd(kappa=KAPPA, adaptive_kappa=ADAPTIVE),
        )
    search = Uniform(phases=(evidence, cont), kappa=KAPPA)
    return search, (NodeMonteCarlo() if method == "node_mc" else DirectBranchTd(kappa=KAPPA, adaptive_kappa=ADAPTIVE))


def score(batch: Batch, mdps: list[TreeMDP], values: list[list[float]]) -> dict[str, float]:
    se = sw = agree = aw = 0.0
    for r in batch.actor:
        task, s = read_state(r.prompt_ids)
        a = r.completion_ids[0] - 48
        exact = mdps[task].advantage(s, a, values[task])
        w = float(sum(r.loss_mask))
        se += w * (r.advantage - exact) ** 2
        sw += w
        if abs(exact) > 1e-9:
            agree += w * float((r.advantage > 0) == (exact > 0) and abs(r.advantage) > 1e-12)
            aw += w
    te = tw = 0.0
    for c in batch.critic:
        task, s = read_state(c.context_ids)
        te += c.weight * (c.target - values[task][s]) ** 2
        tw += c.weight
    return {
        "adv_mse": se / sw,
        "sign_agreement": agree / aw if aw else 1.0,
        "target_mse": te / tw if tw else 0.0,
        "transitions": batch.stats["transitions"],
        "tokens": batch.n_tokens,
    }


async def run_one(shape: str, n_tasks: int, budget_factor: int, critic: str, method: str, seed: int) -> dict[str, Any]:
    mdps = [SHAPES[shape](1000 * seed + i) for i in range(n_tasks)]
    values = [m.values() for m in mdps]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=HORIZON[shape] + 2)
    total = budget_factor * HORIZON[shape] * n_tasks
    search, est = make_search(method, total - EVIDENCE * HORIZON[shape] * n_tasks)
    col = Collector(
        agent,
        search,
        make_critic(critic, mdps, seed),
        est,
        Execution(max_concurrency=64),
        collection_id=f"{shape}-{method}",
        seed=seed,
    )
    tasks = [Task(f"{shape}{i}", {"mdp": i}) for i in range(n_tasks)]
    batch = await col.collect(tasks)
    return score(batch, mdps, values)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    global KAPPA, ADAPTIVE  # noqa: PLW0603 - one process, one configuration
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--quick", action="store_true", help="fewer tasks and seeds (a smoke run)")
    ap.add_argument("--tasks", type=int, default=8)
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--budgets", default="4,8,16", help="transitions per task, in multiples of the horizon")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--critics", default=",".join(CRITICS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--kappa", type=float, default=1.0)
    ap.add_argument("--fixed-kappa", action="store_true", help="ignore the critic's reported uncertainty")
    args = ap.parse_args(argv)
    KAPPA, ADAPTIVE = args.kappa, not args.fixed_kappa
    shapes, critics, methods = args.shapes.split(","), args.critics.split(","), args.methods.split(",")
    n_tasks, seeds = (3, 1) if args.quick else (args.tasks, args.seeds)
    budgets = [int(b) for b in args.budgets.split(",")]
    t0 = time.perf_counter()
    rows = []
    cache: dict[tuple[str, int, str], list[dict[str, float]]] = {}
    for shape in shapes:
        for b in budgets:
            for critic in critics:
                for method in methods:
                    # grpo and node_mc read no critic prediction: run once, report under every critic
                    key = (shape, b, method if method in ("grpo", "node_mc") else f"{method}/{critic}")
                    if key not in cache:
                        cache[key] = [asyncio.run(run_one(shape, n_tasks, b, critic, method, s)) for s in range(seeds)]
                    res = cache[key]
                    row = {"shape": shape, "budget": b, "critic": critic, "method": method}
                    for k in res[0]:
                        row[k] = statistics.fmean(r[k] for r in res)
                    rows.append(row)
    elapsed = time.perf_counter() - t0

    def get(shape: str, b: int, critic: str, method: str, key: str = "adv_mse") -> float:
        return next(
            r[key] for r in rows if (r["shape"], r["budget"], r["critic"], r["method"]) == (shape, b, critic, method)
        )

    def ratio(other: str, crit: list[str]) -> float:
        xs = [
            get(s, b, c, "selective") / max(get(s, b, c, other), 1e-12)
            for s in shapes
            for b in budgets
            for c in crit
            if c in critics and "selective" in methods and other in methods
        ]
        return statistics.median(xs) if xs else float("nan")

    noisy = [c for c in critics if c.startswith("noisy")]
    summary = {
        "mse_ratio_selective_vs_grpo": ratio("grpo", noisy),
        "mse_ratio_selective_vs_uniform": ratio("uniform", noisy),
        "mse_ratio_selective_vs_uniform_constant_critic": ratio("uniform", ["constant"]),
        "mse_ratio_selective_vs_grpo_constant_critic": ratio("grpo", ["constant"]),
        "tasks": n_tasks,
        "seeds": seeds,
        "budgets": budgets,
        "kappa": KAPPA,
        "adaptive_kappa": ADAPTIVE,
        "evidence_rollouts": EVIDENCE,
        "wall_s": round(elapsed, 1),
    }
    print("| shape | budget/task | critic | method | adv MSE | sign agree | target MSE | transitions |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['shape']} | {r['budget']}H | {r['critic']} | {r['method']} | {r['adv_mse']:.4f} | "
            f"{r['sign_agreement']:.3f} | {r['target_mse']:.4f} | {r['transitions']:.0f} |"
        )
    print()
    for k, v in summary.items():
        print(f"{k}: {v:.3f}" if isinstance(v, float) else f"{k}: {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "summary": summary}, f, indent=1)
    return summary


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
