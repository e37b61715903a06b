"""The ``collect`` flow: one iteration of collection, phase by phase, resumable.

The flow is a loop over Prefect tasks (one per phase, one per wave): check the
configuration, evidence rollouts, critic scoring, then for each continuation phase
waves of prioritised continuations (each task run also scores the checkpoints its wave
added) until the phase's plan is empty, then preparation and export. Every task is idempotent on (collection id, phase,
wave) through the checkpoint store, so running the flow again - a retry of the same
flow run, a rerun from the UI, or the CLI with the same collection id - skips what is
finished and continues from the last finished wave.

Services the configuration leaves implicit are started for the duration of the run
(:func:`services`): the embedded model server when ``model.kind`` is ``local`` without
a URL, and a Dask LocalCluster when ``execution.kind`` is ``dask`` without an address.
Tasks receive their URL and address in the config; nothing is shared in-process.

When a collection stops, the flow logs the traceback (the run's log in the UI, the
CLI's log file) and fails with one line naming the cause (:mod:`flows.errors`), which is
the failed state's message. While it runs it emits a heartbeat event every
``execution.heartbeat_s`` seconds, so an automation can mark a run whose node is gone
``Crashed`` without waiting for a timeout (``deployments/watchdog.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from prefect import flow, get_run_logger

from deployments.watchdog import HEARTBEAT_EVENT
from flows.errors import as_failure, one_line
from flows.preflight import new_collection_id
from flows.progress import CollectionProgress
from tasks.config import FocusConfig, config_at_runtime
from tasks.phases import (
    check_config,
    continuation_wave,
    critic_scoring,
    evidence_rollouts,
    prepare_export,
    publish_report,
)
from tasks.steps import EVIDENCE, EVIDENCE_SCORED, Handoff, Key, score_key


@contextlib.contextmanager
def services(config: FocusConfig) -> Iterator[tuple[FocusConfig, Any]]:
    """Start what the config needs but does not name; yield the config that names them
    and the local model server started (``None`` if none was)."""
    with contextlib.ExitStack() as stack:
        updates: dict[str, Any] = {}
        server = None
        if config.model.kind == "local" and config.model.url is None:
            from focus.backends import LocalModelServer

            server = stack.enter_context(LocalModelServer(config.model.weights))
            updates["model.url"] = server.url
            if config.model.policy_version is None:
                # the batch records which weights sampled it; prepare runs in its own task
                updates["model.policy_version"] = server.policy_version
        if config.execution.kind == "dask" and config.execution.address is None:
            from focus.dask_execution import DaskExecution

            ex = config.execution
            cluster = stack.enter_context(
                DaskExecution(n_workers=ex.n_workers, threads_per_worker=ex.threads_per_worker, processes=ex.processes)
            )
            cluster.client()
            updates["execution.address"] = cluster.scheduler_address
        yield (config.with_updates(**updates) if updates else config), server


@contextlib.asynccontextmanager
async def services_in_thread(config: FocusConfig) -> AsyncIterator[tuple[FocusConfig, Any]]:
    """:func:`services` entered and left in a worker thread, for async flows: starting a
    model server or a Dask cluster blocks, and Dask's synchronous client must not be
    created on a thread whose event loop is running."""
    cm = services(config)
    value = await asyncio.to_thread(cm.__enter__)
    try:
        yield value
    except BaseException as e:
        if not await asyncio.to_thread(cm.__exit__, type(e), e, e.__traceback__):
            raise
    else:
        await asyncio.to_thread(cm.__exit__, None, None, None)


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
    """The phases of one collection as Prefect tasks (await inside a flow), holding the
    collection's write lease throughout: a second run of the same collection is refused."""
    from storage import collection_lease

    with collection_lease(config.storage.root, str(config.collection_id)):
        return await _run_collection(config)


async def _run_collection(config: FocusConfig) -> dict[str, Any]:
    log = get_run_logger()
    t0 = time.perf_counter()
    records: list[dict[str, Any]] = [await check_config(config)]
    # the live state and the agent/collector, step to step, within this process
    handoff = Handoff()
    phases = config.search.phases
    try:
        with CollectionProgress(config, enabled=config.progress, log=log) as progress:
            if phases[0].is_evidence:
                progress.start_evidence(phases[0], config.env.n_tasks * (phases[0].rollouts_per_task or 1))
            first = await evidence_rollouts(config, handoff)
            records.append(first)
            if phases[0].is_evidence:
                progress.evidence_done(first)
            records.append(
                await critic_scoring(config, EVIDENCE.phase, EVIDENCE.wave, EVIDENCE_SCORED.phase, 0, handoff)
            )
            source: Key = EVIDENCE_SCORED
            for p in range(1, len(phases)):
                progress.start_phase(p, phases[p])
                wave = 0
                while True:
                    recs = await continuation_wave(config, source.phase, source.wave, p, wave, handoff)
                    records.extend(recs)
                    if recs[0].get("done"):
                        break
                    progress.wave_done(recs[0])
                    source = score_key(config, p, wave)
                    wave += 1
        result = await prepare_export(config, source.phase, source.wave, handoff)
    finally:
        # the runtime's loop is closed where the steps ran it: outside the flow's loop
        await asyncio.to_thread(handoff.close)
    if result.get("repaired"):
        log.warning(
            "batch %s did not match its manifest (%s); wrote it again from the checkpoints",
            result["batch_url"],
            result["repaired"],
            extra={"focus_console": True},
        )
    await publish_report(config, result, records)
    stats = {
        **result.get("summary", {}),
        "steps": len(records),
        "steps_reused": sum(1 for r in records if r.get("reused")),
        "flow_wall_s": time.perf_counter() - t0,
    }
    log.info("collection %s: batch at %s", config.collection_id, result["batch_url"])
    return {
        "collection_id": config.collection_id,
        "batch_url": result["batch_url"],
        "stats": stats,
        "failure_causes": result.get("failure_causes", {}),
    }


def _flow_run_name() -> str:
    """Name a flow run after its collection when the config names one."""
    from prefect.runtime import flow_run

    cfg = flow_run.parameters.get("config")
    cid = getattr(cfg, "collection_id", None) or (cfg.get("collection_id") if isinstance(cfg, dict) else None)
    return str(cid or flow_run.name)


@flow(name="collect", log_prints=True, flow_run_name=_flow_run_name)
async def collect(config: FocusConfig | None = None) -> dict[str, Any]:
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
