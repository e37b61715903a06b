"""The execution service: where and how concurrently rollout jobs run.

:class:`Execution` runs a wave's jobs in this process on asyncio, at most
``max_concurrency`` at once (the model service is the bottleneck; rollouts mostly
wait on it). Subclasses run elsewhere - ``focus.dask_execution.DaskExecution`` ships
shards of jobs to Dask workers, each of which runs its shard with this class.

With ``streaming=True`` the collector runs continuation phases without wave barriers:
it keeps up to ``max_concurrency`` rollouts in flight, grafting each as it finishes and
refilling from :func:`focus.search.plan_refill` (see :meth:`focus.collector.Collector.
stream_phase`). This class then only starts single jobs (:meth:`launch`); every
decision stays in the planner.

A job that raises is not allowed to take the wave down with it: it comes back as a
rollout ending in a ``failed`` leaf whose cause names the exception, and the other
jobs' work is kept.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from typing import TYPE_CHECKING, ClassVar

from pydantic import BaseModel, ConfigDict, Field, model_validator

from focus.agent import Piece, Rollout

if TYPE_CHECKING:
    from focus.agent import Agent
    from focus.search import RolloutJob

log = logging.getLogger(__name__)


class Execution(BaseModel):
    """Runs rollout jobs in-process with bounded concurrency."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_concurrency: int = Field(64, ge=1)
    #: While a wave runs, keep the objects that existed when it started (the trees and
    #: branch states: most of the heap) out of cyclic garbage collection, and put them
    #: back afterwards. Each full collection otherwise walks every node and turn of every
    #: tree, stalling the event loop for up to half a second while serving slots sit
    #: idle (measured in benchmarks/engine.py). Skipped if the caller froze objects itself;
    #: finding that out walks every frozen object (``gc.get_freeze_count`` counts a
    #: list), so a caller that keeps objects frozen across waves passes ``False``.
    freeze_gc: bool = True
    #: Opt-in: continuation phases keep ``max_concurrency`` rollouts in flight instead
    #: of running in waves, so the model service does not drain while a wave's slowest
    #: rollouts finish and the next wave is planned. What the search does then depends
    #: on the order rollouts finish in: a streamed collection is not reproducible as a
    #: whole and is not resumable per wave (the Prefect pipeline runs waves and ignores
    #: this flag). Each rollout is still reproducible from its job: seeds derive from
    #: (collection seed, tree, node, branch). The default, wave-synchronous mode is
    #: deterministic and unchanged.
    streaming: bool = False
    #: Streaming mode: refill once this share of ``max_concurrency`` is free (planning
    #: costs a pass over every tree, so not after every single rollout) ...
    refill_fraction: float = Field(1 / 8, gt=0.0, le=1.0)
    #: ... and graft finished rollouts once this multiple of ``max_concurrency`` has
    #: piled up (may exceed 1: finished rollouts hold no slot). A graft re-ranks every
    #: tree it touches, which costs in proportion to the tree, so grafting after every
    #: rollout would cost more CPU than the rollouts; smaller values plan on fresher
    #: trees, larger ones on fewer re-rankings (benchmarks/README.md, engine section).
    graft_fraction: float = Field(1.0, gt=0.0)
    #: Whether this class runs streamed jobs the way it runs waves. A subclass that
    #: overrides :meth:`run` to send jobs elsewhere (Dask) does not stream through
    #: :meth:`launch` unless it says so.
    supports_streaming: ClassVar[bool] = True

    @model_validator(mode="after")
    def _can_stream(self) -> Execution:
        cls = type(self)
        if self.streaming and cls.run is not Execution.run and "supports_streaming" not in cls.__dict__:
            raise ValueError(
                f"{cls.__name__} runs jobs its own way (it overrides run) and does not declare "
                "supports_streaming; streaming=True would run them in this process instead"
            )
        if self.streaming and not cls.supports_streaming:
            raise ValueError(f"{cls.__name__} does not support streaming=True")
        return self

    async def run(self, agent: Agent, jobs: list[RolloutJob]) -> list[Rollout]:
        """One rollout per job, in job order."""
        frozen = self.freeze_gc and gc.get_freeze_count() == 0
        if frozen:
            gc.freeze()
        try:
            return await self._run(agent, jobs)
        finally:
            if frozen:
                gc.unfreeze()

    def launch(self, agent: Agent, job: RolloutJob) -> asyncio.Task[Rollout]:
        """Start one job now on the running loop (streaming mode; the caller bounds how
        many run at once). The task never raises: a crash becomes a failed rollout."""
        return asyncio.ensure_future(_guarded(agent, job))

    async def _run(self, agent: Agent, jobs: list[RolloutJob]) -> list[Rollout]:
        sem = asyncio.Semaphore(self.max_concurrency)

        async def one(job: RolloutJob) -> Rollout:
            async with sem:
                return await _guarded(agent, job)

        # Start the jobs with the most steps left first (fewest steps taken: the best
        # guess without a model of the task), so a wave's tail is made of short rollouts
        # and slots do not sit idle behind a few long ones started last. The semaphore
        # admits waiters in order; results still come back in job order.
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].start.steps)
        done = await asyncio.gather(*(one(jobs[i]) for i in order))
        out: list[Rollout] = [done[0]] * len(jobs) if jobs else []
        for i, rollout in zip(order, done, strict=True):
            out[i] = rollout
        return out


async def _guarded(agent: Agent, job: RolloutJob) -> Rollout:
    t0 = time.perf_counter()
    try:
        return await agent.rollout(job.start, job.seed)
    except Exception as e:  # noqa: BLE001 - one broken rollout must not lose the wave
        log.warning("rollout from node %s of tree %s failed: %r", job.node_id, job.tree_index, e)
        return failed_rollout(job, f"error: {type(e).__name__}: {e}", time.perf_counter() - t0)


def failed_rollout(job: RolloutJob, cause: str, wall_s: float = 0.0) -> Rollout:
    """A rollout that produced nothing but a failed leaf (used for crashed jobs)."""
    leaf = Piece((), "failed", job.start.steps, job.start.context.prompt_ids, cause=cause)
    return Rollout(job.start.task.id, (leaf,), wall_s, {})
