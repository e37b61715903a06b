"""The train loop on the embedded model, for several seeds: a table and a plot of success.

For each seed this runs the train loop - exactly ``focus train -c configs/loop.toml
--set seed=<seed> ...`` without a Prefect server (:func:`flows.loop.train_direct`; its
own progress line below instead of the command's live lines): the embedded model server starts from the committed weights; each iteration collects a FOCUS batch
(Selective search, LocalCritic), trains the model (clipped policy gradient) and the
critic, publishes the weights to the store and reloads them into the server; every
version is evaluated on held-out targets. Prints a table of success rates and writes a
PNG plot and ``results.json``. A line on standard error every 30 s says how far each
seed got (batches collected, versions trained and evaluated, read from the store).

    .venv/bin/python -m examples.train_local.run --seeds 0 1 2 --out runs/train_local
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from examples import common

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "loop.toml"


def run_seed(seed: int, out: Path, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """One train loop; its records, one per version."""
    from flows.loop import train_direct
    from tasks.config import load_config

    cfg = load_config(
        CONFIG,
        {
            "seed": seed,
            "collection_id": f"train-local-s{seed}",
            "storage.root": str(out / "store"),
            "train.local.seed": seed,
            "critic.options": {"seed": seed},
            "progress": False,  # the line every 30 s below says how far each seed got
            **overrides,
        },
    )
    return asyncio.run(train_direct(cfg))


def store_progress(out: Path, seed: int) -> dict[str, int]:
    """What the store of ``seed``'s loop holds so far: batches, versions trained and evaluated."""
    from storage import BatchStore, CheckpointStore

    base, root = f"train-local-s{seed}", str(out / "store")
    try:
        saved = CheckpointStore(root).list(base)
        batches = [u for u in BatchStore(root).list() if f"/batches/{base}-it" in u]
    except Exception:  # noqa: BLE001 - nothing written yet, or a write in progress: say nothing
        return {}
    return {
        "batches": len(batches),
        "versions trained": sum(1 for phase, _ in saved if phase == "train"),
        "versions evaluated": sum(1 for phase, _ in saved if str(phase).startswith("eval")),
    }


def table(results: dict[int, list[dict[str, Any]]]) -> str:
    seeds = sorted(results)
    n = max(len(v) for v in results.values())
    head = "version | " + " | ".join(f"seed {s}" for s in seeds) + " | mean"
    lines = [head, "-" * len(head)]
    for i in range(n):
        rates = [results[s][i]["eval"]["success_rate"] for s in seeds if i < len(results[s])]
        cells = " | ".join(
            f"{results[s][i]['eval']['success_rate']:6.3f}" if i < len(results[s]) else "   -  " for s in seeds
        )
        lines.append(f"{i:7d} | {cells} | {sum(rates) / len(rates):.3f}")
    return "\n".join(lines)


def plot(results: dict[int, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    n = max(len(v) for v in results.values())
    for seed, recs in sorted(results.items()):
        ax.plot(
            range(len(recs)), [r["eval"]["success_rate"] for r in recs], marker="o", alpha=0.5, label=f"seed {seed}"
        )
    mean = [sum(results[s][i]["eval"]["success_rate"] for s in results) / len(results) for i in range(n)]
    ax.plot(range(n), mean, color="black", linewidth=2.5, label="mean")
    ax.set_xlabel("policy version (0 = initial weights; v = after v updates)")
    ax.set_ylabel("success rate on held-out targets")
    ax.set_title("focus train -c configs/loop.toml: ReachTarget, tiny model")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parser() -> argparse.ArgumentParser:
    ap = common.ArgumentParser(prog="python -m examples.train_local.run", description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/train_local", help="folder for the store, results and the plot")
    ap.add_argument(
        "--set", dest="sets", action="append", default=[], help="override a field of configs/loop.toml: key=value"
    )
    common.add_json_option(ap)
    return ap


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = parser()
    args = ap.parse_args(argv)
    common.check_out(ap, args.out)
    overrides: dict[str, Any] = {}
    for item in args.sets:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    os.environ.setdefault("DO_NOT_TRACK", "1")  # nothing sent anywhere
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    results: dict[int, list[dict[str, Any]]] = {}
    seed_wall: dict[int, float] = {}
    for seed in args.seeds:
        t = time.perf_counter()
        with common.Progress(f"train_local seed {seed}", every_s=30, poll=lambda s=seed: store_progress(out, s)):
            results[seed] = run_seed(seed, out, overrides)
        seed_wall[seed] = round(time.perf_counter() - t, 1)
        rates = " ".join(f"{r['eval']['success_rate']:.3f}" for r in results[seed])
        print(f"seed {seed}: success by version {rates} ({seed_wall[seed]:.0f} s)", flush=True)
    text = table(results)
    print(text)
    plot(results, out / "success.png")
    first = [recs[0]["eval"]["success_rate"] for recs in results.values()]
    last = [recs[-1]["eval"]["success_rate"] for recs in results.values()]
    summary = {
        "seeds": args.seeds,
        "overrides": overrides,
        "before": sum(first) / len(first),
        "after": sum(last) / len(last),
        "final_versions": {s: recs[-1]["policy_version"] for s, recs in results.items()},
        "per_seed": results,
        "plot": str(out / "success.png"),
        "wall_s": time.perf_counter() - t0,
    }
    (out / "results.json").write_text(json.dumps(summary, indent=2, default=str))
    print(
        f"success rate before {summary['before']:.3f} -> after {summary['after']:.3f} "
        f"(mean over seeds {args.seeds}); final versions "
        + " ".join(f"s{s}:{v}" for s, v in summary["final_versions"].items())
        + f"; plot {summary['plot']}; {summary['wall_s']:.0f} s"
    )
    if args.json_path:  # the figures the README shows (results.json has every record)
        figures = {
            "seeds": args.seeds,
            "overrides": overrides,
            "success": {s: [r["eval"]["success_rate"] for r in recs] for s, recs in results.items()},
            "eval_episodes": {s: recs[0]["eval"].get("episodes") for s, recs in results.items()},
            "final_versions": summary["final_versions"],
            "seed_wall_s": seed_wall,
            "wall_s": round(summary["wall_s"], 1),
        }
        Path(args.json_path).write_text(json.dumps(figures, indent=1, default=str) + "\n")
    return summary


if __name__ == "__main__":
    main()
