"""A flow run left ``Running`` by a process that could not report its end (killed,
interrupted while it reported, its Prefect server down at that moment) is closed by
the next run of its collection: ``Crashed``, with a message naming the run that took
the collection over (``flows/abandoned.py``). A run of the collection that is alive -
it sends heartbeats - is left alone. Against the session's real Prefect server.

Before, such a run stayed ``Running`` in the UI for good, beside the rerun that finished
its collection; only the watchdog automation of ``focus deploy`` closed it, and only
for a run that had sent heartbeats."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from typing import Any

import pytest
from test_run_parameters import SMALL, flushed, run_logs

from flows.heartbeat import HEARTBEAT_EVENT

pytestmark = pytest.mark.timeout(120)


async def left_running(name: str, flow: Any = None) -> Any:
    """A flow run of ``flow`` (default: ``collect``) named ``name``, ``Running`` as a
    process that died (or could not reach the server at its end) leaves it."""
    from prefect import get_client
    from prefect.states import Running

    from flows.collect import collect

    async with get_client() as client:
        run = await client.create_flow_run(flow or collect, name=name, parameters={})
        await client.set_flow_run_state(run.id, Running(), force=True)
    return run.id


async def state_of(run_id: Any) -> Any:
    from prefect import get_client

    async with get_client() as client:
        return (await client.read_flow_run(run_id)).state


def beating(run_id: Any, every_s: float) -> threading.Event:
    """Send the heartbeats of a live run ``run_id`` from a thread until the event is set."""
    from prefect.events import emit_event

    stop = threading.Event()
    resource = {"prefect.resource.id": f"prefect.flow-run.{run_id}"}

    def beat() -> None:
        while not stop.is_set():
            emit_event(event=HEARTBEAT_EVENT, resource=resource)
            stop.wait(every_s)

    threading.Thread(target=contextvars.copy_context().run, args=(beat,), daemon=True).start()
    return stop


class _Sleeps:
    """``asyncio`` as flows.abandoned sees it, with the sleeps it asks for recorded: how
    long it waited for a run to be silent, read without wall time (a loaded machine is slow)."""

    def __init__(self) -> None:
        self.asked: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(asyncio, name)

    async def sleep(self, seconds: float) -> None:
        self.asked.append(seconds)
        await asyncio.sleep(seconds)


def test_the_next_run_of_a_collection_closes_the_runs_a_gone_process_left_running(prefect_api, tmp_path, monkeypatch):
    from flows import abandoned
    from flows.collect import collect

    sleeps = _Sleeps()
    monkeypatch.setattr(abandoned, "asyncio", sleeps)

    cid = "left-running"
    gone, alive = asyncio.run(left_running(cid)), asyncio.run(left_running(cid))
    stop = beating(alive, 0.5)
    try:
        cfg = {
            **SMALL,
            "collection_id": cid,
            "model": {"kind": "factory", "factory": "fixtures.digits:digit_policy"},
            "storage": {"root": str(tmp_path / "store")},
        }
        state = asyncio.run(flushed(collect(cfg, return_state=True)))
        assert state.is_completed(), state
        closed, live = asyncio.run(state_of(gone)), asyncio.run(state_of(alive))
    finally:
        stop.set()
    assert closed.type.value == "CRASHED", closed
    me = state.state_details.flow_run_id
    assert closed.message.startswith("its process ended without reporting the run's end"), closed.message
    assert f"({me}) took collection 'left-running' over" in closed.message, closed.message
    assert live.type.value == "RUNNING", live  # it sends heartbeats: alive, left alone
    said = [m for lv, m in run_logs(prefect_api, str(me)) if lv == 20 and "by a process that is gone" in m]
    assert said == [
        f"flow run {cid} ({gone}) of collection {cid} was left RUNNING by a process that is gone: marked Crashed"
    ]
    # the gone run was changed moments before (its Running state): the run waited for it
    # to be silent for 2 heartbeats (0.5 s) and the event lag (5 s), and no longer: its
    # sleeps (one a run looked at, each to 0.1 s past that run's silence) add up to one
    # silence at most, read without wall time (it once asserted under 60 s)
    silence = abandoned.silence_s(0.5) + 2 * 0.1
    assert len(sleeps.asked) <= 2 and sum(sleeps.asked) <= silence, sleeps.asked
    # a rerun of the finished collection finds nothing more to close, and waits no longer
    # (the live run's last beat may come just before the rerun takes the lease: it looks
    # again; on a loaded machine a late beat can make that twice, each wait shorter, so the
    # bound is on the time waited, one silence, as above)
    sleeps.asked.clear()
    stop = beating(alive, 0.5)
    try:
        assert asyncio.run(flushed(collect(cfg, return_state=True))).is_completed()
    finally:
        stop.set()
    assert len(sleeps.asked) <= 2 and sum(sleeps.asked) <= silence, sleeps.asked


@pytest.mark.needs("torch")  # the local trainer
def test_the_next_run_of_a_train_loop_closes_the_loop_run_a_gone_process_left_running(prefect_api, tmp_path):
    """The same for the ``train_loop`` flow, under the loop's own lease (its runs are
    named after the loop's id); a ``collect`` run of that name is another flow's, left alone."""
    from fixtures.loop import TINY_LOOP
    from test_train_watch import LOOP_TOML

    from flows.train_loop import train_loop
    from tasks.config import load_config

    gone, other = asyncio.run(left_running("loop-left", train_loop)), asyncio.run(left_running("loop-left"))
    # heartbeats every 0.5 s, as the collect test's: the silence that makes the gone run
    # gone (flows.abandoned.silence_s) is 6 s, which the loop's own work outlasts, not the
    # default's 25 s (2 heartbeats of 10 s and the event lag), which the loop waited out
    over = {"collection_id": "loop-left", **TINY_LOOP, "storage.root": str(tmp_path), "train.iterations": 1}
    over["execution.heartbeat_s"] = 0.5
    cfg = load_config(LOOP_TOML, overrides={**over, "train.eval_tasks": 0, "progress": False}, environ={})
    state = asyncio.run(flushed(train_loop(cfg, return_state=True)))
    assert state.is_completed(), state
    closed = asyncio.run(state_of(gone))
    assert closed.type.value == "CRASHED", closed
    assert "took collection 'loop-left' over" in closed.message, closed.message
    assert asyncio.run(state_of(other)).type.value == "RUNNING"  # a collect run: not the loop's
