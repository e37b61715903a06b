"""Services a collection needs but its configuration leaves implicit, started for the
run: the embedded model server (``model.kind = "local"`` without a URL) and a Dask
LocalCluster (``execution.kind = "dask"`` without an address). Tasks receive their URL
and address in the config; nothing is shared in-process. No Prefect here: an
unorchestrated collection (:mod:`flows.direct`) starts them the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from typing import Any

from tasks.config import FocusConfig


@contextlib.contextmanager
def services(config: FocusConfig) -> Iterator[tuple[FocusConfig, Any]]:
    """Start what the config needs but does not name; yield the config that names them
    and the local model server started (``None`` if none was)."""
    with contextlib.ExitStack() as stack:
        updates: dict[str, Any] = {}
        server = None
        if config.model.kind == "local" and config.model.url is None:
            from focus.backends import LocalModelServer

            server = stack.enter_context(LocalModelServer(config.model.weights))
            updates["model.url"] = server.url
            if config.model.policy_version is None:
                # the batch records which weights sampled it; prepare runs in its own task
                updates["model.policy_version"] = server.policy_version
        if config.execution.kind == "dask" and config.execution.address is None:
            from focus.dask_execution import DaskExecution

            ex = config.execution
            cluster = stack.enter_context(
                DaskExecution(n_workers=ex.n_workers, threads_per_worker=ex.threads_per_worker, processes=ex.processes)
            )
            cluster.client()
            updates["execution.address"] = cluster.scheduler_address
        yield (config.with_updates(**updates) if updates else config), server


@contextlib.asynccontextmanager
async def services_in_thread(config: FocusConfig) -> AsyncIterator[tuple[FocusConfig, Any]]:
    """:func:`services` entered and left in a worker thread, for async flows: starting a
    model server or a Dask cluster blocks, and Dask's synchronous client must not be
    created on a thread whose event loop is running."""
    cm = services(config)
    value = await asyncio.to_thread(cm.__enter__)
    try:
        yield value
    except BaseException as e:
        if not await asyncio.to_thread(cm.__exit__, type(e), e, e.__traceback__):
            raise
    else:
        await asyncio.to_thread(cm.__exit__, None, None, None)
