"""The live side of a collection's waves: what runs on the event loop, what landed, and
the work done on a wave's trees while the rest of the wave still runs.

A wave ends in a barrier: nothing is in flight while its rollouts are grafted, the new
nodes scored and the next wave planned, and most of that time went into bringing each
touched tree's ranking up to date (benchmarks/README.md, scale). None of it needs the
whole wave: a tree's share of the graft needs only that tree's rollouts, its scores only
the critic's predictions for its own nodes, and its ranking only those and the
calibration the wave was planned under. :class:`WaveTail` does that share as soon as the
last of a tree's jobs in the wave has finished (:func:`focus.search.graft_tree`,
:func:`focus.search.score_tree`, on the event loop a few trees at a time between the
rollouts' own callbacks), so that at the barrier only the
trees that finished last, the merge (:func:`focus.search.graft` with ``ahead``) and the
next plan's greedy selection remain. Every part is the same pure function of the state,
the plan and the tree's rollouts whichever order trees finish in, so the states, plans
and batches are those of grafting everything at the barrier.

Before a graft that may fit a new calibration on its own trees (the evidence's, and in
a small collection one at a power of two of waves,
:meth:`focus.search.SearchState.may_refit`), the tail also computes what that fit reads
of each tree, its noise rows, counts and spreads (for the trees the wave does not touch
first, then each tree as it is scored), and for the evidence trees the parts of their
first ranking that no calibration changes (edge segments, tie-breaks): the fit at the
barrier joins the trees' rows, and the rankings it makes new are built on those parts.
A fit and a ranking read the same numbers either way. Once the fit rests on
:data:`focus.search.LAG_SPREADS` spreads a refit lags its waves by one
(:data:`focus.search.REFIT_LAG`): it reads only trees the state before the graft has,
so the tail of the wave whose graft brings it in fits it and ranks every tree under it
while the wave runs, the trees the wave touches as they are scored and the others
whenever no tree is ready (:meth:`focus.search.SearchState.next_calibration`).

The next wave then starts as it is chosen (:func:`launch_choosing`): once every tree's
ranking is up to date, the greedy choice hands its jobs to the running wave
(:class:`focus.execution.JobFeed`) a slice at a time, the loop starting each slice
before the next is taken, so the model service waits for the rankings but not for the
whole choice; a wave's leading exploration picks, which need no ranking, start even
before the calibration is fitted and the rankings built. The trees of a wave still being chosen are grafted once it is whole
(:meth:`WaveTail.complete`): a tree may get more jobs until then.

Scoring ahead asks the critic about a few trees' nodes at a time instead of the whole
wave's at once, so it is done only for a critic whose prediction of a context does not
depend on the other contexts of the call (:attr:`focus.critic.Critic.row_wise`); with
another critic the trees are grafted ahead and scored and ranked at the barrier, as
before.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from focus.agent import Rollout
from focus.critic import Critic, check_predictions, context_label
from focus.execution import Execution, JobFeed, is_bad_response, refreeze
from focus.placement import choice_s, placed
from focus.priority import Priority
from focus.search import (
    Predictions,
    RolloutJob,
    SearchState,
    TreeWave,
    WaveChoice,
    WavePlan,
    graft_tree,
    last_wave,
    plan_begin,
    plan_choose,
    plan_chosen,
    plan_lead,
    plan_rank,
    score_tree,
)

log = logging.getLogger(__name__)
_T = TypeVar("_T")


@dataclass
class Launched:
    """A wave whose rollouts are running on the event loop."""

    plan: WavePlan
    task: asyncio.Future[list[Rollout]]
    t0: float
    #: Its trees whose jobs have all finished, grafted ahead (``None``: the execution
    #: service returns a wave's rollouts only all at once).
    tail: WaveTail | None = None


@dataclass(frozen=True)
class Landed:
    """A wave whose rollouts came back and were grafted (what a pipeline stores)."""

    plan: WavePlan
    rollouts: tuple[Rollout, ...]
    #: Elapsed time the wave accounts for: since the previous wave of the phase landed
    #: (or, for the first, since it was launched). Summed over waves: the phase's wall time.
    wall_s: float
    #: The critic's predictions for the trees scored while the wave ran (:class:`WaveTail`),
    #: already in the grafted state; the wave's other new nodes are scored after it lands.
    predictions: Predictions = field(default_factory=dict)


@dataclass(frozen=True)
class WaveOutcome:
    """One continuation wave as :meth:`focus.collector.Collector.phase_waves` yields it."""

    landed: Landed
    #: The state with the wave grafted (what the wave's checkpoint holds); the trees
    #: scored while the wave ran (``landed.predictions``) hold their scores already.
    grafted: SearchState
    #: The critic's predictions for the checkpoints the wave added (empty if it failed).
    predictions: Predictions
    #: ``grafted`` with ``predictions``, its next waves planned and launched; ``None``
    #: when scoring failed.
    scored: SearchState | None
    #: Why scoring failed, if it did.
    error: Exception | None = None


@dataclass
class Running:
    """The live side of a phase's planned waves: those launched on this event loop and
    not landed yet. It holds no search data, so losing it (a crash) loses only running
    rollouts, which a resumed collection launches again with the same jobs.
    """

    waves: dict[tuple[int, int], Launched] = field(default_factory=dict)
    #: When the last wave landed.
    mark: float | None = None

    async def cancel(self) -> None:
        """Cancel the running waves and wait until they have stopped."""
        tasks = [w.task for w in self.waves.values()]
        self.waves.clear()
        self.mark = None
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


class WaveTail:
    """Which of a running wave's trees have all their jobs finished, and those trees
    grafted (and scored, and ranked) ahead of the barrier: :meth:`done` is the execution
    service's report of one job (:meth:`focus.execution.Execution.run_reporting`),
    :meth:`follow` does the work while the wave runs."""

    def __init__(self, plan: WavePlan, complete: bool = True) -> None:
        self.plan = plan
        self.rollouts: list[Rollout | None] = []
        #: Each tree's jobs, by position in the plan (in plan order).
        self._jobs: dict[int, list[int]] = {}
        self._left: dict[int, int] = {}
        #: Each job's tree, by position in the plan.
        self._tree: list[int] = []
        self._ready: list[int] = []
        self._event = asyncio.Event()
        #: Whether every job of the wave is in (:meth:`complete`): a tree is ready once
        #: its jobs have finished and no more can come.
        self._complete = False
        #: A rollout got a bad response: the wave will not be grafted, nothing more is done.
        self.stopped = False
        #: When the last job finished.
        self.finished_at: float | None = None
        #: Trees grafted ahead, by tree index, and the predictions of those scored.
        self.parts: dict[int, TreeWave] = {}
        self.predictions: dict[tuple[int, int], tuple[float | None, float | None]] = {}
        self._prefit: Priority | None = None
        #: Prefit the noise rows alone (a wave expected to end the search).
        self._rows_only = False
        self._rank = True
        #: Whether the graft will fit a new calibration, as the trees come in (``prefit``).
        self._refit: _Refit | None = None
        #: Rank the trees the wave does not touch too, under the calibration (a wave
        #: chosen before its calibration was fitted, :func:`launch_choosing`).
        self.rank_rest = False
        self.add(plan.jobs)
        if complete:
            self.complete(plan)

    def add(self, jobs: Sequence[RolloutJob]) -> None:
        """The wave's next jobs, in plan order (a wave launched as it is chosen,
        :func:`launch_choosing`)."""
        for job in jobs:
            self._jobs.setdefault(job.tree_index, []).append(len(self.rollouts))
            self._left[job.tree_index] = self._left.get(job.tree_index, 0) + 1
            self._tree.append(job.tree_index)
            self.rollouts.append(None)

    def complete(self, plan: WavePlan) -> None:
        """Every job is in: ``plan`` is the wave's (its jobs those added, in order)."""
        self.plan, self._complete = plan, True
        ready = [ti for ti, n in self._left.items() if not n]
        if ready:
            self._ready.extend(ready)
            self._event.set()

    def done(self, index: int, rollout: Rollout) -> None:
        self.rollouts[index] = rollout
        if is_bad_response(rollout):
            self.stopped = True
        ti = self._tree[index]
        self._left[ti] -= 1
        if not self._left[ti] and self._complete:
            self._ready.append(ti)
            self._event.set()

    async def follow(
        self,
        state: SearchState,
        task: asyncio.Future[Any],
        phase_name: str,
        score: tuple[Priority, Critic] | None = None,
        prefit: Priority | None = None,
        rank: bool = True,
    ) -> None:
        """Graft each tree of the wave onto ``state`` (the state the wave is grafted onto)
        once its jobs have finished, a batch of the trees ready at a time, until ``task``
        (the wave) is done and every tree is grafted; with ``score`` (the search and a
        row-wise critic), score them and, with ``rank``, bring their rankings up to date
        too (not for the evidence: the first plan's calibration is fitted on all of it),
        under the calibration the graft's state will have
        (:meth:`focus.search.SearchState.next_calibration`). Returns early, leaving the
        rest to the barrier, when the wave failed or got a bad response. With ``score``
        and ``rank``, and no ``prefit``, where the graft brings in a new calibration
        (:meth:`focus.search.SearchState.refits_next`) or with :attr:`rank_rest` (a
        wave of exploration picks chosen before the calibration's fit), whenever no tree
        is ready it ranks the trees the wave does not touch under that calibration
        (fitting it first), until the wave is done: after the evidence of many tasks the
        first plan's rankings (about a second at 100k transitions over 2,000 tasks), and
        after a refit every tree's, run while the wave's model calls do, and the next
        plan ranks what is left.

        ``prefit`` (the search, when the graft may fit a new calibration on its own
        trees, :meth:`focus.search.SearchState.may_refit`, or for a wave expected to end
        the search, :func:`focus.search.last_wave`): compute what that fit reads of each
        tree (:meth:`_TreeFacts.prefit`; after the last wave, the rows of the batch's
        noise fit alone) here too, first for the trees the wave does not touch, then for
        each tree as it is grafted (its noise rows once it is scored), so the fit at the
        barrier only joins them; rank a tree only once the graft is known not to refit
        (:class:`_Refit`), and once the wave has finished, rank no more trees: the plan
        ranks them in the same barrier, or, under a new calibration, ranks every tree
        again (at 40k transitions over 40 tasks, whose trees finish only as their wave
        ends, 0.1-0.2 s of each refit's barrier went into rankings the refit threw away).

        Cancelled (an interrupted notebook cell, a timeout around the search), it cancels
        the wave and waits until it has stopped: nothing else awaits it then, and its
        rollouts kept calling the model service on the loop until they finished."""
        try:
            await self._follow(state, task, phase_name, score, prefit, rank)
        except asyncio.CancelledError:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            raise

    async def _follow(
        self,
        state: SearchState,
        task: asyncio.Future[Any],
        phase_name: str,
        score: tuple[Priority, Critic] | None,
        prefit: Priority | None,
        rank: bool,
    ) -> None:
        if task.done():
            self.finished_at = time.perf_counter()
        else:
            task.add_done_callback(lambda _: setattr(self, "finished_at", time.perf_counter()))
        self._prefit, self._rank = prefit, rank
        self._rows_only = prefit is not None and last_wave(state, prefit, self.plan)
        if prefit is not None and score is not None and rank:
            self._refit = _Refit(state, prefit, len(self.plan.jobs))
        unranked: list[int] = []
        if prefit is not None:
            await _sliced(lambda ti: state.facts(ti).prefit(prefit, rows_only=self._rows_only), self._rest(state))
        elif score is not None and rank and (self.rank_rest or state.refits_next(score[0])):
            unranked = self._rest(state)[::-1]
        while not self.stopped:
            if not self._ready:
                if task.done():
                    return
                if unranked and score is not None:  # nothing to graft: rank a slice of the rest
                    self._rank_some(state, score[0], unranked)
                    await asyncio.sleep(0)
                    continue
                waiter = asyncio.ensure_future(self._event.wait())
                try:
                    await asyncio.wait((task, waiter), return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
                self._event.clear()
                continue
            if task.done() and (task.cancelled() or task.exception() is not None):
                return
            if task.done() and prefit is not None:
                # nothing in flight any more: ranking now or at the plan costs the same
                # barrier time, and if the graft fits a new calibration the plan ranks
                # every tree again, so leave the rest of the ranking to the plan
                self._rank = False
            trees, self._ready = self._ready, []
            parts = await _sliced(lambda ti: self._graft(state, ti, phase_name), trees)
            if self._refit is not None:
                self._refit.add(state, parts)
            if score is not None:
                parts, score = await self._score(state, parts, *score)
            self.parts.update((p.tree_index, p) for p in parts)

    def _rest(self, state: SearchState) -> list[int]:
        """The trees the wave does not touch (a pass over every tree: only where the tail
        works on them)."""
        return [ti for ti in range(len(state.trees)) if ti not in self._jobs]

    def _rank_some(self, state: SearchState, search: Priority, unranked: list[int]) -> None:
        """Rank trees of ``unranked`` (taken from its end) under the calibration the
        graft's state will have, for :data:`SLICE_S` (the first call fits it)."""
        calib = state.next_calibration(search) or state.calibration(search)
        pi, seed = self.plan.phase_index, state.seed
        t = time.perf_counter()
        while unranked and time.perf_counter() - t < SLICE_S:
            state.facts(unranked.pop()).ranked(search, calib, pi, seed)
        refreeze()  # the rankings made stay alive (see _sliced)

    def _graft(self, state: SearchState, ti: int, phase_name: str) -> TreeWave:
        jobs = self._jobs[ti]
        rollouts = [self.rollouts[i] for i in jobs]
        part = graft_tree(state, self.plan, ti, rollouts, phase_name, jobs)  # type: ignore[arg-type]
        if self._prefit is not None and not self._rows_only:
            part.facts.prefit(self._prefit, scored=False)
        return part

    def _scored(
        self, state: SearchState, search: Priority, part: TreeWave, preds: Predictions, calib: Any, rank: bool
    ) -> TreeWave:
        part = score_tree(state, search, part, preds, rank, calib)
        if self._prefit is not None:
            part.facts.prefit(self._prefit, seed=state.seed, rows_only=self._rows_only)
        return part

    async def _score(
        self, state: SearchState, parts: list[TreeWave], search: Priority, critic: Critic
    ) -> tuple[list[TreeWave], tuple[Priority, Critic] | None]:
        """``parts`` scored by one call of ``critic`` and ranked; unscored, and scoring
        given up for the rest of the wave, if the critic fails (the barrier asks it again)."""
        keys = [k for p in parts for k in p.unscored]
        preds: dict[tuple[int, int], tuple[float | None, float | None]] = {}
        if keys:
            trees = {p.tree_index: p.tree for p in parts}
            try:
                got = await critic.predict_with_std([trees[ti].nodes[nid].context_ids for ti, nid in keys])
                label = context_label(trees, keys)
                checked = check_predictions(got, len(keys), f"critic {type(critic).__name__}", label)
            except Exception as e:  # noqa: BLE001 - scoring at the barrier raises it where it is handled
                log.debug("scoring ahead of the barrier failed (%r); the barrier scores the rest", e)
                return parts, None
            preds = {k: (p.value, p.std) for k, p in zip(keys, checked, strict=True)}
        by_tree: dict[int, dict[tuple[int, int], tuple[float | None, float | None]]] = {}
        for key, value in preds.items():
            by_tree.setdefault(key[0], {})[key] = value
        # the calibration the graft's state will have where that is known (no refit, or a
        # lagged one); else a tree ranked under a calibration the graft replaces is
        # ranked again: until the graft is known to keep it, the next plan ranks the tree
        calib = (state.next_calibration(search) or state.calibration(search)) if self._rank else None
        rank = self._rank and (self._refit is None or self._refit.verdict is False)
        scored = await _sliced(
            lambda p: self._scored(state, search, p, by_tree.get(p.tree_index, {}), calib, rank), parts
        )
        self.predictions.update(preds)
        return scored, (search, critic)


class _Refit:
    """Whether grafting a wave that may fit a new calibration
    (:meth:`focus.search.SearchState.may_refit`) will, told as its trees are grafted:
    the spreads of the state with the trees grafted so far only grow with the rest, by
    at most one per job (:meth:`focus.search.SearchState.refit_floor`). Rankings made
    under the calibration a refit replaces are thrown away (at 10k transitions over 200
    tasks the first continuation wave's were 68 ms of CPU, a seventh of the search's),
    so the tail ranks a tree only once the graft is known not to refit; the trees scored
    before that are ranked by the next plan under whichever calibration it has, as at a
    barrier (in the scale benchmark's collections from 10k to 40k transitions, every
    wave whose graft refit was known to by the time its first trees were scored)."""

    def __init__(self, state: SearchState, search: Priority, jobs: int) -> None:
        self.floor = state.refit_floor(search)
        self.spreads = state.spread_count(len(state.waves))
        self.open = jobs  # jobs of the trees not grafted yet

    def add(self, state: SearchState, parts: list[TreeWave]) -> None:
        for p in parts:
            self.spreads += p.facts.spreads - state.facts(p.tree_index).spreads
            self.open -= p.records

    @property
    def verdict(self) -> bool | None:
        """True: the graft refits; False: it does not; None: not known yet."""
        if self.floor is None or self.spreads + self.open < self.floor:
            return False
        return True if self.spreads >= self.floor else None


#: Longest stretch (seconds) the tail's work holds the event loop before it lets the
#: loop serve the rollouts still in flight. Between two slices the loop runs one pass
#: over everything ready, which with hundreds of rollouts in flight takes longer than
#: a slice: with 5 ms slices the tail fell behind while the wave ran and caught up only
#: after its last call (0.1-0.4 s of each barrier at 40k/800 and 100k/2,000 tasks).
#: With 20 ms, one run each at load 6-8 on 2 cores: idle share 0.095 -> 0.069 at 40k
#: transitions over 800 tasks, 0.110 -> 0.066 at 100k over 2,000, the collections'
#: lengths the same within 8% (36.3 -> 33.5 s, 100.7 -> 101.1 s); an answer waits at
#: most this long for the loop, against the model call's own milliseconds to seconds.
SLICE_S = 0.02


async def _sliced(fn: Callable[[Any], _T], items: list[Any]) -> list[_T]:
    """``[fn(item) for item in items]`` on the event loop, yielding to it whenever
    :data:`SLICE_S` has passed: one tree's share takes about a millisecond, so the loop
    goes on serving the wave's rollouts between trees. In a worker thread
    (:func:`focus.placement.off_loop`) the work took the GIL whenever the loop blocked
    on I/O, its share set by the interpreter's switch interval rather than by the loop; back to back at
    100k transitions over 2,000 tasks (one run each, load 8-10 on 2 cores) it hid less
    of the barrier than these slices (idle share 0.187 against 0.164; 0.264 before)."""
    out = []
    refreeze()
    t = time.perf_counter()
    for item in items:
        out.append(fn(item))
        if time.perf_counter() - t > SLICE_S:
            refreeze()  # what the slice made (trees, rows, rankings) stays alive: kept out of young collections
            await asyncio.sleep(0)
            t = time.perf_counter()
    refreeze()
    return out


def merged_predictions(*parts: Predictions) -> dict[tuple[int, int], tuple[float | None, float | None]]:
    """Predictions of one wave made in parts (ahead of the barrier, at it), in the order
    one call at the barrier would have made them (:func:`focus.search.unscored`'s: by
    tree, each tree's nodes in its own order; a tree is scored in one part)."""
    items = [kv for p in parts for kv in p.items()]
    items.sort(key=lambda kv: kv[0][0])  # stable: each tree's nodes keep their order
    return dict(items)


#: Jobs the greedy choice hands over at a time while it chooses a wave
#: (:func:`launch_choosing`): about a millisecond of choosing each, between which the
#: event loop starts the jobs handed over.
CHOOSE_SLICE = 64


async def launch_choosing(
    execution: Execution, agent: Any, search: Priority, state: SearchState, phase_index: int, running: Running
) -> SearchState | None:
    """:func:`focus.search.plan_next` for a continuation wave, its jobs started as they
    are chosen: the rankings are brought up to date (in a worker thread where that is
    long, :mod:`focus.placement`), then the greedy
    choice takes :data:`CHOOSE_SLICE` jobs at a time on the loop, each slice handed to
    the running wave (a :class:`focus.execution.JobFeed`) before the next is taken, so
    the model service has the wave's first jobs while the rest is chosen instead of
    waiting for the whole plan (the choice was most of a barrier's length after a wave
    without a refit, benchmarks/README.md, scale). Where the wave starts with slots
    drawn for exploration, which need no ranking, those are handed over first and the
    calibration's fit and the rankings (after the evidence or a refit, most of what was
    left of the barrier) run in a worker thread while they do (:func:`_after_lead`);
    a wave that is all such picks leaves them to its tail (:attr:`WaveTail.rank_rest`).
    The wave is in ``running`` with its plan once chosen. The same plan as :func:`focus.search.plan_next`; ``None`` where
    that plans no continuation wave (evidence, or the waves in flight are planned), or
    where ``execution`` takes a wave's jobs only all at once: the caller plans as before."""
    if not execution.reports_jobs:
        return None
    begin_s, rank_s = choice_s(state, search)
    begun = await placed(begin_s, _begin, state, search, phase_index)
    if begun is None:
        return None
    c, first = begun
    if not first:  # no leading exploration picks
        first = await _after_lead(c, rank_s)
    if not first:
        return plan_chosen(c)
    tail = WaveTail(WavePlan(phase_index, c.wave_index), complete=False)
    tail.add(first)
    feed = JobFeed(first)
    task = asyncio.ensure_future(execution.run_reporting(agent, feed, tail.done))
    key = (phase_index, c.wave_index)
    launched = running.waves[key] = Launched(tail.plan, task, time.perf_counter(), tail)
    try:
        while not c.done:
            await asyncio.sleep(0)  # the loop starts what was handed over
            jobs = plan_lead(c, CHOOSE_SLICE) or await _after_lead(c, rank_s)
            tail.add(jobs)
            feed.add(jobs)
        # a wave of exploration picks only, chosen before the calibration's fit: its
        # tail fits it and ranks the trees it does not touch while it runs (the next
        # plan would do both at its barrier)
        tail.rank_rest = bool(c.lead) and not c.ranked
        chosen = plan_chosen(c)
    except BaseException:
        running.waves.pop(key, None)
        task.cancel()
        raise
    launched.plan = chosen.planned[-1]
    tail.complete(launched.plan)
    feed.close()
    return chosen


def _begin(state: SearchState, search: Priority, phase_index: int) -> tuple[WaveChoice, list[RolloutJob]] | None:
    """:func:`focus.search.plan_begin` and the first slice of the wave's leading
    exploration picks (none where it has none): neither fits nor ranks."""
    choice = plan_begin(state, search, phase_index)
    return None if choice is None else (choice, plan_lead(choice, CHOOSE_SLICE))


async def _after_lead(c: WaveChoice, rank_s: float) -> list[RolloutJob]:
    """The wave's next slice once its leading exploration picks are taken: the rankings
    brought up to date first (:func:`focus.search.plan_rank`: after the evidence or a
    refit, the calibration's fit and every tree), inline or in a worker thread by what
    that is expected to cost (``rank_s``, :func:`focus.placement.choice_s`)."""
    if c.done:
        return []
    if c.ranks_next:
        await placed(rank_s, plan_rank, c)
    return plan_choose(c, CHOOSE_SLICE)
