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
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from prefect import flow, get_run_logger

from flows.progress import CollectionProgress
from tasks.config import FocusConfig
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
    """Give the config a collection id: its own, or one derived from the flow run, so a
    retry of the same flow run resumes the same collection."""
    if config.collection_id:
        return config
    from prefect.runtime import flow_run

    run_id = str(flow_run.id or "")
    name = str(flow_run.name or "run")
    return config.with_updates(collection_id=f"{name}-{run_id[:8]}" if run_id else name)


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
    try:
        first = await evidence_rollouts(config, handoff)
        records.append(first)
        log.info("collection %s: evidence %s", config.collection_id, "reused" if first["reused"] else "done")
        records.append(await critic_scoring(config, EVIDENCE.phase, EVIDENCE.wave, EVIDENCE_SCORED.phase, 0, handoff))
        source: Key = EVIDENCE_SCORED
        phases = config.search.phases
        with CollectionProgress(config, enabled=config.progress, log=log) as progress:
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
    await publish_report(config, result, records)
    stats = {
        **result.get("summary", {}),
        "steps": len(records),
        "steps_reused": sum(1 for r in records if r.get("reused")),
        "flow_wall_s": time.perf_counter() - t0,
    }
    log.info("collection %s: batch at %s", config.collection_id, result["batch_url"])
    return {"collection_id": config.collection_id, "batch_url": result["batch_url"], "stats": stats}


@flow(name="collect", log_prints=True)
async def collect(config: FocusConfig | None = None) -> dict[str, Any]:
    """Collect one iteration; returns the batch URL and statistics.

    An async flow (see :mod:`tasks.phases` for why): from synchronous code run it with
    ``asyncio.run(collect(config))``; inside another async flow, ``await`` it.
    """
    config = collection_id_for_run(config or FocusConfig())
    async with services_in_thread(config) as (cfg, _server):
        return await run_collection(cfg)
