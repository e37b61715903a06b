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
import contextlib
import gc
import threading
from collections.abc import Callable, Coroutine
from typing import Any

from focus.collector import Running
from focus.execution import frozen_heap
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
        #: The frozen heap this runtime holds (:meth:`freeze_heap`), if it froze.
        self._heap: contextlib.ExitStack | None = None
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
        self.freeze_heap()
        self.call(go())
        return out[0]

    def freeze_heap(self) -> None:
        """Move what exists now out of the garbage collector's sight (see :meth:`run`),
        holding :func:`focus.execution.frozen_heap` (young collections spaced out) until
        the runtime closes."""
        if self._heap is None:
            stack = contextlib.ExitStack()
            if stack.enter_context(frozen_heap()):
                self._heap = stack  # it froze what exists now
                return
            stack.close()  # someone else froze objects first: leave GC be
        else:
            gc.freeze()

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
            heap, self._heap = self._heap, None
            if heap is not None:
                heap.close()
            close = getattr(self.execution, "close", None)
            if close is not None:
                close()


class WaveDriver:
    """:meth:`focus.collector.Collector.phase_waves` of one continuation phase, running
    on a runtime's loop ahead of the steps that checkpoint its outcomes.

    A wave step takes the next outcome (waiting if it has not landed yet) and writes its
    checkpoints while the driver lands, scores and launches the waves after it. So the
    time a step spends checkpointing, and the orchestrator between two task runs, holds
    no wave back: waves land as they would in ``Collector.collect()``. The outcomes
    are the ones a step-by-step run computes (planning is a pure function of the state);
    a crash loses only what was landed and not yet checkpointed, which a rerun
    computes again from the same jobs.
    """

    def __init__(self, runtime: Runtime, state: Any, phase_index: int, wave: int, running: Running) -> None:
        self.runtime = runtime
        self.phase_index = phase_index
        #: The wave :meth:`take` returns next.
        self.next_wave = wave
        #: The state the next wave's outcome follows from (its scored predecessor).
        self.state = state
        #: The outcome :meth:`take` returned last (the score step reads it).
        self.last: Any = None
        self._queue: asyncio.Queue[Any] | None = None
        self._task: asyncio.Task[None] | None = None

        async def start() -> None:
            self._queue = asyncio.Queue()
            waves = runtime.collector.phase_waves(state, phase_index, running)
            self._task = asyncio.ensure_future(self._pump(waves, self._queue))

        runtime.call(start())

    @staticmethod
    async def _pump(waves: Any, queue: asyncio.Queue[Any]) -> None:
        try:
            async for outcome in waves:
                queue.put_nowait(outcome)
            queue.put_nowait(None)
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # a step raises it when it takes this wave
            queue.put_nowait(e)

    def continues(self, phase_index: int, wave: int, state: Any) -> bool:
        """Whether this driver's next outcome is wave ``wave`` of ``phase_index`` from ``state``."""
        return (phase_index, wave) == (self.phase_index, self.next_wave) and state is self.state

    def take(self) -> Any:
        """The next wave's :class:`~focus.collector.WaveOutcome`, or ``None`` when the
        phase is done; raises what landing it raised."""
        assert self._queue is not None
        self.runtime.freeze_heap()
        item = self.runtime.call(self._queue.get())
        if isinstance(item, BaseException):
            raise item
        self.last = item
        if item is not None:
            self.next_wave += 1
            self.state = item.scored
        return item

    def stop(self) -> None:
        """Cancel the driver (the waves it launched are the handoff's to cancel)."""
        task, self._task = self._task, None
        if task is not None and not self.runtime.closed:

            async def cancel() -> None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

            self.runtime.call(cancel())
