"""The watchdog: an automation that marks a collection ``Crashed`` when its node is gone.

When the machine running a flow run dies (power, OOM killer on the whole tree, a lost
VM), nobody reports the run's end: Prefect keeps it ``Running``, offers no Retry, and a
Cancel settles only after about five minutes. A running collection emits
``focus.flow-run.heartbeat`` every ``execution.heartbeat_s`` seconds (10 by default;
:func:`flows.heartbeat.heartbeats`). This automation - Prefect's own events and
automations, the mechanism of Prefect's "detect zombie flows" recipe - expects the next
heartbeat (or the run's end) within ``crash_after_s`` of the last one; when none comes
it sets the run ``Crashed`` with a message saying why, and the UI's Retry resumes it
(a Retry re-runs the same flow run: same collection id, finished waves reused).

Prefect's built-in flow-run heartbeats would work too but are at least 30 s apart (180 s
by default), so detection would take minutes; ours are as frequent as configured.

``focus deploy`` installs it; for the ``prefect.yaml`` work-pool path run (after every
``prefect deploy``, as it also closes the deployments' parameter schemas)::

    focus deploy --work-pool --crash-after 30

It is created or updated by name, so running it again changes the timeout in place.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from flows.heartbeat import HEARTBEAT_EVENT

NAME = "focus: mark silent collections crashed"
#: Prefect refuses proactive triggers over shorter windows.
MIN_CRASH_AFTER_S = 10
#: Events after which no heartbeat is expected any more.
FINAL_EVENTS = (
    "prefect.flow-run.Completed",
    "prefect.flow-run.Failed",
    "prefect.flow-run.Cancelled",
    "prefect.flow-run.Crashed",
)


#: How many heartbeat intervals of silence the watchdog must allow: with one interval, a
#: heartbeat a moment late (a busy machine, the events client's send) marks a healthy run
#: Crashed; measured: --crash-after 10 with 10 s heartbeats crashed a running collection
#: 10.4 s after it started.
HEARTBEATS_MISSED = 2


def too_soon(crash_after_s: float, heartbeat_s: float) -> str | None:
    """Why a watchdog of ``crash_after_s`` would mark healthy runs that beat every
    ``heartbeat_s`` seconds Crashed, or None (0: no watchdog)."""
    if crash_after_s <= 0 or crash_after_s >= HEARTBEATS_MISSED * heartbeat_s:
        return None
    return (
        f"--crash-after {crash_after_s:g} would mark healthy runs Crashed: they send a heartbeat every "
        f"{heartbeat_s:g} s (execution.heartbeat_s); use --crash-after {HEARTBEATS_MISSED * heartbeat_s:g} or more, "
        f"or a heartbeat_s of {crash_after_s / HEARTBEATS_MISSED:g} or less"
    )


def watchdog_automation(crash_after_s: float) -> Any:
    """The automation (not yet saved)."""
    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    if crash_after_s < MIN_CRASH_AFTER_S:
        raise ValueError(
            f"the watchdog's timeout must be at least {MIN_CRASH_AFTER_S} s (Prefect's shortest proactive trigger), "
            f"got {crash_after_s:g}"
        )
    return Automation(
        name=NAME,
        description=(
            f"A FOCUS collection sends {HEARTBEAT_EVENT} while it runs; after {crash_after_s:g} s without one "
            "(and without the run ending) its process or node is gone: mark it Crashed so it can be retried."
        ),
        trigger=EventTrigger(
            after={HEARTBEAT_EVENT},
            expect={HEARTBEAT_EVENT, *FINAL_EVENTS},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=crash_after_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=(
                    f"no heartbeat for {crash_after_s:g} s: the process or node running this collection is gone; "
                    "Retry resumes it from its last finished wave"
                ),
            )
        ],
    )


async def aensure_watchdog(crash_after_s: float) -> Any:
    """Create the automation, or update the one of the same name; returns it."""
    from prefect.automations import Automation
    from prefect.exceptions import ObjectNotFound

    wanted = watchdog_automation(crash_after_s)
    try:
        existing = await Automation.aread(name=NAME)
    except (ObjectNotFound, ValueError):
        return await wanted.acreate()
    wanted.id = existing.id
    await wanted.aupdate()
    return wanted


def ensure_watchdog(crash_after_s: float) -> Any:
    import asyncio

    return asyncio.run(aensure_watchdog(crash_after_s))
