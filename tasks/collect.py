"""One collection, with or without Prefect: ``collect(config, journal)``.

Build the policy, agent, collector and execution service from the configuration, run
the collector's loop (:meth:`focus.collector.Collector.search`, the only loop a
collection has) with the pipeline's journal (:mod:`tasks.journal`), then export the
batch, under the collection's write lease. Nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from focus.execution import Execution
from tasks.config import FocusConfig
from tasks.config.build import make_execution
from tasks.gaps import check_records, load_record, repairing
from tasks.journal import CheckpointJournal


async def collect(
    config: FocusConfig, journal: CheckpointJournal, *, execution: Execution | None = None
) -> dict[str, Any]:
    """Collect ``config``'s iteration through ``journal``; returns the collection's id,
    batch URL, statistics (with its steps: how many, how many replayed) and failure causes.

    ``execution`` replaces the one the configuration describes (it is closed at the end
    either way). A finished collection whose batch checks out returns at once; an
    unfinished one resumes after its last saved step (:func:`tasks.gaps.repairing`).
    """
    t0 = time.perf_counter()
    if journal.read_by_preflight is None:  # else the preflight checked them
        # before the lease: its sweep deletes a data file whose manifest is gone, a lost record's too
        await asyncio.to_thread(check_records, journal)
    async with journal.lease():
        await journal.check_config()
        result = await journal.finished()
        if result is None:
            async with repairing(journal):  # a gap in the checkpoints mended, a damaged batch written again
                result = await _search_and_export(config, journal, execution or make_execution(config.execution))
    steps = journal.records
    stats = {**result.get("summary", {}), "steps": len(steps), "steps_reused": sum(r.reused for r in steps)}
    stats["flow_wall_s"] = time.perf_counter() - t0
    cid, url, causes = config.collection_id, result["batch_url"], result.get("failure_causes", {})
    return {"collection_id": cid, "batch_url": url, "stats": stats, "failure_causes": causes}


async def _search_and_export(config: FocusConfig, journal: CheckpointJournal, execution: Execution) -> dict[str, Any]:
    """The objects built from the configuration, the search, the batch exported; all closed after."""
    policy = config.build_policy()
    collector = None
    try:
        agent, tasks = config.build_agent(policy)
        await journal.codec.check(agent.format.codec, journal.save)
        collector = config.build_collector(agent, execution)
        await journal.critic.check(collector.critic, lambda k: load_record(journal, k), journal.save)
        try:
            state = await collector.search(tasks, journal)
        finally:  # what was recorded is saved, also when the search stopped
            await journal.flush()
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
