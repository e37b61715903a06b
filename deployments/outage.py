"""``focus deploy`` serves on through a Prefect server outage of any length.

Prefect's runner asks the server for scheduled runs in ``critical_service_loop``, which
gives up after 3 failed polls in a row (a poll every ``PREFECT_RUNNER_POLL_FREQUENCY``
seconds, 10 by default): it printed ``Failed the last 3 attempts`` and a 60-line httpx
traceback on the console, raised, and ``focus deploy`` exited 1 - a Prefect server
restarted in more than about 20-30 s (a database migration, a loaded machine: 40 s at
load 15) ended it, while its console had just said "serving goes on". While the server
is gone :class:`deployments.console.ServerWatch` says so once, and once when it is back;
the polls go on at their interval, their failures in the log file at DEBUG.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

#: The log the failed polls go to (asked for at each failure: Prefect's logging set-up,
#: on its import, disables the loggers that exist then).
LOGGER = "focus.deploy.polls"


async def patient_service_loop(
    workload: Callable[..., Coroutine[Any, Any, Any]],
    interval: float,
    *args: Any,
    run_once: bool = False,
    jitter_range: float | None = None,
    **kwargs: Any,
) -> None:
    """Prefect's ``critical_service_loop`` (same arguments) less its end: a poll that
    fails on the way (``httpx.TransportError``) or on a server error (5xx) is logged at
    DEBUG and tried again at the same interval, however many fail in a row. Any other
    error (a 4xx: a request the server refuses) ends the loop as it did."""
    import anyio
    import httpx

    while True:
        try:
            await workload()
        except httpx.TransportError as exc:
            logging.getLogger(LOGGER).debug("a poll of the Prefect server failed: %s: %s", type(exc).__name__, exc)
        except httpx.HTTPStatusError as exc:
            if exc.response.status_code < 500:
                raise
            logging.getLogger(LOGGER).debug("a poll of the Prefect server failed: HTTP %s", exc.response.status_code)
        if run_once:
            return
        sleep = interval
        if jitter_range is not None:
            from prefect.utilities.math import clamped_poisson_interval

            sleep = clamped_poisson_interval(interval, clamping_factor=jitter_range)
        await anyio.sleep(sleep)


@contextlib.contextmanager
def patient_polls() -> Iterator[None]:
    """While it lasts, the runner's poll for scheduled runs is
    :func:`patient_service_loop`: through the name Prefect's scheduled-run poller
    (``prefect.runner._scheduled_run_poller``, a private module) calls. A Prefect
    without that module or name polls as before."""
    try:
        from prefect.runner import _scheduled_run_poller as poller
    except ImportError:
        yield
        return
    original = getattr(poller, "critical_service_loop", None)
    if original is None:
        yield
        return
    poller.critical_service_loop = patient_service_loop  # type: ignore[assignment]
    try:
        yield
    finally:
        poller.critical_service_loop = original
