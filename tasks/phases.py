"""Prefect tasks, one per collection phase, as thin wrappers over :mod:`tasks.steps`.

Each task takes the (small, picklable) config and checkpoint keys, does its work
through :class:`tasks.steps.Steps` - which persists the big data to object storage -
and returns a small JSON-able record. Prefect's own result caching is off
(``NO_CACHE``): idempotency lives in the checkpoint store, so it holds across flow
runs, retries, UI reruns and CLI reruns alike, and does not depend on Prefect's
result storage being configured.

The tasks are async and run their step in a worker thread (``asyncio.to_thread``, which
carries the task run's context along): a step drives its own event loop (the run's
:class:`tasks.runtime.Runtime`), which cannot run inside the flow's. The flow is async
for a measured reason: Prefect's sync flow engine joins its heartbeat thread on exit,
and that thread sleeps in one-second slices, so every sync flow run waited up to a
second for it (benchmarks/README.md, orchestration section).
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from prefect import task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NO_CACHE

from tasks.config import ExecutionConfig, FocusConfig, check_factories
from tasks.steps import Handoff, Key, Steps, score_key, wave_key


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


_OPTS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


@task(name="check-config", **_OPTS)
async def check_config(config: FocusConfig) -> dict[str, Any]:
    """Factories importable with their options; the stored configuration, if any, the same."""

    def both() -> dict[str, Any]:
        check_factories(config)
        return steps_for(config).check_config()

    return await asyncio.to_thread(both)


@task(name="evidence-rollouts", **_OPTS)
async def evidence_rollouts(config: FocusConfig, handoff: Handoff | None = None) -> dict[str, Any]:
    """Phase 0: complete rollouts from every task's root."""
    return await asyncio.to_thread(steps_for(config, handoff).evidence)


@task(name="critic-scoring", task_run_name="score-{target_phase}-{target_wave}", **_OPTS)
async def critic_scoring(
    config: FocusConfig,
    source_phase: str,
    source_wave: int,
    target_phase: str,
    target_wave: int,
    handoff: Handoff | None = None,
) -> dict[str, Any]:
    """Critic predictions on the checkpoints the previous step added (the evidence
    rollouts'; each continuation wave scores its own, see :func:`continuation_wave`)."""
    steps = steps_for(config, handoff)
    return await asyncio.to_thread(steps.score, Key(source_phase, source_wave), Key(target_phase, target_wave))


@task(name="continuation-wave", task_run_name="wave-{phase_index}-{wave}", **_OPTS)
async def continuation_wave(
    config: FocusConfig,
    source_phase: str,
    source_wave: int,
    phase_index: int,
    wave: int,
    handoff: Handoff | None = None,
) -> list[dict[str, Any]]:
    """One wave of prioritised continuations (fanned out by the execution service), then
    the critic's predictions for the checkpoints it added, which the next wave ranks by.

    Two steps with two checkpoints in one task run: a task run costs the flow several
    milliseconds of Prefect bookkeeping, and a separate scoring task per wave doubled
    that. A critic failure still loses no rollout: the wave's checkpoint is written
    before scoring starts, so a retry or rerun only scores. Returns the step records
    (one, marked ``done``, when the phase had nothing left to plan).
    """
    steps = steps_for(config, handoff)

    def both() -> list[dict[str, Any]]:
        rec = steps.wave(Key(source_phase, source_wave), phase_index, wave)
        if rec.get("done"):
            return [rec]
        return [rec, steps.score(wave_key(config, phase_index, wave), score_key(config, phase_index, wave))]

    return await asyncio.to_thread(both)


@task(name="prepare-export", **_OPTS)
async def prepare_export(
    config: FocusConfig, source_phase: str, source_wave: int, handoff: Handoff | None = None
) -> dict[str, Any]:
    """Estimator, critic targets and the Parquet batch; returns its URL and statistics."""
    return await asyncio.to_thread(steps_for(config, handoff).export, Key(source_phase, source_wave))


@task(name="publish-report", **_OPTS)
async def publish_report(config: FocusConfig, result: dict[str, Any], steps: list[dict[str, Any]]) -> None:
    """Prefect artifacts: a statistics table and a picture of the search trees."""
    cid = config.collection_id or "collection"
    rows = [{"statistic": k, "value": v} for k, v in result.get("summary", {}).items()]
    # why rollouts failed, most frequent first (docs/operations.md, "Reading failure statistics")
    rows += [{"statistic": f"failure cause: {c}", "value": n} for c, n in result.get("failure_causes", {}).items()]
    rows.append({"statistic": "batch_url", "value": result.get("batch_url")})
    await acreate_table_artifact(
        rows, key=_artifact_key(cid, "stats"), description=f"Collection {cid}: batch statistics"
    )
    step_rows = [
        {
            **{k: s.get(k) for k in ("phase", "wave", "reused", "wall_s", "jobs")},
            "transitions": _used(s, "transitions"),
            "failed_rollouts": s.get("failed_rollouts"),
        }
        for s in steps
    ]
    await acreate_table_artifact(step_rows, key=_artifact_key(cid, "steps"), description=f"Collection {cid}: steps")
    svg = await asyncio.to_thread(steps_for(config).tree_picture)
    if svg:
        body = base64.b64encode(svg.encode()).decode()
        await acreate_markdown_artifact(
            f"### Search trees of {cid}\n\n![search trees](data:image/svg+xml;base64,{body})\n",
            key=_artifact_key(cid, "trees"),
            description=f"Collection {cid}: search trees (nodes coloured by refined value, edges by advantage)",
        )


def _used(record: dict[str, Any], what: str) -> Any:
    """A figure of a step record's usage (``None`` for steps that ran no rollouts)."""
    return (record.get("usage") or {}).get(what)


def _artifact_key(cid: str, what: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    clean = "".join(c if c.isalnum() else "-" for c in cid.lower()).strip("-") or "collection"
    return f"{clean[:60]}-{what}"
