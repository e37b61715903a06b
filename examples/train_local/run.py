"""Collect -> export -> train -> reload, several iterations, on the toy task, on CPU.

For each seed a fresh embedded model server starts from the committed initial
weights; ``focus.train_local.run_loop`` evaluates the policy on held-out targets,
collects a batch with the FOCUS collector (Selective search, LocalCritic), writes it
as Parquet and reads it back with ``storage.BatchStore``, updates the model with
clipped importance-weighted policy gradient, fits the critic, saves the weights and
reloads them into the server. Prints a table of success rates and writes a PNG plot.

    python -m examples.train_local.run --iterations 6 --seeds 0 1 2 --out runs/train_local
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from focus.train_local import IterationRecord, LoopConfig, TrainConfig, run_loop


def run_seed(config: LoopConfig, workdir: Path, log: bool = True) -> list[IterationRecord]:
    from focus.backends import LocalModelServer

    def show(r: IterationRecord) -> None:
        if log:
            extra = f" kl {r.train['approx_kl']:.3f} rows {r.actor_rows}" if r.train else ""
            print(
                f"  seed {config.seed} iter {r.iteration}: success {r.success_rate:.3f} "
                f"version {r.policy_version[:8]}{extra} ({r.wall_s:.1f} s)",
                flush=True,
            )

    with LocalModelServer() as server:
        from storage import BatchStore

        return asyncio.run(run_loop(config, server, workdir, BatchStore(config.store), on_iteration=show))


def table(results: dict[int, list[IterationRecord]]) -> str:
    seeds = sorted(results)
    n = max(len(v) for v in results.values())
    head = "iteration | " + " | ".join(f"seed {s}" for s in seeds) + " | mean"
    lines = [head, "-" * len(head)]
    for i in range(n):
        rates = [results[s][i].success_rate for s in seeds if i < len(results[s])]
        cells = " | ".join(f"{results[s][i].success_rate:6.3f}" if i < len(results[s]) else "   -  " for s in seeds)
        lines.append(f"{i:9d} | {cells} | {sum(rates) / len(rates):.3f}")
    return "\n".join(lines)


def plot(results: dict[int, list[IterationRecord]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    n = max(len(v) for v in results.values())
    for seed, recs in sorted(results.items()):
        ax.plot(
            [r.iteration for r in recs], [r.success_rate for r in recs], marker="o", alpha=0.5, label=f"seed {seed}"
        )
    mean = [sum(results[s][i].success_rate for s in results) / len(results) for i in range(n)]
    ax.plot(range(n), mean, color="black", linewidth=2.5, label="mean")
    ax.set_xlabel("training iteration (evaluated before the update)")
    ax.set_ylabel("success rate on held-out targets")
    ax.set_title("ReachTarget, tiny model, FOCUS batches + clipped PG")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iterations", type=int, default=6)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--tasks", type=int, default=32, help="tasks collected per iteration")
    ap.add_argument("--eval-tasks", type=int, default=128)
    ap.add_argument("--rollouts-per-task", type=int, default=4)
    ap.add_argument("--transitions", type=int, default=96, help="continuation budget per iteration")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--critic", choices=["local", "constant"], default="local")
    ap.add_argument("--out", default="runs/train_local", help="folder for weights, batches, results and the plot")
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results: dict[int, list[IterationRecord]] = {}
    for seed in args.seeds:
        config = LoopConfig(
            iterations=args.iterations,
            seed=seed,
            tasks_per_iteration=args.tasks,
            eval_tasks=args.eval_tasks,
            rollouts_per_task=args.rollouts_per_task,
            transitions=args.transitions,
            critic=args.critic,
            train=TrainConfig(lr=args.lr, seed=seed),
            store=str(out / "store"),
            collection_id=f"train-local-s{seed}",
        )
        results[seed] = run_seed(config, out / f"weights-s{seed}", log=not args.quiet)
    text = table(results)
    print(text)
    plot(results, out / "success.png")
    first = [recs[0].success_rate for recs in results.values()]
    last = [recs[-1].success_rate for recs in results.values()]
    summary = {
        "seeds": args.seeds,
        "iterations": args.iterations,
        "before": sum(first) / len(first),
        "after": sum(last) / len(last),
        "per_seed": {s: [r.as_dict() for r in recs] for s, recs in results.items()},
        "plot": str(out / "success.png"),
        "wall_s": time.perf_counter() - t0,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2))
    print(
        f"success rate before {summary['before']:.3f} -> after {summary['after']:.3f} "
        f"(mean over seeds {args.seeds}); plot {summary['plot']}; {summary['wall_s']:.0f} s"
    )
    return summary


if __name__ == "__main__":
    main()
