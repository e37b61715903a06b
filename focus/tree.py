"""The search tree: checkpoints (nodes) joined by segments (edges).

Everything here is plain, picklable data. A rollout is a root-to-leaf path. A node is
either a checkpoint (an eligible decision point, continuable) or a leaf: ``terminal``
(the env said done; value 0), ``truncated`` (a step or context limit; bootstrap from
the critic) or ``failed`` (model or env failure; excluded from learning signals). The
root is always a checkpoint.

Branch states (what is needed to continue from a checkpoint) are kept beside the tree
in ``Tree.states``, so the tree itself stays small and cheap to ship.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from focus.reprs import short_repr
from focus.sums import left_sum
from focus.usage import Usage, fields_state, restore_fields

NODE_KINDS = ("checkpoint", "terminal", "truncated", "failed")


@dataclass(frozen=True, slots=True)
class Turn:
    """One model call inside a segment, recorded token-exactly. Slotted: one per model
    call, kept for the whole collection (and pickled with its trees; one pickled with a
    ``__dict__`` loads field by field, :func:`focus.usage.restore_fields`)."""

    __repr__ = short_repr

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    #: 1 if the completion tokens are trained on (compactions default to 0).
    loss_mask: int
    finish_reason: str
    #: "action" (an env step, or a parse error shown back) or "compaction".
    kind: str = "action"
    #: Reward of the task transition this turn caused (0 if none).
    reward: float = 0.0
    #: Whether the turn caused a task transition (parse errors and compactions do not).
    transition: bool = True
    observation: str = ""
    #: Policy version that sampled the turn (server-reported); None: the policy's at preparation.
    policy_version: str | None = None

    def __getstate__(self) -> tuple[Any, ...]:
        return _state(self)

    def __setstate__(self, state: Any) -> None:
        restore_fields(self, state)


@dataclass
class Edge:
    """A segment: the turns from checkpoint ``parent`` to the next node ``child``."""

    __repr__ = short_repr

    id: int
    parent: int
    child: int
    turns: tuple[Turn, ...]
    #: Rollout index that produced the segment (several edges share one rollout).
    rollout: int = 0

    @property
    def rewards(self) -> list[float]:
        """One reward per task transition, in order."""
        return [t.reward for t in self.turns if t.transition]

    @property
    def k(self) -> int:
        """Number of task transitions in the segment (the discount exponent)."""
        return sum(1 for t in self.turns if t.transition)

    def discounted_reward(self, gamma: float) -> float:
        return left_sum(r * gamma**i for i, r in enumerate(self.rewards))

    @property
    def n_tokens(self) -> int:
        return sum(len(t.completion_ids) for t in self.turns)


@dataclass
class Node:
    """A checkpoint or a leaf."""

    __repr__ = short_repr

    id: int
    parent_edge: int | None
    depth: int
    #: Task transitions and rollout steps from the root.
    transitions: int
    steps: int
    kind: str = "checkpoint"
    #: Prompt ids at this node (the critic's input); leaves may leave it empty.
    context_ids: tuple[int, ...] = ()
    #: Critic prediction v-hat and optional uncertainty, filled by scoring.
    value: float | None = None
    value_std: float | None = None
    children: list[int] = field(default_factory=list)
    #: Why a failed leaf failed.
    cause: str = ""

    @property
    def is_leaf(self) -> bool:
        return self.kind != "checkpoint"


@dataclass(frozen=True, slots=True)
class RolloutRecord:
    """What one rollout grafted by search was: where it started, in which phase and
    wave, with which seed, how it ended and what it used. A tree's ``log`` holds one
    per rollout, so batch statistics can be derived from the trees alone. Slotted, as
    :class:`~focus.usage.Usage`: one per rollout, kept for the whole collection."""

    #: Index of the rollout in its tree (``Edge.rollout`` of its segments).
    rollout: int
    phase: int
    phase_name: str
    wave: int
    #: The checkpoint it continued, and which continuation of it (0-based).
    node: int
    branch: int
    seed: int
    failed: bool
    #: Why it failed (``None`` unless ``failed``).
    cause: str | None
    #: The kind of its leaf: terminal, truncated or failed.
    leaf: str
    wall_s: float
    #: Elapsed time of its wave (the same for every rollout of the wave).
    wave_wall_s: float
    usage: Usage

    def __getstate__(self) -> tuple[Any, ...]:
        return _state(self)

    def __setstate__(self, state: Any) -> None:
        restore_fields(self, state)


#: Each slotted record class's field getter (:func:`focus.usage.fields_state`).
_STATE: dict[type, Any] = {}


def _state(record: Any) -> tuple[Any, ...]:
    """The ``__getstate__`` of :class:`Turn` and :class:`RolloutRecord` (and subclasses)."""
    getter = _STATE.get(type(record))
    if getter is None:
        getter = _STATE[type(record)] = fields_state(type(record))
    return tuple(getter(record))


@dataclass
class Tree:
    """All checkpoints and segments of one task."""

    task_id: str
    nodes: dict[int, Node] = field(default_factory=dict)
    edges: dict[int, Edge] = field(default_factory=dict)
    #: Branch states of continuable checkpoints (node id -> focus.agent.BranchState).
    states: dict[int, Any] = field(default_factory=dict)
    #: Rollouts started from each node (children plus rollouts still running).
    rollouts: int = 0
    #: One record per rollout grafted by search, in the order grafted.
    log: list[RolloutRecord] = field(default_factory=list)

    ROOT = 0

    def __repr__(self) -> str:
        # A summary: the dataclass's repr printed every node, edge and turn (84 kB for one
        # tree of the README's toy collection in a notebook); ``nodes``/``edges`` hold them.
        kinds = {kind: 0 for kind in NODE_KINDS}
        for node in self.nodes.values():
            kinds[node.kind] = kinds.get(node.kind, 0) + 1
        counts = ", ".join(f"{kind}={n}" for kind, n in kinds.items())
        return f"Tree({self.task_id!r}, nodes={len(self.nodes)} ({counts}), edges={len(self.edges)}, rollouts={self.rollouts})"

    def __setstate__(self, state: dict[str, Any]) -> None:
        # trees pickled before the log was typed hold one dict per rollout
        log = state.get("log") or []
        if log and isinstance(log[0], dict):
            state["log"] = [RolloutRecord(**{**r, "wave_wall_s": r.get("wave_wall_s", 0.0)}) for r in log]
        self.__dict__.update(state)

    @classmethod
    def new(cls, task_id: str, root_state: Any, context_ids: tuple[int, ...] = ()) -> Tree:
        t = cls(task_id)
        t.nodes[0] = Node(0, None, 0, 0, 0, "checkpoint", context_ids)
        t.states[0] = root_state
        return t

    @property
    def root(self) -> Node:
        return self.nodes[self.ROOT]

    def add_node(
        self,
        parent: int,
        turns: tuple[Turn, ...],
        kind: str,
        *,
        steps: int,
        context_ids: tuple[int, ...] = (),
        rollout: int = 0,
        cause: str = "",
    ) -> Node:
        """Append a segment from ``parent`` ending in a new node; return the node."""
        if kind not in NODE_KINDS:
            raise ValueError(f"unknown node kind {kind!r}")
        p = self.nodes[parent]
        nid, eid = len(self.nodes), len(self.edges)
        k = 0  # Edge.k, without its generator
        for t in turns:
            if t.transition:
                k += 1
        edge = Edge(eid, parent, nid, turns, rollout)
        node = Node(nid, eid, p.depth + 1, p.transitions + k, steps, kind, context_ids, cause=cause)
        self.nodes[nid] = node
        self.edges[eid] = edge
        p.children.append(eid)
        return node

    def parent(self, node: Node) -> Node | None:
        return None if node.parent_edge is None else self.nodes[self.edges[node.parent_edge].parent]

    def child_edges(self, node_id: int) -> list[Edge]:
        return [self.edges[e] for e in self.nodes[node_id].children]

    def path_to(self, node_id: int) -> list[Edge]:
        """Edges from the root down to ``node_id``."""
        path: list[Edge] = []
        node = self.nodes[node_id]
        while node.parent_edge is not None:
            e = self.edges[node.parent_edge]
            path.append(e)
            node = self.nodes[e.parent]
        return path[::-1]

    def leaves(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if n.is_leaf)

    def checkpoints(self) -> Iterator[Node]:
        return (n for n in self.nodes.values() if not n.is_leaf)

    def postorder(self) -> list[Node]:
        """Nodes, children before parents (ids grow downward, so reverse id order)."""
        return [self.nodes[i] for i in sorted(self.nodes, reverse=True)]

    def reaches_valid_leaf(self, node_id: int) -> bool:
        """Whether some complete (non-failed) rollout passes through ``node_id``. A walk
        with a stack of its own: recursing, an episode of about 500 checkpoints
        (``EveryDecision``, 500 steps) exceeded Python's recursion limit once the whole
        collection had run."""
        stack = [node_id]
        while stack:
            node = self.nodes[stack.pop()]
            if node.is_leaf:
                if node.kind != "failed":
                    return True
            else:
                stack.extend(self.edges[e].child for e in node.children)
        return False

    def without_states(self) -> Tree:
        """A copy without branch states (what a batch or a report needs)."""
        return Tree(self.task_id, self.nodes, self.edges, {}, self.rollouts, self.log)

    def stats(self) -> dict[str, int]:
        """Nodes by kind and what the recorded turns hold. A model answer whose env step
        failed is in no turn: the batch statistics (:class:`focus.usage.Usage`, from
        :attr:`log`) count it in ``model_calls`` and ``tokens``, this does not."""
        kinds = {k: 0 for k in NODE_KINDS}
        for n in self.nodes.values():
            kinds[n.kind] += 1
        turns = [t for e in self.edges.values() for t in e.turns]
        return {
            "nodes": len(self.nodes),
            "edges": len(self.edges),
            **{f"{k}_nodes": v for k, v in kinds.items()},
            "transitions": sum(1 for t in turns if t.transition),
            "rollout_steps": len(turns),
            "model_calls": len(turns),
            "tokens": sum(len(t.completion_ids) for t in turns),
            "compactions": sum(1 for t in turns if t.kind == "compaction"),
        }
