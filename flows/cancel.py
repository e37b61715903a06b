"""A run cancelled from the UI or the API ends with lines that say so, not with an ERROR.

The UI's Cancel sets a run ``Cancelling``; the runner (``focus deploy``) or worker that
started it tells the run's process so and sends it SIGTERM; Prefect's engine logs "Flow
run was cancelled." and leaves the ``Cancelled`` state to that runner, which records it
a moment later. Prefect 3.9's async engine - every async flow, not only FOCUS's: a flow
that only awaits ``asyncio.sleep`` does the same (measured) - then ends with
misleading output:

* the run's last log line, ``[ERROR] Finished in state Running()``: the state the
  engine holds locally, logged at ERROR because it is not Completed (the sync engine
  logs it at INFO);
* for the step that was running, ``[ERROR] Crash detected! Execution was cancelled by
  the runtime environment.`` and ``[ERROR] Finished in state Crashed(...)``: Prefect
  calls a task run cancelled with its flow run a crash;
* on the serving process's console, asyncio's ``unhandled exception during
  asyncio.run() shutdown`` with a 50-line ``TerminationSignal`` traceback: the signal
  came while the event loop waited, so ``asyncio.run`` cancels the flow's task on its
  way out and reports the ``TerminationSignal`` the engine re-raised after handling it.

:func:`quiet_cancellation` installs two documented hooks: a logging filter on Prefect's
flow-run and task-run loggers that, while the run is being cancelled, turns those lines
into INFO lines saying so (dropped where INFO is not shown); and an exception handler on
the running event loop that drops asyncio's shutdown report of a ``TerminationSignal``
while the run is being cancelled. "Being cancelled" is what the runner told the process
before its SIGTERM, which Prefect offers no public way to read: it is read from
``prefect._internal.control_listener`` (guarded: without it, only what follows the
engine's "Flow run was cancelled." changes, where INFO is shown). Anything else passes
unchanged: a SIGTERM that is no cancellation (a crash) keeps Prefect's lines, and the
states are Prefect's (the step's task run stays ``Crashed``, the flow run ``Cancelled``).
Both hooks key on Prefect's wording: a Prefect that words these otherwise gets its own
lines back, nothing breaks.
Test: ``tests/test_deploy.py::test_overlap_skip_and_cancel_ends_quietly_and_retry_resumes``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

#: What Prefect's engine logs when its runner cancels the run (``handle_cancellation``).
CANCELLED = "Flow run was cancelled."
#: The flow engine's last line when it ends without a final state of its own.
RUNNING_END = "Finished in state Running("
#: A task run's state message when asyncio cancelled it (Prefect calls that a crash).
CANCELLED_BY_RUNTIME = "Execution was cancelled by the runtime environment."
#: asyncio's report of a task that ended with an exception while ``asyncio.run`` shut down.
SHUTDOWN = "unhandled exception during asyncio.run() shutdown"
#: What the run's log says instead of ``Finished in state Running()``.
ENDED = "Finished: cancelled (Retry resumes it after its last finished step)"
#: What a step's log says instead of ``Crash detected! Execution was cancelled ...``.
STEP_STOPPED = "Stopped: its flow run was cancelled (a Retry computes this step again)"

log = logging.getLogger("focus.cancel")


def _intent_is_cancel() -> bool:
    """Whether the runner or worker told this process it cancels the run, before its
    SIGTERM. Prefect has no public way to ask (``prefect._internal.control_listener``,
    read only; a Prefect without it answers False)."""
    try:
        from prefect._internal.control_listener import get_intent

        return bool(get_intent() == "cancel")
    except Exception:  # noqa: BLE001 - a Prefect without it: Prefect's lines stay
        return False


class CancelledRunEnd(logging.Filter):
    """On ``prefect.flow_runs`` and ``prefect.task_runs``: while the run is being
    cancelled, the flow run's "Finished in state Running()" becomes :data:`ENDED`, and a
    step's "Crash detected! Execution was cancelled by the runtime environment." becomes
    :data:`STEP_STOPPED`, both at INFO; a step's "Finished in state Crashed(...)" keeps
    its words (the UI shows that state) at INFO. Remembers the runs the engine said were
    cancelled, for a Prefect that does not say it beforehand."""

    def __init__(self) -> None:
        super().__init__()
        self.cancelled: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.msg if isinstance(record.msg, str) and not record.args else ""
        run = str(getattr(record, "flow_run_id", ""))
        if msg == CANCELLED:
            self.cancelled.add(run)
            return True
        if msg.startswith(RUNNING_END) and record.name == "prefect.flow_runs":
            new = ENDED
        elif msg == f"Crash detected! {CANCELLED_BY_RUNTIME}" and record.name == "prefect.task_runs":
            new = STEP_STOPPED
        elif msg.startswith("Finished in state Crashed(") and CANCELLED_BY_RUNTIME in msg:
            new = msg
        else:
            return True
        if run not in self.cancelled and not _intent_is_cancel():
            return True
        record.msg, record.levelno, record.levelname = new, logging.INFO, "INFO"
        return logging.getLogger(record.name).isEnabledFor(logging.INFO)


_FILTER = CancelledRunEnd()


@contextlib.contextmanager
def quiet_cancellation() -> Iterator[None]:
    """Install the filter (once per process) and the loop's handler (once per loop),
    then run the block. Enter it inside a flow, on its event loop; the hooks stay
    installed after the block: the lines they change come after the flow's body ends."""
    _install()
    yield


#: Prefect's background services, each logging under its class name: on a stop they
#: drain their queues and warn "Still processing items: N items remaining..." every 4 s
SERVICE_LOGGERS = ("EventsWorker", "APILogWorker")


def quiet_services(environ: Mapping[str, str] = os.environ) -> None:
    """On a console that shows warnings and errors only (``focus deploy``'s, which sets
    Prefect's console level to WARNING for its flow-run processes), Prefect's services'
    draining notes are not a warning an operator acts on: a Ctrl-C left one among the
    console's lines. Their loggers then keep errors only."""
    if environ.get("PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL", "").upper() in ("WARNING", "ERROR", "CRITICAL"):
        for name in SERVICE_LOGGERS:
            logging.getLogger(name).setLevel(logging.ERROR)


def _install() -> None:
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    quiet_services()
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    previous = loop.get_exception_handler()
    if getattr(previous, "focus_quiet_cancellation", False):
        return

    def handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        cancelled = bool(_FILTER.cancelled) or _intent_is_cancel()  # at WARNING, no "was cancelled" line
        if cancelled and context.get("message") == SHUTDOWN and _is_termination(context.get("exception")):
            log.debug("the cancelled flow's task ended with %r (reported by the engine)", context.get("exception"))
            return
        if previous is None:
            loop.default_exception_handler(context)
        else:
            previous(loop, context)

    handler.focus_quiet_cancellation = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handler)


def _is_termination(exc: object) -> bool:
    from prefect.exceptions import TerminationSignal

    return isinstance(exc, TerminationSignal)
