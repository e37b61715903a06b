"""One collection, with or without Prefect: ``collect(config, journal)``.

Build the policy, the agent, the collector and the execution service from the
configuration, run the collector's loop (:meth:`focus.collector.Collector.run_search`,
the only loop a collection has) with the pipeline's journal, then export the batch.
The journal decides what is durable and how each step shows: a
:class:`tasks.journal.CheckpointJournal` saves each step to the checkpoint store; the
``collect`` flow's journal (:mod:`flows.collect`) also makes each step a Prefect task
run. Either way a rerun with the same collection id resumes after the last saved step,
under the collection's write lease (a second run of the same collection is refused).

Nothing here imports Prefect: an unorchestrated collection never pays its import.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from focus.execution import Execution
from tasks.config import ExecutionConfig, FocusConfig
from tasks.journal import CheckpointJournal, StepRecord

log = logging.getLogger(__name__)


def make_execution(ex: ExecutionConfig) -> Execution:
    """The execution service the collection's rollouts run on.

    The pipeline owns its process, so it keeps the search state out of cyclic garbage
    collection while the collection runs (``freeze_gc``, off in the library by default
    because it changes process-wide state): each full collection would otherwise walk
    every node of every tree.
    """
    if ex.kind == "dask":
        from focus.dask_execution import DaskExecution

        return DaskExecution(
            address=ex.address,
            n_workers=ex.n_workers,
            threads_per_worker=ex.threads_per_worker,
            processes=ex.processes,
            shard_size=ex.shard_size,
            max_concurrency=ex.max_concurrency,
            max_outage_share=ex.max_outage_share,
            freeze_gc=True,
        )
    return Execution(max_concurrency=ex.max_concurrency, max_outage_share=ex.max_outage_share, freeze_gc=True)


async def collect(
    config: FocusConfig, journal: CheckpointJournal, *, execution: Execution | None = None
) -> dict[str, Any]:
    """Collect ``config``'s iteration through ``journal``; returns the collection's id,
    batch URL, statistics and failure causes (:func:`collection_result`).

    ``execution`` replaces the one the configuration describes (it is closed at the end
    either way). A finished collection whose batch checks out returns at once.
    """
    t0 = time.perf_counter()
    with journal.lease():
        await journal.check_config()
        result = await journal.finished()
        if result is None:
            result = await _search_and_export(config, journal, execution or make_execution(config.execution))
            if journal.damaged:
                log.warning(
                    "batch %s did not match its manifest (%s); wrote it again from the checkpoints",
                    result["batch_url"],
                    journal.damaged,
                    extra={"focus_console": True},
                )
    return collection_result(config, result, journal.records, t0)


async def _search_and_export(config: FocusConfig, journal: CheckpointJournal, execution: Execution) -> dict[str, Any]:
    policy = config.build_policy()
    collector = None
    try:
        agent, tasks = config.build_agent(policy)
        collector = config.build_collector(agent, execution)
        state = await collector.run_search(tasks, journal)
        return await journal.export(collector, state)
    finally:
        try:
            await policy.aclose()
            if collector is not None:
                await collector.critic.aclose()
        finally:
            close = getattr(execution, "close", None)
            if close is not None:  # a Dask client's close blocks: not on the event loop
                await asyncio.to_thread(close)


def collection_result(
    config: FocusConfig, result: dict[str, Any], records: list[StepRecord], t0: float
) -> dict[str, Any]:
    """What a collection returns: its id, the batch URL, statistics and failure causes."""
    stats = {
        **result.get("summary", {}),
        "steps": len(records),
        "steps_reused": sum(1 for r in records if r.reused),
        "flow_wall_s": time.perf_counter() - t0,
    }
    return {
        "collection_id": config.collection_id,
        "batch_url": result["batch_url"],
        "stats": stats,
        "failure_causes": result.get("failure_causes", {}),
    }
