"""One collection's steps, in order, with or without Prefect.

Each step below is the body of one Prefect task (:mod:`tasks.phases` wraps them, and
nothing else): check the configuration, evidence rollouts, critic scoring, continuation
waves (each also scoring what it added), export. :func:`run_steps` is the order they run
in, given the calls to make - the Prefect tasks inside the ``collect`` flow, or
:data:`DIRECT` (these functions themselves) when no Prefect server is configured and
the CLI collects without orchestration. Either way every step is idempotent on
(collection id, phase, wave) through the checkpoint store, so resume and reuse are the
same: the durability lives in the store, not in the orchestrator.

Nothing here imports Prefect: an unorchestrated collection never pays its import.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from tasks.config import ExecutionConfig, FocusConfig, check_factories
from tasks.steps import EVIDENCE, EVIDENCE_SCORED, Handoff, Key, Steps, score_key, wave_key


def make_execution(ex: ExecutionConfig) -> Any:
    """The execution service a step runs its rollouts on.

    ``freeze_gc`` is off: the step's :class:`tasks.runtime.Runtime` keeps the search
    state out of garbage collection for the whole flow run, and the execution service
    checking for that itself would walk every frozen object once per wave.
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
            freeze_gc=False,
        )
    from focus.execution import Execution

    return Execution(max_concurrency=ex.max_concurrency, max_outage_share=ex.max_outage_share, freeze_gc=False)


def steps_for(config: FocusConfig, handoff: Handoff | None = None) -> Steps:
    from storage import BatchStore, CheckpointStore

    root = config.storage.root
    return Steps(config, CheckpointStore(root), BatchStore(root), lambda: make_execution(config.execution), handoff)


# ---- the steps (each the body of one Prefect task; they run the step in a worker
# thread, since a step drives its own event loop: the run's tasks.runtime.Runtime) ----


async def check_config(config: FocusConfig) -> dict[str, Any]:
    """Factories importable with their options; the stored configuration, if any, the same."""

    def both() -> dict[str, Any]:
        check_factories(config)
        return steps_for(config).check_config()

    return await asyncio.to_thread(both)


async def evidence(config: FocusConfig, handoff: Handoff | None = None) -> dict[str, Any]:
    """Phase 0: complete rollouts from every task's root."""
    return await asyncio.to_thread(steps_for(config, handoff).evidence)


async def score(
    config: FocusConfig,
    source_phase: str,
    source_wave: int,
    target_phase: str,
    target_wave: int,
    handoff: Handoff | None = None,
) -> dict[str, Any]:
    """Critic predictions on the checkpoints the previous step added (the evidence
    rollouts'; each continuation wave scores its own, see :func:`wave`)."""
    steps = steps_for(config, handoff)
    return await asyncio.to_thread(steps.score, Key(source_phase, source_wave), Key(target_phase, target_wave))


async def wave(
    config: FocusConfig,
    source_phase: str,
    source_wave: int,
    phase_index: int,
    wave: int,
    handoff: Handoff | None = None,
) -> list[dict[str, Any]]:
    """One wave of prioritised continuations (fanned out by the execution service), then
    the critic's predictions for the checkpoints it added, which the next wave ranks by.

    Two steps with two checkpoints in one call: a Prefect task run costs the flow
    several milliseconds of bookkeeping, and a separate scoring task per wave doubled
    that. A critic failure still loses no rollout: the wave's checkpoint is written
    before the scoring step raises it, so a retry or rerun only scores. Returns the
    step records (one, marked ``done``, when the phase had nothing left to plan).
    """
    steps = steps_for(config, handoff)

    def both() -> list[dict[str, Any]]:
        rec = steps.wave(Key(source_phase, source_wave), phase_index, wave)
        if rec.get("done"):
            return [rec]
        return [rec, steps.score(wave_key(config, phase_index, wave), score_key(config, phase_index, wave))]

    return await asyncio.to_thread(both)


async def export(
    config: FocusConfig, source_phase: str, source_wave: int, handoff: Handoff | None = None
) -> dict[str, Any]:
    """Estimator, critic targets and the Parquet batch; returns its URL and statistics."""
    return await asyncio.to_thread(steps_for(config, handoff).export, Key(source_phase, source_wave))


@dataclass(frozen=True)
class StepCalls:
    """How :func:`run_steps` runs each step: these functions, or Prefect tasks wrapping them."""

    check_config: Callable[..., Awaitable[dict[str, Any]]]
    evidence: Callable[..., Awaitable[dict[str, Any]]]
    score: Callable[..., Awaitable[dict[str, Any]]]
    wave: Callable[..., Awaitable[list[dict[str, Any]]]]
    export: Callable[..., Awaitable[dict[str, Any]]]


#: The steps called directly, without an orchestrator.
DIRECT = StepCalls(check_config, evidence, score, wave, export)


async def run_steps(
    config: FocusConfig, calls: StepCalls, progress: Any, log: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every step of one collection in order, holding the collection's write lease
    throughout (a second run of the same collection is refused); returns the export's
    result and the step records. ``progress`` (a :class:`flows.progress.CollectionProgress`,
    not yet entered) shows the phases and is closed before the export; ``log`` is the
    run's logger."""
    from storage import collection_lease

    with collection_lease(config.storage.root, str(config.collection_id)):
        result, records = await _run_steps(config, calls, progress)
    if result.get("repaired"):
        log.warning(
            "batch %s did not match its manifest (%s); wrote it again from the checkpoints",
            result["batch_url"],
            result["repaired"],
            extra={"focus_console": True},
        )
    return result, records


async def _run_steps(
    config: FocusConfig, calls: StepCalls, progress: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    records: list[dict[str, Any]] = [await calls.check_config(config)]
    # the live state and the agent/collector, step to step, within this process
    handoff = Handoff()
    phases = config.search.phases
    try:
        with progress:
            if phases[0].is_evidence:
                progress.start_evidence(phases[0], config.env.n_tasks * (phases[0].rollouts_per_task or 1))
            first = await calls.evidence(config, handoff)
            records.append(first)
            if phases[0].is_evidence:
                progress.evidence_done(first)
            records.append(await calls.score(config, EVIDENCE.phase, EVIDENCE.wave, EVIDENCE_SCORED.phase, 0, handoff))
            source: Key = EVIDENCE_SCORED
            for p in range(1, len(phases)):
                progress.start_phase(p, phases[p])
                w = 0
                while True:
                    recs = await calls.wave(config, source.phase, source.wave, p, w, handoff)
                    records.extend(recs)
                    if recs[0].get("done"):
                        break
                    progress.wave_done(recs[0])
                    source = score_key(config, p, w)
                    w += 1
        result = await calls.export(config, source.phase, source.wave, handoff)
    finally:
        # the runtime's loop is closed where the steps ran it: outside the caller's loop
        await asyncio.to_thread(handoff.close)
    return result, records


def collection_result(
    config: FocusConfig, result: dict[str, Any], records: list[dict[str, Any]], t0: float
) -> dict[str, Any]:
    """What a collection returns: its id, the batch URL, statistics and failure causes."""
    stats = {
        **result.get("summary", {}),
        "steps": len(records),
        "steps_reused": sum(1 for r in records if r.get("reused")),
        "flow_wall_s": time.perf_counter() - t0,
    }
    return {
        "collection_id": config.collection_id,
        "batch_url": result["batch_url"],
        "stats": stats,
        "failure_causes": result.get("failure_causes", {}),
    }
