"""A crashed Prefect run's task runs end in a final state: the ``collect`` flow killed
with SIGKILL mid-wave leaves the task run in flight ``Running`` (or ``Pending``); once
the run is marked ``Crashed`` (as the watchdog does), rerunning the collection closes
it - ``Crashed``, with a message that says how to resume - and nothing of either run
is left unfinished. A real Prefect server and the tiny model server on loopback."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from fixtures.resume import crash_at
from test_relocate import settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]


async def runs_of(api: str, name: str) -> tuple[list, list]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, FlowRunFilterName

    async with get_client() as client:
        flows = await client.read_flow_runs(flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[name])))
        tasks = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[f.id for f in flows]))
        )
    return flows, tasks


async def mark_crashed(flow_run_id) -> None:
    """What the watchdog automation does to a run whose heartbeats stopped."""
    from prefect import get_client
    from prefect.states import Crashed

    async with get_client() as client:
        await client.set_flow_run_state(flow_run_id, Crashed(message="no heartbeat"), force=True)


def test_a_crashed_runs_task_runs_end_crashed_when_the_collection_reruns(
    local_model_server, prefect_env, prefect_api, tmp_path
):
    args = [*settings(str(tmp_path / "store"), local_model_server.url, "swept"), "--prefect"]

    def in_flight() -> list:
        _, tasks = asyncio.run(runs_of(prefect_api, "swept"))
        return [t for t in tasks if t.state_type is not None and t.state_type.value in ("RUNNING", "PENDING")]

    # killed once the task run in flight at the point is on the server: Running, or
    # Pending where its Running state had not arrived yet. States travel as events from
    # a thread of their own, so on a loaded machine the run can reach the point before
    # the server has heard of that task run at all; the run waits there, blocked.
    crash_at("saved:1.continue:1", args, prefect_env, tmp_path, settled=lambda: bool(in_flight()))
    (flow,), tasks = asyncio.run(runs_of(prefect_api, "swept"))
    left = [t for t in tasks if t.state_type is not None and t.state_type.value in ("RUNNING", "PENDING")]
    assert left, [(t.name, t.state_type) for t in tasks]
    asyncio.run(mark_crashed(flow.id))

    done = subprocess.run(
        [sys.executable, "-m", "cli", *args], env=prefect_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["stats"]["steps_reused"] >= 3

    flows, tasks = asyncio.run(runs_of(prefect_api, "swept"))
    assert len(flows) == 2 and {f.state_type.value for f in flows} == {"CRASHED", "COMPLETED"}
    final = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    unfinished = [(t.name, t.state_type) for t in tasks if t.state_type is None or t.state_type.value not in final]
    assert not unfinished, unfinished
    swept = {t.id: t for t in tasks}
    # the task run blocked at the point never finishes, so the rerun closes it Crashed; one
    # that finished just before the kill may have had its Completed event still on the way
    # when ``left`` was read (the server takes states in as events, asynchronously)
    crashed = [swept[t.id] for t in left if swept[t.id].state_type.value == "CRASHED"]
    assert crashed, [(t.name, swept[t.id].state_type) for t in left]
    assert all(swept[t.id].state_type.value in ("CRASHED", "COMPLETED") for t in left)
    for t in crashed:
        assert t.state is None or "run 'swept' again" in (t.state.message or "")

    # the sweep's cost when there is nothing left to close (what every later run pays)
    import time

    from flows.sweep import end_stale_task_runs

    t0 = time.perf_counter()
    assert asyncio.run(end_stale_task_runs(flow.id)) == 0
    print(f"sweep with nothing to close: {1000 * (time.perf_counter() - t0):.0f} ms")


def test_a_killed_run_nothing_marked_is_closed_by_the_collections_next_run(
    local_model_server, prefect_env, prefect_api, tmp_path
):
    """No watchdog (a CLI run): the killed run stays ``Running``, as does its task run in
    flight, until the rerun closes both once the killed run has been silent for two
    heartbeats plus the event lag (flows/abandoned.py); they stayed ``Running`` for good."""
    # heartbeats every 0.5 s: the rerun waits out a silence of 6 s (2 heartbeats and the
    # event lag), 7 s with 1 s ones
    beat = ["--set", "execution.heartbeat_s=0.5"]
    args = [*settings(str(tmp_path / "store"), local_model_server.url, "unmarked"), "--prefect", *beat]

    def in_flight() -> list:
        _, tasks = asyncio.run(runs_of(prefect_api, "unmarked"))
        return [t for t in tasks if t.state_type is not None and t.state_type.value in ("RUNNING", "PENDING")]

    crash_at("saved:1.continue:1", args, prefect_env, tmp_path, settled=lambda: bool(in_flight()))
    (killed,), _ = asyncio.run(runs_of(prefect_api, "unmarked"))
    assert killed.state_type.value == "RUNNING"  # nobody reported its end
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args], env=prefect_env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    flows, tasks = asyncio.run(runs_of(prefect_api, "unmarked"))
    states = {f.id: f.state for f in flows}
    assert len(flows) == 2 and states[killed.id].type.value == "CRASHED", states
    assert states[killed.id].message.startswith("its process ended without reporting the run's end")
    final = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    unfinished = [(t.name, t.state_type) for t in tasks if t.state_type is None or t.state_type.value not in final]
    assert not unfinished, unfinished
