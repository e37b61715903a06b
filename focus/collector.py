"""The collector: search over tasks, then prepare a training batch from the trees.

``Collector`` wires an agent to a search configuration (a :class:`Priority` with its
phases), a critic, an estimator and an execution service. ``collect()`` is
``search()`` then ``prepare()``, and ``search()`` is the one loop a collection
has, over an explicit :class:`~focus.search.SearchState`:

* :meth:`start` (roots) and :meth:`evidence` (the evidence wave, grafted);
* :meth:`predict` / :meth:`score` (critic predictions for unscored checkpoints);
* :meth:`advance` (plan ahead, launch what is planned, graft the oldest wave; :meth:`run_rollouts`
  is the same for a single plan), and :meth:`phase_waves`, the waves of a phase one
  after another, each scored and its successors launched before it is handed over;
* :meth:`prepare` (estimator, critic targets, the batch).

While a wave runs, each tree whose jobs in it have all finished is grafted (and, with a
row-wise critic, scored and ranked; evidence trees scored, not ranked) between the rollouts'
callbacks (:mod:`focus.waves`), under the calibration the graft's state will have (a lagged
refit, :data:`focus.search.REFIT_LAG`, is fitted and every tree ranked under it then; before a
graft that may refit on its own trees, what that fit reads of each tree is computed then), so
the barrier keeps only the trees that finished last, the merge and the next plan's greedy choice
(its jobs start as it takes them); the results are those of doing it all at the barrier.

At each step boundary the loop consults a :class:`~focus.journal.Journal`: a step it holds is
replayed, one it lacks is computed and recorded. The pipeline's journal writes to its checkpoint
store, so a rerun after a crash continues after the last recorded step. Every step is a function
of its inputs and the collection seed, so a resumed collection rebuilds the same trees and the
same batch. A wave whose rollouts got bad responses on every run stops the loop, kept as
``unfinished`` (:mod:`focus.journal`).

With ``Execution(streaming=True)``, ``search`` runs each continuation phase with
:meth:`Collector.stream_phase` instead of in waves: no barrier, results depend on the
order rollouts finish in (see :class:`focus.execution.Execution`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import math
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any, TypeVar

from focus.agent import Agent
from focus.batch import Batch, BatchBuilder
from focus.critic import ConstantCritic, Critic, check_predictions, context_label, scored
from focus.env import Task
from focus.estimation import DirectBranchTd, Estimator, critic_targets, truncated_segments
from focus.execution import BadResponses, Execution, check_env_failures, check_outage, check_responses, is_bad_response
from focus.journal import (
    EVIDENCE,
    EVIDENCE_SCORES,
    Journal,
    NoJournal,
    Step,
    WaveRollouts,
    check_unfinished,
    end_step,
    kept,
    scores_step,
    unfinished_step,
    wave_step,
)
from focus.parts import advantages_of, bad_advantage, check_parts, check_trees
from focus.placement import graft_placed, off_loop, plan_next_placed, scored_placed, warm_start_placed
from focus.priority import Priority, Selective
from focus.search import (
    InFlight,
    Predictions,
    SearchState,
    WavePlan,
    WaveRecord,
    graft,
    last_wave,
    plan_ahead,
    plan_refill,
    plan_wave,
    replay,
    unscored,
)
from focus.statistics import collection_statistics, noise_model_statistics, warn_failures
from focus.tree import Tree
from focus.waves import Landed, Launched, Running, WaveOutcome, WaveTail, launch_choosing, merged_predictions

__all__ = ["Collector", "Landed", "Launched", "Running", "WaveOutcome"]

log = logging.getLogger(__name__)
_T = TypeVar("_T")


class Collector:
    """Collects branching rollouts (:meth:`search`) and prepares them for training (:meth:`prepare`;
    :meth:`collect` is both). The search it is given runs as ``priority``, its interface."""

    def __init__(
        self,
        agent: Agent,
        search: Priority | None = None,
        critic: Critic | None = None,
        estimator: Estimator | None = None,
        execution: Execution | None = None,
        *,
        collection_id: str = "collection",
        iteration: int = 0,
        seed: int = 0,
        warm_start_critic: bool = True,
    ) -> None:
        self.agent = agent
        self.estimator = estimator if estimator is not None else DirectBranchTd()
        self.critic = critic if critic is not None else ConstantCritic(0.0)
        self.execution = execution if execution is not None else Execution()
        check_parts(agent, search, self.critic, self.estimator, self.execution)
        # one γ, truncation rule and κ setting for search and batch (see Priority.resolved)
        self.priority = (search if search is not None else Selective()).resolved(self.estimator)
        self.collection_id, self.iteration, self.seed = collection_id, iteration, seed
        self.warm_start_critic = warm_start_critic  # focus.critic.warm_start on the evidence

    # -- the steps ---------------------------------------------------------------------

    async def start(self, tasks: Sequence[Task]) -> SearchState:
        """A state with one root checkpoint per task (env reset, opening context)."""
        if not tasks:
            raise ValueError("Collector needs at least one task")
        trees = []
        for task in tasks:
            if not isinstance(task, Task):
                raise TypeError(f"tasks must be focus.env.Task objects, got {type(task).__name__}")
            root = await self.agent.start(task)
            trees.append(Tree.new(task.id, root, tuple(root.context.prompt_ids)))
        return SearchState(self.collection_id, self.seed, tuple(tasks), trees)

    async def evidence(self, tasks: Sequence[Task]) -> SearchState:
        """Start the trees and, if the first phase is an evidence phase, run it (grafted,
        not scored)."""
        state = await self.start(tasks)
        if self.priority.phases[0].is_evidence:
            state = await self.run_rollouts(state, self.plan_wave(state, 0, 0))
        return state

    async def run_evidence(self, tasks: Sequence[Task], journal: Journal | None = None) -> SearchState:
        """:meth:`evidence`, scored; each of the two steps taken from ``journal`` when it
        is recorded there, else computed and recorded (evidence recorded unfinished: its
        rollouts that got bad responses run again, :meth:`rerun`).

        With a row-wise critic that the warm start leaves as it is, each tree is scored as
        soon as its evidence rollouts are done (:class:`focus.waves.WaveTail`), so the
        recorded evidence state holds those predictions already; the recorded scores are
        all of them, in the order one call at the barrier makes them."""
        journal = journal if journal is not None else NoJournal()
        state = await journal.evidence(tasks)
        ahead: Predictions = {}
        if state is None:
            state, ahead = await self._evidence(tasks, journal)
            await journal.record(EVIDENCE, state)
        if self.warm_start_critic:  # a trainable critic never fitted is fitted on the evidence first
            await warm_start_placed(self.critic, state.trees, self.estimator.gamma, self.estimator.truncation)
        return await self._scored(state, EVIDENCE_SCORES, journal, ahead)

    def scores_evidence_ahead(self) -> bool:
        """Whether :meth:`run_evidence` scores each tree as its evidence finishes: the
        critic's prediction of a context does not depend on the call's other contexts
        (:attr:`focus.critic.Critic.row_wise`) and the warm start will not fit it first
        (:func:`focus.critic.warm_start`: a trainable critic never fitted)."""
        unfitted = callable(getattr(self.critic, "fit", None)) and not getattr(self.critic, "fitted", True)
        return self.critic.row_wise and not (self.warm_start_critic and unfitted)

    async def _evidence(self, tasks: Sequence[Task], journal: Journal) -> tuple[SearchState, Predictions]:
        partial = await journal.recorded(unfinished_step(0, 0)) if self.priority.phases[0].is_evidence else None
        if partial is None:
            try:
                state = await self.start(tasks)
                plan = self.plan_wave(state, 0, 0) if self.priority.phases[0].is_evidence else WavePlan(0, 0)
                if plan.empty:
                    return state, {}
                # scored as its trees finish, not ranked: the first plan's calibration needs all of them
                state, landed = await self.land(
                    state, self.launch(plan), score_ahead=self.scores_evidence_ahead(), rank=False
                )
                return state, landed.predictions
            except BadResponses as e:
                await journal.record(unfinished_step(*e.wave), WaveRollouts(e.rollouts, e.wall_s))
                raise
        state = await self.start(tasks)
        plan = self.plan_wave(state, 0, 0)
        done = await self.rerun(plan, partial)
        new = await graft_placed(state, plan, done.rollouts, self.priority.phases[0].name, done.wall_s)
        warn_failures(self.priority.phases[0].name, 0, done.rollouts, state.trees, new.trees)
        return new, {}

    async def rerun(self, plan: WavePlan, partial: WaveRollouts) -> WaveRollouts:
        """``partial`` (what a wave that got bad responses left, in ``plan``'s job order)
        with the rollouts that got them run again from their jobs; raises
        :class:`~focus.execution.BadResponses` if some still do."""
        check_unfinished(plan, partial)
        todo = [i for i, r in enumerate(partial.rollouts) if is_bad_response(r)]
        t0 = time.perf_counter()
        redone = await self.execution.run(self.agent, [plan.jobs[i] for i in todo])
        check_outage(redone, self.execution.max_outage_share)
        rollouts = list(partial.rollouts)
        for i, ro in zip(todo, redone, strict=True):
            rollouts[i] = ro
        wall = partial.wall_s + time.perf_counter() - t0
        check_responses(rollouts, _wave_name(self.priority, plan), (plan.phase_index, plan.wave_index), wall)
        return WaveRollouts(tuple(rollouts), wall)

    async def predict(self, state: SearchState) -> Predictions:
        """Critic predictions ``{(tree, node): (value, std)}`` for the checkpoints and
        truncated leaves that have none yet."""
        todo = unscored(state)
        if not todo:
            return {}
        where = f"critic {type(self.critic).__name__}"
        preds = await scored(self.critic, [state.trees[ti].nodes[nid].context_ids for ti, nid in todo], where)
        checked = check_predictions(preds, len(todo), where, context_label(state.trees, todo))
        return {key: (p.value, p.std) for key, p in zip(todo, checked, strict=True)}

    async def score(self, state: SearchState) -> SearchState:
        """``state`` with :meth:`predict`'s predictions filled in."""
        preds = await self.predict(state)
        return await scored_placed(state, preds)

    def plan_wave(self, state: SearchState, phase_index: int, wave_index: int) -> WavePlan:
        """The jobs of one wave (pure); empty when the phase is done."""
        return plan_wave(state, self.priority, phase_index, wave_index)

    def launch(self, plan: WavePlan) -> Launched:
        """Start ``plan``'s rollouts on the running loop; :meth:`land` collects them (and
        grafts each tree as soon as its jobs are done, :class:`focus.waves.WaveTail`, when
        the execution service reports jobs one by one)."""
        if not self.execution.reports_jobs:
            task = asyncio.ensure_future(self.execution.run(self.agent, list(plan.jobs)))
            return Launched(plan, task, time.perf_counter())
        tail = WaveTail(plan)
        task = asyncio.ensure_future(self.execution.run_reporting(self.agent, list(plan.jobs), tail.done))
        return Launched(plan, task, time.perf_counter(), tail)

    async def land(
        self,
        state: SearchState,
        launched: Launched,
        since: float | None = None,
        score_ahead: bool = False,
        rank: bool = True,
    ) -> tuple[SearchState, Landed]:
        """Wait for a launched wave and graft its rollouts onto ``state``; each tree is
        grafted as soon as its jobs are done (:class:`focus.waves.WaveTail`), and with
        ``score_ahead`` and a row-wise critic also scored and, with ``rank``, ranked then
        (its predictions in the :class:`Landed`); nothing else is scored. Raises
        :class:`focus.execution.ModelServiceOutage` (grafting nothing) when too many of
        its rollouts failed because the model service was out, and
        :class:`focus.execution.BadResponses` (grafting nothing) when any got bad
        responses. ``since``: when the wave's elapsed time starts (default: its launch)."""
        plan, tail = launched.plan, launched.tail
        phase = self.priority.phases[plan.phase_index]
        rank = not (last := last_wave(state, self.priority, plan)) and rank  # rankings no plan reads
        if tail is not None:
            score = (self.priority, self.critic) if score_ahead and self.critic.row_wise else None
            prefit = self.priority if state.may_refit(self.priority, len(plan.jobs)) or last else None
            await tail.follow(state, launched.task, phase.name, score, prefit, rank)
        if rank and state.refits_next(self.priority):
            state.next_calibration(self.priority)  # (as a rule by the tail) fitted on the trees at hand
        rollouts = await launched.task
        check_outage(rollouts, self.execution.max_outage_share)
        check_env_failures(rollouts, plan.jobs)
        now = tail.finished_at if tail is not None and tail.finished_at is not None else time.perf_counter()
        wall = now - (launched.t0 if since is None else since)
        check_responses(rollouts, _wave_name(self.priority, plan), (plan.phase_index, plan.wave_index), wall)
        ahead = tail.parts if tail is not None else None
        new = await graft_placed(state, plan, rollouts, phase.name, wall, ahead)
        warn_failures(phase.name, plan.wave_index, rollouts, state.trees, new.trees)
        return new, Landed(plan, tuple(rollouts), wall, dict(tail.predictions) if tail is not None else {})

    async def run_rollouts(self, state: SearchState, plan: WavePlan) -> SearchState:
        """Run ``plan`` on the execution service and graft its rollouts (no scoring)."""
        if plan.empty:
            return state
        return (await self.land(state, self.launch(plan)))[0]

    async def run_wave(self, state: SearchState, plan: WavePlan) -> SearchState:
        """:meth:`run_rollouts`, then score the new nodes."""
        if plan.empty:
            return state
        return await self.score(await self.run_rollouts(state, plan))

    async def launch_ahead(self, state: SearchState, phase_index: int, running: Running) -> SearchState:
        """Plan ahead (:func:`focus.search.plan_ahead`) and launch each planned wave not in
        ``running`` as soon as it is planned; returns ``state`` with its planned waves.

        The first half of :meth:`advance`, on its own so that :meth:`phase_waves`
        starts the next waves before it hands a wave over. Planning is a pure function
        of the state, so calling this early changes no plan: :meth:`advance` finds the
        waves already running.
        """
        while True:
            # launch each wave as soon as it is planned, then plan the next one
            for plan in state.planned:
                key = (plan.phase_index, plan.wave_index)
                have = running.waves.get(key)
                if have is not None and have.plan is not plan:  # launched for another state: stale
                    have.task.cancel()
                    have = None
                if have is None:
                    running.waves[key] = self.launch(plan)
            nxt = await launch_choosing(self.execution, self.agent, self.priority, state, phase_index, running)
            if nxt is None:  # not a continuation wave, or jobs not reported one by one
                nxt = await plan_next_placed(state, self.priority, phase_index)
            if nxt is state:
                return state
            state = nxt

    async def advance(
        self, state: SearchState, phase_index: int, running: Running, *, score_ahead: bool = False
    ) -> tuple[SearchState, Landed | None]:
        """One wave of continuation phase ``phase_index``: plan ahead
        (:func:`focus.search.plan_ahead`, launching each wave not in ``running`` as soon
        as it is planned), wait for the oldest and graft it (not scored). ``None`` when
        the phase is done. The wave's trees are grafted as their jobs finish
        (:meth:`land`); with ``score_ahead`` and a row-wise critic they are scored and
        ranked then too (those predictions are in the :class:`Landed`, the rest is the
        caller's to score).

        With ``waves_in_flight`` > 1 the waves planned after the oldest keep running
        when this returns (in ``running``), so the model service stays busy while the
        caller scores, checkpoints and calls again.
        """
        state = await self.launch_ahead(state, phase_index, running)
        if not state.planned:
            running.mark = None  # the phase is done; the next one's first wave counts from its launch
            return state, None
        oldest = state.planned[0]
        launched = running.waves.pop((oldest.phase_index, oldest.wave_index))
        try:
            state, landed = await self.land(state, launched, since=running.mark, score_ahead=score_ahead)
        except BaseException:
            await running.cancel()
            raise
        running.mark = time.perf_counter()
        return state, landed

    # -- whole-collection API ----------------------------------------------------------

    async def search(self, tasks: Sequence[Task], journal: Journal | None = None) -> SearchState:
        """Every phase in order (a phase ends when nothing more is planned): the trees
        :meth:`prepare` turns into a batch, to inspect before it does.

        ``journal`` records each step as it ends and, for steps it holds already, gives
        the recorded value instead (:mod:`focus.journal`): a collection given the
        journal of an interrupted one continues after its last recorded step and
        returns the same state; one given none loses its finished steps to an error that
        stops it (the error's note says so). Streamed phases, not resumable, take none.
        """
        if self.execution.streaming:
            if journal is not None:
                raise ValueError("a streamed collection is not resumable per step: run it without a journal")
            for phase in self.priority.phases:
                if phase.max_waves is not None:
                    raise ValueError(
                        f"phase {phase.name!r} sets max_waves, which streaming mode has no waves to count; "
                        "drop max_waves or run with Execution(streaming=False)"
                    )
        with kept(journal, not self.execution.streaming) as journal, self.execution.frozen_heap():
            state = await self.run_evidence(tasks, journal)
            for pi, phase in enumerate(self.priority.phases):
                if phase.is_evidence:
                    continue
                if self.execution.streaming:
                    state = await self.stream_phase(state, pi)
                else:
                    state = await self.run_phase(state, pi, journal)
        return state

    async def _scored(
        self, state: SearchState, step: Step, journal: Journal, ahead: Predictions | None = None
    ) -> SearchState:
        """``state`` with the predictions recorded for ``step``, or new ones (then recorded,
        with ``ahead``: those ``state`` holds already, made while the step's wave ran)."""
        preds = await journal.recorded(step)
        if preds is None:
            preds = await self.predict(state)
            await journal.record(step, merged_predictions(ahead, preds) if ahead else preds)
        return await scored_placed(state, preds)

    async def run_phase(self, state: SearchState, phase_index: int, journal: Journal | None = None) -> SearchState:
        """Continuation phase ``phase_index``, wave after wave (:meth:`phase_waves`),
        until nothing more is planned; the waves ``journal`` holds are replayed first
        (planned again, their recorded rollouts grafted: :func:`focus.search.replay`)."""
        journal = journal if journal is not None else NoJournal()
        wave = state.waves_done(phase_index)
        while (landed := await self._recorded_wave(state, phase_index, wave, journal)) is not None:
            record = WaveRecord(phase_index, wave, landed.rollouts, landed.wall_s)
            state = await off_loop(replay, state, self.priority, [record])
            state = await self._scored(state, scores_step(phase_index, wave), journal)
            wave += 1
        if await journal.phase_ended(phase_index, wave):
            return state
        running = Running()
        try:
            async for outcome in self.phase_waves(state, phase_index, running):
                plan = outcome.landed.plan
                await journal.record(
                    wave_step(phase_index, plan.wave_index),
                    WaveRollouts(outcome.landed.rollouts, outcome.landed.wall_s),
                )
                if outcome.scored is None:
                    raise outcome.error or RuntimeError("a wave was not scored")
                await journal.record(scores_step(phase_index, plan.wave_index), outcome.predictions)
                state = outcome.scored
            await journal.record(end_step(phase_index), state.waves_done(phase_index))
            return state
        except BadResponses as e:  # the wave's finished rollouts are kept; a rerun runs the rest
            await journal.record(unfinished_step(*e.wave), WaveRollouts(e.rollouts, e.wall_s))
            raise
        finally:
            await running.cancel()

    async def _recorded_wave(
        self, state: SearchState, phase_index: int, wave: int, journal: Journal
    ) -> WaveRollouts | None:
        """The rollouts ``journal`` holds for a wave; for a wave it holds unfinished, with
        those that got bad responses run again (:meth:`rerun`), then recorded whole."""
        landed = await journal.recorded(wave_step(phase_index, wave))
        if landed is not None or (partial := await journal.recorded(unfinished_step(phase_index, wave))) is None:
            return landed
        planned = (await off_loop(plan_ahead, state, self.priority, phase_index)).planned
        if not planned:
            raise ValueError(f"an unfinished wave {wave} of phase {phase_index} is recorded; the search plans none")
        landed = await self.rerun(planned[0], partial)
        await journal.record(wave_step(phase_index, wave), landed)
        return landed

    async def phase_waves(self, state: SearchState, phase_index: int, running: Running) -> AsyncIterator[WaveOutcome]:
        """The waves of continuation phase ``phase_index`` from ``state`` on, one
        :class:`WaveOutcome` each: :meth:`advance` (land and graft the oldest planned
        wave, scoring the trees a row-wise critic scored while it ran), :meth:`predict`
        for the rest of what it added, then :meth:`launch_ahead` from the
        scored state, so the next waves run before the caller sees this one. Ends when
        nothing more is planned, or after an outcome whose scoring failed (its
        rollouts are in the outcome; the error is its ``error``). A failure to land
        (:class:`focus.execution.ModelServiceOutage`) is raised.

        :meth:`run_phase` records each outcome in its journal while the next waves
        already run, so recording never holds a wave back.
        """
        while True:
            grafted, landed = await self.advance(state, phase_index, running, score_ahead=True)
            if landed is None:
                return
            try:
                rest = await self.predict(grafted)
                ready = await self.launch_ahead(await scored_placed(grafted, rest), phase_index, running)
            except Exception as e:  # the critic's failure: the landed rollouts stay good
                yield WaveOutcome(landed, grafted, {}, None, e)
                return
            preds = merged_predictions(landed.predictions, rest) if landed.predictions else rest
            yield WaveOutcome(landed, grafted, preds, ready)
            state = ready

    async def stream_phase(self, state: SearchState, phase_index: int) -> SearchState:
        """Run continuation phase ``phase_index`` keeping up to ``max_concurrency``
        rollouts in flight (streaming mode; not resumable part-way).

        Refilling and grafting are decoupled, because re-ranking a tree after a graft
        costs in proportion to the tree: whenever at least ``refill_at`` slots are free,
        :func:`focus.search.plan_refill` fills them from the last grafted state,
        counting rollouts running *and* finished-but-not-grafted toward branch limits and
        (by their expected transitions) the budget; finished rollouts are grafted (in
        (tree, node, branch) order, recorded as one "wave" of the phase) and their new
        nodes scored once ``graft_at`` of them have piled up, when a refill comes up
        short, or when nothing runs. The phase ends when nothing runs, nothing waits to
        be grafted and the planner has nothing more. Which rollouts a refill sees
        depends on timing, so two runs may plan differently; each rollout is still
        fixed by its job's seed.
        """
        phase = self.priority.phases[phase_index]
        cap = self.execution.max_concurrency
        refill_at = max(1, int(cap * self.execution.refill_fraction))
        graft_at = max(1, int(cap * self.execution.graft_fraction))
        running: dict[asyncio.Future[Any], InFlight] = {}
        finished: list[tuple[InFlight, Any]] = []
        done: asyncio.Queue[asyncio.Future[Any]] = asyncio.Queue()
        wave = state.waves_done(phase_index)
        t_last = time.perf_counter()
        with self.execution.frozen_heap() as frozen:
            try:
                while True:
                    free = cap - len(running)
                    short = False
                    if free >= refill_at or not running:
                        waiting = [*running.values(), *(f for f, _ in finished)]
                        refill = plan_refill(state, self.priority, phase_index, waiting, free)
                        short = len(refill) < free
                        # longest-remaining first, as in a wave
                        for f in sorted(refill, key=lambda f: f.job.start.steps):
                            launched = self.execution.launch(self.agent, f.job)
                            launched.add_done_callback(done.put_nowait)
                            running[launched] = f
                    if finished and (
                        not running or len(finished) >= graft_at or (short and len(finished) >= refill_at)
                    ):
                        finished.sort(key=lambda p: (p[0].job.tree_index, p[0].job.node_id, p[0].job.branch))
                        now = time.perf_counter()
                        plan = WavePlan(phase_index, wave, tuple(f.job for f, _ in finished))
                        rollouts = [r for _, r in finished]
                        check_outage(rollouts, self.execution.max_outage_share)
                        check_responses(rollouts, _wave_name(self.priority, plan), (phase_index, wave), now - t_last)
                        new = graft(state, plan, rollouts, phase.name, wave_wall_s=now - t_last)
                        warn_failures(phase.name, wave, rollouts, state.trees, new.trees)
                        state = new
                        state = await self.score(state)
                        finished, t_last, wave = [], now, wave + 1
                        continue
                    if not running:
                        return state
                    if frozen:
                        # Keep the trees (most of the heap) out of cyclic GC while rollouts run;
                        # freezing again moves only what was created since (O(1)).
                        gc.freeze()
                    task = await done.get()
                    while True:
                        finished.append((running.pop(task), task.result()))
                        if done.empty():
                            break
                        task = done.get_nowait()
            finally:
                for t in running:
                    t.cancel()

    async def collect(self, tasks: Sequence[Task], journal: Journal | None = None) -> Batch:
        return self.prepare(await self.search(tasks, journal))

    def prepare(self, trees: Sequence[Tree] | SearchState) -> Batch:
        """Actor rows (one per model turn of every segment with an advantage) and critic
        rows (one per checkpoint), plus what the collection actually used.

        The batch is built as Arrow columns (:class:`focus.batch.BatchBuilder`): each
        turn's ids, log-probs and mask go straight into the column buffers; a token tuple
        shared by rows (a checkpoint's prefix, sent by every branch from it and stored as
        the critic's context) is converted once, a rollout's next prompt by its new ids.

        The trees stay out of cyclic GC meanwhile (:meth:`focus.execution.Execution.frozen_heap`):
        once :meth:`search` lets them go back to the oldest generation, preparing made Python
        walk all of them in a full collection (1.5 s at 100k transitions over 2,000 tasks).
        """
        est = self.estimator
        with self.execution.frozen_heap():
            if not isinstance(trees, SearchState):
                return self._prepare(check_trees(trees))
            if type(est).noise is not Estimator.noise or type(est).values is not Estimator.values:
                return self._prepare(trees.trees)  # an estimator's own fit or backups read the trees alone
            # the noise rows and edge segments its search computed of the trees, not computed again
            return self._prepare(trees.trees, *trees.batch_parts(est.gamma, est.truncation, est.kappa is None))

    def _prepare(
        self, trees: Sequence[Tree], rows: Sequence[Any] | None = None, segments: Sequence[Any] | None = None
    ) -> Batch:
        est = self.estimator
        version = str(getattr(self.agent.policy, "policy_version", "0"))
        out = BatchBuilder(self.collection_id, self.iteration)
        add_turn, add_checkpoint = out.add_turn, out.add_checkpoint
        excluded = 0
        # the critic's weight is fitted once on the whole collection (empirical Bayes)
        noise = (est.noise(trees) if rows is None else est.noise(trees, rows)) if est.kappa is None else None
        for ti, tree in enumerate(trees):
            tree_id = f"{tree.task_id}#{ti}"
            task_id = tree.task_id
            values = est.values(tree, noise) if segments is None else est.values(tree, noise, segments[ti])
            adv = advantages_of(est, tree, values, tree_id)
            truncated = truncated_segments(tree)
            for e in tree.edges.values():
                a = adv.get(e.id)
                if a is None:
                    excluded += 1
                    continue
                if not math.isfinite(a := float(a)):  # a trainer's loss would carry it to every weight
                    raise bad_advantage(est, e.id, tree_id, a)
                for j, t in enumerate(e.turns):
                    add_turn(
                        task_id, tree_id, e.parent, e.id, j,
                        t.policy_version or version,  # the weights that sampled this turn
                        t.kind, t.prompt_ids, t.completion_ids, t.logprobs, t.loss_mask,
                        a, float(t.reward), t.finish_reason, e.id in truncated, chained=True,
                    )  # fmt: skip
            for nid, tgt in sorted(
                critic_targets(tree, gamma=est.gamma, truncation=est.truncation, segments=values.segments).items()
            ):
                node = tree.nodes[nid]
                add_checkpoint(task_id, tree_id, nid, node.context_ids, tgt.target, tgt.weight, node.value)
        stats = self.statistics(trees, excluded_segments=excluded)
        if noise is not None:
            stats["noise_model"] = noise_model_statistics(noise)
        return out.build(stats)

    def statistics(self, trees: Sequence[Tree], *, excluded_segments: int = 0) -> dict[str, Any]:
        """:func:`focus.statistics.collection_statistics` of ``trees`` under this search."""
        return collection_statistics(self.priority.phases, trees, excluded_segments=excluded_segments)


def _wave_name(search: Priority, plan: WavePlan) -> str:
    return f"phase {search.phases[plan.phase_index].name} wave {plan.wave_index}"
