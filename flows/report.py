"""The artifacts of a ``collect`` flow run: its statistics, its steps and a picture of
its search trees, shown on the run's page in the Prefect UI."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from typing import TYPE_CHECKING, Any

from prefect import task
from prefect.artifacts import acreate_markdown_artifact, acreate_table_artifact
from prefect.cache_policies import NO_CACHE

if TYPE_CHECKING:
    from tasks.journal import CheckpointJournal


@task(name="publish-report", task_run_name="publish-report", cache_policy=NO_CACHE, persist_result=False)
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
    """The artifact's key: the collection id itself where it is a valid key (lowercase
    letters, digits and dashes, at most 60), else its cleaned form and 8 hex of a hash of
    the id. Keys are global in a Prefect server and its UI shows a key's latest version,
    so a lossy cleaning alone gave ``Odd.Id_1``, ``odd-id-1`` and ``ODD_ID_1`` (and ids
    alike in their first 60 characters) one key: each collection's report replaced the
    other's."""
    clean = "".join(c if c.isalnum() and c.isascii() else "-" for c in cid.lower()).strip("-") or "collection"
    if clean != cid or len(clean) > 60:
        clean = f"{clean[:51]}-{hashlib.sha256(cid.encode()).hexdigest()[:8]}"
    return f"{clean}-{what}"
