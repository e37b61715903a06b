"""The artifacts of a ``collect`` flow run: its statistics, its steps and a picture of
its search trees, shown on the run's page in the Prefect UI."""

from __future__ import annotations

import asyncio
import base64
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NO_CACHE

if TYPE_CHECKING:
    from tasks.journal import CheckpointJournal


@task(name="publish-report", cache_policy=NO_CACHE, persist_result=False)
async def publish_report(journal: CheckpointJournal, result: dict[str, Any]) -> None:
    """Prefect artifacts: a statistics table, the steps, and a picture of the search trees."""
    cid = journal.cid
    rows = [{"statistic": k, "value": v} for k, v in result["stats"].items()]
    # why rollouts failed, most frequent first (docs/operations.md, "Reading failure statistics")
    rows += [{"statistic": f"failure cause: {c}", "value": n} for c, n in result.get("failure_causes", {}).items()]
    rows.append({"statistic": "batch_url", "value": result.get("batch_url")})
    await acreate_table_artifact(rows, key=_artifact_key(cid, "stats"), description=f"Collection {cid}: statistics")
    step_rows = [
        {
            "phase": s.key,
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
    from tasks.journal import TREES_SVG

    svg = str(await asyncio.to_thread(journal.load, TREES_SVG) or "")  # the export drew it (none: empty)
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
