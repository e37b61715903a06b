"""What a collect flow run shows on its page in the Prefect UI, and how a run no ``focus``
command checked fails, against the session's real Prefect server (in-process runs, as a
deployment's process runs them).

- Its steps' task runs are named as docs/pipeline.md names them (``check-config``,
  ``evidence-rollouts``, ``prepare-export``, ``publish-report``); Prefect's default name
  added three random hex digits (``check-config-1e6``).
- A model URL nothing answers fails the run in seconds with the command's line
  (``cannot reach the model service at ...``); a deployment's run waited out
  ``model.http.outage_wait_s`` (300 s by default) as for an outage, its log silent.
- The library's lines for the operator (``focus_console``: here a damaged batch written
  again) are in the run's log; they reached only the serving process's console.
- A rerun of a finished collection says so in its log (``finished before, nothing run
  again``); it said ``batch at <url>`` as a run that collected does.
"""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.prefect import free_port, using_api

pytestmark = pytest.mark.timeout(150)


def small(tmp_path: Path, cid: str) -> dict[str, Any]:
    return {
        "seed": 2,
        "collection_id": cid,
        "env": {"n_tasks": 2},
        "search": {
            "phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 6, "wave_size": 3, "max_depth": 4},
            ]
        },
        "model": {"kind": "factory", "factory": "fixtures.digits:digit_policy"},
        "execution": {"kind": "local", "heartbeat_s": 0.5},
        "storage": {"root": str(tmp_path / "store")},
        "progress": False,
    }


async def flushed(call: Any) -> Any:
    """Await the flow call, then send the run's log lines (they go in batches)."""
    from prefect.logging.handlers import APILogHandler

    try:
        return await call
    finally:
        await APILogHandler.aflush()


def run_named(api: str, name: str) -> list[dict[str, Any]]:
    body = {"flow_runs": {"name": {"any_": [name]}}, "sort": "EXPECTED_START_TIME_ASC"}
    return list(httpx.post(f"{api}/flow_runs/filter", json=body, timeout=30).json())


def task_run_names(api: str, run_id: str) -> list[str]:
    body = {"task_runs": {"flow_run_id": {"any_": [run_id]}}}
    return sorted(t["name"] for t in httpx.post(f"{api}/task_runs/filter", json=body, timeout=30).json())


def run_logs(api: str, run_id: str) -> list[tuple[int, str, str]]:
    body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    logs = httpx.post(f"{api}/logs/filter", json=body, timeout=30).json()
    return [(x["level"], x["name"], x["message"]) for x in logs]


@pytest.fixture(scope="module")
def first_run(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, ...]:
    """A collect flow run of a collection of its own: its config, result and run (the one
    run the collection made), whose page the names test reads and that the lines test
    runs again. The id is this build's own: under ``--dist worksteal`` a worker can run
    this module's tests apart, with another module's between them, and then builds this
    fixture again against its server, where a second run of the same collection was the
    finished collection's rerun, and ``(run,)`` found two."""
    from flows.collect import collect

    tmp = tmp_path_factory.mktemp("page")
    cfg = small(tmp, f"page-lines-{os.getpid()}-{time.monotonic_ns()}")
    with using_api(prefect_server, tmp / "prefect"):
        result = asyncio.run(flushed(collect(cfg)))
    (run,) = run_named(prefect_server, cfg["collection_id"])
    return cfg, result, run


def test_step_task_runs_are_named_as_the_docs_name_them(prefect_api, first_run):
    _, _, run = first_run
    names = task_run_names(prefect_api, run["id"])
    waves = [n for n in names if n.startswith("wave-")]
    assert waves and all(n.split("-")[1:] and n.count("-") == 2 for n in waves), names
    assert sorted(set(names) - set(waves)) == [
        "check-config",
        "evidence-rollouts",
        "prepare-export",
        "publish-report",
        "score-evidence",
    ], names


def test_the_librarys_lines_for_the_operator_reach_the_runs_log(prefect_api, first_run):
    from flows.collect import collect

    cfg, result, run = first_run
    # a rerun of the finished collection says that nothing ran again
    asyncio.run(flushed(collect(cfg)))
    cid = cfg["collection_id"]
    again = run_named(prefect_api, cid)[-1]
    said = [m for _, _, m in run_logs(prefect_api, again["id"]) if m.startswith(f"collection {cid}: ")]
    assert said == [f"collection {cid}: finished before, nothing run again; its batch is at {result['batch_url']}"]
    # the finished batch damaged: the rerun writes it again and says so in its run's log
    part = Path(result["batch_url"].removeprefix("file://")) / "actor" / "part-00000.parquet"
    good = part.read_bytes()
    part.write_bytes(good[:-10] + b"0123456789")
    asyncio.run(flushed(collect(cfg)))
    assert part.read_bytes() == good
    rerun = run_named(prefect_api, cid)[-1]
    assert rerun["id"] != run["id"] and rerun["state_type"] == "COMPLETED"
    lines = [(lv, name, m) for lv, name, m in run_logs(prefect_api, rerun["id"]) if "wrote it again" in m]
    assert len(lines) == 1, run_logs(prefect_api, rerun["id"])
    level, logger, message = lines[0]
    assert level == 30 and logger == "tasks.gaps" and "did not match its manifest" in message, lines


def test_a_model_url_nothing_answers_fails_the_run_in_seconds(prefect_api, tmp_path):
    from flows.collect import collect

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"  # nothing listens there
    cfg = {**small(tmp_path, "page-unreachable"), "model": {"kind": "openai", "url": url}}
    # before: failed as an outage after outage_wait_s; the contact tries for first_contact_s (5 s by default)
    cfg["model"]["http"] = {"outage_wait_s": 60, "first_contact_s": 0.5}
    t0 = time.monotonic()
    state = asyncio.run(flushed(collect(cfg, return_state=True)))
    took = time.monotonic() - t0
    assert state.is_failed()
    line = state.message or ""
    assert line.startswith(f"cannot reach the model service at http://127.0.0.1:{port}"), line
    assert "no connection in 0.5 s" in line, line
    # named as the run's user set it: the run's parameter, not the focus command's flag
    assert "check the model.url field of the run's config parameter," in line and "--model-url" not in line, line
    # the message names the path that ended the run (no connection in 0.5 s), not wall time (a
    # loaded machine is slow); before, an outage after outage_wait_s (60 s), said as one
    assert "waited for it up to outage_wait_s" not in line, (took, line)
    logs = run_logs(prefect_api, str(state.state_details.flow_run_id))
    assert any(lv == 40 and line in m for lv, _, m in logs), logs


def test_a_train_loops_evaluation_shows_its_progress_in_the_runs_log(prefect_api, tmp_path):
    """A long evaluation (``train.eval_tasks`` episodes on a real model) is told in the run's
    log as a training is: a line as it begins, then its episode count (here at every
    report: ``log_every_s = 0``); a recorded one says nothing. It said nothing between
    ``publish version`` and ``held-out success``."""
    from prefect import flow, get_run_logger
    from test_train_watch import small as loop_config

    from flows.loop_progress import LoopProgress

    @flow(name="loop-progress-page", flow_run_name="loop-progress-page")
    async def evaluations() -> None:
        show = LoopProgress(loop_config(tmp_path), enabled=True, log=get_run_logger(), log_every_s=0.0)
        show.interactive = False  # as a deployment's run (its console no terminal)
        with show.evaluating(1, 3) as report:
            for done in (1, 2, 3):
                report(done, 3)
        show.evaluated(1, {"success_rate": 2 / 3})
        with show.evaluating(0, 3, fresh=False) as report:  # recorded by an earlier run: reused, not run
            report(3, 3)

    asyncio.run(flushed(evaluations()))
    (run,) = run_named(prefect_api, "loop-progress-page")
    said = [m for lv, _, m in run_logs(prefect_api, run["id"]) if m.startswith("version ")]
    assert said == [
        "version 1: evaluate on 3 held-out tasks",
        "version 1: evaluate 1/3 episodes",
        "version 1: evaluate 2/3 episodes",
        "version 1: evaluate 3/3 episodes",
        "version 1: held-out success 0.667",
    ], said
