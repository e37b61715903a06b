"""One restart of the embedded model server is one line on the console.

``focus train`` (and ``focus collect`` on the embedded default) with its model server
killed mid-iteration printed three lines for one restart: the keeper's ``the embedded
model server (pid N) exited (killed by SIGKILL) while in use; started again on port P
...``, then the model client's ``model service at <url> has not answered for 0.6 s ...``
and ``... answers again after 4.8 s``. The keeper owns that server and says what
happened; the client's two lines about it now go to the log file alone
(``focus.backends.outage.kept_by_owner``). An outage of a server nobody here restarts
(vLLM; an embedded server another process started) is reported as before
(``tests/test_restart.py``, ``test_focus_collect_waits_out_a_restart_with_one_line...``).
The real ``focus train`` with its server killed mid-collection, one line on its console
and the client's two in its log file: ``tests/test_train_resume.py``,
``test_focus_train_waits_out_its_model_server_killed_after_a_reload`` (which also checks
that the loop ends with the uninterrupted weights: one train loop for both).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import time

import pytest

from focus.backends import HttpConfig, LocalModelServer, OpenAICompatPolicy
from focus.backends.outage import CONSOLE, kept_by_owner
from focus.policy import SamplingParams

pytestmark = [pytest.mark.timeout(300), pytest.mark.integration]

#: Ordinary retries spent within a fraction of a second: a restart is past them.
HTTP = HttpConfig(max_retries=2, backoff_s=0.01, backoff_max_s=0.2, timeout_s=20.0, outage_wait_s=60.0)


def _outage_lines(server: LocalModelServer, caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The outage gate's records while ``server`` is killed under a client's calls (the
    client samples on until an answer comes after the kill)."""
    policy = OpenAICompatPolicy(server.url, config=HTTP)

    async def go() -> None:
        try:
            await policy.sample([1, 2, 3], SamplingParams(max_tokens=2, seed=0))
            first = server.pid
            assert first is not None
            os.kill(first, signal.SIGKILL)
            await asyncio.gather(*(policy.sample([1, 2, k], SamplingParams(max_tokens=2, seed=k)) for k in range(4)))
        finally:
            await policy.aclose()

    with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
        asyncio.run(go())
    return [r for r in caplog.records if r.name == "focus.backends.outage"]


def test_a_server_whose_keeper_restarts_it_is_reported_by_the_keeper_alone(caplog):
    server = LocalModelServer().start()
    try:
        server.keep_alive()
        records = _outage_lines(server, caplog)
        assert server.restarts == 1
    finally:
        server.stop()
    said = [r.getMessage() for r in records]
    assert any("has not answered for" in m for m in said) and any("answers again" in m for m in said), said
    assert not any(getattr(r, "focus_console", False) for r in records), said  # the log file's, not the console's
    keeper = [r for r in caplog.records if r.name == "focus.backends.local"]
    assert len(keeper) == 1 and getattr(keeper[0], "focus_console", False), [r.getMessage() for r in keeper]
    assert "exited (killed by SIGKILL) while in use; started again on port" in keeper[0].getMessage()


def test_a_server_nobody_here_restarts_is_reported_as_before(caplog):
    """No keeper (a server another process runs; stopped by its keeper, it is not kept
    any more): the client's two lines are the console's."""
    from focus.testing.faults import ServerRestart, served_requests

    server = LocalModelServer().start()
    try:
        server.keep_alive()
        kept_url = server.url
        server.stop()  # the keeper ends with its server: the port is not kept any more
        deadline = time.monotonic() + 10
        from focus.backends import outage

        while outage._server(kept_url) in outage._KEPT:
            assert time.monotonic() < deadline, "the keeper did not let go of the port"
            time.sleep(0.02)
        server = LocalModelServer().start()
        policy = OpenAICompatPolicy(server.url, config=HTTP)

        async def go() -> None:
            try:
                for k in range(12):
                    await policy.sample([1, 2, k], SamplingParams(max_tokens=2, seed=k))
            finally:
                await policy.aclose()

        with caplog.at_level(logging.WARNING, logger="focus.backends.outage"):
            with ServerRestart(server, after_requests=served_requests(server.url) + 2, down_s=2.0):
                asyncio.run(go())
    finally:
        server.stop()
    records = [r for r in caplog.records if r.name == "focus.backends.outage"]
    assert len(records) == 2 and all(r.__dict__.get("focus_console") for r in records), records
    assert CONSOLE == {"focus_console": True}


def test_kept_servers_are_told_apart_by_host_and_port():
    from focus.backends.outage import _for

    kept_by_owner("http://127.0.0.1:5")
    try:
        assert _for("http://127.0.0.1:5") == {} and _for("http://127.0.0.1:5/") == {}
        assert _for("http://127.0.0.1:6") == CONSOLE and _for("http://gpu0:5") == CONSOLE
    finally:
        kept_by_owner("http://127.0.0.1:5", False)
    assert _for("http://127.0.0.1:5") == CONSOLE
