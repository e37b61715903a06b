"""Heartbeats of a running flow: an event every few seconds while a collection runs.

Prefect's own flow-run heartbeats are at least 30 s apart (180 s by default); a
watchdog built on them notices a lost node after one to several minutes. These are as
frequent as the collection wants (``execution.heartbeat_s``), so the watchdog
automation (:mod:`deployments.watchdog`) can mark a run whose node is gone ``Crashed``
quickly. The event's name lives here, with the flow that emits it. The same thread
first closes what crashed attempts of the run left ``Running`` (:mod:`flows.sweep`).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Iterator

HEARTBEAT_EVENT = "focus.flow-run.heartbeat"


@contextlib.contextmanager
def heartbeats(every_s: float) -> Iterator[None]:
    """Emit :data:`HEARTBEAT_EVENT` for the current flow run every ``every_s`` seconds
    from a daemon thread, until the block ends (no-op outside a flow run)."""
    from prefect.runtime import flow_run

    run_id = flow_run.id
    if not run_id:
        yield
        return
    from prefect.events import emit_event

    resource = {"prefect.resource.id": f"prefect.flow-run.{run_id}", "prefect.resource.name": str(flow_run.name)}
    stop = threading.Event()

    def beat() -> None:
        import asyncio

        from flows.sweep import end_stale_task_runs

        asyncio.run(end_stale_task_runs(run_id))  # what crashed attempts left Running
        while not stop.is_set():
            with contextlib.suppress(Exception):
                emit_event(event=HEARTBEAT_EVENT, resource=resource)
            stop.wait(every_s)

    # the thread runs in a copy of this context: Prefect's settings (the API URL) live in
    # context variables, and a thread started without them made Prefect start an
    # ephemeral server of its own for the events
    ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(beat,), name="focus-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
