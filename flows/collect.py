"""The ``collect`` flow: one iteration of collection as a Prefect flow run, resumable.

The flow runs :func:`tasks.collect.collect` - the collector's one loop - with a
journal that makes each step a Prefect task run as it is saved to the checkpoint
store: ``check-config``, ``evidence-rollouts``, ``critic-scoring``, one
``continuation-wave`` per wave (``wave-<phase>-<wave>``) and ``prepare-export``, so the
UI shows the run's progress wave by wave. Running the flow again - a retry of the same
flow run, a rerun from the UI, or the CLI with the same collection id - skips what is
saved and continues from the last saved wave.

Services the configuration leaves implicit are started for the duration of the run
(:func:`flows.services.services`): the embedded model server when ``model.kind`` is
``local`` without a URL, and a Dask LocalCluster when ``execution.kind`` is ``dask``
without an address.

When a collection stops, the flow logs the traceback (the run's log in the UI, the
CLI's log file) and fails with one line naming the cause (:mod:`flows.errors`), which is
the failed state's message. While it runs it emits heartbeats
(:mod:`flows.heartbeat`), so a watchdog can mark a run whose node is gone ``Crashed``.

The flow is async for a measured reason: Prefect's sync flow engine joins its
heartbeat thread on exit, and that thread sleeps in one-second slices, so every sync
flow run waited up to a second for it (benchmarks/README.md, orchestration section).
"""

from __future__ import annotations

import base64
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from flows.errors import as_failure, one_line
from flows.heartbeat import heartbeats
from flows.preflight import new_collection_id
from flows.progress import CollectionProgress
from flows.services import services_in_thread
from focus.journal import Step
from tasks.collect import collect as collect_iteration
from tasks.config import FocusConfig, config_at_runtime
from tasks.journal import CheckpointJournal, StepRecord

#: Idempotency lives in the checkpoint store, so it holds across flow runs, retries, UI
#: and CLI reruns alike; Prefect's own result caching would only duplicate it.
_OPTS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}


async def _write(journal: Any, kind: Any, phase: int, wave: int, key: Any, value: Any) -> StepRecord:
    return await CheckpointJournal.write(journal, Step(kind, phase, wave), key, value)


#: The steps that are task runs of their own (wave scores are saved by the flow: a
#: second task run per wave doubled the flow's bookkeeping).
_STEP_TASKS = {
    "evidence": task(name="evidence-rollouts", **_OPTS)(_write),
    "evidence_scores": task(name="critic-scoring", task_run_name="score-evidence", **_OPTS)(_write),
    "wave": task(name="continuation-wave", task_run_name="wave-{phase}-{wave}", **_OPTS)(_write),
}


@task(name="check-config", **_OPTS)
async def _check_config(journal: Any) -> StepRecord:
    return await CheckpointJournal.check_config(journal)


@task(name="prepare-export", **_OPTS)
async def _export(journal: Any, collector: Any, state: Any) -> dict[str, Any]:
    return await CheckpointJournal.export(journal, collector, state)


class PrefectJournal(CheckpointJournal):
    """A :class:`~tasks.journal.CheckpointJournal` whose steps are Prefect task runs.

    Every argument is passed ``quote``-d: Prefect walks task parameters twice per task
    run (resolving futures, recording inputs), and the config and a wave's rollouts
    hold neither futures nor upstream results; walking them was about a third of the
    flow's own CPU per task run.
    """

    async def write(self, step: Step, key: tuple[str, int], value: Any) -> StepRecord:
        run = _STEP_TASKS.get(step.kind)
        if run is None:
            return await super().write(step, key, value)
        result: StepRecord = await run(quote(self), step.kind, step.phase, step.wave, quote(key), quote(value))
        return result

    async def check_config(self) -> StepRecord:
        result: StepRecord = await _check_config(quote(self))
        return result

    async def export(self, collector: Any, state: Any) -> dict[str, Any]:
        result: dict[str, Any] = await _export(quote(self), quote(collector), quote(state))
        return result


@task(name="publish-report", **_OPTS)
async def publish_report(journal: Any, result: dict[str, Any]) -> None:
    """Prefect artifacts: a statistics table, the steps, and a picture of the search trees."""
    import asyncio

    cid = journal.cid
    rows = [{"statistic": k, "value": v} for k, v in result["stats"].items()]
    # why rollouts failed, most frequent first (docs/operations.md, "Reading failure statistics")
    rows += [{"statistic": f"failure cause: {c}", "value": n} for c, n in result.get("failure_causes", {}).items()]
    rows.append({"statistic": "batch_url", "value": result.get("batch_url")})
    await acreate_table_artifact(rows, key=_artifact_key(cid, "stats"), description=f"Collection {cid}: statistics")
    step_rows = [
        {
            "step": s.key,
            "wave": s.wave,
            "reused": s.reused,
            "wall_s": s.wall_s,
            "rollouts": s.rollouts,
            "transitions": s.phase_usage.transitions if s.phase_usage is not None else None,
            "failed_rollouts": s.failed_rollouts,
        }
        for s in journal.records
    ]
    await acreate_table_artifact(step_rows, key=_artifact_key(cid, "steps"), description=f"Collection {cid}: steps")
    svg = await asyncio.to_thread(journal.tree_picture)
    if svg:
        body = base64.b64encode(svg.encode()).decode()
        await acreate_markdown_artifact(
            f"### Search trees of {cid}\n\n![search trees](data:image/svg+xml;base64,{body})\n",
            key=_artifact_key(cid, "trees"),
            description=f"Collection {cid}: search trees (nodes coloured by refined value, edges by advantage)",
        )


def _artifact_key(cid: str, what: str) -> str:
    """Artifact keys allow lowercase letters, digits and dashes only."""
    clean = "".join(c if c.isalnum() else "-" for c in cid.lower()).strip("-") or "collection"
    return f"{clean[:60]}-{what}"


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


async def run_collection(config: FocusConfig) -> dict[str, Any]:
    """The collection with its steps as task runs (await inside a flow), then its artifacts."""
    log = get_run_logger()
    progress = CollectionProgress(config, enabled=config.progress, log=log)
    journal = PrefectJournal(config, on_step=progress.step)
    with progress:
        result = await collect_iteration(config, journal)
    report: Any = publish_report  # Prefect's typing does not know that quote() is unwrapped
    await report(quote(journal), quote(result))
    log.info("collection %s: batch at %s", config.collection_id, result["batch_url"])
    return result


def _flow_run_name() -> str:
    """Name a flow run after its collection when the config names one."""
    from prefect.runtime import flow_run

    cfg = flow_run.parameters.get("config")
    cid = getattr(cfg, "collection_id", None) or (cfg.get("collection_id") if isinstance(cfg, dict) else None)
    return str(cid or flow_run.name)


@flow(name="collect", log_prints=True, flow_run_name=_flow_run_name)
async def collect(config: FocusConfig | None = None) -> dict[str, Any]:
    """Collect one iteration; returns the batch URL and statistics.

    An async flow: from synchronous code run it with ``asyncio.run(collect(config))``;
    inside another async flow, ``await`` it. A failure raises the original error when
    its message already names the cause, else :class:`flows.errors.CollectionFailed`
    with one line that does.
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
