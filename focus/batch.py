"""The prepared training batch: what a trainer consumes.

Two kinds of rows. Actor rows, one per model turn: the exact prompt and completion
ids, the behaviour log-probs of the sampled tokens, a loss mask over the completion,
the segment's advantage and the reward. Critic rows, one per checkpoint: the context
ids, the critic target and its weight, and the critic's own prediction at collection
time. ``stats`` records what the collection actually used, per phase.

Storage (``storage.batches``) writes these as Parquet; ``focus.exporters`` turns them
into Tinker ``Datum`` and slime ``Sample`` records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ActorRow:
    collection_id: str
    iteration: int
    task_id: str
    tree_id: str
    node_id: int  # the segment's parent checkpoint
    edge_id: int
    turn_index: int  # position of the turn inside its segment
    policy_version: str
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    loss_mask: tuple[int, ...]  # one per completion token
    advantage: float
    reward: float  # reward of the transition this turn caused
    finish_reason: str
    kind: str = "action"  # or "compaction"
    #: The segment ends in a truncated leaf (step or context limit): its advantage
    #: bootstraps from the critic there, or counts the leaf as terminal (the
    #: estimator's ``truncation``).
    truncated: bool = False


@dataclass(frozen=True)
class CriticRow:
    collection_id: str
    iteration: int
    task_id: str
    tree_id: str
    node_id: int
    context_ids: tuple[int, ...]
    target: float
    weight: float
    prediction: float | None


@dataclass
class Batch:
    """Actor rows, critic rows and statistics of one collection."""

    collection_id: str
    iteration: int
    actor: list[ActorRow] = field(default_factory=list)
    critic: list[CriticRow] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def n_tokens(self) -> int:
        return sum(len(r.completion_ids) for r in self.actor)

    def summary(self) -> dict[str, Any]:
        return {
            "collection_id": self.collection_id,
            "iteration": self.iteration,
            "actor_rows": len(self.actor),
            "critic_rows": len(self.critic),
            "tokens": self.n_tokens,
            "tasks": len({r.task_id for r in self.actor}),
            **{k: v for k, v in self.stats.items() if not isinstance(v, (dict, list))},
        }
