"""Wave planning: pure functions from a :class:`~focus.search.state.SearchState` to the
next jobs.

:func:`plan_wave` decides, without side effects, which checkpoints the next wave
continues; :func:`plan_ahead` is the one schedule every runner follows;
:func:`plan_refill` is the streaming counterpart. The collector and the execution
service only carry plans out, so a wave planned twice from the same state gives the
same jobs and the same seeds.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from focus.calibration import Calibration
from focus.node_view import subtree_length
from focus.priority import EXPLORE, NodeEvidence, Phase, Priority, exploration_rate, explores
from focus.ranking import Entry, TreeRanking, entry, tie
from focus.search.depth_share import DepthShare
from focus.search.heads import PlanIndex, plan_index, spent
from focus.search.jobs import RolloutJob, WavePlan, rollout_seed
from focus.search.state import SearchState, _successor
from focus.sums import left_sum


def plan_wave(state: SearchState, search: Priority, phase_index: int, wave_index: int) -> WavePlan:
    """Jobs of wave ``wave_index`` of phase ``phase_index`` (pure; empty when done).

    Evidence phase: ``rollouts_per_task`` rollouts from every root in wave 0 (not one
    refused at its task's opening prompt, :func:`focus.refusals.refused_task`).
    Continuation phase: greedily take the highest-priority eligible checkpoint, count
    the planned continuation into its evidence (``pending``) and re-rank it, until the
    wave is full (``Phase.wave_size`` in ``Phase.wave_unit``: by default the planned
    jobs' expected transitions reach ``wave_size`` half rollouts, :func:`wave_limits`)
    or the expected transitions of the planned jobs cover what is left of the phase
    budget. The jobs of waves planned but not grafted yet (``state.planned``, see
    :func:`plan_ahead`) count as pending from the start, and their expected
    transitions are held back from the budget.
    """
    _check_wave(state, search, phase_index, wave_index)
    phase = search.phases[phase_index]
    if phase.is_evidence:
        if state.waves_done(phase_index) or state.planned:
            return WavePlan(phase_index, wave_index)
        jobs = []
        for ti, tree in [(ti, t) for ti, t in enumerate(state.trees) if t.ROOT in t.states]:
            base = len(tree.root.children)
            for b in range(base, base + (phase.rollouts_per_task or 0)):
                jobs.append(
                    RolloutJob(ti, tree.ROOT, rollout_seed(state.seed, ti, tree.ROOT, b), tree.states[tree.ROOT], b)
                )
        return WavePlan(phase_index, wave_index, tuple(jobs))
    chosen = tuple(wave_choices(state, search, phase_index, wave_index))
    return WavePlan(
        phase_index, wave_index, tuple(c.job for c in chosen), tuple(c.expected_transitions for c in chosen)
    )


def _check_wave(state: SearchState, search: Priority, phase_index: int, wave_index: int) -> None:
    """Raise unless wave ``wave_index`` of phase ``phase_index`` is the one to plan next."""
    if not 0 <= phase_index < len(search.phases):
        raise ValueError(f"phase index {phase_index} out of range: the search has {len(search.phases)} phases")
    phase = search.phases[phase_index]
    other = [(p.phase_index, p.wave_index) for p in state.planned if p.phase_index != phase_index]
    if other:
        raise ValueError(
            f"cannot plan phase {phase.name!r} while waves {other} of another phase are planned and not grafted"
        )
    done = state.waves_done(phase_index)
    queued = len(state.planned)
    if wave_index != done + queued:
        raise ValueError(
            f"cannot plan wave {wave_index} of phase {phase.name!r}: {done} waves of it are done and {queued} "
            f"planned (plan wave {done + queued} next)"
        )


def wave_choices(state: SearchState, search: Priority, phase_index: int, wave_index: int) -> Iterator[InFlight]:
    """The jobs of continuation wave ``wave_index`` (:func:`plan_wave`) one at a time, in
    the order the greedy choice takes them (nothing for an evidence phase, or when the
    phase is done). Lazy: the first job brings the rankings up to date (those of the
    trees changed since the last plan, :class:`focus.search.heads.PlanIndex`; after the
    evidence or a refit every tree's), each later one costs a heap step. A runner that
    starts jobs as they are chosen goes through :class:`WaveChoice`, which takes the
    leading exploration picks before any ranking (:meth:`_Greedy.lead`); here, for a
    plan made whole, that would only add the cost of finding them."""
    g = _wave_greedy(state, search, phase_index, wave_index)
    if g is not None:
        yield from g.rest()


def _wave_greedy(state: SearchState, search: Priority, phase_index: int, wave_index: int) -> _Greedy | None:
    """The greedy choice of continuation wave ``wave_index``, or ``None`` where the wave
    has no job (an evidence phase, the phase's waves or budget used up)."""
    _check_wave(state, search, phase_index, wave_index)
    phase = search.phases[phase_index]
    if phase.is_evidence or (phase.max_waves is not None and wave_index >= phase.max_waves):
        return None
    # A rollout that made no task transition (only parse errors or compactions) still
    # counts one against the budget (Usage.spend), so a phase always ends.
    index = plan_index(state)
    remaining: float = (phase.transitions or 0) - index.spent_total(state, phase_index)
    pending: dict[tuple[int, int], int] = {}
    for p in state.planned:
        remaining -= left_sum(p.expected)
        for job in p.jobs:
            pending[(job.tree_index, job.node_id)] = pending.get((job.tree_index, job.node_id), 0) + 1
    if remaining <= 0:
        return None
    # Each tree's eligible checkpoints are ranked once per tree version (cached in the
    # state); the wave merges the per-tree rankings, whose heads the index keeps.
    return _Greedy(state, search, phase_index, index, pending, None, remaining)


def last_wave(state: SearchState, search: Priority, plan: WavePlan) -> bool:
    """Whether no wave is to be planned after ``plan`` (a wave planned in ``state``): it
    is a continuation wave of the last phase, and either the phase's last by count, or
    the waves planned in ``state`` are expected to take what is left of its budget (the
    planner plans nothing more once the grafted rollouts do, :func:`_wave_greedy`).
    Then no plan reads its trees' rankings; a runner need not bring them up to date
    ahead of the barrier (where they did fall short, the next plan ranks them)."""
    pi = plan.phase_index
    phase = search.phases[pi]
    if pi != len(search.phases) - 1 or phase.is_evidence:
        return False
    if phase.max_waves is not None and plan.wave_index + 1 >= phase.max_waves:
        return True
    remaining: float = (phase.transitions or 0) - spent(state, pi)
    for p in state.planned:
        remaining -= left_sum(p.expected)
    return remaining <= 0


def plan_ahead(state: SearchState, search: Priority, phase_index: int) -> SearchState:
    """``state`` with waves of phase ``phase_index`` planned until
    ``search.waves_in_flight`` of them are planned and not grafted, or the planner has
    nothing more (pure). No waves planned afterwards means the phase is done.

    This is the one schedule every runner follows (:meth:`focus.collector.Collector.
    advance`, the pipeline, :func:`replay`): plan ahead, launch what is planned, graft
    the oldest planned wave, score, plan ahead again. With ``waves_in_flight=1`` it
    plans one wave after the previous one is grafted and scored; with more, each new
    wave is planned with the jobs of the waves still running counted as pending (their
    checkpoints' branch counts and the budget they are expected to take), which is what
    lets it launch while they finish. Either way a plan depends on grafted rollouts
    only, never on timing.
    """
    while True:
        nxt = plan_next(state, search, phase_index)
        if nxt is state:
            return state
        state = nxt


def plan_next(state: SearchState, search: Priority, phase_index: int) -> SearchState:
    """``state`` with one more wave of phase ``phase_index`` planned, if fewer than
    ``search.waves_in_flight`` are planned and the planner has one; else ``state``
    itself (pure). :func:`plan_ahead` is this until it returns its input; a runner
    launches each wave as soon as it is planned, before planning the next."""
    phase = search.phases[phase_index]
    depth = 1 if phase.is_evidence else search.waves_in_flight
    if len(state.planned) >= depth:
        return state
    plan = plan_wave(state, search, phase_index, state.waves_done(phase_index) + len(state.planned))
    return state if plan.empty else with_plan(state, plan)


def with_plan(state: SearchState, plan: WavePlan) -> SearchState:
    """A state that records ``plan`` as planned and not grafted (shares everything else)."""
    return _successor(
        state, state.trees, state._derived, list(state.waves), (*state.planned, plan), state._calibrations
    )


@dataclass(frozen=True)
class InFlight:
    """A continuation launched but not yet grafted, with the transitions it was
    expected to take when planned (what :func:`plan_refill` holds back from the budget)."""

    job: RolloutJob
    expected_transitions: float


def plan_refill(
    state: SearchState, search: Priority, phase_index: int, in_flight: Sequence[InFlight], slots: int
) -> tuple[InFlight, ...]:
    """Up to ``slots`` more continuations of phase ``phase_index`` while ``in_flight``
    run (pure; empty when nothing is eligible or the budget is covered).

    The streaming counterpart of :func:`plan_wave` with the same greedy choice: an
    in-flight continuation counts as ``pending`` at its checkpoint (toward
    ``max_branches`` and in the priority), and its expected transitions are held back
    from what is left of the phase budget. A refill is also capped at ``wave_size``
    in its unit, like a wave (:func:`wave_limits`).
    Branch indices continue after every continuation started from the checkpoint
    (grafted or in flight), so seeds stay a function of (tree, node, branch).
    """
    if not 0 <= phase_index < len(search.phases):
        raise ValueError(f"phase index {phase_index} out of range: the search has {len(search.phases)} phases")
    phase = search.phases[phase_index]
    if phase.is_evidence:
        raise ValueError(f"phase {phase.name!r} is an evidence phase: it runs as one wave, not by refills")
    if slots <= 0:
        return ()
    index = plan_index(state)
    remaining = (
        (phase.transitions or 0)
        - index.spent_total(state, phase_index)
        - left_sum(f.expected_transitions for f in in_flight)
    )
    if remaining <= 0:
        return ()
    pending: dict[tuple[int, int], int] = {}
    for f in in_flight:
        key = (f.job.tree_index, f.job.node_id)
        pending[key] = pending.get(key, 0) + 1
    return tuple(_Greedy(state, search, phase_index, index, pending, slots, remaining).rest())  # no lead: planned whole


def wave_limits(phase: Phase, calib: Calibration, slots: int | None = None) -> tuple[int, float]:
    """The most jobs and the most expected task transitions one wave (or one refill of
    ``slots`` free slots) of ``phase`` plans.

    ``wave_unit="jobs"``: ``wave_size`` jobs. ``"transitions"``: ``wave_size``
    continuations of average length in expected transitions, half a mean rollout each
    (``calib.mean_leaf_transitions / 2``: a continuation from a uniformly drawn point of
    a rollout), however many jobs that takes. Why transitions: a continuation's length
    depends on where it
    starts, and a priority that favours late checkpoints (Selective ranks per expected
    transition) plans continuations of a couple of transitions; counted in jobs its
    waves held a quarter of uniform branching's transitions, so it ran about four times
    as many barriers, each a small batch for the model server, for the same budget
    (issue 37, benchmarks/waves.py). The wave is re-ranked after as many transitions
    of new evidence whichever checkpoints the priority picks. Why half a rollout: waves
    of ``wave_size`` whole rollouts' worth cut Selective's and uniform's re-rankings so
    far that both estimated a few percent worse; half kept both within noise of the
    former waves (docs/algorithm.md, "Planning").
    """
    return _limits(phase, calib.mean_leaf_transitions, slots)


def _branched(state: SearchState) -> bool:
    """Whether the next wave is planned on a fit that may read spreads: a continuation
    wave has been grafted, or the evidence (the first wave) has a checkpoint with two
    valid children. Counted on the first wave alone, a count cached once and carried to
    successor states, so a plan off a refit does not read every tree for it."""
    n = len(state.waves)
    return n > 1 or (n == 1 and state.spread_count(1) > 0)


def _limits(phase: Phase, mean_leaf_transitions: float, slots: int | None) -> tuple[int, float]:
    """:func:`wave_limits` from the calibration's mean rollout length alone."""
    if phase.wave_unit == "jobs":
        return (phase.wave_size if slots is None else min(slots, phase.wave_size)), math.inf
    return (sys.maxsize if slots is None else slots), phase.wave_size * mean_leaf_transitions / 2


class _Greedy:
    """Greedily take the highest-priority eligible checkpoint, count the planned
    continuation into its evidence (``pending``) and re-rank it, until the wave is full
    (:func:`wave_limits`, at most ``slots`` jobs when given) or the planned jobs'
    expected transitions cover ``remaining``.

    ``pending`` holds continuations already running (streaming mode, or waves planned
    ahead; empty otherwise): their checkpoints leave the cached rankings (ranked with
    nothing pending) and enter the heap re-ranked with their pending count. The choice
    pops the smallest of two sources: the heads of every tree's ranking, kept sorted
    for the collection (:class:`focus.search.heads.PlanIndex`; the trees with a
    checkpoint pending left out), and a heap of the next entry of each tree whose head
    (or later entry) was taken, the first entries of the trees left out, and the
    re-ranked entries. That is exactly the order a heap of every eligible checkpoint
    would pop (an entry names its checkpoint, so no two compare equal), and a plan
    reads the trees it takes jobs from, not every tree. A checkpoint taken again reads
    the view it was re-ranked with (``taken``: the ranking's view with its pending
    count, the same fields) instead of copying the ranking's view once more.

    The choice comes in two parts. Slots drawn for exploration rank above every other
    whatever the calibration (:func:`focus.priority.exploration_rate`), so the greedy
    takes them first, in their seeded tie-break order, and that is all of the choice
    until none is left: :meth:`lead` takes them from the trees as they are, with the
    wave's limits from the mean rollout length alone, without fitting the noise model
    or ranking any tree. :meth:`rank` then does both (after the evidence or a refit a
    pass over every tree, about a second at 100k transitions over 2,000 tasks; else
    the trees changed since the last plan) and :meth:`rest` takes the remaining jobs,
    the lead's counted as pending. A runner starts the lead's jobs while it ranks
    (:func:`plan_rank`). At 100k transitions over 2,000 tasks the first three waves
    after the evidence were exploration picks only (472-488 jobs each).
    """

    def __init__(
        self,
        state: SearchState,
        search: Priority,
        phase_index: int,
        index: PlanIndex,
        pending: dict[tuple[int, int], int],
        slots: int | None,
        remaining: float,
    ) -> None:
        self.state, self.search, self.index, self.pending = state, search, index, pending
        self.phase = search.phases[phase_index]
        self.phase_index = phase_index
        self.mean_leaf = state.mean_leaf_transitions(search)
        self.limit, fill = _limits(self.phase, self.mean_leaf, slots)
        self.refill = slots is not None
        # before any spread the ranking's model is the unbranched rollouts' guess: a
        # priority may keep part of the budget for a fit on the spreads this wave makes
        share = search.wave_share(_branched(state))
        self.remaining = min(remaining * share if share < 1.0 else remaining, fill)
        self.jobs = 0
        self.planned = 0.0
        self._heap: list[tuple[float, float, int, int, int]] | None = None

    @property
    def full(self) -> bool:
        return not (self.jobs < self.limit and self.planned < self.remaining)

    def _take(self, job: RolloutJob, expected: float) -> InFlight:
        self.jobs += 1
        self.planned += expected
        return InFlight(job, expected)

    def lead(self) -> Iterator[InFlight]:
        """The choice's leading jobs: every slot drawn for exploration at the trees'
        current branch counts (pending included), in tie-break order, each taken slot's
        next one drawn again, until none is left or the wave is full; none where every
        tree is ranked under the calibration already (then the merged rankings hold the
        picks, and taking them there costs less than finding them in every tree)."""
        search, state, phase, pending = self.search, self.state, self.phase, self.pending
        rate = exploration_rate(search, self.mean_leaf)
        if rate <= 0 or self.full or self.refill or self._ranked_already():
            # (a streaming refill is planned whole, whatever comes first: nothing gained)
            return
        seed, most, deepest = state.seed, phase.max_branches, phase.max_depth
        heap: list[tuple[float, int, int]] = []
        for ti in range(len(state.trees)):  # some tree is to be ranked: a pass over every tree anyway
            f = state.facts(ti)
            nodes = f.tree.nodes
            for u, nid in f.draws:  # the slots of checkpoints with nothing pending
                if u >= rate:
                    break
                node = nodes[nid]
                if len(node.children) < most and node.depth <= deepest and (ti, nid) not in pending:
                    heap.append((tie(seed, ti, nid, len(node.children)), ti, nid))
        for (ti, nid), n in pending.items():  # checkpoints with continuations planned
            tree = state.trees[ti]
            node = tree.nodes[nid]
            slot = len(node.children) + n
            if not node.is_leaf and nid in tree.states and node.depth <= deepest and 1 <= slot < most:
                if explores(ti, nid, slot, rate):
                    heap.append((tie(seed, ti, nid, slot), ti, nid))
        heapq.heapify(heap)
        lengths: dict[int, dict[int, float]] = {}
        while heap and not self.full:
            _, ti, nid = heapq.heappop(heap)
            tree = state.trees[ti]
            key = (ti, nid)
            branch = len(tree.nodes[nid].children) + pending.get(key, 0)
            job = RolloutJob(ti, nid, rollout_seed(seed, ti, nid, branch), tree.states[nid], branch)
            yield self._take(job, self._expected(ti, nid, lengths))
            pending[key] = pending.get(key, 0) + 1
            if branch + 1 < most and explores(ti, nid, branch + 1, rate):
                heapq.heappush(heap, (tie(seed, ti, nid, branch + 1), ti, nid))

    def _ranked_already(self) -> bool:
        """Whether the calibration is fitted and every tree's ranking built under it:
        where the index's heads are under it, every tree's was when they were last
        brought up to date, so only the trees changed since are asked."""
        state, search = self.state, self.search
        if not state.calibrated(search):
            return False
        calib, seed = state.calibration(search), state.seed
        index = self.index
        trees = sorted(index.unranked) if index.holds(search, calib, seed) else range(len(state.trees))
        return all(state.facts(ti).built(search, calib, seed) for ti in trees)

    def _expected(self, ti: int, nid: int, lengths: dict[int, dict[int, float]]) -> float:
        """The view's ``expected_transitions`` (:func:`focus.node_view.node_view`) from the
        tree alone: the children's mean segment length plus theirs, as the ranking sums
        them, or the mean rollout length left for a checkpoint without children."""
        tree = self.state.trees[ti]
        length = subtree_length(tree, nid, lengths.setdefault(ti, {}))
        if math.isnan(length):
            length = max(1.0, self.mean_leaf - tree.nodes[nid].transitions)
        return max(length, 1.0)

    def rank(self) -> None:
        """Fit the calibration and bring the rankings up to date (every tree's after a
        refit, else those of the trees changed since the last plan: :class:`PlanIndex`),
        then fill the heap: the lead's picks enter it re-ranked with their pending
        counts, with the first entries of their trees' rankings."""
        if self._heap is not None:
            return
        state, search, pending, phase = self.state, self.search, self.pending, self.phase
        calib = state.calibration(search)
        heads = self.index.ranked_heads(state, search, calib, self.phase_index)
        heap: list[tuple[float, float, int, int, int]] = []
        for (ti, nid), n in pending.items():
            ev = state.facts(ti).view(search, calib, state.seed, nid)
            if ev is None or nid not in state.trees[ti].states or ev.depth > phase.max_depth:
                continue
            ev = ev.with_pending(n)
            if ev.branches + n < phase.max_branches:
                heap.append((*entry(search, state.seed, ev), -1))
        self._ranked: dict[int, list[Entry]] = {}
        self._rankings: dict[int, TreeRanking] = {}  # theirs: a taken job's view is read there
        self._busy, self._calib, self._heads = dict(pending), calib, heads
        #: Trees with a checkpoint pending: their heads are read from their rankings.
        self._aside = {ti for ti, _ in self._busy}
        for ti in sorted(self._aside):
            self._push_next(heap, ti, 0)
        heapq.heapify(heap)
        self._heap = heap

    def _push_next(self, heap: list[tuple[float, float, int, int, int]], ti: int, pos: int) -> None:
        # the next entry of tree ti's ranking at or after pos whose node has nothing in flight
        r = self._ranked.get(ti)
        if r is None:  # (_TreeFacts.ranked, keeping the ranking)
            f = self.state.facts(ti)
            rk = self._rankings[ti] = f.ranking(self.search, self._calib, self.state.seed)
            r = self._ranked[ti] = rk.ranked(f.tree, self.phase_index)
        busy = self._busy
        while pos < len(r) and busy and (ti, r[pos][3]) in busy:
            pos += 1
        if pos < len(r):
            heapq.heappush(heap, (*r[pos], pos))

    def _next(self, heap: list[tuple[float, float, int, int, int]], at: int) -> tuple[Entry, int] | None:
        """Pop the smallest of the heap and the heads from ``at`` on (those of trees set
        aside skipped), pushing its tree's next entry: (the entry, where the heads go
        on), or ``None`` where both are empty. The entry's key is its checkpoint's score
        with what is pending counted (a ranking's entries are of checkpoints with nothing
        pending; one taken is pushed again re-ranked)."""
        heads, aside = self._heads, self._aside
        n = len(heads)
        while at < n and heads[at][2] in aside:
            at += 1
        if heap and (at == n or heap[0] < heads[at]):
            key, tied, ti, nid, pos = heapq.heappop(heap)
            if pos >= 0:
                self._push_next(heap, ti, pos + 1)
            return (key, tied, ti, nid), at
        if at == n:
            return None
        head = heads[at]
        self._push_next(heap, head[2], 1)
        return head, at + 1

    def rest(self) -> Iterator[InFlight]:
        """The choice's jobs after :meth:`lead` (ranking first if :meth:`rank` was not called)."""
        if self.full:
            return
        self.rank()
        heap, state, search, pending, phase = self._heap, self.state, self.search, self.pending, self.phase
        assert heap is not None
        taken: dict[tuple[int, int], NodeEvidence] = {}
        factor = search.depth_share_bound()
        share = DepthShare.of(state, self.phase_index, phase, factor, pending) if factor > 0 else None
        held: list[Entry] = []  # checkpoints of depths that were full
        at = 0
        while not self.full:
            popped = self._next(heap, at)
            if popped is None:
                if not held:
                    break  # every depth is full or done: the wave takes the rest unbounded
                share, heap[:], held = None, [(*h, -1) for h in held], []
                heapq.heapify(heap)
                continue
            top, at = popped
            ti, nid = top[2], top[3]
            if share is not None:  # (an exploration pick, scored EXPLORE, is never held)
                depth = state.trees[ti].nodes[nid].depth
                if top[0] != -EXPLORE and not share.allows(depth):
                    held.append(top)
                    continue
                share.take(depth)
            key = (ti, nid)
            ev = taken.get(key)
            if ev is None:
                ev = self._rankings[ti].view(nid)  # (_next pushed its tree's next entry: _push_next)
                assert ev is not None  # a ranked entry is a checkpoint's
                n = pending.get(key, 0)
                if n != ev.pending:  # a ranking's views have none pending: mostly no copy to make
                    ev = ev.with_pending(n)
            branch = ev.branches + ev.pending
            job = RolloutJob(ti, nid, rollout_seed(state.seed, ti, nid, branch), state.trees[ti].states[nid], branch)
            yield self._take(job, ev.expected_transitions)
            ev = ev.with_pending(ev.pending + 1)
            pending[key] = ev.pending
            if ev.branches + ev.pending < phase.max_branches:
                taken[key] = ev
                heapq.heappush(heap, (*entry(search, state.seed, ev), -1))


class WaveChoice:
    """A continuation wave being chosen a slice at a time (:func:`plan_begin`,
    :func:`plan_choose`, :func:`plan_rank`, :func:`plan_chosen`): :func:`plan_next`'s
    wave, the same jobs in the same order, handed over as they are taken so that a
    runner starts the first ones while the greedy choice takes the rest (each later job
    costs a heap step; a wave of a thousand jobs took 15-60 ms at the barrier,
    benchmarks/README.md, scale)."""

    def __init__(self, state: SearchState, search: Priority, phase_index: int) -> None:
        self.state, self.phase_index = state, phase_index
        self.wave_index = state.waves_done(phase_index) + len(state.planned)
        self._greedy = _wave_greedy(state, search, phase_index, self.wave_index)
        self._lead: Iterator[InFlight] | None = None if self._greedy is None else self._greedy.lead()
        self._rest: Iterator[InFlight] | None = None
        self.chosen: list[InFlight] = []
        #: How many of the jobs taken so far are the leading exploration picks (chosen
        #: without the calibration's fit or any ranking).
        self.lead = 0
        #: Every job of the wave is taken.
        self.done = self._greedy is None

    @property
    def ranked(self) -> bool:
        """Whether the calibration is fitted and every tree ranked for this wave."""
        return self._greedy is None or self._greedy._heap is not None

    @property
    def ranks_next(self) -> bool:
        """Whether the next :func:`plan_choose` fits the calibration and ranks every tree
        (the leading exploration picks are taken, :func:`plan_rank` not called)."""
        g = self._greedy
        return not self.done and self._lead is None and g is not None and g._heap is None and not g.full


def plan_begin(state: SearchState, search: Priority, phase_index: int) -> WaveChoice | None:
    """The next continuation wave of phase ``phase_index`` to choose a slice at a time;
    ``None`` where :func:`plan_next` plans no such wave (an evidence phase, or
    ``search.waves_in_flight`` waves planned already)."""
    phase = search.phases[phase_index]
    if phase.is_evidence or len(state.planned) >= search.waves_in_flight:
        return None
    return WaveChoice(state, search, phase_index)


def plan_choose(choice: WaveChoice, n: int) -> list[RolloutJob]:
    """The wave's next ``n`` jobs in plan order; fewer where its leading exploration
    picks end (a runner may then rank off its event loop, :func:`plan_rank`, before it
    asks for more), or once the wave is full (then ``choice.done``). The first call
    that takes a job after the lead (the first call, where there is no lead) fits the
    calibration and ranks every tree unless :func:`plan_rank` did."""
    taken = _lead(choice, n)
    g = choice._greedy
    if g is not None and not choice.done and not taken:
        if choice._rest is None:
            choice._rest = g.rest()
        taken = list(itertools.islice(choice._rest, n))
        choice.done = len(taken) < n
        choice.chosen.extend(taken)
    return [c.job for c in taken]


def plan_lead(choice: WaveChoice, n: int) -> list[RolloutJob]:
    """:func:`plan_choose` as long as the wave's leading exploration picks last: their
    next ``n`` jobs, fewer (maybe none) where they end; never fits the calibration or
    ranks a tree, so a runner can take it on its event loop and tell from
    ``choice.ranks_next`` whether the next slice ranks first."""
    return [c.job for c in _lead(choice, n)]


def _lead(choice: WaveChoice, n: int) -> list[InFlight]:
    g = choice._greedy
    if g is None or choice._lead is None:
        return []
    taken = list(itertools.islice(choice._lead, n))
    choice.lead += len(taken)
    if len(taken) < n:  # the lead is over
        choice._lead = None
        choice.done = g.full
    choice.chosen.extend(taken)
    return taken


def plan_rank(choice: WaveChoice) -> None:
    """Fit the wave's calibration and bring the rankings up to date (what the first
    :func:`plan_choose` after the leading exploration picks would do; pure, and after
    the evidence or a refit what reads every tree: a runner calls it off its event loop
    while the lead's jobs run; else it reads the trees changed since the last plan)."""
    if choice._greedy is not None:
        choice._greedy.rank()


def plan_chosen(choice: WaveChoice) -> SearchState:
    """What :func:`plan_next` returns, once every job of ``choice`` is taken."""
    if not choice.done:
        raise ValueError("the wave is still being chosen: take its jobs (plan_choose) until none are left")
    c = choice.chosen
    plan = WavePlan(
        choice.phase_index, choice.wave_index, tuple(x.job for x in c), tuple(x.expected_transitions for x in c)
    )
    return choice.state if plan.empty else with_plan(choice.state, plan)
