"""Local trainer speed: one policy update under each sequence layout, 1 vs 2 threads.

Collects one toy batch on the embedded model with the search of ``configs/loop.toml``
(what ``focus train -c configs/loop.toml`` collects per iteration), then times
``PolicyTrainer.update`` on it from the same initial weights in each setting,
``--repeats`` times, and prints the median wall time and tokens forwarded. The
settings: ``pack`` ``none``, ``prefixes`` and ``tree`` (``focus.packing``) under one
``adam`` epoch with 1 and 2 threads, and under the default rule at the learning
benchmark's step (``rule="sgd"``, one step sized to ``target_kl`` 0.2 over the whole
batch) with one.

    .venv/bin/python -m benchmarks.train_local --tasks 32 --repeats 3 [--json PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path

from focus.exporters import actor_sequences
from focus.packing import pack_trees
from focus.train_local import PolicyTrainer, UpdateConfig, pack_prefixes, toy_agent

#: One Adam epoch of minibatch 32 with no KL stop (the default rule before 2026-12-06).
ADAM_EPOCH = {"rule": "adam", "target_kl": None}
#: The learning benchmark's trainer (benchmarks.learning.TRAINER).
KL_STEP = {"rule": "sgd", "lr": 3e-4, "clip": 0.5, "epochs": 8, "target_kl": 0.2}


async def collect(url: str, tasks: int):
    from pathlib import Path

    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.priority import Selective
    from focus.toy import reach_target_tasks
    from tasks.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / "loop.toml", environ={})
    agent = toy_agent(url, max_steps=cfg.agent.max_steps)
    search = Selective(phases=tuple(cfg.search.phases))
    try:
        return await Collector(agent, search=search, critic=ConstantCritic(0.3)).collect(reach_target_tasks(tasks))
    finally:
        await agent.policy.aclose()


def main() -> None:
    from focus.backends import LocalModelServer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write every figure here")
    args = ap.parse_args()
    with LocalModelServer() as server:
        batch = asyncio.run(collect(server.url, args.tasks))
    seqs = actor_sequences(batch)
    packed = pack_prefixes(seqs)
    tree = pack_trees(seqs)
    settings: list[dict[str, object]] = []
    figures: dict[str, object] = {
        "tasks": args.tasks,
        "repeats": args.repeats,
        "actor_rows": len(batch.actor),
        "sequences": len(seqs),
        "tokens": sum(len(s.tokens) for s in seqs),
        "packed_sequences": len(packed),
        "packed_tokens": sum(len(s.tokens) for s in packed),
        "tree_pieces": len(tree),
        "tree_tokens": sum(len(s.tokens) for s in tree),
        "settings": settings,
    }
    print(
        f"batch: {len(batch.actor)} actor rows, {len(seqs)} sequences ({figures['tokens']} tokens); "
        f"packed: {len(packed)} sequences ({figures['packed_tokens']} tokens)"
    )
    print(f"{'setting':28s} {'median s':>9s} {'runs':>24s}")
    packs = ("none", "prefixes", "tree")
    grid: list[tuple[str, int, dict[str, object]]] = [(p, t, ADAM_EPOCH) for p in packs for t in (2, 1)]
    grid += [(p, 1, KL_STEP) for p in packs]
    for pack, threads, rule in grid:
        runs = []
        for _ in range(args.repeats):
            trainer = PolicyTrainer(config=UpdateConfig(pack=pack, torch_threads=threads, **rule))  # type: ignore[arg-type]
            t0 = time.perf_counter()
            trainer.update(batch)
            runs.append(time.perf_counter() - t0)
        name = f"pack={pack} threads={threads}" + (" sgd" if rule is KL_STEP else "")
        print(f"{name:28s} {statistics.median(runs):9.2f} {' '.join(f'{r:.2f}' for r in runs):>24s}")
        settings.append(
            {
                "pack": pack,
                "torch_threads": threads,
                "rule": rule["rule"],
                "median_s": statistics.median(runs),
                "runs_s": runs,
            }
        )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
