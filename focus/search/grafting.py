"""What finished rollouts and critic scores do to a state, and rebuilding a state from
its records.

:func:`graft` adds a wave's rollouts to a successor of the state, :func:`with_predictions`
fills in the critic's scores, and :func:`replay` rebuilds the state a collection reached
from its stored waves (planning again, grafting the stored rollouts). Each returns a new
state that shares every tree and node it did not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from focus.agent import CONTEXT_LIMIT, Rollout
from focus.priority import Calibration, Priority
from focus.refusals import opening_refusal, refused_opening
from focus.search.copies import cow_tree, own
from focus.search.jobs import RolloutJob, WavePlan
from focus.search.planning import plan_ahead
from focus.search.shape import known_shape
from focus.search.state import _SCORED_KINDS, SearchState, _successor, _TreeFacts
from focus.tree import RolloutRecord, Tree
from focus.usage import Usage


def graft(
    state: SearchState,
    plan: WavePlan,
    rollouts: Sequence[Rollout],
    phase_name: str = "",
    wave_wall_s: float = 0.0,
    ahead: Mapping[int, TreeWave] | None = None,
) -> SearchState:
    """A new state with each rollout added below its job's checkpoint (in job order).

    ``state`` is left as it was. The new state shares the trees no job touched, and in
    a touched tree every node but the continued checkpoints, so a wave costs in
    proportion to its own rollouts, not to the collection. When waves are planned
    ahead (``state.planned``), ``plan`` must be the oldest of them: waves are grafted in
    the order they were planned.

    ``ahead``: trees of the wave already grafted from ``state`` while the wave ran
    (:func:`graft_tree`, maybe scored by :func:`score_tree`), by tree index; their trees
    and facts are taken over (single use: their records of the wave get
    ``wave_wall_s`` here), the other trees are grafted from ``rollouts``. The result is
    the state ``graft`` without ``ahead`` would give, with the parts' predictions
    applied as :func:`with_predictions` would apply them.
    """
    if len(rollouts) != len(plan.jobs):
        raise ValueError(f"wave has {len(plan.jobs)} jobs but {len(rollouts)} rollouts came back")
    planned = _after(state, plan)
    ahead = ahead or {}
    trees = list(state.trees)
    owned: dict[int, set[int]] = {}
    jobs_ahead: dict[int, int] = {}
    for job, ro in zip(plan.jobs, rollouts, strict=True):
        ti = job.tree_index
        if ti in ahead:
            jobs_ahead[ti] = jobs_ahead.get(ti, 0) + 1
            continue
        if not 0 <= ti < len(trees):
            raise ValueError(f"job continues tree {ti}, but the state has {len(trees)} trees")
        if ti not in owned:
            trees[ti], owned[ti] = cow_tree(trees[ti]), set()
        _add_rollout(trees[ti], job, ro, owned[ti], plan, phase_name, wave_wall_s)
    derived = dict(state._derived)  # a copy at C speed; the changed trees' facts replaced below
    for ti in owned:
        derived[ti] = _grown_facts(state, ti, trees[ti])
    scored: list[tuple[int, int]] = []
    for ti, part in ahead.items():
        if (part.phase_index, part.wave_index, part.tree_index) != (plan.phase_index, plan.wave_index, ti):
            raise ValueError(f"tree {ti} was grafted ahead for another wave or tree")
        if part.records != jobs_ahead.get(ti, 0):
            raise ValueError(f"tree {ti} was grafted ahead with {part.records} of its {jobs_ahead.get(ti, 0)} jobs")
        trees[ti], derived[ti] = part.tree, part.facts
        for record in part.tree.log[len(part.tree.log) - part.records :]:
            _set(record, "wave_wall_s", wave_wall_s)  # made by graft_tree for this wave, not shared
        scored.extend(part.predictions)
    # a calibration covers earlier waves only, which this graft does not change
    waves = [*state.waves, (plan.phase_index, plan.wave_index)]
    calibrations = _calibrations_kept(state._calibrations, trees, waves, scored)
    return _successor(state, trees, derived, waves, planned, calibrations, (*owned, *ahead))


def _after(state: SearchState, plan: WavePlan) -> tuple[WavePlan, ...]:
    """``state.planned`` once ``plan`` is grafted; raises if ``plan`` is not the wave to graft next."""
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
    return planned


def _add_rollout(
    tree: Tree, job: RolloutJob, ro: Rollout, owned: set[int], plan: WavePlan, phase_name: str, wave_wall_s: float
) -> None:
    """Add ``ro`` below ``job``'s checkpoint of ``tree`` (a private copy: :func:`focus.search.copies.cow_tree`)."""
    if job.node_id not in tree.nodes or tree.nodes[job.node_id].is_leaf:
        raise ValueError(f"job continues node {job.node_id} of tree {job.tree_index}, which is not a checkpoint")
    if ro.task_id != tree.task_id:
        # a rollout stored for another task's job (a replay planned otherwise than the
        # run was, or rollouts out of job order) would graft silently onto this tree
        raise ValueError(
            f"a rollout of task {ro.task_id!r} came back for a job of tree {job.tree_index} (task {tree.task_id!r}): "
            "the rollouts are not this plan's, in its job order"
        )
    own(tree, job.node_id, owned)
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
        owned.add(node.id)
        if piece.kind == "checkpoint":
            tree.states[node.id] = piece.state
        elif piece.cause == CONTEXT_LIMIT and not piece.turns:
            # the checkpoint's next prompt does not fit the model: every continuation
            # from it would end here again, with no transition, so none is planned
            tree.states.pop(parent, None)
        elif (
            parent == tree.ROOT
            and not piece.turns
            and refused_opening(piece.kind, piece.steps, piece.cause)
            and opening_refusal(tree, tree.root.children) is node
        ):
            # the task's opening prompt is over the model's context, and it is the same
            # on every rollout: none from the root is planned again (its first refusal
            # decides, after rollouts that all ended without a turn)
            tree.states.pop(parent, None)
        parent = node.id
    tree.rollouts += 1
    tree.log.append(
        _record(
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


def _record(**fields: Any) -> RolloutRecord:
    """``RolloutRecord(**fields)`` without the dataclass's ``__init__`` (the fields
    straight into the new instance's slots; the class has no ``__post_init__``): a
    frozen dataclass sets each of its 14 fields through ``object.__setattr__``, several
    microseconds per rollout grafted, more than the rest of its record-keeping."""
    record = _new(RolloutRecord)
    for name, value in fields.items():
        _RECORD_SET[name](record, value)
    return record


#: Each slot's setter (a member descriptor's, which the frozen class's ``__setattr__`` does not guard).
_RECORD_SET = {f.name: RolloutRecord.__dict__[f.name].__set__ for f in dataclasses.fields(RolloutRecord)}


_new = object.__new__
_set = object.__setattr__


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
    known = known_shape(old.shape, old.tree, old.known)  # grown when next asked for
    rank, changed, ahead = old.handover(range(len(old.tree.nodes), len(tree.nodes)))
    return _TreeFacts(tree, ti, spent=spent, unscored=unscored, rank=rank, changed=changed, known=known, ahead=ahead)


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
            trees[ti], owned[ti] = cow_tree(trees[ti]), set()
        node = own(trees[ti], nid, owned[ti])
        node.value, node.value_std = value, std
    derived = dict(state._derived)
    for ti, nids in owned.items():
        old = derived.pop(ti, None)
        if old is not None and old.describes(state.trees[ti], ti):
            derived[ti] = old.rescored(trees[ti], nids)
    calibrations = _calibrations_kept(state._calibrations, state.trees, state.waves, predictions)
    return _successor(state, trees, derived, list(state.waves), state.planned, calibrations, owned)


def _calibrations_kept(
    calibrations: Mapping[tuple[Any, ...], Calibration],
    trees: Sequence[Tree],
    waves: Sequence[tuple[int, int]],
    scored: Iterable[tuple[int, int]],
) -> dict[tuple[Any, ...], Calibration]:
    """The cached calibrations that still hold once the nodes ``scored`` (tree, node) got
    new predictions: a calibration that covers a wave whose nodes were just scored
    (or a node grafted by no wave) is fitted again."""
    waves_scored = set()
    for ti, nid in scored:
        tree = trees[ti]
        pe = tree.nodes[nid].parent_edge
        r = tree.edges[pe].rollout if pe is not None else -1
        waves_scored.add((tree.log[r].phase, tree.log[r].wave) if 0 <= r < len(tree.log) else None)
    if not waves_scored:
        return dict(calibrations)
    return {key: c for key, c in calibrations.items() if not waves_scored & ({None} | set(waves[: key[0]]))}


Predictions = Mapping[tuple[int, int], tuple[float | None, float | None]]


@dataclass(frozen=True)
class TreeWave:
    """One tree's share of a wave, grafted while the wave still runs (:func:`graft_tree`)
    and maybe scored (:func:`score_tree`): what :func:`graft` takes over for that tree
    at the wave's barrier instead of grafting its rollouts there.

    Grafting a tree needs only its own jobs' rollouts, and scoring it only the critic's
    predictions for its own nodes, so a collector can do both as soon as the last of the
    tree's jobs in the wave has finished, in whatever order trees finish: every part is
    a function of the state, the plan and the tree's rollouts, the same as the barrier
    computes. Single use: :func:`graft` hands its tree to the new state.
    """

    phase_index: int
    wave_index: int
    tree_index: int
    #: The tree with the wave's rollouts (a private copy; its records of the wave are
    #: the last ``records`` of its log, their ``wave_wall_s`` set by :func:`graft`).
    tree: Tree
    facts: _TreeFacts
    records: int
    #: The critic's predictions applied to it (empty until :func:`score_tree`).
    predictions: Predictions = field(default_factory=dict)

    @property
    def unscored(self) -> list[tuple[int, int]]:
        """(tree, node) of the nodes the critic should score (:func:`focus.search.unscored`'s, for this tree)."""
        return [(self.tree_index, nid) for nid in self.facts.unscored]


def graft_tree(
    state: SearchState,
    plan: WavePlan,
    tree_index: int,
    rollouts: Sequence[Rollout],
    phase_name: str = "",
    jobs: Sequence[int] | None = None,
) -> TreeWave:
    """Tree ``tree_index``'s share of :func:`graft`: its jobs of ``plan`` (in plan order)
    with ``rollouts`` (theirs, in that order), added to a private copy of the tree.
    ``jobs``: the positions of the tree's jobs in ``plan``, if known (a caller grafting
    every tree of a wave finds them in one pass, not one pass per tree).

    Pure, like :func:`graft` (the ranking of ``state``'s facts for the tree moves to the
    part, as it moves to a successor state). ``plan`` must be the wave :func:`graft`
    takes next.
    """
    _after(state, plan)
    if not 0 <= tree_index < len(state.trees):
        raise ValueError(f"job continues tree {tree_index}, but the state has {len(state.trees)} trees")
    if jobs is None:
        jobs = [i for i, job in enumerate(plan.jobs) if job.tree_index == tree_index]
    mine = [plan.jobs[i] for i in jobs]
    if any(job.tree_index != tree_index for job in mine) or list(jobs) != sorted(set(jobs)):
        raise ValueError(f"jobs {list(jobs)} are not tree {tree_index}'s jobs in plan order")
    if len(rollouts) != len(mine):
        raise ValueError(f"tree {tree_index} has {len(mine)} jobs in the wave but {len(rollouts)} rollouts came back")
    tree, owned = cow_tree(state.trees[tree_index]), set[int]()
    for job, ro in zip(mine, rollouts, strict=True):
        _add_rollout(tree, job, ro, owned, plan, phase_name, 0.0)
    facts = _grown_facts(state, tree_index, tree)
    return TreeWave(plan.phase_index, plan.wave_index, tree_index, tree, facts, len(mine))


def score_tree(
    state: SearchState,
    search: Priority,
    part: TreeWave,
    predictions: Predictions,
    rank: bool = True,
    calibration: Calibration | None = None,
) -> TreeWave:
    """``part`` with the critic's ``predictions`` for its nodes filled in, as
    :func:`with_predictions` fills them in (copying the nodes it changes), and, with
    ``rank``, the tree's ranking for the part's phase brought up to date under
    ``state``'s calibration, the work the next plan would otherwise do at the barrier
    (if the wave moves the calibration, the plan ranks the tree again, as it would
    have). ``calibration``: ``state.calibration(search)``, if the caller has it."""
    tree, owned = cow_tree(part.tree), set[int]()
    nids: set[int] = set()
    for (ti, nid), (value, std) in predictions.items():
        if ti != part.tree_index:
            raise ValueError(f"a prediction for tree {ti} given to tree {part.tree_index}'s part")
        node = own(tree, nid, owned)
        node.value, node.value_std = value, std
        nids.add(nid)
    facts = part.facts.rescored(tree, nids)
    if rank:
        calib = calibration if calibration is not None else state.calibration(search)
        facts.ranked(search, calib, part.phase_index, state.seed)
    return TreeWave(
        part.phase_index, part.wave_index, part.tree_index, tree, facts, part.records,
        {**part.predictions, **predictions},
    )  # fmt: skip


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
