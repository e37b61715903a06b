"""A deployment's run whose runner no longer acts on a Cancel stops itself.

Prefect's runner (``focus deploy``) watches for cancels on the server's event stream and
by polling; once its poll failed three times in a row - a Prefect server restart of
20-30 s with the default poll interval - it logs "Cancellation polling task failed ...
flow run cancellation will fail" and never watches again: every later Cancel of a run it
serves left the run ``Cancelling`` while it went on to its end (measured: a restart of
14 s under ``focus deploy`` with a 1 s poll, then a Cancel ignored for over 120 s).

Here the run of a real deployment is executed as the runner executes it
(``python -m prefect.engine`` with the run's id), with no runner to act on the Cancel:
the run must end ``Cancelled`` within the grace (:func:`flows.watch.runner_grace_s`,
7 s with the tests' 1 s polls) and some seconds, its lease released, its saved steps
kept, and its log must say why, in one line. Against the session's real Prefect server.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.digits import ran_out
from fixtures.prefect import ROOT, kill_tree
from test_deploy import create_run

from storage import CheckpointStore

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def config(root: str, gate: str, cid: str) -> dict[str, Any]:
    return {
        "seed": 2,
        "collection_id": cid,
        "env": {"n_tasks": 2},
        "search": {
            "phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": 30, "wave_size": 3, "max_depth": 4},
            ]
        },
        # answers the evidence and three waves, then waits for the gate (as tests/test_deploy.py)
        "model": {
            "kind": "factory",
            "factory": "fixtures.digits:gated_policy",
            "options": {"gate": gate, "free_calls": 21},
        },
        "execution": {"kind": "local", "heartbeat_s": 0.5},
        "storage": {"root": root},
        "progress": False,
    }


async def register(name: str) -> str:
    from flows.collect import collect

    deployment = await collect.to_deployment(name=name)  # type: ignore[misc]
    return str(await deployment.apply())


def test_a_deployment_run_its_runner_does_not_cancel_stops_itself(prefect_api, prefect_env, tmp_path, monkeypatch):
    root, gate, cid = str(tmp_path / "store"), str(tmp_path / "gate"), "unserved-cancel"
    monkeypatch.chdir(ROOT)  # the deployment's path: where the engine finds flows/collect.py
    dep_id = asyncio.run(register("unserved"))
    run = create_run(prefect_api, dep_id, {"config": config(root, gate, cid)})  # a busy server's 503 is asked again
    env = {**prefect_env, "PREFECT__FLOW_RUN_ID": run["id"]}
    log = open(tmp_path / "engine.log", "wb")  # noqa: SIM115 - closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "prefect.engine"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        store, deadline = CheckpointStore(root), time.monotonic() + 90
        while not any(p.startswith("1.continue") for p, _ in store.list(cid)):
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "engine.log").read_text()[-3000:]
            time.sleep(0.2)
        r = httpx.post(
            f"{prefect_api}/flow_runs/{run['id']}/set_state", json={"state": {"type": "CANCELLING"}}, timeout=30
        )
        assert r.json()["status"] == "ACCEPT", r.text
        t0 = time.monotonic()
        proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        Path(gate).touch()
        kill_tree(proc)
        log.close()
    state = httpx.get(f"{prefect_api}/flow_runs/{run['id']}", timeout=30).json()
    assert state["state_type"] == "CANCELLED", (state["state"], (tmp_path / "engine.log").read_text()[-3000:])
    # the run stopped itself (the grace, 7 s, and the engine's exit), not the gate's 90 s
    # hold running out: read from the gate, not wall time (a loaded machine is slow)
    assert not ran_out(gate).exists(), f"a call was held its 90 s; the engine exited {took:.1f} s after the Cancel"
    saved = [p for p, _ in CheckpointStore(root).list(cid)]
    assert "evidence" in saved and any(p.startswith("1.continue") for p in saved), saved
    assert not list((tmp_path / "store" / "leases").glob(f"{cid}*")), "the lease is left behind"
    logs = httpx.post(
        f"{prefect_api}/logs/filter", json={"logs": {"flow_run_id": {"any_": [run["id"]]}}, "limit": 200}, timeout=30
    ).json()
    said = [x["message"] for x in logs if "the run stops itself" in x["message"]]
    assert len(said) == 1 and x_level(logs, said[0]) == 30, [x["message"] for x in logs]


def x_level(logs: list[dict[str, Any]], message: str) -> int:
    return int(next(x["level"] for x in logs if x["message"] == message))
