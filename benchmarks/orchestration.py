"""Orchestration overhead: the same collection through Collector.collect() and through
the Prefect flow (one task per phase and wave, a checkpoint after each), in one run.

The policy is in-process and fast (a seeded digit chooser for the toy task, with a small
simulated latency), so the figures measure orchestration - Prefect task runs, state
pickling and checkpoint writes - not a model. The Prefect API (ephemeral unless
PREFECT_API_URL is set) is started by a warm-up flow run before anything is timed.

    .venv/bin/python benchmarks/orchestration.py --json /tmp/bench_orch.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from focus.config import FocusConfig, load_config  # noqa: E402
from focus.format import ByteCodec  # noqa: E402
from focus.policy import Completion, Policy, SamplingParams  # noqa: E402


class FastDigits(Policy):
    """Seeded digit per call; ``latency_s`` of asyncio sleep stands in for a server."""

    vocab_size = ByteCodec.vocab_size

    def __init__(self, latency_s: float = 0.0) -> None:
        self.latency_s = latency_s
        self.policy_version = "bench"

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        rng = random.Random(hash((params.seed, len(prompt_ids))))
        return Completion((ord(str(rng.randint(1, 9))), ByteCodec.EOT), (math.log(1 / 9), 0.0), "stop")


def fast_policy(**options: Any) -> FastDigits:
    return FastDigits(**options)


def config(root: str, cid: str, transitions: int, latency_s: float) -> FocusConfig:
    n_tasks = 64
    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 1,
            "model.kind": "factory",
            "model.factory": "orchestration:fast_policy",
            "model.options": {"latency_s": latency_s},
            "env.n_tasks": n_tasks,
            "agent.max_steps": 8,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 4},
                {"name": "continue", "transitions": transitions, "wave_size": 256, "max_branches": 4, "max_depth": 8},
            ],
            "execution.kind": "local",
            "execution.max_concurrency": 256,
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


def direct(cfg: FocusConfig) -> tuple[float, Any]:
    t0 = time.perf_counter()
    policy = cfg.build_policy()
    agent, tasks = cfg.build_agent(policy)
    batch = asyncio.run(cfg.build_collector(agent).collect(tasks))
    return time.perf_counter() - t0, batch


def through_flow(cfg: FocusConfig) -> tuple[float, Any, int]:
    """Time of the flow run (it also writes the batch and checkpoints); the batch it
    wrote, read back afterwards (not timed), and its number of steps."""
    from flows.collect import collect
    from storage import BatchStore

    t0 = time.perf_counter()
    out = collect(cfg)
    took = time.perf_counter() - t0
    return took, BatchStore(cfg.storage.root).read(out["batch_url"]), int(out["stats"]["steps"])


def same_batch(a: Any, b: Any) -> bool:
    """Same rows apart from the collection id (the two runs use different ids)."""

    def key(batch: Any) -> tuple[list[Any], list[Any]]:
        actor = [(r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.advantage) for r in batch.actor]
        critic = [(r.tree_id, r.node_id, r.context_ids, r.target, r.weight) for r in batch.critic]
        return actor, critic

    return key(a) == key(b)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    ap.add_argument("--latency-ms", type=float, default=2.0, help="simulated model latency per call")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args(argv)
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    lat = args.latency_ms / 1000
    figures: dict[str, Any] = {"latency_ms": args.latency_ms, "repeats": args.repeats}
    with tempfile.TemporaryDirectory() as tmp:
        through_flow(config(f"{tmp}/warm", "warmup", 64, lat))  # start the API before timing
        for label, budget in (("2k", 1_700), ("10k", 9_700)):
            d_times, f_times = [], []
            for r in range(args.repeats):
                d, d_batch = direct(config(f"{tmp}/d", f"d{label}{r}", budget, lat))
                f, f_batch, steps = through_flow(config(f"{tmp}/f{r}", f"f{label}{r}", budget, lat))
                d_tr = int(d_batch.stats["transitions"])
                assert same_batch(d_batch, f_batch), f"{label}: the flow's batch differs from the direct one"
                d_times.append(d)
                f_times.append(f)
            d, f = min(d_times), min(f_times)
            figures.update(
                {
                    f"transitions_{label}": d_tr,
                    f"flow_steps_{label}": steps,
                    f"direct_s_{label}": round(d, 3),
                    f"flow_s_{label}": round(f, 3),
                    f"overhead_ratio_{label}": round(f / d, 3),
                }
            )
            print(f"{label}: {d_tr} transitions, direct {d:.2f} s, flow {f:.2f} s ({steps} steps), ratio {f / d:.3f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
