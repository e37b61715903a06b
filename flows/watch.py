"""A Prefect server that stops answering while a flow runs is found within seconds.

Once a flow run has started, its steps need no answer from the server: a task run's
states travel as events, which Prefect's events worker keeps trying to send. A server
that died mid-run was found only at the flow's next call that waits for an answer (an
artifact, the flow run's final state), and Prefect's client retries each such call
``PREFECT_CLIENT_MAX_RETRIES`` times (5 by default) with exponential backoff
(2 + 4 + 8 + 16 + 32 s): a collection whose server died ran on, then took about 2.5
minutes (152 s measured), two such calls, to print its error line (docs/operations.md).

:func:`watched` runs a flow's body while a thread asks the server's ``/health`` every
:data:`PROBE_S` seconds, one try each (in which Prefect's transport retries a refused
connection for 1.5 s) with a :data:`PROBE_TIMEOUT_S` timeout. When none has answered for
``grace_s`` seconds (``execution.prefect_grace_s``) the server is taken for gone: the
body is cancelled as by Ctrl-C (finished steps are saved, the running one is recomputed
by the rerun) and the flow fails with the one line of
:class:`flows.errors.PrefectServerGone`. An outage shorter than the grace (a restart)
fails nothing: the calls made meanwhile retry as configured.

Once the server is taken for gone, the Prefect calls still to be made are tried once,
not retried for a minute each: those of the cancelled body (a subflow's or task run's
final state) through the body's own client settings (:func:`_own_settings`), and the
engine's report of the flow run's failed state through settings entered for the rest of
the flow's task (:func:`_try_once_from_here`). The user's settings are never changed.
Tests: ``tests/test_prefect_watch.py``, ``tests/test_prefect_gone.py``.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from flows.errors import GONE, PrefectServerGone

_T = TypeVar("_T")
log = logging.getLogger("focus.watch")
#: Marks a record for the operator: the ``focus`` command's console, a flow run's log (:func:`flows.report.run_lines`).
CONSOLE = {"focus_console": True}

#: Seconds between two health checks of the Prefect server.
PROBE_S = 2.0
#: How long one health check waits for its answer (a server behind a lost network
#: answers nothing, not even a refusal).
PROBE_TIMEOUT_S = 5.0

#: Set in the body of a watched flow: a subflow (``collect`` in ``train_loop``) is
#: watched by its parent's watch.
_WATCHED: contextvars.ContextVar[bool] = contextvars.ContextVar("focus_prefect_watched", default=False)


def found_gone(api: str | None = None) -> bool:
    """Whether a watch of this process found the Prefect API ``api`` (default: the
    configured one) gone: the logs and events Prefect still holds for it are not waited
    for (``flows.services._drain_prefect``)."""
    if api is None:
        from prefect.settings import PREFECT_API_URL

        api = PREFECT_API_URL.value()
    return bool(api) and api.rstrip("/") in GONE


class _Probe:
    """The thread that checks the server's health; calls ``on_gone`` once, from the
    thread, when no check has answered for ``grace_s`` seconds."""

    def __init__(
        self,
        api: str,
        grace_s: float,
        on_gone: Callable[[PrefectServerGone], None],
        cancel: tuple[str, Callable[[], None], float] | None = None,
    ) -> None:
        self.api, self.grace_s, self.on_gone = api, grace_s, on_gone
        #: (flow run id, what to call, once, when the run has been ``Cancelling`` for so
        #: many seconds): see :func:`watched`
        self.cancel = cancel
        self.every_s = min(PROBE_S, grace_s / 3)
        self._stop = threading.Event()
        # the thread runs in a copy of this context: Prefect's settings live in it
        ctx = contextvars.copy_context()
        self._thread = threading.Thread(target=ctx.run, args=(self._run,), name="focus-prefect-watch", daemon=True)

    def start(self) -> _Probe:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:  # noqa: BLE001 - a watch that cannot run must not stop the flow
            log.warning("cannot watch the Prefect server at %s", self.api, exc_info=True)

    def _watch(self) -> None:
        from prefect import get_client

        last_ok, failed, cancelling = time.monotonic(), False, None
        if self._stop.wait(self.every_s):
            return  # a run this short needs no client
        timeout = min(PROBE_TIMEOUT_S, self.grace_s)
        with _own_settings(max_retries=0), get_client(httpx_settings={"timeout": timeout}, sync_client=True) as client:
            while True:
                error = _unanswered(client.api_healthcheck())
                now = time.monotonic()
                if error is None:
                    if failed:
                        log.info("the Prefect server at %s answers again after %.1f s", self.api, now - last_ok)
                    last_ok, failed = now, False
                    if self.cancel is not None and _cancelling(client, self.cancel[0]):
                        cancelling = now if cancelling is None else cancelling
                        if now - cancelling >= self.cancel[2]:
                            self.cancel[1]()
                            return
                    else:
                        cancelling = None
                elif now - last_ok >= self.grace_s and not self._stop.is_set():
                    cause = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
                    self.on_gone(PrefectServerGone(self.api, f"{cause}; no answer for {now - last_ok:.0f} s"))
                    return
                elif not failed:
                    failed = True
                    log.warning(
                        "the Prefect server at %s did not answer a health check (%s: %s); the run goes on if it "
                        "answers within %.0f s",
                        self.api,
                        type(error).__name__,
                        error,
                        self.grace_s,
                    )
                if self._stop.wait(self.every_s):
                    return


def _cancelling(client: Any, run_id: str) -> bool:
    """Whether flow run ``run_id`` was set ``Cancelling`` (the UI's Cancel, the API's)."""
    try:
        state = client.read_flow_run(run_id).state_type
    except Exception:  # noqa: BLE001 - a read that failed is no cancel; the health check says the rest
        return False
    return state is not None and state.value == "CANCELLING"


def _unanswered(error: Exception | None) -> Exception | None:
    """The error of a health check that got no answer; ``None`` if the server answered
    (a 4xx is an answer: the server is there, and the call that matters says the rest)."""
    response = getattr(error, "response", None)
    if response is not None and getattr(response, "status_code", 500) < 500:
        return None
    return error


async def watched(body: Coroutine[Any, Any, _T], grace_s: float) -> _T:
    """Await ``body`` (a flow's work) while the Prefect server answers; raise
    :class:`~flows.errors.PrefectServerGone` once it has not for ``grace_s`` seconds.
    Outside a flow run, without an API URL, or inside a watched flow, just ``body``.

    A run no runner or worker started (``focus collect`` or ``focus train`` with a Prefect
    server, a flow called from Python: no deployment) is also stopped as by Ctrl-C when it
    is set ``Cancelling`` (the UI's Cancel), raising :class:`~flows.errors.RunCancelled`,
    which the flow ends ``Cancelled`` with. Nothing else would: Prefect leaves a cancel to
    the runner or worker that started the run (which sends its process SIGTERM,
    :mod:`flows.cancel`), so such a run went on, stayed ``Cancelling`` and ended
    ``Completed``, the Cancel ignored. A deployment's run is stopped so too when it has
    been ``Cancelling`` for :func:`runner_grace_s` and its runner or worker has not
    stopped it: Prefect's runner stops watching for cancels for good once its watch
    failed three times in a row (a Prefect server restart of 20-30 s with the default
    poll interval, 7 s with a 1 s one: "Cancellation polling task failed ... flow run
    cancellation will fail"), and every later Cancel of a run it served was ignored."""
    from prefect.runtime import deployment, flow_run
    from prefect.settings import PREFECT_API_URL

    from flows.errors import RunCancelled

    api = (PREFECT_API_URL.value() or "").rstrip("/")
    if _WATCHED.get() or not flow_run.id or not api:
        return await body
    GONE.pop(api, None)
    loop = asyncio.get_running_loop()
    gone = asyncio.Event()
    found: list[PrefectServerGone] = []
    own: list[Any] = []  # the body's copy of Prefect's settings

    async def run() -> _T:
        _WATCHED.set(True)  # in this task's context only
        with _own_settings() as settings:
            own.append(settings.settings)
            return await body

    def on_gone(error: PrefectServerGone) -> None:  # in the probe's thread
        found.append(error)
        for settings in own:
            settings.client.max_retries = 0  # what the body still calls is tried once
        GONE[api] = error
        loop.call_soon_threadsafe(gone.set)

    cancelled: list[RunCancelled] = []
    name = str(flow_run.name)

    def on_cancel() -> None:  # in the probe's thread
        if deployment.id:
            log.warning(
                "flow run %r has been Cancelling for %.0f s and the process serving it has not stopped it (its watch "
                "for cancels is down, as after a Prefect server restart): the run stops itself",
                name,
                after_s,
                extra=CONSOLE,
            )
        cancelled.append(RunCancelled(name))
        loop.call_soon_threadsafe(gone.set)

    after_s = runner_grace_s() if deployment.id else 0.0
    task = asyncio.create_task(run(), name="focus-watched-body")
    waiter = asyncio.ensure_future(gone.wait())
    probe = _Probe(api, grace_s, on_gone, (str(flow_run.id), on_cancel, after_s)).start()
    try:
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        probe.stop()
        waiter.cancel()
        if not task.done():
            task.cancel()  # the server is gone, or the flow itself was cancelled (Ctrl-C)
            await asyncio.wait({task})
    if cancelled and (task.cancelled() or task.exception() is not None):
        raise cancelled[0] from None
    if not found:
        return task.result()
    _try_once_from_here()
    if not task.cancelled() and task.exception() is None:
        return task.result()  # it finished as the server was found gone: the work is done
    raise found[0] from (None if task.cancelled() else task.exception())


def runner_grace_s() -> float:
    """Seconds a deployment's run stays ``Cancelling`` before it stops itself: two poll
    intervals of a runner (``PREFECT_RUNNER_POLL_FREQUENCY``) or worker
    (``PREFECT_WORKER_QUERY_SECONDS``), 10 s each by default, and 5 s more, so a runner
    whose watch works (at once on its event stream, else at its next poll) stops it
    first, as Prefect does (SIGTERM, :mod:`flows.cancel`)."""
    from prefect.settings import get_current_settings

    settings = get_current_settings()
    return 2 * max(float(settings.runner.poll_frequency), float(settings.worker.query_seconds)) + 5.0


def _own_settings(max_retries: int | None = None) -> Any:
    """A settings context for Prefect's current settings with a ``client`` part of its own
    (the rest is shared and never changed): a change to its ``max_retries`` reaches
    only the code run in it. Copying all of Prefect's settings (``temporary_settings``)
    cost 100-170 ms of the flow's event loop, this 0.03 ms."""
    from prefect.context import SettingsContext, get_settings_context

    ctx = get_settings_context()
    settings = ctx.settings.model_copy(update={"client": ctx.settings.client.model_copy()})
    if max_retries is not None:
        settings.client.max_retries = max_retries
    return SettingsContext(profile=ctx.profile, settings=settings)


def _try_once_from_here() -> None:
    """Prefect's client calls made from here on in the current task are tried once.

    The flow's engine reports the run's failed state after the flow function has
    raised, in the same task: with Prefect's retries that report alone waited about a
    minute for a server known to be gone. The settings entered here are left entered on
    purpose; the task ends with the flow run, or, for a flow awaited by other code,
    that code's own Prefect calls fail fast too."""
    _own_settings(max_retries=0).__enter__()
