"""The library's lines for the operator, in the flow run's log (what the Prefect UI shows).

The library and the pipeline's lower layers (``focus``, ``tasks``, ``storage``) log
through their own module loggers and mark the lines an operator must see
(``extra={"focus_console": True}``: a model service that does not answer and is waited
for, then answers again; a replica set aside; the embedded model server restarted; a
gap in the checkpoints mended; a damaged batch written again; a write lease waited for or
taken over; a train loop's settings changed). The ``focus`` command shows them on its
console. Prefect sends to the API only its own loggers' records (and
``PREFECT_LOGGING_EXTRA_LOGGERS``'), so in a run a deployment started none of them
reached the run's log: a model service down for minutes left the UI's log silent,
the lines only on the serving process's console.

:func:`run_lines` sends those marked records, at WARNING and above, to the run's log
while a flow runs: one line each, its traceback left out, under the logger's name.
Records logged in the run's context (its event loop, its worker threads) go to that
run; those of threads without one (a model server's keeper) to the innermost flow run
in the block. Nothing else is sent (a failed rollout's own DEBUG-to-WARNING record is
not marked: the step's warning says it once).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from typing import Any

from flows.logs import CONSOLE_FLAG


class _ToRunLog(logging.Handler):
    """On the root logger: a marked record of a non-Prefect logger to the run's log."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        #: The flow runs in a :func:`run_lines` block, innermost last.
        self.runs: list[Any] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not self.runs or not getattr(record, CONSOLE_FLAG, False) or record.name.startswith("prefect"):
            return
        try:
            from prefect.logging.handlers import APILogHandler

            line = copy.copy(record)
            line.msg, line.args = record.getMessage(), None
            line.exc_info = line.exc_text = line.stack_info = None  # its line, as on the console
            if getattr(line, "flow_run_id", None) is None:
                line.flow_run_id = _context_run_id() or self.runs[-1]
            APILogHandler().handle(line)
        except Exception:  # noqa: BLE001 - a line not sent is no reason to stop the run
            self.handleError(record)


_HANDLER = _ToRunLog()


def _context_run_id() -> Any:
    from prefect.context import FlowRunContext, TaskRunContext

    flow = FlowRunContext.get()
    if flow is not None and flow.flow_run is not None:
        return flow.flow_run.id
    task = TaskRunContext.get()
    return task.task_run.flow_run_id if task is not None else None


@contextlib.contextmanager
def run_lines() -> Iterator[None]:
    """Within the block (inside a flow run), the library's marked lines go to the run's log too."""
    run_id = _context_run_id()
    if run_id is None:
        yield
        return
    root = logging.getLogger()
    if _HANDLER not in root.handlers:
        root.addHandler(_HANDLER)
    _HANDLER.runs.append(run_id)
    try:
        yield
    finally:
        _HANDLER.runs.remove(run_id)
        if not _HANDLER.runs:
            root.removeHandler(_HANDLER)
