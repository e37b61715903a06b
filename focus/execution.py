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
jobs' work is kept. A rollout that ends in a bad response (an answer that breaks the
policy contract) is run again with its seed (:data:`BAD_RESPONSE_RERUNS`); one that
still does is never grafted: the wave raises :class:`BadResponses` once it lands
(:func:`check_responses`), a journaled collection records the wave's other rollouts
as unfinished, and a rerun runs the rest with the same jobs (see
:mod:`focus.journal`). The other exception is an outage of the model service: when more than
``max_outage_share`` of a wave's rollouts fail because the service gave no usable
answer within the client's retries (cause ``model service: ...``, or ``bad response:
...`` for an answer that breaks the policy contract), the wave raises
:class:`ModelServiceOutage` as soon as that share is passed, its other jobs are
cancelled, and nothing of it is kept - a rerun computes the wave again once the
service is back, instead of keeping a batch made mostly of failures. Two more stop a
collection because no rerun of a rollout could help, only a setting: answers the
client cannot read (:class:`~focus.policy.UnreadableAnswers`, raised through the
agent and the wave at the first rollout that meets it), and a wave whose every request
was refused whatever it held (:class:`RequestsRefused`, :func:`check_refused`). A
context manager that returns no context (:class:`~focus.context.BrokenContextManager`)
or a branch-point rule that returns nothing (:class:`~focus.branching.BrokenBranchPoints`)
is code to fix, and stops it the same way as the first rollout meets it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import gc
import heapq
import logging
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, cast

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, model_validator

from focus.agent import Piece, Rollout, error_cause
from focus.branching import BrokenBranchPoints
from focus.context import BrokenContextManager
from focus.local_limits import LocalResourceError
from focus.policy import UnreadableAnswers
from focus.refusals import BrokenEnv as BrokenEnv  # beside RequestsRefused
from focus.refusals import RequestsRefused as RequestsRefused  # the name callers know from here
from focus.refusals import check_env_failures as check_env_failures  # the collector's, beside check_outage
from focus.refusals import check_refused
from focus.usage import BAD_RESPONSE, SERVICE, failure_kind

if TYPE_CHECKING:
    from focus.agent import Agent
    from focus.search import RolloutJob

log = logging.getLogger(__name__)

#: Holders of :meth:`Execution.frozen_heap` in this process (see ``Execution.freeze_gc``),
#: counted under ``_FROZEN_LOCK`` (Dask runs shards in threads of one worker process).
_FROZEN_RUNS = 0
_FROZEN_LOCK = threading.Lock()
#: Python's collection thresholds from before the first holder froze the heap.
_THRESHOLDS = gc.get_threshold()
#: Allocations between young collections while the heap is held frozen (Python's
#: default is 700). Each young collection walks every container still young, and
#: during a collection most of those are alive and stay so for a while: the objects of
#: the requests in flight (a few tens of thousands with 512 rollouts running), a
#: wave's jobs and results, a new search state's tree list. Their number does not
#: grow with the threshold, so the walking done per transition falls in proportion as
#: collections are spaced further apart; and each object walked costs more the larger
#: the heap its references point into (cache misses: 58 ns at 2k transitions, 140 ns
#: at 100k over 2,000 tasks). At 20,000, GC took 0.037 ms per transition at 100k over
#: 2,000 tasks (319 young collections, 3 ms each); at 100,000, 0.011 ms (38), and at
#: most 0.005 ms in the other rows (benchmarks/README.md, scale). At 100,000 it was again
#: 0.017-0.021 ms later (the largest part of what FOCUS's rollout CPU spends beyond the
#: loop a user writes with the collector off), at 400,000 0.008-0.009, with the same
#: peak RSS (816-818 MiB; two runs each, load 1.2). Cyclic garbage waits longer (tens of MB).
GC_THRESHOLD_FROZEN = 400_000
#: Objects in the permanent generation that nobody froze. CPython 3.12's collector moves
#: immortal objects there (the tuples of the built-in types: 375 in a fresh 3.12.1, back
#: after every collection), so ``gc.get_freeze_count()`` is never 0 on 3.12 and
#: :func:`frozen_heap`, taking them for someone else's freeze, never froze. Counted when
#: this module is imported on 3.12; 0 on the versions whose collector leaves them alone.
_NOBODYS_FROZEN = gc.get_freeze_count() if sys.version_info[:2] == (3, 12) else 0


def frozen_by_others() -> bool:
    """Whether objects were frozen (``gc.freeze()``) by someone other than
    :func:`frozen_heap` and the interpreter itself."""
    return gc.get_freeze_count() > _NOBODYS_FROZEN


@contextlib.contextmanager
def frozen_heap(enabled: bool = True) -> Iterator[bool]:
    """Keep the objects that exist now out of cyclic GC until the outermost holder
    exits, with young collections spaced by :data:`GC_THRESHOLD_FROZEN`. Holders nest
    and overlap (waves planned ahead, a whole collection, the pipeline's runtime): the
    first freezes, later ones freeze what was created since (O(new objects)), the last
    to exit unfreezes (what is young too: every object goes to the oldest generation)
    and restores the thresholds. A holder does nothing if objects
    were frozen by someone else first. Yields whether this holder froze (a holder may
    ``gc.freeze()`` again to move what it created since into the frozen set)."""
    global _FROZEN_RUNS, _THRESHOLDS
    with _FROZEN_LOCK:
        frozen = enabled and (_FROZEN_RUNS > 0 or not frozen_by_others())
        if frozen:
            _FROZEN_RUNS += 1
            if _FROZEN_RUNS == 1:
                _THRESHOLDS = gc.get_threshold()
                gc.set_threshold(max(_THRESHOLDS[0], GC_THRESHOLD_FROZEN), *_THRESHOLDS[1:])
            gc.freeze()
    try:
        yield frozen
    finally:
        if frozen:
            with _FROZEN_LOCK:
                _FROZEN_RUNS -= 1
                if _FROZEN_RUNS == 0:
                    # what was made since the last freeze (up to GC_THRESHOLD_FROZEN
                    # objects, most alive) joins the rest in the oldest generation
                    # unwalked, instead of in one young collection once the threshold
                    # is back (6 ms, 2.7 us per transition, at the end of a search of 2k)
                    gc.freeze()
                    gc.unfreeze()
                    gc.set_threshold(*_THRESHOLDS)


def refreeze() -> None:
    """``gc.freeze()`` again (O(1): the generations' lists are spliced onto the permanent
    one and the young count starts over) while a :func:`frozen_heap` holder froze: for
    the collector's bulk work between a wave's freezes (``focus.waves``' tail slices),
    whose containers stay alive with the trees. At 100k transitions over 2,000 tasks
    young collections walked them (4 of 150-270 ms, nothing freed). Cyclic garbage made
    meanwhile waits for the last holder's exit, as a wave's does after the next freeze."""
    with _FROZEN_LOCK:
        if _FROZEN_RUNS:
            gc.freeze()


class ModelServiceOutage(RuntimeError):
    """Too many rollouts of a wave failed because the model service gave no usable
    answer within the client's retries. Nothing of the wave is kept; finished waves are,
    by the collection's journal (a collection given none keeps nothing)."""

    def __init__(self, message: str, failed: int = 0, jobs: int = 0, cause: str = "") -> None:
        super().__init__(message)
        self.failed, self.jobs, self.cause = failed, jobs, cause

    def __reduce__(self) -> tuple[Any, ...]:  # crosses process boundaries (Dask shards)
        return (type(self), (str(self), self.failed, self.jobs, self.cause))


def is_service_failure(rollout: Rollout) -> bool:
    """Whether ``rollout`` ended because the model service was out or answered what
    cannot be used (cause ``model service:`` or ``bad response:``)."""
    if not isinstance(rollout, Rollout):
        return False
    leaf = rollout.leaf
    return leaf.kind == "failed" and failure_kind(leaf.cause) in (SERVICE, BAD_RESPONSE)


def outage_limit(share: float, jobs: int) -> float:
    """Service failures a wave of ``jobs`` rollouts tolerates: more than this fail it."""
    return share * jobs


def outage(failed: int, jobs: int, share: float, cause: str) -> ModelServiceOutage:
    return ModelServiceOutage(
        f"model service outage: {failed} of {jobs} rollouts of the wave failed because the model service gave no "
        f"usable answer within the client's retries (more than {share:.0%} fails the wave; nothing of it is kept, "
        f"a rerun computes it again); last cause: {cause}",
        failed,
        jobs,
        cause,
    )


class BadResponses(RuntimeError):
    """Rollouts of a wave got bad responses on every run of them: the wave is not
    grafted, because every later plan depends on it, so nothing after it could be what a
    clean run computes. ``rollouts`` (in job order) and ``wall_s`` are what the wave
    left: a journal records them as the wave's unfinished step, and a rerun runs the
    rollouts that got bad responses again (:func:`is_bad_response`) and keeps the rest."""

    def __init__(
        self, message: str, rollouts: Sequence[Rollout] = (), wall_s: float = 0.0, wave: tuple[int, int] = (0, 0)
    ) -> None:
        super().__init__(message)
        self.rollouts, self.wall_s, self.wave = tuple(rollouts), wall_s, wave

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.rollouts, self.wall_s, self.wave))


def is_bad_response(rollout: Rollout) -> bool:
    """Whether ``rollout`` ended in a bad response (cause ``bad response:``): never
    grafted; in a recorded unfinished wave, a job to run again."""
    return (
        isinstance(rollout, Rollout)
        and rollout.leaf.kind == "failed"
        and failure_kind(rollout.leaf.cause) == BAD_RESPONSE
    )


def check_responses(rollouts: Sequence[Rollout], where: str, wave: tuple[int, int], wall_s: float) -> None:
    """Raise :class:`BadResponses` if any of a wave's ``rollouts`` ended in a bad
    response (``where`` names the wave): one line with their count by cause."""
    bad = [r.leaf.cause for r in rollouts if is_bad_response(r)]
    if bad:
        causes = Counter(c.removeprefix(f"{BAD_RESPONSE}:").strip()[:160] for c in bad).most_common(3)
        raise BadResponses(  # what to do before the causes: a long line is cut at its end
            f"bad responses: {len(bad)} of {len(rollouts)} rollouts of {where} got an answer that cannot be used on "
            f"each of their {1 + BAD_RESPONSE_RERUNS} runs; the collection stops there, its finished rollouts are "
            f"kept: rerun with the same collection id to run them again (by cause: "
            f"{'; '.join(f'{n}x {c}' for c, n in causes)})",
            rollouts,
            wall_s,
            wave,
        )


def check_outage(rollouts: Sequence[Rollout], share: float) -> None:
    """Raise :class:`ModelServiceOutage` if more than ``share`` of ``rollouts`` failed
    because the model service was out, and :class:`RequestsRefused` if it refused every
    one (:func:`check_refused`)."""
    check_refused(rollouts)
    failed = [r for r in rollouts if is_service_failure(r)]
    if len(failed) > outage_limit(share, len(rollouts)):
        raise outage(len(failed), len(rollouts), share, failed[-1].leaf.cause)


class Execution(BaseModel):
    """Runs rollout jobs in-process with bounded concurrency. A frozen pydantic model: a
    subclass's own options are annotated fields, set by keyword (as ``DaskExecution``'s).

    * ``max_concurrency``: rollouts running at once in this process, over every wave.
    * ``max_outage_share``: the share of a wave's rollouts that may fail for want of the
      model service before the wave fails with :class:`ModelServiceOutage` (1.0: never).
    * ``freeze_gc``: keep the trees out of cyclic garbage collection while waves run.
    * ``streaming``: continuation phases refill free slots as rollouts finish instead of
      running in waves (not reproducible as a whole, not resumable per wave);
      ``refill_fraction`` and ``graft_fraction`` pace its refills and grafts.

    The budgets themselves are the search's (:class:`~focus.priority.Phase`); each
    field's comment in the source says why it is set as it is.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: Rollouts running at once in this process, over every wave it runs (waves planned
    #: ahead share the limit; the oldest wave's jobs are admitted first).
    max_concurrency: int = Field(64, ge=1)
    #: A wave fails (:class:`ModelServiceOutage`) once more than this share of its
    #: rollouts failed because the model service gave no usable answer within the
    #: client's retries. With a working service retries leave such failures at ~0 (none
    #: in 15k rollouts at 10% injected faults, benchmarks/README.md), while a service
    #: down for longer than the retry window fails nearly every rollout in flight; 0.1
    #: sits between the two with room either way, and as a share it scales with the
    #: wave. 1.0 never fails a wave (failed rollouts are kept, as before; bad responses
    #: below the share stop the collection all the same: :class:`BadResponses`).
    max_outage_share: float = Field(0.1, ge=0.0, le=1.0)
    #: While a wave runs (and, under ``Collector.search`` and ``Collector.prepare``,
    #: for the whole collection), keep the objects that existed when it started (the
    #: trees and branch states: most of the heap) out of cyclic garbage collection, with
    #: young collections spaced by :data:`GC_THRESHOLD_FROZEN`; put both back afterwards
    #: (:func:`frozen_heap`). Each full collection otherwise walks every node and turn of
    #: every tree, stalling the event loop for up to half a second while serving slots
    #: sit idle (measured in benchmarks/engine.py), and young collections re-walk the
    #: requests in flight (benchmarks/README.md, scale). On by default: the change to
    #: process-wide state lasts only while a holder runs, holders nest (a counter under
    #: a lock, so Dask shards in threads of one worker share it), the last one restores
    #: Python's own thresholds and frozen set, and nothing is done if something else
    #: froze objects first (a preforking server, say). Off leaves the collector alone:
    #: for a process that runs other latency-sensitive work beside the collection.
    freeze_gc: bool = True
    #: Opt-in: continuation phases keep ``max_concurrency`` rollouts in flight instead
    #: of running in waves, so the model service does not drain while a wave's slowest
    #: rollouts finish and the next wave is planned. What the search does then depends
    #: on the order rollouts finish in: a streamed collection is not reproducible as a
    #: whole and is not resumable per wave (the Prefect pipeline runs waves and ignores
    #: this flag). Each rollout is still reproducible from its job: seeds derive from
    #: (collection seed, tree, node, branch). Waves planned ahead
    #: (``Priority.waves_in_flight`` > 1) keep the service busy too, deterministically.
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
    #: event loop -> the semaphore its waves share (one loop per process, usually).
    _limits: dict[Any, asyncio.Semaphore] = PrivateAttr(default_factory=dict)
    #: :meth:`observe_rollouts`' callback (``None``: none).
    _on_rollout: Callable[[Rollout], object] | None = PrivateAttr(default=None)

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        private = dict(state.get("__pydantic_private__") or {})
        private["_limits"], private["_on_rollout"] = {}, None
        return {**state, "__pydantic_private__": private}

    def _limit(self) -> asyncio.Semaphore:
        """The semaphore of the running loop, shared by every wave run on it."""
        loop = asyncio.get_running_loop()
        limits = self._limits
        sem = limits.get(loop)
        if sem is None:
            for old in [k for k in limits if k.is_closed()]:
                del limits[old]
            sem = limits[loop] = asyncio.Semaphore(self.max_concurrency)
        return sem

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
        with self.frozen_heap():
            return await self._run(agent, jobs)

    def observe_rollouts(self, callback: Callable[[Rollout], object] | None) -> None:
        """Call ``callback(rollout)`` on the event loop as each rollout of a wave this
        process runs finishes (``None``: stop); for a display (a collection's progress):
        nothing the search decides reads it. A subclass that runs jobs elsewhere
        (:class:`focus.dask_execution.DaskExecution`) calls it for none."""
        self._on_rollout = callback

    @property
    def reports_jobs(self) -> bool:
        """Whether :meth:`run_reporting` reports each job as it finishes (this class's
        own :meth:`run`; a subclass that runs jobs elsewhere returns them all at once)."""
        return type(self).run is Execution.run

    async def run_reporting(
        self, agent: Agent, jobs: list[RolloutJob] | JobFeed, on_done: Callable[[int, Rollout], None]
    ) -> list[Rollout]:
        """:meth:`run`, calling ``on_done(index, rollout)`` on the event loop as each job
        finishes (at the end, for all jobs, where :attr:`reports_jobs` is false): what lets
        the collector graft a tree while the rest of its wave still runs. ``jobs`` may be
        a :class:`JobFeed` still being planned where :attr:`reports_jobs` is true."""
        if not self.reports_jobs:
            if isinstance(jobs, JobFeed):
                raise TypeError(f"{type(self).__name__} runs a wave's jobs all at once: give it the list")
            out = await self.run(agent, jobs)
            for i, rollout in enumerate(out):
                on_done(i, rollout)
            return out
        with self.frozen_heap():
            return await self._run(agent, jobs, on_done)

    def frozen_heap(self) -> contextlib.AbstractContextManager[bool]:
        """:func:`frozen_heap`, if ``freeze_gc``."""
        return frozen_heap(self.freeze_gc)

    def launch(self, agent: Agent, job: RolloutJob) -> asyncio.Task[Rollout]:
        """Start one job now on the running loop (streaming mode; the caller bounds how
        many run at once). The task raises only what :func:`_guarded` lets through: a
        crash becomes a failed rollout."""
        return asyncio.ensure_future(_guarded(agent, job))

    async def _run(
        self,
        agent: Agent,
        jobs: list[RolloutJob] | JobFeed,
        on_done: Callable[[int, Rollout], None] | None = None,
    ) -> list[Rollout]:
        feed = jobs if isinstance(jobs, JobFeed) else JobFeed(jobs, closed=True)
        seen = self._on_rollout
        sem = self._limit()
        failed = 0
        # Start the jobs with the most steps left first (fewest steps taken: the best
        # guess without a model of the task), so a wave's tail is made of short rollouts
        # and slots do not sit idle behind a few long ones started last; of a feed's
        # jobs, those handed over by the time a slot takes its next one. Jobs from one
        # start state follow each other, so that siblings freed slots take in one turn
        # of the loop send their first calls as one request (focus.siblings).
        waiting: list[tuple[int, int, int]] = []
        out: list[Rollout | None] = []
        first: dict[int, int] = {}  # id of a start state -> its first job's index
        more = asyncio.Event()  # for this coroutine, while nothing is handed over
        idle = _Idle()  # workers waiting for a feed's next jobs

        def take() -> int | None:
            while len(out) < len(feed.jobs):
                i = len(out)
                start = feed.jobs[i].start
                heapq.heappush(waiting, (start.steps, first.setdefault(id(start), i), i))
                out.append(None)
            return heapq.heappop(waiting)[2] if waiting else None

        async def worker() -> None:
            # A slot, once admitted, runs this wave's next job until none are left, so a
            # wave planned ahead waits for the slots this one gives up (oldest wave
            # first), and only ``max_concurrency`` rollouts of a wave exist at a time:
            # a wave of thousands does not park thousands of tasks on the semaphore.
            nonlocal failed
            async with sem:
                while (i := take()) is not None or not feed.closed:
                    if i is None:  # a feed still being planned: wait for its next jobs
                        await idle.wait()
                        continue
                    rollout = out[i] = await _guarded(agent, feed.jobs[i])
                    if on_done is not None:
                        on_done(i, rollout)
                    if seen is not None:
                        seen(rollout)
                    if is_service_failure(rollout):
                        failed += 1
                        if feed.closed and failed > outage_limit(self.max_outage_share, len(feed.jobs)):
                            raise outage(failed, len(feed.jobs), self.max_outage_share, rollout.leaf.cause)

        workers: list[asyncio.Future[None]] = []

        def grow() -> None:
            more.set()
            # as many idle workers as there are jobs not taken yet; all once the feed is closed
            idle.wake(len(idle) if feed.closed else len(feed.jobs) - len(out) + len(waiting))
            while len(workers) < min(len(feed.jobs), self.max_concurrency):
                workers.append(asyncio.ensure_future(worker()))

        feed.listener = grow
        grow()
        try:
            while not feed.closed or not all(w.done() for w in workers):
                if workers:
                    await asyncio.gather(*workers)
                else:  # nothing handed over yet
                    more.clear()
                    await more.wait()
            await asyncio.gather(*workers)  # raise what a worker raised
        except BaseException:
            # an outage (or a cancelled wave): stop the rest now, not after their retries
            for t in workers:
                t.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
            raise
        finally:
            feed.listener = None
        return cast("list[Rollout]", out)


class _Idle:
    """Workers of one wave waiting for its feed's next jobs, woken first come, first
    served, only as many as there are jobs to take (:meth:`wake`).

    One ``asyncio.Event`` for all of them woke every idle worker at each slice of a
    wave being chosen (:data:`focus.waves.CHOOSE_SLICE` jobs), and at 512 rollouts in
    flight most of them found nothing and waited again, each wait a future, a task step
    and a pass over the feed: at 10k transitions over 40 tasks the loop made 2.07
    futures per transition with one event, 1.52 with this (the loop a user would write:
    1.26; benchmarks/README.md, scale). Which worker runs a job does not change
    the job or its rollout, nor the order jobs are taken in (:meth:`Execution._run`'s
    heap), so the rollouts are the same."""

    def __init__(self) -> None:
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    def __len__(self) -> int:
        return len(self._waiters)

    async def wait(self) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        await fut

    def wake(self, n: int) -> None:
        """Wake up to ``n`` waiting workers, those waiting longest first (a cancelled
        one is skipped: its task is gone). A worker woken for a job another took first
        waits again."""
        waiters = self._waiters
        while n > 0 and waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                n -= 1


class JobFeed:
    """A wave's jobs handed to :meth:`Execution.run_reporting` as they are planned
    (:class:`focus.search.WaveChoice`), in plan order: the first ones run while the rest
    of the wave is chosen, instead of the model service waiting for the whole plan.
    :meth:`close` once every job is in. The jobs and their seeds are the plan's, so
    the rollouts are those of running the whole plan at once; only when each starts
    differs. Too many failures for the outage share raise once the feed is closed
    (the share is of the whole wave)."""

    def __init__(self, jobs: Sequence[RolloutJob] = (), closed: bool = False) -> None:
        self.jobs: list[RolloutJob] = list(jobs)
        self.closed = closed
        #: Told of every change (the running wave starts slots for new jobs).
        self.listener: Callable[[], None] | None = None

    def add(self, jobs: Sequence[RolloutJob]) -> None:
        if self.closed:
            raise ValueError("the feed is closed: its wave is planned")
        self.jobs.extend(jobs)
        if self.listener is not None:
            self.listener()

    def close(self) -> None:
        self.closed = True
        if self.listener is not None:
            self.listener()


#: Times a rollout that ended in a bad response is run again before it counts as
#: failed. A rollout is a pure function of its job's seed and the answers it gets, so a
#: run again against a server that answers properly this time gives the rollout a clean
#: run would have had: a passing misbehaviour costs one more rollout, not a hole in
#: the batch. One that persists is never grafted (:class:`BadResponses`; counted toward
#: the outage share): a rerun of the collection runs it again.
BAD_RESPONSE_RERUNS = 2


async def _guarded(agent: Agent, job: RolloutJob) -> Rollout:
    """The job's rollout, run again (same seed) while it ends in a bad response, at
    most :data:`BAD_RESPONSE_RERUNS` times; a rollout that raises comes back as a
    failed one (cause ``error: ...``), not run again. The exceptions it lets through
    are those every rollout would meet: :class:`~focus.policy.UnreadableAnswers`,
    :class:`~focus.context.BrokenContextManager`, :class:`~focus.branching.BrokenBranchPoints`
    and :class:`~focus.local_limits.LocalResourceError` (this machine out of files or ports).

    One coroutine for every run: each one between the worker and the rollout is resumed
    on every model call of it, and continuations are short (1-2 calls), so a frame more
    per rollout costs about as much as one more per call."""
    for run in range(BAD_RESPONSE_RERUNS + 1):
        t0 = time.perf_counter()
        try:
            rollout = await agent.rollout(job.start, job.seed)
        except (UnreadableAnswers, BrokenContextManager, BrokenBranchPoints, LocalResourceError):
            raise  # every rollout would meet it again: the wave (and collection) stops
        except Exception as e:  # noqa: BLE001 - one broken rollout must not lose the wave
            log.warning("rollout from node %s of tree %s failed: %r", job.node_id, job.tree_index, e)
            return failed_rollout(job, error_cause(e), time.perf_counter() - t0)
        if not (isinstance(rollout, Rollout) and rollout.leaf.kind == "failed"):
            return rollout
        if run == BAD_RESPONSE_RERUNS or failure_kind(rollout.leaf.cause) != BAD_RESPONSE:
            return rollout
        log.info(
            "rollout from node %s of tree %s: %s; running it again", job.node_id, job.tree_index, rollout.leaf.cause
        )
    raise AssertionError("unreachable: the last run returns")


def failed_rollout(job: RolloutJob, cause: str, wall_s: float = 0.0) -> Rollout:
    """A rollout that produced nothing but a failed leaf (used for crashed jobs)."""
    leaf = Piece((), "failed", job.start.steps, job.start.context.prompt_ids, cause=cause)
    return Rollout(job.start.task.id, (leaf,), wall_s, {})
