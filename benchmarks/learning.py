"""Learning curves: does a FOCUS batch teach a policy more per task transition than GRPO's?

Each run trains the embedded tiny model from its committed weights for a few
iterations of collect -> train (``focus.train_local``: the same ``PolicyTrainer`` and
``UpdateConfig()`` for every method) -> reload into the server, and evaluates every
version on held-out tasks (one plain rollout each, fixed seeds: versions differ by the
weights, not by the dice). Per iteration every method gets the same tasks and the same
transitions: GRPO ``2 * EVIDENCE`` rollouts per task; FOCUS and uniform ``EVIDENCE``
rollouts per task, then a continuation budget equal to the transitions those took
(what ``2 * EVIDENCE`` rollouts of the same policy cost). They differ in where the
budget goes and in the advantages:

  focus    Selective priority + DirectBranchTd, LocalCritic fitted on the critic targets
           (library defaults: ``Selective()``'s ranking, ``Phase()``'s wave/branch/depth
           limits, ``DirectBranchTd()``)
  uniform  Uniform branching + DirectBranchTd + LocalCritic (where to branch, not how to score)
  grpo     ``2 * EVIDENCE`` independent rollouts per task (a search with an evidence phase
           only) + ``GroupNormalized()``: every segment gets its rollout's
           group-normalised return; no critic

on two tasks: the toy task ``focus.toy.ReachTarget`` and the MATH example
(``examples.math``: generated problems, verifier reward, two attempts). The x axes
are cumulative task transitions and cumulative wall time (collection + training +
reload; evaluation excluded). The goal read off the curves, per task, medians over
seeds: the transitions FOCUS needs to reach GRPO's final success, as a share of
GRPO's total (goal: at most 0.5). Writes a JSON and a PNG.

    .venv/bin/python -m benchmarks.learning                 # the default run (~15 min on 2 cores)
    .venv/bin/python -m benchmarks.learning --quick         # a smoke run (a test uses it)
    .venv/bin/python -m benchmarks.learning --json PATH --plot PNG   # also the JSON to PATH, the plot to PNG
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from focus.agent import Agent, derive_seed
from focus.critic import ConstantCritic, Critic, LocalCritic
from focus.env import Task
from focus.estimation import DirectBranchTd, Estimator, GroupNormalized
from focus.priority import Phase, Priority, Selective, Uniform

METHODS = ("focus", "grpo", "uniform")
#: Complete rollouts per task before any branching (every method).
EVIDENCE = 4


@dataclass(frozen=True)
class Sizes:
    """How big one run is (the same for every method)."""

    iterations: int
    tasks: int  # collected per iteration
    eval_tasks: int


#: Chosen for the time budget (about 15 minutes on 2 cores for everything), not tuned per method.
DEFAULT = {"toy": Sizes(iterations=6, tasks=16, eval_tasks=200), "math": Sizes(iterations=3, tasks=10, eval_tasks=60)}
SEEDS = [0, 1, 2, 3, 4]
QUICK = {"toy": Sizes(iterations=1, tasks=3, eval_tasks=6), "math": Sizes(iterations=1, tasks=2, eval_tasks=3)}


@dataclass(frozen=True)
class Domain:
    name: str
    make_agent: Callable[[str], Agent]
    tasks: Callable[[int, int], list[Task]]  # (n, seed) -> tasks


def toy_domain() -> Domain:
    from focus.toy import reach_target_tasks
    from focus.train_local import toy_agent

    return Domain("toy", lambda url: toy_agent(url, max_steps=12), lambda n, seed: reach_target_tasks(n, seed=seed))


def math_domain() -> Domain:
    from examples.math.env import MathEnv, default_tasks
    from focus.backends import OpenAICompatPolicy
    from focus.format import ByteCodec, FinalAnswerParser, PolicyFormat
    from focus.policy import SamplingParams

    def make_agent(url: str) -> Agent:
        # as examples/math/run.py builds it for the embedded model (MathConfig defaults)
        return Agent(
            OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size),
            MathEnv(max_attempts=2),
            PolicyFormat(ByteCodec(), FinalAnswerParser(require_marker=False)),
            max_steps=4,
            sampling=SamplingParams(max_tokens=64, temperature=1.0),
        )

    return Domain("math", make_agent, lambda n, seed: default_tasks(n, seed))


DOMAINS: dict[str, Callable[[], Domain]] = {"toy": toy_domain, "math": math_domain}


def make_method(method: str, seed: int) -> tuple[type[Priority], Estimator, Critic, bool]:
    """(priority class, estimator, critic, fit the critic?) of one method."""
    if method == "grpo":
        return Selective, GroupNormalized(), ConstantCritic(0.0), False
    return (Selective if method == "focus" else Uniform), DirectBranchTd(), LocalCritic(seed=seed), True


async def collect(
    agent: Agent, method: str, critic: Critic, estimator: Estimator, tasks: list[Task], cid: str, it: int, seed: int
) -> Any:
    """One iteration's batch. GRPO: ``2 * EVIDENCE`` independent rollouts per task.
    FOCUS and uniform: ``EVIDENCE`` rollouts per task, then a continuation phase whose
    budget is the transitions those rollouts took - so a batch costs what ``2 *
    EVIDENCE`` independent rollouts of the same policy cost."""
    from focus.collector import Collector
    from focus.execution import Execution

    priority, _, _, _ = make_method(method, 0)

    def collector(*phases: Phase) -> Collector:
        return Collector(
            agent,
            search=priority(phases=phases),
            critic=critic,
            estimator=estimator,
            execution=Execution(max_concurrency=32),
            collection_id=cid,
            iteration=it,
            seed=seed,
        )

    if method == "grpo":
        return await collector(Phase("evidence", rollouts_per_task=2 * EVIDENCE)).collect(tasks)
    evidence = Phase("evidence", rollouts_per_task=EVIDENCE)
    state = await collector(evidence).run_evidence(tasks)
    used = state.usage().transitions
    full = collector(evidence, Phase("continue", transitions=used))
    wave = 0
    while not (plan := full.plan_wave(state, 1, wave)).empty:
        state = await full.run_wave(state, plan)
        wave += 1
    return full.prepare(state)


async def run_one(domain: Domain, method: str, seed: int, sizes: Sizes, server: Any, workdir: Path) -> dict[str, Any]:
    """One learning curve: evaluate, then ``iterations`` x (collect, train, reload, evaluate)."""
    from focus.tinylm.model import DEFAULT_WEIGHTS
    from focus.train_local import PolicyTrainer, UpdateConfig, evaluate, train_iteration

    await asyncio.to_thread(server.reload, DEFAULT_WEIGHTS)
    _, estimator, critic, fit = make_method(method, seed)
    trainer = PolicyTrainer(None, UpdateConfig(seed=seed))
    agent = domain.make_agent(server.url)
    held_out = domain.tasks(sizes.eval_tasks, 10_000 + seed)
    points: list[dict[str, Any]] = []
    transitions = 0
    wall = 0.0
    try:
        ev = await evaluate(agent, held_out, seed=seed)
        points.append({"version": 0, "transitions": 0, "wall_s": 0.0, **_ev(ev)})
        for it in range(sizes.iterations):
            t0 = time.perf_counter()
            # the same tasks for every method at this seed and iteration
            tasks = domain.tasks(sizes.tasks, derive_seed("tasks", seed, it))
            cid = f"{domain.name}-{method}-s{seed}"
            batch = await collect(agent, method, critic, estimator, tasks, cid, it, derive_seed("learning", seed, it))
            out = await asyncio.to_thread(
                train_iteration, trainer, critic if fit else None, batch, workdir / f"{method}-s{seed}.pt"
            )
            await asyncio.to_thread(server.reload, workdir / f"{method}-s{seed}.pt")
            wall += time.perf_counter() - t0
            transitions += int(batch.stats["transitions"])
            ev = await evaluate(agent, held_out, seed=seed)
            points.append(
                {
                    "version": it + 1,
                    "transitions": transitions,
                    "wall_s": round(wall, 3),
                    **_ev(ev),
                    "batch_transitions": int(batch.stats["transitions"]),
                    "actor_rows": len(batch.actor),
                    "nonzero_advantage_rows": sum(1 for r in batch.actor if abs(r.advantage) > 1e-9),
                    "batch_reward": sum(r.reward for r in batch.actor),
                    "approx_kl": out["train"]["approx_kl"],
                    "policy_version": out["policy_version"],
                }
            )
    finally:
        await agent.policy.aclose()
    return {"task": domain.name, "method": method, "seed": seed, "points": points}


def _ev(ev: Any) -> dict[str, float]:
    return {"success": ev.success_rate, "mean_return": ev.mean_return}


# --- reading the curves ---------------------------------------------------------------------


def median_curve(runs: Sequence[dict[str, Any]], key: str = "transitions") -> list[tuple[float, float]]:
    """(median x, median success) per version over the runs (seeds) of one method."""
    n = min(len(r["points"]) for r in runs)
    return [
        (
            statistics.median(r["points"][v][key] for r in runs),
            statistics.median(r["points"][v]["success"] for r in runs),
        )
        for v in range(n)
    ]


def reach(curve: Sequence[tuple[float, float]], level: float) -> float | None:
    """The x at which ``curve`` first reaches ``level`` (linear between points; pure)."""
    for (x0, y0), (x1, y1) in zip(curve, curve[1:], strict=False):
        if y0 >= level:
            return x0
        if y1 >= level:
            return x0 + (x1 - x0) * (level - y0) / (y1 - y0)
    return curve[-1][0] if curve and curve[-1][1] >= level else None


def goal(runs: Sequence[dict[str, Any]], task: str) -> dict[str, Any]:
    """FOCUS's transitions to GRPO's final success, as a share of GRPO's (medians over seeds)."""
    by = {m: [r for r in runs if r["task"] == task and r["method"] == m] for m in METHODS}
    grpo = median_curve(by["grpo"])
    target, total = grpo[-1][1], grpo[-1][0]
    out: dict[str, Any] = {"grpo_final_success": target, "grpo_transitions": total}
    for m in ("focus", "uniform"):
        x = reach(median_curve(by[m]), target)
        out[f"{m}_transitions_to_grpo_final"] = x
        out[f"{m}_ratio"] = None if x is None or total <= 0 else round(x / total, 6)
    # per seed (paired: the same tasks, evaluation and initial weights)
    per_seed = {}
    for g_run in by["grpo"]:
        f_run = next((r for r in by["focus"] if r["seed"] == g_run["seed"]), None)
        if f_run is None:
            continue
        g_curve = [(p["transitions"], p["success"]) for p in g_run["points"]]
        x = reach([(p["transitions"], p["success"]) for p in f_run["points"]], g_curve[-1][1])
        per_seed[str(g_run["seed"])] = {
            "focus_ratio": None if x is None or g_curve[-1][0] <= 0 else round(x / g_curve[-1][0], 6),
            "focus_minus_grpo_final": round(f_run["points"][-1]["success"] - g_curve[-1][1], 6),
        }
    out["per_seed"] = per_seed
    # the initial weights are the same for every method: reaching GRPO's final success at
    # version 0 means GRPO did not improve on them, which says nothing about FOCUS
    out["grpo_improved"] = target > grpo[0][1]
    out["goal_met"] = bool(out["grpo_improved"] and out["focus_ratio"] is not None and out["focus_ratio"] <= 0.5)
    return out


def plot(runs: Sequence[dict[str, Any]], tasks: Sequence[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"focus": "tab:blue", "grpo": "tab:red", "uniform": "tab:green"}
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.8 * len(tasks)), squeeze=False)
    for row, task in enumerate(tasks):
        for col, (key, label) in enumerate(
            (("transitions", "cumulative task transitions"), ("wall_s", "wall time (s)"))
        ):
            ax = axes[row][col]
            for m in METHODS:
                mine = [r for r in runs if r["task"] == task and r["method"] == m]
                for r in mine:
                    ax.plot(
                        [p[key] for p in r["points"]],
                        [p["success"] for p in r["points"]],
                        color=colors[m],
                        alpha=0.2,
                        linewidth=1,
                    )
                if mine:
                    xs, ys = zip(*median_curve(mine, key), strict=True)
                    ax.plot(xs, ys, color=colors[m], marker="o", linewidth=2.2, label=f"{m} (median of {len(mine)})")
            ax.set_xlabel(label)
            ax.set_ylabel("held-out success rate")
            ax.set_title(f"{task}: success vs {label}")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def table(runs: Sequence[dict[str, Any]], tasks: Sequence[str], goals: dict[str, Any]) -> str:
    lines = [
        "| task | method | success v0 | final success (median [min, max]) | transitions | wall s | "
        "transitions to GRPO's final / GRPO's |",
        "|---|---|---|---|---|---|---|",
    ]
    for task in tasks:
        for m in METHODS:
            mine = [r for r in runs if r["task"] == task and r["method"] == m]
            if not mine:
                continue
            first = statistics.median(r["points"][0]["success"] for r in mine)
            finals = [r["points"][-1]["success"] for r in mine]
            trans = statistics.median(r["points"][-1]["transitions"] for r in mine)
            wall = statistics.median(r["points"][-1]["wall_s"] for r in mine)
            ratio = goals[task].get(f"{m}_ratio") if m != "grpo" else 1.0
            if not goals[task]["grpo_improved"]:
                reached = "n/a (GRPO did not improve)"
            else:
                reached = "not reached" if ratio is None else f"{ratio:.2f}"
            lines.append(
                f"| {task} | {m} | {first:.3f} | {statistics.median(finals):.3f} [{min(finals):.3f}, {max(finals):.3f}]"
                f" | {trans:.0f} | {wall:.0f} | {reached} |"
            )
    return "\n".join(lines)


async def run_task(name: str, sizes: Sizes, seeds: Sequence[int], workdir: Path, log: bool) -> list[dict[str, Any]]:
    from focus.backends import LocalModelServer

    domain = DOMAINS[name]()
    runs = []
    with LocalModelServer() as server:
        for seed in seeds:
            for method in METHODS:
                t0 = time.perf_counter()
                run = await run_one(domain, method, seed, sizes, server, workdir)
                runs.append(run)
                if log:
                    curve = " ".join(f"{p['success']:.3f}@{p['transitions']}" for p in run["points"])
                    print(f"{name} {method:7s} seed {seed}: {curve} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return runs


def _print_goals(goals: dict[str, Any]) -> None:
    for t, g in goals.items():
        ratio = g["focus_ratio"]
        print(
            f"{t}: GRPO final success {g['grpo_final_success']:.3f} after {g['grpo_transitions']:.0f} transitions "
            f"({'improved on' if g['grpo_improved'] else 'no better than'} the initial weights); FOCUS reaches it "
            f"at {'never' if ratio is None else f'{ratio:.2f} of them'}; goal (<= 0.5 with GRPO improving) "
            f"{'met' if g['goal_met'] else 'not met'}"
        )


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, one seed: a smoke run")
    ap.add_argument("--tasks", nargs="+", choices=sorted(DOMAINS), default=["toy", "math"])
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 0 1 2 3 4 (--quick: 0)")
    ap.add_argument("--out", default="runs/learning", help="folder for learning.json and learning.png")
    ap.add_argument("--quiet", action="store_true")
    ap.add_argument("--report", metavar="JSON", help="print the table and redraw the plot of a saved run; run nothing")
    ap.add_argument("--json", type=Path, help="also write learning.json's content here")
    ap.add_argument("--plot", type=Path, help="draw the plot here instead of <out>/learning.png")
    args = ap.parse_args(argv)
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        tasks = list(saved["goals"])
        goals = {t: goal(saved["runs"], t) for t in tasks}
        plot(saved["runs"], tasks, Path(args.report).with_suffix(".png"))
        print(table(saved["runs"], tasks, goals))
        _print_goals(goals)
        return {**saved, "goals": goals}
    seeds = args.seeds if args.seeds is not None else ([0] if args.quick else SEEDS)
    sizes = QUICK if args.quick else DEFAULT
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="focus-learning-") as tmp:
        for name in args.tasks:
            runs += asyncio.run(run_task(name, sizes[name], seeds, Path(tmp), not args.quiet))
    goals = {t: goal(runs, t) for t in args.tasks}
    result = {
        "command": "python -m benchmarks.learning" + (" --quick" if args.quick else ""),
        "seeds": seeds,
        "evidence_rollouts_per_task": EVIDENCE,
        "sizes": {t: sizes[t].__dict__ for t in args.tasks},
        "goals": goals,
        "runs": runs,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (out / "learning.json").write_text(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    png = args.plot or out / "learning.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    plot(runs, args.tasks, png)
    print(table(runs, args.tasks, goals))
    _print_goals(goals)
    print(f"wrote {out / 'learning.json'} and {png} in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
