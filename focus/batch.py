"""The prepared training batch: what a trainer consumes, held as Arrow columns.

Two tables. The actor table, one row per model turn: the exact prompt and completion
ids, the behaviour log-probs of the sampled tokens, a loss mask over the completion,
the segment's advantage and the reward. The critic table, one row per checkpoint: the
context ids, the critic target and its weight, and the critic's own prediction at
collection time. ``stats`` records what the collection actually used, per phase. The
columns are documented in ``docs/batch-schema.md``; :data:`ACTOR_SCHEMA` and
:data:`CRITIC_SCHEMA` (:mod:`focus.batch_schema`, with the typed rows) are the contract
with trainers and query tools, re-exported here.

The batch is columnar from the start: :class:`BatchBuilder` (what
``Collector.prepare`` fills) appends each turn's token ids, log-probs and mask to flat
buffers as it goes, converting every Python int once, and a token tuple shared by
several rows - the checkpoint prefix that sibling branches all send, which is also the
critic row's context - is converted and stored once, however many rows use it. So
writing a batch (``storage.batches``) is Parquet encoding alone. Converting Python ints
is most of that work: a batch holds millions of token ids, and each costs ~15 ns to pack
(one compiled ``struct.Struct`` per row length packs a whole row in one C call) against
~1 ns to gather into the final columns (:mod:`focus.batch_columns`).

Typed rows remain the view most code reads: ``batch.actor`` and ``batch.critic`` are
lists of :class:`ActorRow` / :class:`CriticRow`, built from the columns on first use
(``focus.exporters`` and ``focus.train_local`` iterate them). A batch can also be made
from rows, as before; it is converted when its tables are first asked for.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from focus.batch_columns import TokenBuffer, _gathered, _list_column, _Packer, _repeat, _scalars, finite
from focus.batch_schema import (
    _TOKEN,
    ACTOR_SCHEMA,
    CRITIC_SCHEMA,
    SCHEMA_VERSION,
    ActorRow,
    BatchError,
    CriticRow,
    actor_rows,
    critic_rows,
    numpy_of,
)

__all__ = [
    "ACTOR_SCHEMA",
    "CRITIC_SCHEMA",
    "SCHEMA_VERSION",
    "ActorRow",
    "Batch",
    "BatchBuilder",
    "BatchError",
    "CriticRow",
    "TokenBuffer",
    "actor_rows",
    "critic_rows",
]

# --- the builder ------------------------------------------------------------------------------


class BatchBuilder:
    """Appends actor and critic rows to column buffers; :meth:`build` makes the :class:`Batch`.

    Token sequences go through one :class:`TokenBuffer` for both tables, so a tuple
    shared by rows (or between a prompt and a critic context) is packed once. Bad values
    (an id outside int32, a float among ids, a mask entry other than 0/1, a log-prob
    that is not a number, lengths that disagree) raise :class:`BatchError` naming the
    column, at the row that carries them.
    """

    def __init__(self, collection_id: str, iteration: int) -> None:
        self.collection_id = collection_id
        self.iteration = iteration
        self.tokens = TokenBuffer()
        self._logprobs = _Packer("d", np.float64, "logprobs")
        self._masks = _Packer("b", np.int8, "loss_mask")
        self._a: dict[str, list[Any]] = {
            k: []
            for k in (
                "task_id",
                "tree_id",
                "node_id",
                "edge_id",
                "turn_index",
                "policy_version",
                "kind",
                "advantage",
                "reward",
                "finish_reason",
                "truncated",
                "prompt_start",
                "prompt_len",
                "completion_start",
                "completion_len",
                "mask_flag",
            )
        }
        #: packed as they come, grown in place (a list of chunks joined at the end held both)
        self._logprobs_bytes = bytearray()
        #: row -> packed mask bytes, for rows whose mask is not one repeated flag
        self._mixed_masks: dict[int, bytes] = {}
        self._c: dict[str, list[Any]] = {
            k: [] for k in ("task_id", "tree_id", "node_id", "context_start", "context_len", "target", "weight")
        }
        self._predictions: list[float | None] = []

    def __len__(self) -> int:
        return len(self._a["task_id"])

    def add_turn(
        self,
        task_id: str,
        tree_id: str,
        node_id: int,
        edge_id: int,
        turn_index: int,
        policy_version: str,
        kind: str,
        prompt_ids: Sequence[int],
        completion_ids: Sequence[int],
        logprobs: Sequence[float],
        loss_mask: int | Sequence[int],
        advantage: float,
        reward: float,
        finish_reason: str,
        truncated: bool = False,
        *,
        chained: bool = False,
    ) -> None:
        """One actor row. ``loss_mask`` is one flag for every completion token (what the
        collector records per turn) or one entry per token; ``truncated``: the row's
        segment ends in a truncated leaf. ``chained``: the prompt may extend the previous
        row's prompt and completion (a rollout's next turn), and is then packed by its
        tail alone (:class:`TokenBuffer`); the prefix is compared by value, so only a
        caller whose ids were checked when first packed says so (the collector: each
        prompt is the last one's tuple, its completion and new ids)."""
        n, row = len(completion_ids), len(self)
        if len(logprobs) != n:
            raise BatchError(f"actor row {row} has {n} completion ids but {len(logprobs)} logprobs entries")
        if isinstance(loss_mask, (int, np.integer)):
            flag = int(loss_mask)
            if flag not in (0, 1):
                raise BatchError(f"actor row {row}: loss_mask entries must be 0 or 1, got {flag}")
        else:
            if len(loss_mask) != n:
                raise BatchError(f"actor row {row} has {n} completion ids but {len(loss_mask)} loss_mask entries")
            packed = self._masks.pack(loss_mask)  # refuses floats and values outside int8, naming them
            ones = packed.count(1)
            if ones + packed.count(0) != n:
                raise BatchError(f"actor row {row}: loss_mask entries must be 0 or 1")
            if ones in (0, n):
                flag = 1 if ones else 0
            else:
                flag = -1
                self._mixed_masks[row] = packed
        a = self._a
        prompt_start = self.tokens.add(prompt_ids, "prompt_ids", chain=chained)
        completion_start = self.tokens.add(completion_ids, "completion_ids")
        self._logprobs_bytes += self._logprobs.pack(logprobs)
        a["task_id"].append(task_id)
        a["tree_id"].append(tree_id)
        a["node_id"].append(node_id)
        a["edge_id"].append(edge_id)
        a["turn_index"].append(turn_index)
        a["policy_version"].append(policy_version)
        a["kind"].append(kind)
        a["advantage"].append(advantage)
        a["reward"].append(reward)
        a["finish_reason"].append(finish_reason)
        a["truncated"].append(bool(truncated))
        a["prompt_start"].append(prompt_start)
        a["prompt_len"].append(len(prompt_ids))
        a["completion_start"].append(completion_start)
        a["completion_len"].append(n)
        a["mask_flag"].append(flag)

    def add_checkpoint(
        self,
        task_id: str,
        tree_id: str,
        node_id: int,
        context_ids: Sequence[int],
        target: float,
        weight: float,
        prediction: float | None,
    ) -> None:
        """One critic row."""
        c = self._c
        c["context_start"].append(self.tokens.add(context_ids, "context_ids"))
        c["context_len"].append(len(context_ids))
        c["task_id"].append(task_id)
        c["tree_id"].append(tree_id)
        c["node_id"].append(node_id)
        c["target"].append(target)
        c["weight"].append(weight)
        self._predictions.append(prediction)

    def add_rows(self, actor: Sequence[ActorRow], critic: Sequence[CriticRow]) -> BatchBuilder:
        """Typed rows, as they are; a row of another collection or iteration is refused."""
        for i, r in enumerate(actor):
            self._same_batch(r, "actor", i)
            self.add_turn(
                r.task_id, r.tree_id, r.node_id, r.edge_id, r.turn_index, r.policy_version, r.kind,
                r.prompt_ids, r.completion_ids, r.logprobs, r.loss_mask, r.advantage, r.reward, r.finish_reason,
                r.truncated,
            )  # fmt: skip
        for i, c in enumerate(critic):
            self._same_batch(c, "critic", i)
            self.add_checkpoint(c.task_id, c.tree_id, c.node_id, c.context_ids, c.target, c.weight, c.prediction)
        return self

    def _same_batch(self, r: ActorRow | CriticRow, what: str, index: int) -> None:
        if r.collection_id != self.collection_id or r.iteration != self.iteration:
            raise BatchError(
                f"{what} row {index} belongs to collection {r.collection_id!r} iteration {r.iteration!r}, "
                f"but the batch is {self.collection_id!r} iteration {self.iteration!r}"
            )

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """The actor and critic tables of the rows added so far."""
        pool = self.tokens.values()
        a, c = self._a, self._c
        n = len(a["task_id"])
        p_len = np.array(a["prompt_len"], dtype=np.int64)
        c_len = np.array(a["completion_len"], dtype=np.int64)
        prompts = _gathered(pool, np.array(a["prompt_start"], dtype=np.int64), p_len)
        completions = _gathered(pool, np.array(a["completion_start"], dtype=np.int64), c_len)
        logprobs = np.frombuffer(bytes(self._logprobs_bytes), dtype=np.float64)
        flags = np.array(a["mask_flag"], dtype=np.int8)
        if self._mixed_masks:
            masks = np.concatenate(
                [
                    np.frombuffer(self._mixed_masks[i], dtype=np.int8) if f < 0 else np.full(k, f, dtype=np.int8)
                    for i, (f, k) in enumerate(zip(flags.tolist(), c_len.tolist(), strict=True))
                ]
                or [np.zeros(0, np.int8)]
            )
        else:
            masks = np.repeat(flags, c_len)
        actor = pa.Table.from_arrays(
            [
                _repeat(self.collection_id, n, pa.string()),
                _repeat(self.iteration, n, pa.int64()),
                _scalars(a["task_id"], pa.string(), "task_id"),
                _scalars(a["tree_id"], pa.string(), "tree_id"),
                _scalars(a["node_id"], pa.int64(), "node_id"),
                _scalars(a["edge_id"], pa.int64(), "edge_id"),
                _scalars(a["turn_index"], pa.int32(), "turn_index"),
                _scalars(a["policy_version"], pa.string(), "policy_version"),
                _scalars(a["kind"], pa.string(), "kind"),
                _list_column(prompts, p_len, _TOKEN),
                _list_column(completions, c_len, _TOKEN),
                _list_column(logprobs, c_len, pa.float64()),
                _list_column(masks, c_len, pa.int8()),
                _scalars(a["advantage"], pa.float64(), "advantage"),
                _scalars(a["reward"], pa.float64(), "reward"),
                _scalars(a["finish_reason"], pa.string(), "finish_reason"),
                _scalars(a["truncated"], pa.bool_(), "truncated"),
            ],
            schema=ACTOR_SCHEMA,
        )
        finite(logprobs, "logprobs", "actor", c_len)
        for name in ("advantage", "reward"):  # numpy_of: to_numpy and compute kernels import pandas
            finite(numpy_of(actor.column(name)), name, "actor")
        m = len(c["task_id"])
        x_len = np.array(c["context_len"], dtype=np.int64)
        contexts = _gathered(pool, np.array(c["context_start"], dtype=np.int64), x_len)
        critic = pa.Table.from_arrays(
            [
                _repeat(self.collection_id, m, pa.string()),
                _repeat(self.iteration, m, pa.int64()),
                _scalars(c["task_id"], pa.string(), "task_id"),
                _scalars(c["tree_id"], pa.string(), "tree_id"),
                _scalars(c["node_id"], pa.int64(), "node_id"),
                _list_column(contexts, x_len, _TOKEN),
                _scalars(c["target"], pa.float64(), "target"),
                _scalars(c["weight"], pa.float64(), "weight"),
                _scalars(self._predictions, pa.float64(), "prediction"),
            ],
            schema=CRITIC_SCHEMA,
        )
        for name in ("target", "weight"):
            finite(numpy_of(critic.column(name)), name, "critic")
        finite(np.array([0.0 if p is None else p for p in self._predictions], np.float64), "prediction", "critic")
        return actor, critic

    def build(self, stats: dict[str, Any] | None = None) -> Batch:
        actor, critic = self.tables()
        return Batch(self.collection_id, self.iteration, actor, critic, dict(stats or {}))


# --- the batch --------------------------------------------------------------------------------


#: The endings of a statistic that is a time (``wall_s``, ``retry_s``, ``retry_ms``):
#: a run's, not its data's.
TIME_SUFFIXES = ("_s", "_ms")


def timeless(stats: Any) -> Any:
    """``stats`` without the statistics that are times (:data:`TIME_SUFFIXES`), at any
    depth (a phase's ``wall_s`` too): what :meth:`Batch.__eq__` compares."""
    if isinstance(stats, dict):
        return {k: timeless(v) for k, v in stats.items() if not (isinstance(k, str) and k.endswith(TIME_SUFFIXES))}
    if isinstance(stats, list):
        return [timeless(v) for v in stats]
    return stats


class Batch:
    """Actor and critic tables and statistics of one collection (see the module docstring).

    ``actor`` and ``critic`` may be Arrow tables (what :class:`BatchBuilder` and the
    store produce) or sequences of typed rows. Either way ``actor_table`` /
    ``critic_table`` give the columns and ``actor`` / ``critic`` give rows. A batch made
    from rows converts them each time its tables are asked for, so rows edited in place
    are what gets written; the rows of a columnar batch are a copy made once, and
    editing them changes nothing stored.
    """

    def __init__(
        self,
        collection_id: str,
        iteration: int,
        actor: pa.Table | Sequence[ActorRow] | None = None,
        critic: pa.Table | Sequence[CriticRow] | None = None,
        stats: dict[str, Any] | None = None,
    ) -> None:
        self.collection_id = collection_id
        self.iteration = iteration
        self.stats: dict[str, Any] = {} if stats is None else stats
        self._actor_table = actor if isinstance(actor, pa.Table) else None
        self._critic_table = critic if isinstance(critic, pa.Table) else None
        self._actor_rows: list[ActorRow] | None = None if self._actor_table is not None else list(actor or [])
        self._critic_rows: list[CriticRow] | None = None if self._critic_table is not None else list(critic or [])
        for t, schema in ((self._actor_table, ACTOR_SCHEMA), (self._critic_table, CRITIC_SCHEMA)):
            if t is not None and not t.schema.equals(schema, check_metadata=False):
                raise BatchError(f"a {schema.metadata[b'focus.table'].decode()} table must have the batch schema")

    @classmethod
    def from_rows(
        cls,
        collection_id: str,
        iteration: int,
        actor: Sequence[ActorRow],
        critic: Sequence[CriticRow],
        stats: dict[str, Any] | None = None,
    ) -> Batch:
        """A columnar batch of typed rows (converted now; :class:`BatchError` for bad values)."""
        return BatchBuilder(collection_id, iteration).add_rows(actor, critic).build(stats)

    @property
    def columnar(self) -> bool:
        return self._actor_table is not None and self._critic_table is not None

    @property
    def actor(self) -> list[ActorRow]:
        if self._actor_rows is None:
            assert self._actor_table is not None
            self._actor_rows = actor_rows(self._actor_table)
        return self._actor_rows

    @property
    def critic(self) -> list[CriticRow]:
        if self._critic_rows is None:
            assert self._critic_table is not None
            self._critic_rows = critic_rows(self._critic_table)
        return self._critic_rows

    def tables(self) -> tuple[pa.Table, pa.Table]:
        """The actor and critic tables (:class:`BatchError` if rows do not fit the schema)."""
        if self.columnar:
            assert self._actor_table is not None and self._critic_table is not None
            return self._actor_table, self._critic_table
        b = BatchBuilder(self.collection_id, self.iteration)
        actor, critic = b.add_rows(self.actor, self.critic).tables()
        return self._actor_table or actor, self._critic_table or critic

    @property
    def actor_table(self) -> pa.Table:
        return self.tables()[0]

    @property
    def critic_table(self) -> pa.Table:
        return self.tables()[1]

    @property
    def n_tokens(self) -> int:
        """Completion tokens (what the policy sampled)."""
        if self._actor_table is not None:
            col = self._actor_table.column("completion_ids")
            return int(sum(int(c.offsets[-1].as_py()) - int(c.offsets[0].as_py()) for c in col.chunks))
        return sum(len(r.completion_ids) for r in self.actor)

    def summary(self) -> dict[str, Any]:
        if self._actor_table is not None:
            n_actor = self._actor_table.num_rows
            tasks = int(pc.count_distinct(self._actor_table.column("task_id")).as_py()) if n_actor else 0
        else:
            n_actor, tasks = len(self.actor), len({r.task_id for r in self.actor})
        n_critic = self._critic_table.num_rows if self._critic_table is not None else len(self.critic)
        return {
            "collection_id": self.collection_id,
            "iteration": self.iteration,
            "actor_rows": n_actor,
            "critic_rows": n_critic,
            "tokens": self.n_tokens,
            "tasks": tasks,
            **{k: v for k, v in self.stats.items() if not isinstance(v, (dict, list))},
        }

    def __eq__(self, other: object) -> bool:
        """The same collection, iteration, rows and statistics, the times among them
        aside (:func:`timeless`): the same collection run twice, or resumed, gives equal
        batches; its wall times differ run to run, and made every two unequal."""
        if not isinstance(other, Batch):
            return NotImplemented
        return (
            (self.collection_id, self.iteration) == (other.collection_id, other.iteration)
            and timeless(self.stats) == timeless(other.stats)
            and self.actor == other.actor
            and self.critic == other.critic
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        s = self.summary()
        return (
            f"Batch({self.collection_id!r}, iteration={self.iteration}, actor_rows={s['actor_rows']}, "
            f"critic_rows={s['critic_rows']}, tokens={s['tokens']}, columnar={self.columnar})"
        )
