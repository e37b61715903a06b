"""The ``collect`` flow: one iteration of collection, phase by phase, resumable.

The flow is a loop over Prefect tasks (one per phase, one per wave): check the
configuration, evidence rollouts, critic scoring, then for each continuation phase
waves of prioritised continuations until the phase's plan is empty (each task run
stores one wave and the critic's predictions for the checkpoints it added, as landed
and scored by the run's wave driver, :class:`tasks.runtime.WaveDriver`), then
preparation and export. Every task is idempotent on (collection id, phase, wave)
through the checkpoint store, so running the flow again - a retry of the same
flow run, a rerun from the UI, or the CLI with the same collection id - skips what is
finished and continues from the last finished wave.

Services the configuration leaves implicit are started for the duration of the run
(:func:`flows.services.services`): the embedded model server when ``model.kind`` is ``local`` without
a URL, and a Dask LocalCluster when ``execution.kind`` is ``dask`` without an address.
Tasks receive their URL and address in the config; nothing is shared in-process.

When a collection stops, the flow logs the traceback (the run's log in the UI, the
CLI's log file) and fails with one line naming the cause (:mod:`flows.errors`), which is
the failed state's message. While it runs it emits a heartbeat event every
``execution.heartbeat_s`` seconds, so an automation can mark a run whose node is gone
``Crashed`` without waiting for a timeout (``deployments/watchdog.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from collections.abc import Iterator
from typing import Any

from prefect import flow, get_run_logger
from prefect.utilities.annotations import quote

from deployments.watchdog import HEARTBEAT_EVENT
from flows.errors import as_failure, one_line
from flows.preflight import new_collection_id
from flows.progress import CollectionProgress
from flows.services import services_in_thread
from tasks.collection import collection_result, run_steps
from tasks.config import FocusConfig, config_at_runtime
from tasks.config.form import ConfigParameter
from tasks.phases import PREFECT_STEPS, publish_report


def collection_id_for_run(config: FocusConfig) -> FocusConfig:
    """Give the config a collection id: its own, or one derived from the flow run (its
    deployment's name, scheduled start and id), so a retry of the same flow run resumes
    the same collection and runs scheduled together get different ones."""
    if config.collection_id:
        return config
    from prefect.runtime import deployment, flow_run

    run_id = str(flow_run.id or "")
    prefix = str(deployment.name or flow_run.name or "collect")
    when = flow_run.scheduled_start_time if run_id else None
    return config.with_updates(collection_id=new_collection_id(prefix, when, run_id or None))


@contextlib.contextmanager
def heartbeats(every_s: float) -> Iterator[None]:
    """Emit :data:`HEARTBEAT_EVENT` for the current flow run every ``every_s`` seconds
    from a daemon thread, until the block ends (no-op outside a flow run).

    Prefect's own flow-run heartbeats are at least 30 s apart (180 s by default); a
    watchdog built on them notices a lost node after one to several minutes. This one
    is as frequent as the collection wants, so the watchdog can be quick.
    """
    from prefect.runtime import flow_run

    run_id = flow_run.id
    if not run_id:
        yield
        return
    from prefect.events import emit_event

    resource = {"prefect.resource.id": f"prefect.flow-run.{run_id}", "prefect.resource.name": str(flow_run.name)}
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            with contextlib.suppress(Exception):
                emit_event(event=HEARTBEAT_EVENT, resource=resource)
            stop.wait(every_s)

    # the thread runs in a copy of this context: Prefect's settings (the API URL) live in
    # context variables, and a thread started without them made Prefect start an
    # ephemeral server of its own for the events (found leaked by the tests)
    ctx = contextvars.copy_context()
    thread = threading.Thread(target=ctx.run, args=(beat,), name="focus-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()


async def run_collection(config: FocusConfig) -> dict[str, Any]:
    """The steps of one collection as Prefect tasks (await inside a flow), then the run's
    artifacts."""
    log = get_run_logger()
    t0 = time.perf_counter()
    progress = CollectionProgress(config, enabled=config.progress, log=log)
    result, records = await run_steps(config, PREFECT_STEPS, progress, log)
    # quoted: Prefect need not walk the config and the step records (see tasks.phases)
    report: Any = publish_report  # Prefect's typing does not know that quote() is unwrapped
    await report(quote(config), quote(result), quote(records))
    log.info("collection %s: batch at %s", config.collection_id, result["batch_url"])
    return collection_result(config, result, records, t0)


def _flow_run_name() -> str:
    """Name a flow run after its collection when the config names one."""
    from prefect.runtime import flow_run

    cfg = flow_run.parameters.get("config")
    cid = getattr(cfg, "collection_id", None) or (cfg.get("collection_id") if isinstance(cfg, dict) else None)
    return str(cid or flow_run.name)


@flow(name="collect", log_prints=True, flow_run_name=_flow_run_name)
async def collect(config: ConfigParameter = None) -> dict[str, Any]:
    """Collect one iteration; returns the batch URL and statistics.

    An async flow (see :mod:`tasks.phases` for why): from synchronous code run it with
    ``asyncio.run(collect(config))``; inside another async flow, ``await`` it. A failure
    raises the original error when its message already names the cause, else
    :class:`flows.errors.CollectionFailed` with one line that does.
    """
    cid = getattr(config, "collection_id", None)
    try:
        config = collection_id_for_run(config_at_runtime(config))
        cid = config.collection_id
        with heartbeats(config.execution.heartbeat_s):
            async with services_in_thread(config) as (cfg, _server):
                return await run_collection(cfg)
    except Exception as e:
        get_run_logger().error("collection %s failed: %s", cid, one_line(e), exc_info=True)
        failure = as_failure(e)
        if failure is e:
            raise
        raise failure from e
