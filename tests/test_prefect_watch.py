"""The Prefect server's watch (``flows/watch.py``) against small HTTP servers on loopback:
a server that answers its health checks, even with a 4xx, is never taken for gone; one
that refuses connections or answers 503 is, once the grace has passed; the line then
names the server and how long it was silent, also for the engine's own failed call.
The whole run under a real Prefect server cut mid-run is ``tests/test_prefect_gone.py``."""

from __future__ import annotations

import asyncio
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from fixtures.http_stub import serving
from fixtures.prefect import free_port

import flows.watch as watch
from flows.errors import GONE, PrefectServerGone, exit_code, one_line
from tests.test_operator_lines import prefect_client_error


@contextmanager
def health_server(status: int) -> Iterator[tuple[str, list[float]]]:
    """An HTTP server on loopback answering every GET with ``status``; its API URL and
    when each GET arrived (``time.monotonic``), appended as they come."""
    arrivals: list[float] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            arrivals.append(time.monotonic())
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "4")
            self.end_headers()
            self.wfile.write(b"true")

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield f"{url}/api", arrivals


def watch_for(
    api: str, grace_s: float, seconds: float, until: Callable[[], bool] = lambda: False
) -> list[PrefectServerGone]:
    """Run a probe of ``api`` for ``seconds``, or until it finds the server gone, or until
    ``until()`` says enough was seen."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    found: list[PrefectServerGone] = []
    with temporary_settings({PREFECT_API_URL: api}):
        probe = watch._Probe(api, grace_s, found.append).start()
        deadline = time.monotonic() + seconds
        while not found and not until() and time.monotonic() < deadline:
            time.sleep(0.02)
        probe.stop()
    return found


@pytest.mark.integration
@pytest.mark.parametrize("status", [200, 404])
def test_a_server_that_answers_is_not_taken_for_gone(status, monkeypatch):
    """Watched until two health checks arrived a grace after the first one, not for a fixed
    3 s: the watch counts the grace from before its first check, so a watch that took the
    answers for silence calls the server gone at the first of the two at the latest, and
    the second comes only from a watch that did not."""
    monkeypatch.setattr(watch, "PROBE_S", 0.1)
    grace_s = 1.0
    with health_server(status) as (api, arrivals):
        past_grace = lambda: sum(t >= arrivals[0] + grace_s for t in arrivals[:]) >= 2  # noqa: E731
        assert watch_for(api, grace_s=grace_s, seconds=60, until=past_grace) == []
        assert past_grace(), arrivals  # watched past the grace, not stopped by the deadline


@pytest.mark.integration
@pytest.mark.parametrize("how", ["refused", "503"])
def test_a_server_that_does_not_answer_is_gone_after_the_grace(how, monkeypatch):
    monkeypatch.setattr(watch, "PROBE_S", 0.1)
    if how == "refused":
        api = f"http://127.0.0.1:{free_port()}/api"
        t0 = time.monotonic()
        found = watch_for(api, grace_s=0.5, seconds=60)
    else:
        with health_server(503) as (api, _):
            t0 = time.monotonic()
            found = watch_for(api, grace_s=0.5, seconds=60)
    assert len(found) == 1 and time.monotonic() - t0 >= 0.5
    line = one_line(found[0])
    assert line.startswith(f"the Prefect server at {api} did not answer (") and "; no answer for " in line, line
    assert line.endswith("then rerun with the same collection id to resume") and exit_code(found[0]) == 1


def test_the_engines_own_failed_call_gets_the_watchs_line(monkeypatch):
    """Once a watch found the server gone, the flow run's final state cannot be reported
    either; the command names the cause with the watch's line, not httpx's error."""
    api, error = prefect_client_error()
    assert "no answer for" not in one_line(error)
    gone = PrefectServerGone(api, "ConnectError: All connection attempts failed; no answer for 11 s")
    monkeypatch.setitem(GONE, api, gone)
    assert one_line(error) == str(gone)


def test_outside_a_flow_run_the_body_runs_unwatched():
    async def body() -> int:
        return 7

    before = threading.active_count()
    assert asyncio.run(watch.watched(body(), grace_s=0.1)) == 7
    assert threading.active_count() == before
