"""Prefect tasks, one per collection phase: the steps of :mod:`tasks.collection`
(thin wrappers over :mod:`tasks.steps`) as task runs, plus the run's artifacts.

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
from prefect.utilities.annotations import quote

from tasks import collection
from tasks.collection import steps_for
from tasks.config import FocusConfig
from tasks.steps import Handoff

_OPTS: dict[str, Any] = {"cache_policy": NO_CACHE, "persist_result": False}

check_config = task(name="check-config", **_OPTS)(collection.check_config)
evidence_rollouts = task(name="evidence-rollouts", **_OPTS)(collection.evidence)
critic_scoring = task(name="critic-scoring", task_run_name="score-{target_phase}-{target_wave}", **_OPTS)(
    collection.score
)
continuation_wave = task(name="continuation-wave", task_run_name="wave-{phase_index}-{wave}", **_OPTS)(collection.wave)
prepare_export = task(name="prepare-export", **_OPTS)(collection.export)


def _unwalked(step: Any) -> Any:
    """Call the task ``step`` with its config and handoff wrapped in Prefect's ``quote``.

    Prefect walks every task parameter twice per task run (resolving futures, recording
    inputs); the config is a tree of a few hundred fields, which made that walk about a
    third of the flow's own CPU per task run. Neither holds futures or upstream results,
    so nothing is lost by not walking them; the task receives them unwrapped.
    """

    async def call(config: FocusConfig, *args: Any) -> Any:
        return await step(quote(config), *(quote(a) if isinstance(a, Handoff) else a for a in args))

    return call


#: The steps as Prefect tasks, for :func:`tasks.collection.run_steps` inside a flow.
PREFECT_STEPS = collection.StepCalls(
    *map(_unwalked, (check_config, evidence_rollouts, critic_scoring, continuation_wave, prepare_export))
)


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
