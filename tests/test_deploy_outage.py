"""``focus deploy`` polls on through a Prefect server outage (deployments/outage.py),
without a server: the runner's poll loop, as its scheduled-run poller calls it. The whole
path - the server stopped and started again under a serving ``focus deploy`` - runs in
tests/test_deploy_console.py."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from deployments.outage import patient_polls


class Done(Exception):
    """Ends the loop under test once the polls wanted were made."""


def polls(failures: list[Exception]) -> tuple[list[int], object]:
    """A poll that raises each of ``failures`` in turn, then :class:`Done`; its calls."""
    calls: list[int] = []

    async def poll() -> None:
        calls.append(len(calls))
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        raise Done

    return calls, poll


def status_error(code: int) -> httpx.HTTPStatusError:
    request = httpx.Request("GET", "http://127.0.0.1:1/api/deployments/get_scheduled_flow_runs")
    return httpx.HTTPStatusError(f"{code}", request=request, response=httpx.Response(code, request=request))


def test_the_runners_polls_go_on_through_an_outage_of_any_length(capsys):
    """Prefect's loop gave up after 3 failed polls in a row: ``Failed the last 3
    attempts`` and an httpx traceback on the console, then ``RuntimeError: Service
    exceeded error threshold``, and ``focus deploy`` exited 1 (a server restarted in 40 s
    under load ended it). Now 12 failures in a row - refused connections, a 503 - are
    logged at DEBUG and the polls go on at the runner's interval."""
    import logging

    from prefect.runner import _scheduled_run_poller as poller  # Prefect sets its logging up: before ours

    from deployments.outage import LOGGER

    original = poller.critical_service_loop
    refused = [httpx.ConnectError("All connection attempts failed")] * 10 + [status_error(503), status_error(502)]
    calls, poll = polls(refused)
    logged: list[logging.LogRecord] = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = logged.append  # type: ignore[method-assign]
    log = logging.getLogger(LOGGER)
    log.addHandler(handler)
    level, log.level = log.level, logging.DEBUG
    try:
        with patient_polls(), pytest.raises(Done):
            asyncio.run(poller.critical_service_loop(workload=poll, interval=0.001, run_once=False, jitter_range=0.3))
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert poller.critical_service_loop is original  # put back
    assert len(calls) == len(refused) + 1
    out = capsys.readouterr()
    assert "Failed the last" not in out.out + out.err and "Traceback" not in out.out + out.err, out
    assert sum("a poll of the Prefect server failed" in r.getMessage() for r in logged) == len(refused)


def test_a_request_the_server_refuses_still_ends_the_polls():
    """A 4xx is no outage (the request is wrong): it ends the loop, as Prefect's did."""
    from prefect.runner import _scheduled_run_poller as poller

    calls, poll = polls([status_error(422)])
    with patient_polls(), pytest.raises(httpx.HTTPStatusError):
        asyncio.run(poller.critical_service_loop(workload=poll, interval=0.001))
    assert calls == [0]
