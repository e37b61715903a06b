"""What the steps of one collection share inside one process: built once, closed once.

A flow run executes its steps one after another in one process. Building the policy
client, the env, the agent and the collector again for every step, and running every
step on a fresh event loop (``asyncio.run``), cost a large share of each step when a
collection has dozens of waves. :class:`Runtime` builds them once for a configuration
and runs each step's coroutine on its own event loop, which stays open between steps so
that clients bound to it (HTTP connection pools) keep working.

The loop runs in a thread of its own, all the time, not only while a step awaits it:
waves planned ahead (``search.waves_in_flight``) keep running while a step writes its
checkpoint and Prefect moves on to the next task, so their model calls go on being sent
and the model service does not sit idle between steps.

Nothing here is process-global: a runtime belongs to the :class:`tasks.steps.Handoff`
of one flow run, which closes it when the run ends. A step given another configuration
gets another runtime (the old one is closed first), so equal configurations give equal
objects and a resumed collection builds exactly what an uninterrupted one does.
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from tasks.config import FocusConfig


class Runtime:
    """Policy, agent, tasks, collector and an event loop for one configuration."""

    def __init__(self, config: FocusConfig, make_execution: Callable[[], Any]) -> None:
        self.config = config
        self.policy = config.build_policy()
        self.agent, self.tasks = config.build_agent(self.policy)
        # Execution services connect lazily (a Dask client on its first wave), so a
        # scoring or export step never opens a connection it does not use.
        self.execution = make_execution()
        self.collector = config.build_collector(self.agent, self.execution)
        self.loop = asyncio.new_event_loop()
        self.closed = False
        self._froze_gc = False
        self._thread = threading.Thread(target=self._serve, name="focus-runtime-loop", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coro`` on the runtime's loop and wait for its result (from any other thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def matches(self, config: FocusConfig) -> bool:
        return not self.closed and (config is self.config or config == self.config)

    def run(self, fn: Callable[[Any, list[Any]], Coroutine[Any, Any, Any]]) -> Any:
        """``await fn(collector, tasks)`` on this runtime's loop and return its result.

        The result leaves through a list, not as the loop task's result, and no SIGINT
        handler is installed: on Python 3.11 ``asyncio.run`` formats the repr of its
        finished main task (result included) when it restores the SIGINT handler, which
        for a search state of 10k transitions cost about a second per step.
        """
        if self.closed:
            raise RuntimeError("this runtime is closed")
        out: list[Any] = []

        async def go() -> None:
            out.append(await fn(self.collector, self.tasks))

        # The search state is a large graph of small objects that lives through the
        # whole run; left to the collector, every full collection - and Prefect
        # allocates enough between steps to trigger them - scans all of it. So what
        # exists when a step starts is moved out of the collector's sight until the
        # runtime closes (unless someone else froze objects first: then leave GC be).
        # Only garbage collection timing changes, never a result.
        if not self._froze_gc:
            self._froze_gc = gc.get_freeze_count() == 0
        if self._froze_gc:
            gc.freeze()
        self.call(go())
        return out[0]

    def close(self) -> None:
        """Close the clients (policy, critic), the execution service and the loop."""
        if self.closed:
            return
        self.closed = True
        try:

            async def shut() -> None:
                try:
                    await self.policy.aclose()
                finally:
                    await self.collector.critic.aclose()

            self.call(shut())
            self.call(self.loop.shutdown_asyncgens())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join()
            self.loop.close()
            if self._froze_gc:
                gc.unfreeze()
            close = getattr(self.execution, "close", None)
            if close is not None:
                close()
