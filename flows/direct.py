"""A collection without an orchestrator: :func:`tasks.collect.collect` with the plain
checkpoint journal.

With no Prefect server configured, ``focus collect`` runs this instead of starting a
temporary Prefect server for one command: that server's run history would vanish with
it, and starting it cost several times the collection itself (docs/pipeline.md,
"Start-up and wall time"). What makes a collection durable does not change: the same
loop saves the same checkpoints under the same write lease, so a rerun with the same
collection id resumes after the last saved wave, here or under a Prefect flow, and the
batch is the same. What a run gives up is what only a server keeps: the run in the
UI, its artifacts, retries and schedules (``focus collect --prefect``, or
``PREFECT_API_URL``, brings them back).
"""

from __future__ import annotations

import logging
from typing import Any

from flows.errors import as_failure, one_line
from flows.progress import CollectionProgress
from flows.services import services_in_thread
from tasks.collect import collect
from tasks.config import FocusConfig
from tasks.journal import CheckpointJournal


async def collect_direct(config: FocusConfig) -> dict[str, Any]:
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
                result = await collect(cfg, CheckpointJournal(cfg, on_step=progress.step))
            log.info("collection %s: batch at %s", cfg.collection_id, result["batch_url"])
            return result
    except Exception as e:
        log.error("collection %s failed: %s", config.collection_id, one_line(e), exc_info=True)
        failure = as_failure(e)
        if failure is e:
            raise
        raise failure from e
