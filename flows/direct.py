"""A collection without an orchestrator: :func:`tasks.collect.collect` with the plain
checkpoint journal - the same loop, checkpoints and write lease as the ``collect``
flow, so a rerun resumes either way with the same batch. ``focus collect`` runs this
when no Prefect server is configured: a temporary one would forget the run when the
command ends and took several times the default collection to start
(docs/pipeline.md, "Start-up and wall time")."""

from __future__ import annotations

import logging
from typing import Any

from flows.errors import raise_one_line
from flows.progress import CollectionProgress
from flows.services import services_in_thread
from tasks.collect import collect
from tasks.config import FocusConfig
from tasks.journal import CheckpointJournal


async def collect_direct(
    config: FocusConfig, allow_policy_change: bool = False, read_by_preflight: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Collect one iteration without Prefect; returns what the ``collect`` flow returns.

    ``config`` must name its collection (``collection_id``): there is no flow run to
    derive one from. A failure raises as the flow does (one line naming the cause).
    """
    if not config.collection_id:
        raise ValueError("an unorchestrated collection needs a collection_id")
    log = logging.getLogger("focus.collect")
    try:
        async with services_in_thread(config) as (cfg, _server):
            progress = CollectionProgress(cfg, enabled=cfg.progress, log=log)
            with progress:
                journal = CheckpointJournal(cfg, on_step=progress.step, allow_policy_change=allow_policy_change)
                journal.read_by_preflight = read_by_preflight
                result = await collect(cfg, journal, execution=progress.execution())
            log.info("collection %s: batch at %s", cfg.collection_id, result["batch_url"])
            return result
    except Exception as e:
        raise_one_line(e, log, config.collection_id)
