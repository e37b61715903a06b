"""Task runs a crashed attempt left behind end in a final state.

A process killed outright (SIGKILL, a lost node) cannot report its task runs: the
flow run is marked ``Crashed`` (by the watchdog, :mod:`deployments.watchdog`, or by
Prefect when it notices), while the task run that was in flight stayed ``Running`` in
the UI forever - also after a Retry or a rerun with the same collection id finished the
work. So a flow run, as it starts, marks ``Crashed`` every task run still unfinished in
its own earlier attempts (a Retry reuses the flow run) and in earlier flow runs of the
same name (the collection id) that ended ``Crashed``, ``Failed`` or ``Cancelled``. A
flow run of that name still running is left alone: its task runs may be live (a second
writer is refused by the collection's lease anyway).
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("focus.sweep")

#: Flow run states whose unfinished task runs can no longer finish.
ENDED = ("CRASHED", "FAILED", "CANCELLED")
#: Task run states that are not final.
UNFINISHED = ("RUNNING", "PENDING", "SCHEDULED")


async def end_stale_task_runs(run_id: Any = None) -> int:
    """Mark ``Crashed`` the task runs left unfinished by earlier attempts of flow run
    ``run_id`` (default: the current one) and by ended flow runs of its name; how many.
    Best effort: a failure is logged, never raised (the run's own work matters more)."""
    try:
        return await _sweep(run_id)
    except Exception as e:  # noqa: BLE001 - bookkeeping of dead runs must not stop a live one
        log.warning("could not close the task runs of crashed attempts: %s", e)
        return 0


async def _sweep(run_id: Any) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterId,
        FlowRunFilterName,
        FlowRunFilterState,
        FlowRunFilterStateType,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.runtime import flow_run
    from prefect.states import Crashed

    run_id = run_id or flow_run.id
    if not run_id:
        return 0
    async with get_client() as client:
        me = await client.read_flow_run(run_id)
        ended = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                name=FlowRunFilterName(any_=[me.name]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType(s) for s in ENDED])),
            )
        )
        ids = [me.id, *(r.id for r in ended if r.id != me.id)]
        stale = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)),
            task_run_filter=TaskRunFilter(
                state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType(s) for s in UNFINISHED]))
            ),
        )
        # this attempt's own task runs (created since it started) are live: not those
        begun = me.state.timestamp if me.state is not None else None
        stale = [
            tr
            for tr in stale
            if tr.flow_run_id != me.id or (begun is not None and tr.created is not None and tr.created < begun)
        ]
        for tr in stale:
            why = f"its flow run {tr.flow_run_id} crashed before it finished; run {me.name!r} again to resume"
            await client.set_task_run_state(tr.id, Crashed(message=why), force=True)
    if stale:
        log.info("marked %d task run(s) of crashed attempts Crashed", len(stale))
    return len(stale)
