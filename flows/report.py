"""What a flow run's page in the Prefect UI shows beside Prefect's own: the artifacts of a
``collect`` run (its statistics, its steps and a picture of its search trees), and in the
log of a ``collect`` or ``train_loop`` run the library's lines for the operator
(:func:`run_lines`).

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
in the block. Nothing else is sent (a failed rollout's own WARNING record is not marked:
the step's warning line says it once).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.logs import CONSOLE_FLAG

if TYPE_CHECKING:
    from tasks.journal import CheckpointJournal


@task(name="publish-report", task_run_name="publish-report", cache_policy=NO_CACHE, persist_result=False)
async def publish_report(journal: CheckpointJournal, result: dict[str, Any]) -> None:
    """Prefect artifacts: a statistics table, the steps, and a picture of the search trees."""
    cid = journal.cid
    rows = [{"statistic": k, "value": v} for k, v in result["stats"].items()]
    # why rollouts failed, most frequent first (docs/operations.md, "Reading failure statistics")
    rows += [{"statistic": f"failure cause: {c}", "value": n} for c, n in result.get("failure_causes", {}).items()]
    rows.append({"statistic": "batch_url", "value": result.get("batch_url")})
    await acreate_table_artifact(rows, key=_artifact_key(cid, "stats"), description=f"Collection {cid}: statistics")
    step_rows = [
        {
            "phase": s.key,
            "wave": s.wave,
            "reused": s.reused,
            "wall_s": s.wall_s,
            "rollouts": s.rollouts,
            "transitions": s.phase_usage.transitions if s.phase_usage is not None else None,
            "failed_rollouts": s.failed_rollouts,
        }
        for s in journal.records
    ]
    await acreate_table_artifact(step_rows, key=_artifact_key(cid, "steps"), description=f"Collection {cid}: steps")
    from tasks.journal import TREES_SVG

    svg = str(await asyncio.to_thread(journal.load, TREES_SVG) or "")  # the export drew it (none: empty)
    if svg:
        body = base64.b64encode(svg.encode()).decode()
        await acreate_markdown_artifact(
            f"### Search trees of {cid}\n\n![search trees](data:image/svg+xml;base64,{body})\n",
            key=_artifact_key(cid, "trees"),
            description=f"Collection {cid}: search trees (nodes coloured by refined value, edges by advantage)",
        )


def _artifact_key(cid: str, what: str) -> str:
    """The artifact's key: the collection id itself where it is a valid key (lowercase
    letters, digits and dashes, at most 60), else its cleaned form and 8 hex of a hash of
    the id. Keys are global in a Prefect server and its UI shows a key's latest version,
    so a lossy cleaning alone gave ``Odd.Id_1``, ``odd-id-1`` and ``ODD_ID_1`` (and ids
    alike in their first 60 characters) one key: each collection's report replaced the
    other's."""
    clean = "".join(c if c.isalnum() and c.isascii() else "-" for c in cid.lower()).strip("-") or "collection"
    if clean != cid or len(clean) > 60:
        clean = f"{clean[:51]}-{hashlib.sha256(cid.encode()).hexdigest()[:8]}"
    return f"{clean}-{what}"


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
