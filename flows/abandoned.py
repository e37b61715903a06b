"""Flow runs of a collection left ``Running`` by a process that could not report its end.

A flow run's process reports the run's end as its last act. When it cannot - killed
(SIGKILL, the OOM killer), interrupted while it reported, or its Prefect server
unreachable at that moment (a restart) - Prefect keeps the run ``Running`` (or
``Pending``, ``Cancelling``) for good: the UI shows a run that nothing runs, beside the
rerun that took the collection over. The watchdog (:mod:`deployments.watchdog`) closes
such runs only where ``focus deploy`` installed it, and only runs that sent heartbeats.

So a run of a collection, once it holds the collection's write lease, closes them: a
flow run of the same flow and name (the collection id) that is not final, began before
the lease was taken, and has been silent (no event about it: no heartbeat, no state
change) for :func:`silence_s` is marked ``Crashed`` with a message that says so and names
the run that took over. The lease is what makes this safe: while this run holds it no
other process can write the collection, and a live run of it sends heartbeats
(:mod:`flows.heartbeat`) every ``execution.heartbeat_s``, so it is never silent that
long. A candidate not yet silent long enough (a process killed a moment before the
rerun) is looked at again once it would be, and left alone if it was heard of since the
lease was taken; the run waits for that, still holding the lease, before it ends (at
most :func:`silence_s` after it took the lease, and only then).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import logging
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

log = logging.getLogger("focus.abandoned")

#: Flow run states a process that is gone leaves behind.
UNFINISHED = ("RUNNING", "PENDING", "CANCELLING")
#: Heartbeat intervals a live run is never silent for (the watchdog's rule,
#: :data:`deployments.watchdog.HEARTBEATS_MISSED`), plus what the server's event
#: persister may lag behind (it writes events in batches, every few seconds).
HEARTBEATS_MISSED = 2
EVENT_LAG_S = 5.0


@contextlib.asynccontextmanager
async def closing_abandoned(cid: str, heartbeat_s: float) -> AsyncIterator[None]:
    """Enter once the lease of ``cid`` is held: :func:`end_abandoned_runs` runs beside the
    block, and is waited for at its end only where a candidate was not silent long enough."""
    closing = asyncio.ensure_future(end_abandoned_runs(cid, heartbeat_s))
    try:
        yield
        await closing
    finally:
        closing.cancel()


class ClosesAbandoned:
    """A journal mixin (before :class:`~tasks.journal.CheckpointJournal`): its lease
    closes the runs of the collection a gone process left unfinished
    (:func:`closing_abandoned`)."""

    cid: str
    config: Any

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[None]:
        async with super().lease(), closing_abandoned(self.cid, self.config.execution.heartbeat_s):  # type: ignore[misc]
            yield


def silence_s(heartbeat_s: float) -> float:
    """Seconds without any event after which a flow run is gone."""
    return HEARTBEATS_MISSED * heartbeat_s + EVENT_LAG_S


def message(me: Any, cid: str) -> str:
    return (
        "its process ended without reporting the run's end (killed, interrupted while it reported, or the "
        f"Prefect server unreachable then); flow run {me.name!r} ({me.id}) took collection {cid!r} over and "
        "resumes it after its last finished step"
    )


async def end_abandoned_runs(cid: str, heartbeat_s: float, taken_at: dt.datetime | None = None) -> int:
    """Mark ``Crashed`` the flow runs of collection ``cid`` (this flow run's flow and name)
    that a gone process left unfinished; how many. Call while holding the collection's
    lease, taken at ``taken_at`` (default: now). Best effort: a failure is logged, never
    raised (the run's own work matters more); cancel it to stop waiting."""
    from prefect.runtime import flow_run

    if not flow_run.id:
        return 0
    taken_at = taken_at or dt.datetime.now(dt.UTC)
    try:
        done = await _end(str(flow_run.id), cid, silence_s(heartbeat_s), taken_at)
        if done:  # their task runs in flight, which flows.sweep closes for ended runs of this name
            from flows.sweep import end_stale_task_runs

            await end_stale_task_runs(flow_run.id)
        return done
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - bookkeeping of dead runs must not stop a live one
        log.warning("could not close the flow runs an ended process left Running: %s", e)
        return 0


async def _end(run_id: str, cid: str, silent_s: float, taken_at: dt.datetime) -> int:
    from prefect import get_client
    from prefect.states import Crashed

    done = 0
    async with get_client() as client:
        me = await client.read_flow_run(UUID(run_id))
        waiting = await _candidates(client, me, cid, taken_at)
        while waiting:
            now = dt.datetime.now(dt.UTC)
            later = []
            for run in waiting:
                last = await _last_event(client, run)
                if last is not None and last > taken_at:
                    continue  # heard of since the lease was taken: alive (and refused by the lease)
                if last is not None and (now - last).total_seconds() < silent_s:
                    later.append((last + dt.timedelta(seconds=silent_s), run))  # perhaps alive: look again then
                    continue
                current = await client.read_flow_run(run.id)
                if current.state_type is None or current.state_type.value not in UNFINISHED:
                    continue  # it ended meanwhile
                await client.set_flow_run_state(run.id, Crashed(message=message(me, cid)), force=True)
                _run_log().info(
                    "flow run %s (%s) of collection %s was left %s by a process that is gone: marked Crashed",
                    run.name,
                    run.id,
                    cid,
                    current.state_type.value,
                )
                done += 1
            if not later:
                break
            due = min(t for t, _ in later)
            await asyncio.sleep(max(0.0, (due - dt.datetime.now(dt.UTC)).total_seconds()) + 0.1)
            waiting = [run for _, run in later]
    return done


def _run_log() -> Any:
    """The run's own log (the line shows in the UI beside the run's), else this module's."""
    from prefect import get_run_logger

    try:
        return get_run_logger()
    except Exception:  # noqa: BLE001 - no run context: this module's logger
        return log


async def _candidates(client: Any, me: Any, cid: str, taken_at: dt.datetime) -> list[Any]:
    """The unfinished flow runs of this flow named ``cid``, other than ``me``, that were
    in their state before the lease was taken (a run that began after it is refused by
    the lease and reports its own end)."""
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterId,
        FlowRunFilter,
        FlowRunFilterName,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    runs = await client.read_flow_runs(
        flow_filter=FlowFilter(id=FlowFilterId(any_=[me.flow_id])),
        flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[cid]),
            state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType(s) for s in UNFINISHED])),
        ),
    )
    return [r for r in runs if r.id != me.id and r.state is not None and r.state.timestamp < taken_at]


async def _last_event(client: Any, run: Any) -> dt.datetime | None:
    """When the last event about ``run`` occurred (a heartbeat, a state change)."""
    from prefect.events.filters import EventFilter, EventResourceFilter

    page = await client.read_events(
        filter=EventFilter(resource=EventResourceFilter(id=[f"prefect.flow-run.{run.id}"])), limit=1
    )
    last = page.events[0].occurred if page.events else None
    state_at = run.state.timestamp if run.state is not None else None
    known = [t for t in (last, state_at) if t is not None]
    return max(known) if known else None
