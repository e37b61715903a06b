"""Search state and wave planning: pure functions from a state to the next jobs.

:class:`SearchState` is everything a collection has done so far: the trees (with branch
states, so any checkpoint can be continued), the critic's predictions on their nodes,
and which waves have run. It pickles, which is what lets the pipeline persist it after
every wave and resume.

:func:`plan_wave` decides, without side effects, which checkpoints the next wave
continues; :func:`graft` adds finished rollouts to a copy of the state. The collector
and the execution service only carry plans out, so a wave planned twice from the same
state gives the same jobs and the same seeds.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from focus.agent import BranchState, Rollout, derive_seed
from focus.env import Task
from focus.priority import Calibration, NodeEvidence, Priority
from focus.ranking import Entry, TreeRanking, entry
from focus.tree import Edge, Node, RolloutRecord, Tree
from focus.usage import Usage

#: Spreads (checkpoints with two valid children) after which the ranking's calibration
#: is no longer refitted: with thousands of spreads the noise model's variances are
#: known to within a few percent.
CALIBRATION_SPREADS = 4096


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: from checkpoint ``node_id`` of tree ``tree_index``."""

    tree_index: int
    node_id: int
    seed: int
    start: BranchState
    #: Index of this continuation among those started from the node (0-based).
    branch: int = 0


@dataclass(frozen=True)
class WavePlan:
    """The jobs of one wave of one phase; empty when the phase is done."""

    phase_index: int
    wave_index: int
    jobs: tuple[RolloutJob, ...] = ()
    #: Task transitions each job was expected to take when planned (continuation
    #: phases): what later plans hold back from the budget while this wave runs.
    expected: tuple[float, ...] = ()

    @property
    def empty(self) -> bool:
        return not self.jobs


@dataclass
class SearchState:
    """Trees of one collection plus the record of the waves that built them.

    The trees of a state are treated as immutable once the state exists: :func:`graft`
    and :func:`with_predictions` return a new state that shares every tree (and every
    node) they did not change, so a wave costs in proportion to the trees it touched.
    Code that wants to edit a tree in place edits a :func:`copy_state` copy.

    ``_derived`` holds facts derived from the trees (ranked checkpoints, budget spent,
    unscored nodes), filled on first use and carried over for untouched trees; it is
    never pickled and is rebuilt deterministically, so planning a resumed state gives
    the same plan as planning the live one.
    """

    collection_id: str
    seed: int
    tasks: tuple[Task, ...]
    trees: list[Tree]
    #: (phase index, wave index) of every wave grafted, in order.
    waves: list[tuple[int, int]] = field(default_factory=list)
    #: Waves planned (and launched) but not grafted yet, oldest first: their jobs count
    #: as pending when the next wave is planned (:func:`plan_ahead`).
    planned: tuple[WavePlan, ...] = ()
    _derived: dict[int, _TreeFacts] = field(default_factory=dict, init=False, repr=False, compare=False)
    _calibrations: dict[tuple[Any, ...], Calibration] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )
    #: Waves -> :meth:`spread_count` of the first that many waves.
    _spreads: dict[int, int] = field(default_factory=dict, init=False, repr=False, compare=False)

    def waves_done(self, phase_index: int) -> int:
        return sum(1 for p, _ in self.waves if p == phase_index)

    def usage(self, phase_index: int | None = None) -> Usage:
        """What the rollouts of one phase (or all) actually used, from the tree logs."""
        return Usage.of_records(r for t in self.trees for r in t.log if phase_index is None or r.phase == phase_index)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_derived", None)
        state.pop("_calibrations", None)
        state.pop("_spreads", None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._derived = {}
        self._calibrations = {}
        self._spreads = {}

    def calibration(self, search: Priority) -> Calibration:
        """The ranking's :class:`~focus.priority.Calibration`, a pure function of the
        state (cached, carried to successor states, never pickled).

        Fitted on the rollouts of the first ``2^k`` waves, and fitted again at a later
        power of two of waves only once the evidence has doubled since the last fit
        (counted as checkpoints with two or more finished children,
        :meth:`spread_count`): a refit on less new evidence would move the noise model
        by less than its sampling error, and each refit costs a pass over the whole
        collection plus a rebuild of every tree's ranking. A collection of many tasks
        starts with thousands of spreads from its evidence phase, so its first
        continuation waves do not refit; one of few tasks doubles its evidence with
        nearly every doubling of its waves. Once a fit rests on
        :data:`CALIBRATION_SPREADS` spreads it is kept from then on.
        """
        n = len(self.waves)
        size = 1 if n else 0
        c = self._fit(size, search)
        while n and c.noise.spreads < CALIBRATION_SPREADS:
            floor = 2 * self.spread_count(size)
            nxt = 2 * size
            while nxt <= n and self.spread_count(nxt) < floor:
                nxt *= 2
            if nxt > n:
                break
            size, c = nxt, self._fit(nxt, search)
        return c

    def _fit(self, size: int, search: Priority) -> Calibration:
        key = (size, search.discount, search.truncation_rule)
        c = self._calibrations.get(key)
        if c is None:
            c = self._calibrations[key] = search.calibrate(self.trees, self._keep(size))
        return c

    def spread_count(self, waves: int) -> int:
        """Checkpoints with at least two children that did not fail, counting only the
        segments of the first ``waves`` waves: the evidence a calibration fitted on
        them rests on. Depends on tree shapes only (not on critic scores), so it is
        cached for good and carried to successor states."""
        n = self._spreads.get(waves)
        if n is None:
            keep = self._keep(waves)
            n = 0
            for tree in self.trees:
                children: dict[int, int] = {}
                for e in tree.edges.values():
                    if (keep is None or keep(tree, e)) and tree.nodes[e.child].kind != "failed":
                        children[e.parent] = children.get(e.parent, 0) + 1
                n += sum(1 for c in children.values() if c >= 2)
            self._spreads[waves] = n
        return n

    def _keep(self, n: int) -> Callable[[Tree, Edge], bool] | None:
        """Filter accepting the segments of rollouts grafted in the first ``n`` waves
        (and those without a rollout record, e.g. in trees built by hand)."""
        if n >= len(self.waves):
            return None
        allowed = set(self.waves[:n])

        def keep(tree: Tree, e: Edge) -> bool:
            if e.rollout >= len(tree.log):
                return True
            rec = tree.log[e.rollout]
            return (rec.phase, rec.wave) in allowed

        return keep

    def facts(self, tree_index: int) -> _TreeFacts:
        """Derived facts of one tree, recomputed if its tree object changed."""
        tree = self.trees[tree_index]
        f = self._derived.get(tree_index)
        if f is None or not f.describes(tree, tree_index):
            f = self._derived[tree_index] = _TreeFacts(tree, tree_index)
        return f


_SCORED_KINDS = ("checkpoint", "truncated")


class _TreeFacts:
    """What planning and scoring derive from one tree object, computed lazily.

    Valid only for the tree object it was made from (and while that tree has the same
    number of nodes and rollouts, a guard against grafts done in place). The ranking
    (:class:`focus.ranking.TreeRanking`) is tied to one search configuration and
    calibration; a successor tree's facts take it over from their predecessor's with
    the nodes that changed (``changed``) and bring it up to date when next asked, so a
    wave costs in proportion to the paths it touched. Everything here is a pure
    function of the tree, the tree's index, the collection seed and the search
    configuration and calibration.
    """

    __slots__ = ("tree", "index", "size", "_spent", "_unscored", "rank", "changed")

    def __init__(
        self,
        tree: Tree,
        index: int,
        *,
        spent: dict[int, int] | None = None,
        unscored: tuple[int, ...] | None = None,
        rank: TreeRanking | None = None,
        changed: set[int] | None = None,
    ) -> None:
        self.tree, self.index = tree, index
        self.size = (len(tree.nodes), tree.rollouts)
        self._spent, self._unscored = spent, unscored
        self.rank, self.changed = rank, changed if changed is not None else set()

    def describes(self, tree: Tree, index: int) -> bool:
        return self.tree is tree and self.index == index and self.size == (len(tree.nodes), tree.rollouts)

    @property
    def spent(self) -> dict[int, int]:
        """Budget spent per phase (:attr:`focus.usage.Usage.budget_spent`)."""
        if self._spent is None:
            self._spent = {}
            for r in self.tree.log:
                self._spent[r.phase] = self._spent.get(r.phase, 0) + r.usage.budget_spent
        return self._spent

    @property
    def unscored(self) -> tuple[int, ...]:
        """Nodes the critic should score: checkpoints and truncated leaves without a value."""
        if self._unscored is None:
            self._unscored = tuple(
                n.id for n in self.tree.nodes.values() if n.value is None and n.kind in _SCORED_KINDS and n.context_ids
            )
        return self._unscored

    def ranking(self, search: Priority, calibration: Calibration, seed: int) -> TreeRanking:
        """The tree's ranking for this configuration, brought up to date."""
        rank = self.rank
        if rank is None or not rank.matches(search, calibration, seed):
            # a new calibration (or configuration) changes every view, not the edges'
            # segments: those of the same γ are taken over
            segs = rank.segments if rank is not None and rank.gamma == search.discount else None
            rank = self.rank = TreeRanking(self.tree, self.index, search, calibration, seed, segs)
            self.changed = set()
        elif self.changed:
            rank.update(self.tree, self.changed)
            self.changed = set()
        return rank

    def handover(self, changed: Iterable[int]) -> tuple[TreeRanking | None, set[int]]:
        """Give this tree's ranking to its successor (which changed ``changed``): this
        object keeps none, so a state planned again after its successor exists ranks
        from scratch instead of reading a ranking of another tree."""
        rank, pending = self.rank, set(self.changed)
        self.rank, self.changed = None, set()
        pending.update(changed)
        return rank, pending

    def evidence(self, search: Priority, calibration: Calibration, seed: int = 0) -> dict[int, NodeEvidence]:
        return self.ranking(search, calibration, seed).evidence

    def ranked(self, search: Priority, calibration: Calibration, phase_index: int, seed: int) -> list[Entry]:
        """Eligible checkpoints of phase ``phase_index``, best first (nothing pending)."""
        return self.ranking(search, calibration, seed).ranked(self.tree, phase_index)


def copy_tree(tree: Tree) -> Tree:
    """A copy that shares only immutable parts (edges, turns, branch states)."""
    nodes = {i: dataclasses.replace(n, children=list(n.children)) for i, n in tree.nodes.items()}
    return Tree(tree.task_id, nodes, dict(tree.edges), dict(tree.states), tree.rollouts, list(tree.log))


def copy_state(state: SearchState) -> SearchState:
    return SearchState(
        state.collection_id,
        state.seed,
        state.tasks,
        [copy_tree(t) for t in state.trees],
        list(state.waves),
        state.planned,
    )


def rollout_seed(seed: int, tree_index: int, node_id: int, branch: int) -> int:
    """Seed of a continuation: fixed by (collection seed, tree, node, branch index)."""
    return derive_seed(seed, tree_index, node_id, branch)


def plan_wave(state: SearchState, search: Priority, phase_index: int, wave_index: int) -> WavePlan:
    """Jobs of wave ``wave_index`` of phase ``phase_index`` (pure; empty when done).

    Evidence phase: ``rollouts_per_task`` rollouts from every root in wave 0.
    Continuation phase: greedily take the highest-priority eligible checkpoint, count
    the planned continuation into its evidence (``pending``) and re-rank it, until the
    wave is full or the expected transitions of the planned jobs cover what is left of
    the phase budget. The jobs of waves planned but not grafted yet
    (``state.planned``, see :func:`plan_ahead`) count as pending from the start, and
    their expected transitions are held back from the budget.
    """
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
    if phase.is_evidence:
        if done or queued:
            return WavePlan(phase_index, wave_index)
        jobs = []
        for ti, tree in enumerate(state.trees):
            base = len(tree.root.children)
            for b in range(base, base + (phase.rollouts_per_task or 0)):
                jobs.append(
                    RolloutJob(ti, tree.ROOT, rollout_seed(state.seed, ti, tree.ROOT, b), tree.states[tree.ROOT], b)
                )
        return WavePlan(phase_index, wave_index, tuple(jobs))
    if phase.max_waves is not None and wave_index >= phase.max_waves:
        return WavePlan(phase_index, wave_index)
    # A rollout that made no task transition (only parse errors or compactions) still
    # counts one against the budget (Usage.spend), so a phase always ends.
    facts = [state.facts(ti) for ti in range(len(state.trees))]
    remaining: float = (phase.transitions or 0) - sum(f.spent.get(phase_index, 0) for f in facts)
    pending: dict[tuple[int, int], int] = {}
    for p in state.planned:
        remaining -= sum(p.expected)
        for job in p.jobs:
            pending[(job.tree_index, job.node_id)] = pending.get((job.tree_index, job.node_id), 0) + 1
    if remaining <= 0:
        return WavePlan(phase_index, wave_index)
    # Each tree's eligible checkpoints are ranked once per tree version (cached in the
    # state); the wave merges the per-tree rankings.
    chosen = _greedy(state, search, phase_index, facts, pending, phase.wave_size, remaining)
    return WavePlan(
        phase_index, wave_index, tuple(c.job for c in chosen), tuple(c.expected_transitions for c in chosen)
    )


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
    from what is left of the phase budget. A refill is also capped at ``wave_size``.
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
    facts = [state.facts(ti) for ti in range(len(state.trees))]
    remaining = (
        (phase.transitions or 0)
        - sum(f.spent.get(phase_index, 0) for f in facts)
        - sum(f.expected_transitions for f in in_flight)
    )
    if remaining <= 0:
        return ()
    pending: dict[tuple[int, int], int] = {}
    for f in in_flight:
        key = (f.job.tree_index, f.job.node_id)
        pending[key] = pending.get(key, 0) + 1
    return _greedy(state, search, phase_index, facts, pending, min(slots, phase.wave_size), remaining)


def _greedy(
    state: SearchState,
    search: Priority,
    phase_index: int,
    facts: list[_TreeFacts],
    pending: dict[tuple[int, int], int],
    limit: int,
    remaining: float,
) -> tuple[InFlight, ...]:
    """Greedily take the highest-priority eligible checkpoint, count the planned
    continuation into its evidence (``pending``) and re-rank it, until ``limit`` jobs
    are planned or their expected transitions cover ``remaining``.

    ``pending`` holds continuations already running (streaming mode; empty for a wave):
    their checkpoints leave the cached rankings (ranked with nothing pending) and enter
    the heap re-ranked with their pending count. The heap holds the next entry of every
    tree's ranking plus the re-ranked entries, so it pops exactly the order a heap of
    every eligible checkpoint would.
    """
    phase = search.phases[phase_index]
    calib = state.calibration(search)
    ranked = [f.ranked(search, calib, phase_index, state.seed) for f in facts]
    heap: list[tuple[float, float, int, int, int]] = []
    busy = dict(pending)
    for (ti, nid), n in pending.items():
        ev = facts[ti].evidence(search, calib, state.seed).get(nid)
        if ev is None or nid not in state.trees[ti].states or ev.depth > phase.max_depth:
            continue
        ev = dataclasses.replace(ev, pending=n)
        if ev.branches + n < phase.max_branches:
            heap.append((*entry(search, state.seed, ev), -1))

    def push_next(ti: int, pos: int) -> None:
        # the next entry of tree ti's ranking at or after pos whose node has nothing in flight
        r = ranked[ti]
        while pos < len(r) and busy and (ti, r[pos][3]) in busy:
            pos += 1
        if pos < len(r):
            heapq.heappush(heap, (*r[pos], pos))

    for ti in range(len(ranked)):
        push_next(ti, 0)
    heapq.heapify(heap)
    jobs: list[InFlight] = []
    planned = 0.0
    while heap and len(jobs) < limit and planned < remaining:
        _, _, ti, nid, pos = heapq.heappop(heap)
        if pos >= 0:
            push_next(ti, pos + 1)
        ev = facts[ti].evidence(search, calib, state.seed)[nid]
        ev = dataclasses.replace(ev, pending=pending.get((ti, nid), 0))
        branch = ev.branches + ev.pending
        job = RolloutJob(ti, nid, rollout_seed(state.seed, ti, nid, branch), state.trees[ti].states[nid], branch)
        jobs.append(InFlight(job, ev.expected_transitions))
        planned += ev.expected_transitions
        ev = dataclasses.replace(ev, pending=ev.pending + 1)
        pending[(ti, nid)] = ev.pending
        if ev.branches + ev.pending < phase.max_branches:
            heapq.heappush(heap, (*entry(search, state.seed, ev), -1))
    return tuple(jobs)


def _cow_tree(tree: Tree) -> Tree:
    """A new tree object sharing nodes, edges, states and log records with ``tree``;
    a node is copied (:func:`_own`) before it is changed."""
    return Tree(tree.task_id, dict(tree.nodes), dict(tree.edges), dict(tree.states), tree.rollouts, list(tree.log))


def _own(tree: Tree, node_id: int, owned: set[int]) -> Node:
    """Node ``node_id`` of ``tree`` as a private copy, safe to change."""
    if node_id not in owned:
        node = tree.nodes[node_id]
        tree.nodes[node_id] = dataclasses.replace(node, children=list(node.children))
        owned.add(node_id)
    return tree.nodes[node_id]


def _successor(
    state: SearchState,
    trees: list[Tree],
    derived: dict[int, _TreeFacts],
    waves: list[Any],
    planned: tuple[WavePlan, ...],
    calibrations: dict[tuple[Any, ...], Calibration],
) -> SearchState:
    new = SearchState(state.collection_id, state.seed, state.tasks, trees, waves, planned)
    new._derived = derived
    new._calibrations = calibrations
    # the first k waves of a successor are its predecessor's: their counts still hold
    new._spreads = dict(state._spreads)
    return new


def graft(
    state: SearchState, plan: WavePlan, rollouts: Sequence[Rollout], phase_name: str = "", wave_wall_s: float = 0.0
) -> SearchState:
    """A new state with each rollout added below its job's checkpoint (in job order).

    ``state`` is left as it was. The new state shares the trees no job touched, and in
    a touched tree every node but the continued checkpoints, so a wave costs in
    proportion to its own rollouts, not to the collection. When waves are planned
    ahead (``state.planned``), ``plan`` must be the oldest of them: waves are grafted in
    the order they were planned.
    """
    if len(rollouts) != len(plan.jobs):
        raise ValueError(f"wave has {len(plan.jobs)} jobs but {len(rollouts)} rollouts came back")
    if (plan.phase_index, plan.wave_index) in state.waves:
        raise ValueError(f"wave {plan.wave_index} of phase {plan.phase_index} is already grafted onto this state")
    planned = state.planned
    if planned:
        oldest = planned[0]
        same = oldest is plan or (
            (oldest.phase_index, oldest.wave_index) == (plan.phase_index, plan.wave_index) and oldest.jobs == plan.jobs
        )
        if not same:
            raise ValueError(
                f"wave {plan.wave_index} of phase {plan.phase_index} is not the oldest planned wave "
                f"({oldest.wave_index} of phase {oldest.phase_index}); waves are grafted in the order planned"
            )
        planned = planned[1:]
    trees = list(state.trees)
    owned: dict[int, set[int]] = {}
    for job, ro in zip(plan.jobs, rollouts, strict=True):
        ti = job.tree_index
        if not 0 <= ti < len(trees):
            raise ValueError(f"job continues tree {ti}, but the state has {len(trees)} trees")
        if ti not in owned:
            trees[ti], owned[ti] = _cow_tree(trees[ti]), set()
        tree = trees[ti]
        if job.node_id not in tree.nodes or tree.nodes[job.node_id].is_leaf:
            raise ValueError(f"job continues node {job.node_id} of tree {ti}, which is not a checkpoint")
        _own(tree, job.node_id, owned[ti])
        index = tree.rollouts
        parent = job.node_id
        for piece in ro.pieces:
            node = tree.add_node(
                parent,
                piece.turns,
                piece.kind,
                steps=piece.steps,
                context_ids=piece.context_ids,
                rollout=index,
                cause=piece.cause,
            )
            owned[ti].add(node.id)
            if piece.kind == "checkpoint":
                tree.states[node.id] = piece.state
            parent = node.id
        tree.rollouts += 1
        tree.log.append(
            RolloutRecord(
                rollout=index,
                phase=plan.phase_index,
                phase_name=phase_name,
                wave=plan.wave_index,
                node=job.node_id,
                branch=job.branch,
                seed=job.seed,
                failed=ro.leaf.kind == "failed",
                cause=ro.leaf.cause,
                leaf=ro.leaf.kind,
                wall_s=ro.wall_s,
                wave_wall_s=wave_wall_s,
                usage=Usage.of_rollout(ro),
            )
        )
    derived = {ti: f for ti, f in state._derived.items() if ti not in owned}
    for ti in owned:
        derived[ti] = _grown_facts(state, ti, trees[ti])
    # a calibration covers earlier waves only, which this graft does not change
    waves = [*state.waves, (plan.phase_index, plan.wave_index)]
    return _successor(state, trees, derived, waves, planned, dict(state._calibrations))


def _grown_facts(state: SearchState, ti: int, tree: Tree) -> _TreeFacts:
    """Facts of ``tree`` (tree ``ti`` of ``state`` with rollouts appended), updated from
    the old tree's where those were computed: the new log records and nodes come last."""
    old = state._derived.get(ti)
    if old is None or not old.describes(state.trees[ti], ti):
        return _TreeFacts(tree, ti)
    spent = None
    if old._spent is not None:
        spent = dict(old._spent)
        for r in tree.log[len(old.tree.log) :]:
            spent[r.phase] = spent.get(r.phase, 0) + r.usage.budget_spent
    unscored = None
    if old._unscored is not None:
        new_nodes = (tree.nodes[i] for i in range(len(old.tree.nodes), len(tree.nodes)))
        fresh = (n.id for n in new_nodes if n.value is None and n.kind in _SCORED_KINDS and n.context_ids)
        unscored = old._unscored + tuple(fresh)
    rank, changed = old.handover(range(len(old.tree.nodes), len(tree.nodes)))
    return _TreeFacts(tree, ti, spent=spent, unscored=unscored, rank=rank, changed=changed)


def unscored(state: SearchState) -> list[tuple[int, int]]:
    """(tree index, node id) of every node the critic has not scored yet, in tree order."""
    return [(ti, nid) for ti in range(len(state.trees)) for nid in state.facts(ti).unscored]


def with_predictions(
    state: SearchState, predictions: Mapping[tuple[int, int], tuple[float | None, float | None]]
) -> SearchState:
    """A new state with critic predictions ``{(tree, node): (value, std)}`` filled in.

    Like :func:`graft`, copies only the trees and nodes it changes.
    """
    trees = list(state.trees)
    owned: dict[int, set[int]] = {}
    for (ti, nid), (value, std) in predictions.items():
        if ti not in owned:
            trees[ti], owned[ti] = _cow_tree(trees[ti]), set()
        node = _own(trees[ti], nid, owned[ti])
        node.value, node.value_std = value, std
    derived = {ti: f for ti, f in state._derived.items() if ti not in owned}
    for ti, nids in owned.items():
        old = state._derived.get(ti)
        if old is not None and old.describes(state.trees[ti], ti):
            left = None if old._unscored is None else tuple(n for n in old._unscored if n not in nids)
            rank, changed = old.handover(nids)
            derived[ti] = _TreeFacts(trees[ti], ti, spent=old._spent, unscored=left, rank=rank, changed=changed)
    # a calibration that covers a wave whose nodes were just scored is fitted again
    scored = set()
    for ti, nid in predictions:
        tree = state.trees[ti]
        pe = tree.nodes[nid].parent_edge
        r = tree.edges[pe].rollout if pe is not None else -1
        scored.add((tree.log[r].phase, tree.log[r].wave) if 0 <= r < len(tree.log) else None)
    calibrations = {
        key: c for key, c in state._calibrations.items() if not scored & ({None} | set(state.waves[: key[0]]))
    }
    return _successor(state, trees, derived, list(state.waves), state.planned, calibrations)


Predictions = Mapping[tuple[int, int], tuple[float | None, float | None]]


@dataclass(frozen=True)
class WaveRecord:
    """What one continuation wave left behind, as a pipeline stores it: its rollouts (in
    job order), its elapsed time, and the critic predictions scoring added after it
    (``None`` if it was not scored yet)."""

    phase_index: int
    wave_index: int
    rollouts: Sequence[Rollout]
    wave_wall_s: float = 0.0
    predictions: Predictions | None = None


def replay(state: SearchState, search: Priority, waves: Iterable[WaveRecord]) -> SearchState:
    """The state a collection reached, rebuilt from its stored waves (pure; no rollout runs).

    ``state`` is the scored state after the evidence phase; ``waves`` are the records of
    the continuation waves, in the order they were grafted. Each wave is planned again
    exactly as the run planned it (:func:`plan_ahead`: planning is a pure function of
    the state and the seed), its stored rollouts are grafted and its stored predictions
    applied. The result also holds the waves the run had planned beyond the last
    stored one (``planned``), which a resumed run launches again with the same jobs.
    """
    for rec in waves:
        state = plan_ahead(state, search, rec.phase_index)
        nxt = state.planned[0] if state.planned else None
        if nxt is None or (nxt.phase_index, nxt.wave_index) != (rec.phase_index, rec.wave_index):
            where = "nothing" if nxt is None else f"wave {nxt.wave_index} of phase {nxt.phase_index}"
            raise ValueError(
                f"stored wave {rec.wave_index} of phase {rec.phase_index} is not the next wave the search plans "
                f"({where}): the stored waves do not belong to this search configuration and seed"
            )
        state = graft(state, nxt, rec.rollouts, search.phases[rec.phase_index].name, rec.wave_wall_s)
        if rec.predictions is not None:
            state = with_predictions(state, rec.predictions)
    return state
