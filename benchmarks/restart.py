"""A model server restarted mid-collection: what the wait costs, and that nothing else does.

The question (a model server restarts: a crash, a weights reload, a node drain): does a
collection outlive it with the client's default settings, and at what cost? One
collection of the toy task through the pipeline's own direct path
(:func:`flows.direct.collect_direct`, what ``focus collect`` runs without Prefect)
against the embedded tiny model server on a fixed loopback port, first uninterrupted,
then once per ``--down`` value with the server killed (SIGKILL) when it has answered
half the uninterrupted run's requests and started again on the same port that many
seconds later (:class:`focus.testing.faults.ServerRestart`). The client runs with its
defaults (``model.http``: 10 retries, ``outage_wait_s`` 300 s).

Figures per run: wall time, the extra wall time over the uninterrupted run, how long
the server was down (kill to the restarted server answering ``/health``), how long
after that the client had its first answer (a probe's, computed by a server whose
prefix cache is cold, as every restarted server's is), failed rollouts, whether the batch equals the uninterrupted one row for row and bit for bit
(actor rows with their log-probs and advantages, critic rows with their targets and
weights), and the client's outage log lines.

    python -m benchmarks.restart [--down 30,90] [--tasks 6] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from focus.backends import LocalModelServer
from focus.testing.faults import ServerRestart, served_requests


def config(root: str, cid: str, url: str, tasks: int) -> Any:
    from tasks.config import load_config

    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 17,
            "model.kind": "openai",
            "model.url": url,
            "env.n_tasks": tasks,
            "agent.sampling.max_tokens": 8,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 30 * tasks, "wave_size": 8, "max_depth": 6},
            ],
            "execution.kind": "local",
            "execution.max_concurrency": 16,
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


def rows(root: str, url: str) -> tuple[Any, ...]:
    from storage import BatchStore

    batch = BatchStore(root).read(url)
    actor = [
        (r.tree_id, r.edge_id, r.turn_index, r.prompt_ids, r.completion_ids, r.logprobs, r.advantage)
        for r in batch.actor
    ]
    critic = [(r.tree_id, r.node_id, r.context_ids, r.target, r.weight) for r in batch.critic]
    return batch.stats, actor, critic


class _Lines(logging.Handler):
    """The client's outage lines, with the monotonic time each was logged."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[tuple[float, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append((time.monotonic(), record.getMessage()))


def run_one(server: LocalModelServer, root: str, cid: str, tasks: int, down_s: float | None, half: int) -> dict:
    from flows.direct import collect_direct

    lines = _Lines()
    logger = logging.getLogger("focus.backends.outage")
    logger.addHandler(lines)
    logger.setLevel(logging.WARNING)
    before = served_requests(server.url)
    restart = ServerRestart(server, after_requests=before + half, down_s=down_s) if down_s is not None else None
    try:
        if restart is not None:
            restart.start()
        t0 = time.perf_counter()
        out = asyncio.run(collect_direct(config(root, cid, server.url, tasks)))
        wall = time.perf_counter() - t0
    finally:
        if restart is not None:
            restart.stop()
        logger.removeHandler(lines)
    stats, _, _ = rows(root, out["batch_url"])
    back = [t for t, line in lines.lines if "answers again" in line]
    up = restart.up_at if restart is not None else None
    return {
        "down_s": down_s,
        "wall_s": round(wall, 2),
        "requests": served_requests(server.url) - before if restart is None else None,
        "killed_after_requests": (restart.requests_at_kill - before) if restart is not None else None,
        "down_for_s": round(restart.down_for_s, 2) if restart is not None and restart.down_for_s else None,
        "rollouts": stats["rollouts"],
        "failed_rollouts": stats["failed_rollouts"],
        # from the restarted server answering /health to the client's first answer
        # (a probe's: the restarted server computes it with a cold prefix cache)
        "back_after_up_s": round(back[0] - up, 2) if back and up is not None else None,
        "outage_lines": [line for _, line in lines.lines],
        "batch_url": out["batch_url"],
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from benchmarks.results import machine, write_report

    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--down", default="30,90", help="seconds the server stays down, comma-separated")
    ap.add_argument("--tasks", type=int, default=6)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    downs = [float(x) for x in args.down.split(",") if x]
    report: dict[str, Any] = {
        "command": "python -m benchmarks.restart " + " ".join(sys.argv[1:] if argv is None else argv),
        "machine": machine(),
        "tasks": args.tasks,
    }
    root = tempfile.mkdtemp(prefix="focus-bench-restart-")
    server = LocalModelServer().start()
    try:
        clean = run_one(server, root, "clean", args.tasks, None, 0)
        print(f"uninterrupted: {clean['wall_s']} s, {clean['requests']} requests", file=sys.stderr)
        want = rows(root, clean["batch_url"])[1:]
        runs = []
        for down in downs:
            r = run_one(server, root, f"down-{down:g}", args.tasks, down, clean["requests"] // 2)
            r["batch_equal"] = rows(root, r["batch_url"])[1:] == want
            r["extra_wall_s"] = round(r["wall_s"] - clean["wall_s"], 2)
            print(
                f"down {down:g} s: {r['wall_s']} s ({r['extra_wall_s']:+} s), {r['failed_rollouts']} failed, "
                f"batch equal: {r['batch_equal']}",
                file=sys.stderr,
            )
            runs.append(r)
    finally:
        server.stop()
    report["uninterrupted"] = clean
    report["restarts"] = runs
    return write_report(report, args.json)


if __name__ == "__main__":
    main()
