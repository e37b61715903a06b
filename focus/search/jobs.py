"""What a plan is made of: the jobs of a wave (:class:`RolloutJob`, :class:`WavePlan`) and
the seed each continuation samples with (:func:`rollout_seed`)."""

from __future__ import annotations

from dataclasses import dataclass

from focus.agent import BranchState, derive_seed
from focus.reprs import short_repr


@dataclass(frozen=True)
class RolloutJob:
    """One rollout to run: from checkpoint ``node_id`` of tree ``tree_index``."""

    __repr__ = short_repr

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


def rollout_seed(seed: int, tree_index: int, node_id: int, branch: int) -> int:
    """Seed of a continuation: fixed by (collection seed, tree, node, branch index), and
    consecutive over the branches of one checkpoint (a hash of the checkpoint plus the
    branch index), so that siblings' first model calls can go as one request
    (:mod:`focus.siblings`)."""
    return derive_seed(seed, tree_index, node_id) + branch
