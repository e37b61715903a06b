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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from focus.agent import BranchState, Rollout, derive_seed
from focus.env import Task
from focus.priority import Priority, node_evidence
from focus.tree import Tree

#: Usage counters recorded per rollout and summed per phase.
USAGE_KEYS = ("transitions", "rollout_steps", "model_calls", "tokens", "compactions")


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

    @property
    def empty(self) -> bool:
        return not self.jobs


@dataclass
class SearchState:
    """Trees of one collection plus the record of the waves that built them."""

    collection_id: str
    seed: int
    tasks: tuple[Task, ...]
    trees: list[Tree]
    #: (phase index, wave index) of every wave grafted, in order.
    waves: list[tuple[int, int]] = field(default_factory=list)

    def waves_done(self, phase_index: int) -> int:
        return sum(1 for p, _ in self.waves if p == phase_index)

    def usage(self, phase_index: int | None = None) -> dict[str, Any]:
        """What the rollouts of one phase (or all) actually used, from the tree logs."""
        recs = [r for t in self.trees for r in t.log if phase_index is None or r["phase"] == phase_index]
        return usage_of(recs)


def usage_of(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {k: sum(int(r[k]) for r in records) for k in USAGE_KEYS}
    out["rollouts"] = len(records)
    out["failed_rollouts"] = sum(1 for r in records if r["failed"])
    #: Rollout time summed over rollouts (they overlap) and elapsed time of the waves.
    out["rollout_wall_s"] = sum(float(r["wall_s"]) for r in records)
    waves = {(r["phase"], r["wave"]): float(r.get("wave_wall_s", 0.0)) for r in records}
    out["wall_s"] = sum(waves.values())
    return out


def copy_tree(tree: Tree) -> Tree:
    """A copy that shares only immutable parts (edges, turns, branch states)."""
    nodes = {i: dataclasses.replace(n, children=list(n.children)) for i, n in tree.nodes.items()}
    return Tree(tree.task_id, nodes, dict(tree.edges), dict(tree.states), tree.rollouts, [dict(r) for r in tree.log])


def copy_state(state: SearchState) -> SearchState:
    return SearchState(
        state.collection_id, state.seed, state.tasks, [copy_tree(t) for t in state.trees], list(state.waves)
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
    the phase budget.
    """
    if not 0 <= phase_index < len(search.phases):
        raise ValueError(f"phase index {phase_index} out of range: the search has {len(search.phases)} phases")
    done = state.waves_done(phase_index)
    if wave_index != done:
        raise ValueError(
            f"cannot plan wave {wave_index} of phase {search.phases[phase_index].name!r}: {done} waves of it are done "
            f"(plan wave {done} next)"
        )
    phase = search.phases[phase_index]
    if phase.is_evidence:
        if done:
            return WavePlan(phase_index, wave_index)
        jobs = []
        for ti, tree in enumerate(state.trees):
            base = len(tree.root.children)
            for b in range(base, base + (phase.rollouts_per_task or 0)):
                jobs.append(
                    RolloutJob(ti, tree.ROOT, rollout_seed(state.seed, ti, tree.ROOT, b), tree.states[tree.ROOT], b)
                )
        return WavePlan(phase_index, wave_index, tuple(jobs))
    if phase.max_waves is not None and done >= phase.max_waves:
        return WavePlan(phase_index, wave_index)
    # A rollout that made no task transition (only parse errors or compactions) still
    # counts one against the budget, so a phase always ends.
    spent = sum(max(1, int(r["transitions"])) for t in state.trees for r in t.log if r["phase"] == phase_index)
    remaining = (phase.transitions or 0) - spent
    if remaining <= 0:
        return WavePlan(phase_index, wave_index)
    evidence = {}
    for ti, tree in enumerate(state.trees):
        values = search.values(tree)
        for nid, ev in node_evidence(tree, ti, values).items():
            if nid in tree.states and ev.depth <= phase.max_depth and ev.branches < phase.max_branches:
                evidence[(ti, nid)] = ev

    def entry(ev: Any) -> tuple[float, float, int, int]:
        tie = derive_seed("tie", state.seed, ev.tree_index, ev.node_id, ev.branches + ev.pending) / 2**31
        return (-float(search(ev)), tie, ev.tree_index, ev.node_id)

    heap = [entry(ev) for ev in evidence.values()]
    heapq.heapify(heap)
    jobs = []
    planned = 0.0
    while heap and len(jobs) < phase.wave_size and planned < remaining:
        _, _, ti, nid = heapq.heappop(heap)
        ev = evidence[(ti, nid)]
        branch = ev.branches + ev.pending
        tree = state.trees[ti]
        jobs.append(RolloutJob(ti, nid, rollout_seed(state.seed, ti, nid, branch), tree.states[nid], branch))
        planned += ev.expected_transitions
        ev = dataclasses.replace(ev, pending=ev.pending + 1)
        evidence[(ti, nid)] = ev
        if ev.branches + ev.pending < phase.max_branches:
            heapq.heappush(heap, entry(ev))
    return WavePlan(phase_index, wave_index, tuple(jobs))


def graft(
    state: SearchState, plan: WavePlan, rollouts: Sequence[Rollout], phase_name: str = "", wave_wall_s: float = 0.0
) -> SearchState:
    """A new state with each rollout added below its job's checkpoint (in job order)."""
    if len(rollouts) != len(plan.jobs):
        raise ValueError(f"wave has {len(plan.jobs)} jobs but {len(rollouts)} rollouts came back")
    if (plan.phase_index, plan.wave_index) in state.waves:
        raise ValueError(f"wave {plan.wave_index} of phase {plan.phase_index} is already grafted onto this state")
    new = copy_state(state)
    for job, ro in zip(plan.jobs, rollouts, strict=True):
        tree = new.trees[job.tree_index]
        if job.node_id not in tree.nodes or tree.nodes[job.node_id].is_leaf:
            raise ValueError(f"job continues node {job.node_id} of tree {job.tree_index}, which is not a checkpoint")
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
            if piece.kind == "checkpoint":
                tree.states[node.id] = piece.state
            parent = node.id
        tree.rollouts += 1
        turns = ro.turns
        tree.log.append(
            {
                "rollout": index,
                "phase": plan.phase_index,
                "phase_name": phase_name,
                "wave": plan.wave_index,
                "node": job.node_id,
                "branch": job.branch,
                "seed": job.seed,
                "transitions": sum(1 for t in turns if t.transition),
                "rollout_steps": len(turns),
                "model_calls": len(turns),
                "tokens": sum(len(t.completion_ids) for t in turns),
                "compactions": sum(1 for t in turns if t.kind == "compaction"),
                "failed": ro.leaf.kind == "failed",
                "cause": ro.leaf.cause,
                "leaf": ro.leaf.kind,
                "wall_s": ro.wall_s,
                "wave_wall_s": wave_wall_s,
            }
        )
    new.waves.append((plan.phase_index, plan.wave_index))
    return new
