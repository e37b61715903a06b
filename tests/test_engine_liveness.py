"""``/health`` speaks for the engine, not only for the web loop that answers it.

The embedded server answered ``/health`` from its event loop while its engine thread was
stuck, so its keeper (:meth:`focus.backends.local.LocalModelServer.keep_alive`) never saw
the hang. The engine now reports how long its current step has run
(:meth:`focus.tinylm.engine.Engine.step_s`): a step is one token of every running
sequence, so a long generation is many short steps and reports one step's time. The
clock is the test's, so nothing here depends on the machine's speed.
"""

from __future__ import annotations

import threading
import time

import pytest
from starlette.testclient import TestClient

from focus.env import Message
from focus.format import ByteCodec
from focus.tinylm.app import create_app
from focus.tinylm.engine import Engine, GenRequest, GenResult, TokenEvent

PROMPT = tuple(ByteCodec().render([Message("user", "reach 12")]))


def wait_for(predicate, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + 30
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_a_long_generation_reports_one_step_at_a_time():
    """Five tokens, each step taking 10 s of the engine's clock: 40 s into the
    generation the engine reports 10 s (its current step), never the generation's time."""
    now = [0.0]
    engine = Engine(clock=lambda: now[0])
    seen: list[float] = []
    done = threading.Event()

    def on_event(event: object) -> None:
        if isinstance(event, TokenEvent):
            now[0] += 10.0  # this step took 10 s
            seen.append(engine.step_s())
        elif isinstance(event, GenResult | Exception):
            done.set()

    try:
        engine.submit(GenRequest(PROMPT, max_tokens=5, ignore_eos=True, seed=0), on_event, stream=True)
        assert done.wait(30)
        assert seen == [10.0, 10.0, 10.0, 10.0] and now[0] == 40.0
        wait_for(lambda: engine.step_s() == 0.0, "the engine did not go back to waiting")
    finally:
        engine.close()


def test_health_answers_503_while_the_engine_is_stuck_in_one_step():
    now = [0.0]
    engine = Engine(clock=lambda: now[0])
    inside, release = threading.Event(), threading.Event()

    def on_event(event: object) -> None:  # runs on the engine's thread, inside its step
        inside.set()
        release.wait(30)

    client = TestClient(create_app(engine, engine_stall_s=30.0))
    try:
        ok = client.get("/health")
        assert ok.status_code == 200 and ok.json()["engine_step_s"] == 0.0
        engine.submit(GenRequest(PROMPT, max_tokens=1, seed=0), on_event)
        assert inside.wait(30)
        now[0] += 29.0
        assert client.get("/health").json() == {
            "status": "ok", "policy_version": engine.policy_version, "engine_step_s": 29.0
        }  # fmt: skip
        now[0] += 2.0
        stalled = client.get("/health")  # the web loop answers; the engine does not move
        assert stalled.status_code == 503
        assert stalled.json()["status"] == "engine stalled" and stalled.json()["engine_step_s"] == 31.0
        release.set()
        wait_for(lambda: client.get("/health").status_code == 200, "/health did not recover")
    finally:
        release.set()
        client.close()
        engine.close()


@pytest.mark.integration
@pytest.mark.timeout(180)
def test_a_stuck_engine_is_seen_by_the_keeper_and_restarts_share_one_budget(caplog):
    """A real server whose engine thread is wedged (``/debug/stall_engine``) while its web
    loop answers ``/health``: its keeper kills it and starts it again (it never did: the
    probe got 200). Hangs and exits draw on one budget (``restarts``), and the line of
    the last one says how many of each there were."""
    import logging
    import os
    import signal

    import httpx

    from focus.backends import LocalModelServer

    server = LocalModelServer(debug=True).start()
    try:
        server.keep_alive(restarts=1, hang_s=2.0)
        first = server.pid
        assert first is not None
        with caplog.at_level(logging.WARNING, logger="focus.backends.local"):
            httpx.post(f"{server.url}/debug/stall_engine", json={"s": 600}, timeout=5, trust_env=False)
            wait_for(lambda: server.restarts == 1 and server.pid != first, "the stuck server was not started again")
            second = server.pid
            assert second is not None
            wait_for(lambda: server._answers(1.0), "the server started again does not answer")
            os.kill(second, signal.SIGKILL)  # the budget of 1 is spent: not started again
            wait_for(lambda: len(caplog.records) >= 2, "no line for the second failure")
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2, lines
        assert f"(pid {first}) hung (killed: /health answers, but its engine has been in one step for" in lines[0]
        assert "(restart 1 of 1, exits and hangs counted together, in any 600 s)" in lines[0]
        assert f"(pid {second}) exited (killed by SIGKILL) again; it was started again 1 time(s)" in lines[1]
        assert "(0 after it exited, 1 after it hung: restarts = 1 counts both)" in lines[1]
    finally:
        server.stop()


def test_the_keeper_does_not_die_when_this_process_cannot_open_a_file(monkeypatch):
    """The keeper's probe under ``ulimit -n 32``: httpx's client could not open its
    certificates (``OSError: [Errno 24] Too many open files``), the keeper's thread died
    with a traceback on the terminal, and the server went unguarded. A probe this process
    cannot make says nothing of the server: it is not counted as unanswered."""
    import errno

    import httpx

    from focus.backends import LocalModelServer

    def no_files(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    server = LocalModelServer.__new__(LocalModelServer)
    server.port = 9
    monkeypatch.setattr(httpx, "get", no_files)
    assert server._engine_step(0.1) == 0.0


def test_a_probe_whose_socket_this_process_cannot_open_is_not_a_hang(monkeypatch):
    """``Too many open files`` (or no local port) on the probe's connection reaches it as
    httpx's ``ConnectError``, which counted as "no answer": under the limit the keeper
    took the server for hung and killed it. It is this process's, not the server's."""
    import errno

    import httpx

    from focus.backends import LocalModelServer

    def no_socket(url, **kwargs):
        try:
            raise OSError(errno.EMFILE, "Too many open files")
        except OSError as e:
            raise httpx.ConnectError(str(e)) from e

    def refused(url, **kwargs):
        raise httpx.ConnectError("[Errno 111] Connection refused")

    server = LocalModelServer.__new__(LocalModelServer)
    server.port = 9
    monkeypatch.setattr(httpx, "get", no_socket)
    assert server._engine_step(0.1) == 0.0
    monkeypatch.setattr(httpx, "get", refused)
    assert server._engine_step(0.1) is None  # a server that refuses is unanswered
