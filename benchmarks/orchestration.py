"""Orchestration overhead: the same collection through Collector.collect() and through
the Prefect flow (one task per phase and wave, a checkpoint after each), in one run.

Two policies. ``service`` (the headline figures): the simulated model service of
benchmarks/engine.py (focus/testing/simserver.py, its own process on 127.0.0.1, 0.2 s per
call) through the real OpenAI-compatible client: a collection bound by a model service,
as collections are in use. ``inprocess`` (figures suffixed ``_inprocess``): a seeded
digit chooser in this process with 2 ms of simulated latency, a stress case where the
search's own CPU is nearly all of a collection's time and every fixed cost of the flow
shows. The direct path also writes its batch (the flow's product is a stored batch);
the ratio against collecting alone is reported too. The Prefect API (ephemeral unless
PREFECT_API_URL is set) is started by a warm-up flow run before anything is timed.

    .venv/bin/python -m benchmarks.orchestration --repeats 3 --json /tmp/bench_orch.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from focus.format import ByteCodec
from focus.policy import Completion, Policy, SamplingParams
from tasks.config import FocusConfig, load_config


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


def model_overrides(service_url: str | None, latency_s: float) -> dict[str, Any]:
    """The simulated model service over HTTP, or (no URL) the in-process digit policy."""
    if service_url:
        return {
            "model.kind": "factory",
            "model.factory": "benchmarks.orchestration:service_policy",
            "model.options": {"url": service_url},
            "agent.sampling": {"max_tokens": 8},
        }
    return {
        "model.kind": "factory",
        "model.factory": "benchmarks.orchestration:fast_policy",
        "model.options": {"latency_s": latency_s},
    }


def service_policy(url: str) -> Policy:
    """A vLLM-style client of the simulated service, as many calls in flight as jobs."""
    from focus.backends import OpenAICompatPolicy
    from focus.backends.http import HttpConfig

    return OpenAICompatPolicy(
        url, config=HttpConfig(max_concurrency=256, timeout_s=120.0), vocab_size=ByteCodec.vocab_size
    )


def config(root: str, cid: str, transitions: int, model: dict[str, Any]) -> FocusConfig:
    n_tasks = 64
    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 1,
            **model,
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


def direct(cfg: FocusConfig) -> tuple[float, float, Any]:
    """``Collector.collect()`` then writing its batch, as a script without the pipeline
    would: seconds collecting, seconds writing, and the batch. It runs on the execution
    service the pipeline builds from the same configuration (the heap kept out of
    cyclic GC, which the library leaves off), so the ratio is the orchestration's alone."""
    from storage import BatchStore
    from tasks.collect import make_execution

    out: list[Any] = []

    async def go() -> None:
        policy = cfg.build_policy()
        try:
            agent, tasks = cfg.build_agent(policy)
            out.append(await cfg.build_collector(agent, make_execution(cfg.execution)).collect(tasks))
        finally:
            await policy.aclose()

    t0 = time.perf_counter()
    # the batch leaves through a list: Python 3.11's asyncio.run formats the repr of its
    # main task's result on exit, which for a large batch costs about a second
    asyncio.run(go())
    t1 = time.perf_counter()
    BatchStore(cfg.storage.root).write(out[0])
    return t1 - t0, time.perf_counter() - t1, out[0]


def through_flow(cfg: FocusConfig) -> tuple[float, Any, int]:
    """Time of the flow run (it also writes the batch and checkpoints); the batch it
    wrote, read back afterwards (not timed), and its number of steps."""
    from flows.collect import collect
    from storage import BatchStore

    t0 = time.perf_counter()
    out = asyncio.run(collect(cfg))
    took = time.perf_counter() - t0
    return took, BatchStore(cfg.storage.root).read(out["batch_url"]), int(out["stats"]["steps"])


def same_batch(a: Any, b: Any) -> bool:
    """Same rows apart from the collection id (the two runs use different ids)."""

    def key(batch: Any) -> tuple[list[Any], list[Any]]:
        actor = [(r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.advantage) for r in batch.actor]
        critic = [(r.tree_id, r.node_id, r.context_ids, r.target, r.weight) for r in batch.critic]
        return actor, critic

    return key(a) == key(b)


#: (label, continuation budget): with 256 evidence rollouts, about 2k and 10k transitions.
SIZES = (("2k", 1_700), ("10k", 9_700))
#: ``--small``: a smoke run of seconds (tests/test_bench_orchestration.py); its figures mean nothing.
SMALL_SIZES = (("2k", 40), ("10k", 120))


def measure(
    tmp: str, model: dict[str, Any], repeats: int, suffix: str, sizes: Sequence[tuple[str, int]] = SIZES
) -> dict[str, Any]:
    """Both paths at both sizes against one policy; figures keyed ``<name>_<size><suffix>``."""
    figures: dict[str, Any] = {}
    through_flow(config(f"{tmp}/warm{suffix}", f"warmup{suffix}", 64, model))  # API up, imports done
    for label, budget in sizes:
        runs = []
        for r in range(repeats):
            c, w, d_batch = direct(config(f"{tmp}/d", f"d{label}{r}{suffix}", budget, model))
            f, f_batch, steps = through_flow(config(f"{tmp}/f{r}", f"f{label}{r}{suffix}", budget, model))
            assert same_batch(d_batch, f_batch), f"{label}{suffix}: the flow's batch differs from the direct one"
            runs.append((c, w, f))
        # the repeat with the median ratio (each repeat pairs a direct run with the flow run after it)
        c, w, f = sorted(runs, key=lambda x: x[2] / (x[0] + x[1]))[len(runs) // 2]
        key = f"{label}{suffix}"
        figures.update(
            {
                f"transitions_{key}": int(d_batch.stats["transitions"]),
                f"flow_steps_{key}": steps,
                f"direct_collect_s_{key}": round(c, 3),
                f"direct_write_s_{key}": round(w, 3),
                f"direct_s_{key}": round(c + w, 3),
                f"flow_s_{key}": round(f, 3),
                f"overhead_s_{key}": round(f - c - w, 3),
                f"overhead_ratio_{key}": round(f / (c + w), 3),
                f"overhead_ratio_vs_collect_only_{key}": round(f / c, 3),
                f"overhead_ratios_all_repeats_{key}": [round(x[2] / (x[0] + x[1]), 3) for x in runs],
            }
        )
        print(
            f"{key}: {figures[f'transitions_{key}']} transitions, direct {c:.2f} s + write {w:.2f} s, "
            f"flow {f:.2f} s ({steps} steps), ratio {f / (c + w):.3f} ({f / c:.3f} against collecting alone)"
        )
    return figures


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    ap.add_argument(
        "--policy",
        choices=("both", "service", "inprocess"),
        default="both",
        help="the simulated HTTP model service (the headline figures), the in-process digit policy, or both",
    )
    ap.add_argument("--service-latency-s", type=float, default=0.2, help="seconds per call of the simulated service")
    ap.add_argument("--latency-ms", type=float, default=2.0, help="latency per call of the in-process policy")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--small", action="store_true", help="tiny budgets, seconds (a smoke run)")
    args = ap.parse_args(argv)
    sizes = SMALL_SIZES if args.small else SIZES
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    if not os.environ.get("PREFECT_API_URL"):
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "true")
        os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    figures: dict[str, Any] = {
        "repeats": args.repeats,
        "service_latency_s": args.service_latency_s,
        "inprocess_latency_ms": args.latency_ms,
        "cpu_count": os.cpu_count(),
    }
    with tempfile.TemporaryDirectory() as tmp:
        if args.policy in ("both", "service"):
            from focus.testing.simserver import SimConfig, SimServerProcess

            sim = SimConfig(slots=256, latency_s=args.service_latency_s, completion_tokens=2)
            with SimServerProcess(sim) as server:
                figures.update(measure(tmp, model_overrides(server.url, 0.0), args.repeats, "", sizes))
        if args.policy in ("both", "inprocess"):
            figures.update(
                measure(tmp, model_overrides(None, args.latency_ms / 1000), args.repeats, "_inprocess", sizes)
            )
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))
    return figures


if __name__ == "__main__":
    main()
