"""A bound on the share of a continuation phase that checkpoints of one depth may take
(:attr:`focus.priority.Selective.depth_share`, docs/algorithm.md, "Depth share").

Selective ranks a continuation by the error it removes per expected transition, and on
some families that objective piles the budget onto one or two depths (issue 31,
mechanism 3: a family of 40 steps got 1,178 of its 1,500 continuations on its last
two). The planner's greedy choice (:class:`focus.search.planning._Greedy`) asks a
:class:`DepthShare` before it takes a checkpoint: a depth may hold at most ``factor``
times the share uniform branching would give it (its share of the eligible
checkpoints), plus one continuation, of the phase's continuations so far; a
checkpoint of a depth that is full leaves the wave (it is ranked again in the next).
An exploration pick is counted but never held: those slots are drawn independently of
the critic and of every outcome (``Selective.explore``), and a wave takes them first
whether or not it ranks (the plan's lead takes them before any ranking).
"""

from __future__ import annotations

from collections.abc import Mapping

from focus.priority import Phase
from focus.search.heads import plan_index
from focus.search.state import SearchState


def uniform_shares(state: SearchState, phase: Phase) -> dict[int, float]:
    """Each depth's share of the checkpoints eligible for ``phase`` (a saved state, depth
    at most ``max_depth``, fewer than ``max_branches`` continuations): where uniform
    branching would start a continuation, in expectation. Read from the plan index's
    counts (:meth:`focus.search.heads.PlanIndex.depth_counts`), kept up to date from the
    trees each wave changed: a pass over every tree's checkpoints at each wave cost
    0.03 ms a transition at 100k transitions over 2,000 tasks (docs/findings/estimator-allocation.md, "The bound as the default")."""
    counts: dict[int, int] = {}
    deepest, most = phase.max_depth, phase.max_branches
    for (depth, children), n in plan_index(state).depth_counts(state)[0].items():
        if depth <= deepest and children < most:
            counts[depth] = counts.get(depth, 0) + n
    total = sum(counts.values())
    return {d: c / total for d, c in counts.items()} if total else {}


def phase_starts(state: SearchState, phase_index: int, pending: Mapping[tuple[int, int], int]) -> dict[int, int]:
    """The continuations of phase ``phase_index`` by the depth of their checkpoint: those
    grafted (the trees' logs, through the plan index's counts) and ``pending`` (planned
    or running, per checkpoint)."""
    starts: dict[int, int] = {}
    for (phase, depth), n in plan_index(state).depth_counts(state)[1].items():
        if phase == phase_index:
            starts[depth] = starts.get(depth, 0) + n
    for (ti, nid), n in pending.items():
        d = state.trees[ti].nodes[nid].depth
        starts[d] = starts.get(d, 0) + n
    return starts


class DepthShare:
    """The running bound of one wave's choice: a checkpoint at depth ``d`` may be taken
    while the phase's continuations from depth ``d``, with it, are at most
    ``factor · u(d) · (N + 1) + 1``, ``N`` the phase's continuations so far and ``u(d)``
    the depth's share of the eligible checkpoints (:func:`uniform_shares`). The ``+ 1``
    lets every depth take one continuation whatever its share."""

    def __init__(self, factor: float, shares: dict[int, float], starts: dict[int, int]) -> None:
        self.factor, self.shares, self.starts = factor, shares, starts
        self.total = sum(starts.values())
        #: :meth:`allows`' answers since the last :meth:`take` (which changes them): a
        #: late wave at 100k transitions over 2,000 tasks asked about 3,000 times of a
        #: full depth between its takes (docs/findings/speed.md).
        self._known: dict[int, bool] = {}

    @classmethod
    def of(
        cls, state: SearchState, phase_index: int, phase: Phase, factor: float, pending: Mapping[tuple[int, int], int]
    ) -> DepthShare:
        """The bound for a wave of ``phase`` (phase ``phase_index``) planned in ``state``
        with ``pending`` continuations planned or running (the lead's picks included)."""
        return cls(factor, uniform_shares(state, phase), phase_starts(state, phase_index, pending))

    def allows(self, depth: int) -> bool:
        """Whether one more continuation may start at ``depth``."""
        ok = self._known.get(depth)
        if ok is None:
            ok = self._known[depth] = (
                self.starts.get(depth, 0) + 1 <= self.factor * self.shares.get(depth, 0.0) * (self.total + 1) + 1
            )
        return ok

    def take(self, depth: int) -> None:
        """Count one continuation started at ``depth``."""
        self.starts[depth] = self.starts.get(depth, 0) + 1
        self.total += 1
        self._known.clear()
