"""The prepared training batch: what a trainer consumes, held as Arrow columns.

Two tables. The actor table, one row per model turn: the exact prompt and completion
ids, the behaviour log-probs of the sampled tokens, a loss mask over the completion,
the segment's advantage and the reward. The critic table, one row per checkpoint: the
context ids, the critic target and its weight, and the critic's own prediction at
collection time. ``stats`` records what the collection actually used, per phase. The
columns are documented in ``docs/batch-schema.md``; :data:`ACTOR_SCHEMA` and
:data:`CRITIC_SCHEMA` are the contract with trainers and query tools.

The batch is columnar from the start: :class:`BatchBuilder` (what
``Collector.prepare`` fills) appends each turn's token ids, log-probs and mask to flat
buffers as it goes, converting every Python int once, and a token tuple shared by
several rows - the checkpoint prefix that sibling branches all send, which is also the
critic row's context - is converted and stored once, however many rows use it. So
writing a batch (``storage.batches``) is Parquet encoding alone. Converting Python ints
is most of that work: a batch holds millions of token ids, and each costs ~15 ns to pack
(one compiled ``struct.Struct`` per row length packs a whole row in one C call) against
~1 ns to gather into the final columns.

Typed rows remain the view most code reads: ``batch.actor`` and ``batch.critic`` are
lists of :class:`ActorRow` / :class:`CriticRow`, built from the columns on first use
(``focus.exporters`` and ``focus.train_local`` iterate them). A batch can also be made
from rows, as before; it is converted when its tables are first asked for.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: 2: the actor table gained ``truncated``.
SCHEMA_VERSION = 2

_TOKEN = pa.int32()


def _list(value: pa.DataType) -> pa.DataType:
    return pa.list_(pa.field("item", value, nullable=False))


ACTOR_SCHEMA = pa.schema(
    [
        pa.field("collection_id", pa.string(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("tree_id", pa.string(), nullable=False),
        pa.field("node_id", pa.int64(), nullable=False),
        pa.field("edge_id", pa.int64(), nullable=False),
        pa.field("turn_index", pa.int32(), nullable=False),
        pa.field("policy_version", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("prompt_ids", _list(_TOKEN), nullable=False),
        pa.field("completion_ids", _list(_TOKEN), nullable=False),
        pa.field("logprobs", _list(pa.float64()), nullable=False),
        pa.field("loss_mask", _list(pa.int8()), nullable=False),
        pa.field("advantage", pa.float64(), nullable=False),
        pa.field("reward", pa.float64(), nullable=False),
        pa.field("finish_reason", pa.string(), nullable=False),
        pa.field("truncated", pa.bool_(), nullable=False),
    ],
    metadata={"focus.table": "actor", "focus.schema_version": str(SCHEMA_VERSION)},
)

CRITIC_SCHEMA = pa.schema(
    [
        pa.field("collection_id", pa.string(), nullable=False),
        pa.field("iteration", pa.int64(), nullable=False),
        pa.field("task_id", pa.string(), nullable=False),
        pa.field("tree_id", pa.string(), nullable=False),
        pa.field("node_id", pa.int64(), nullable=False),
        pa.field("context_ids", _list(_TOKEN), nullable=False),
        pa.field("target", pa.float64(), nullable=False),
        pa.field("weight", pa.float64(), nullable=False),
        pa.field("prediction", pa.float64(), nullable=True),
    ],
    metadata={"focus.table": "critic", "focus.schema_version": str(SCHEMA_VERSION)},
)


class BatchError(ValueError):
    """A value that does not fit the batch schema; the message names the column and the value."""


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


# --- packing Python numbers ---------------------------------------------------------------

_I32 = np.iinfo(np.int32)
#: Values per chunk of a list column, below the 2^31 offsets of Arrow's ``list`` type.
_CHUNK_VALUES = 1 << 30


class _Packer:
    """Python number sequences -> bytes of one C type, one ``struct`` call per sequence.

    ``struct`` packs a tuple of Python numbers faster than ``np.fromiter`` (one C loop
    over an argument tuple instead of an iterator protocol per item); a compiled
    ``Struct`` per length is kept, since struct's own cache holds 100 formats and
    recompiling costs more than packing. When a sequence does not pack,
    :class:`BatchError` names the column and the first bad value.
    """

    def __init__(self, code: str, dtype: Any, column: str) -> None:
        self.code, self.dtype, self.column = code, np.dtype(dtype), column
        self._structs: dict[int, struct.Struct] = {}

    def pack(self, seq: Sequence[Any]) -> bytes:
        packer = self._structs.get(len(seq))
        if packer is None:
            packer = self._structs[len(seq)] = struct.Struct(f"{len(seq)}{self.code}")
        try:
            return packer.pack(*seq)
        except (struct.error, TypeError, OverflowError):
            raise self._why(seq) from None

    def _why(self, seq: Sequence[Any]) -> BatchError:
        one = struct.Struct(self.code)
        for v in seq:
            try:
                one.pack(v)
            except (struct.error, TypeError, OverflowError) as e:
                if isinstance(v, int) and not isinstance(v, bool):
                    return BatchError(f"column {self.column!r} has a value outside {self.dtype.name}: {v}")
                return BatchError(
                    f"column {self.column!r} has a value {v!r} ({type(v).__name__}) that is not {self.dtype.name}: {e}"
                )
        return BatchError(f"column {self.column!r} could not be converted to {self.dtype.name}")


class TokenBuffer:
    """Token-id sequences packed back to back as int32; each distinct sequence object once.

    The same id tuple object recurs in a batch: sibling branches send their checkpoint's
    very prefix, and a critic row's context is the tuple the first turn after that
    checkpoint was sent (pickling keeps that sharing). :meth:`add` returns where a
    sequence lies in the buffer; a sequence met again, by object identity, is not packed
    again. Identity, not equality: looking an object up costs the same whatever its
    length, and the buffer keeps every sequence it has seen alive, so ids stay unique.
    """

    def __init__(self, column: str = "token ids") -> None:
        self._packer = _Packer("i", np.int32, column)
        self._chunks: list[bytes] = []
        self._size = 0
        self._at: dict[int, int] = {}
        self._keep: list[Sequence[int]] = []

    def add(self, seq: Sequence[int], column: str | None = None) -> int:
        """Start of ``seq`` in the buffer (its length is ``len(seq)``)."""
        start = self._at.get(id(seq))
        if start is not None:
            return start
        if column is not None:
            self._packer.column = column
        self._chunks.append(self._packer.pack(seq))
        start = self._at[id(seq)] = self._size
        self._keep.append(seq)
        self._size += len(seq)
        return start

    def values(self) -> np.ndarray:
        data = b"".join(self._chunks)
        self._chunks = [data]
        return np.frombuffer(data, dtype=np.int32)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _list_column(values: np.ndarray, lengths: np.ndarray, value_type: pa.DataType) -> pa.ChunkedArray:
    """A list column whose rows are consecutive runs of ``values``, in chunks whose
    offsets fit Arrow's 32-bit ``list`` type (one chunk unless a table holds 2^30 values)."""
    offsets = _offsets(lengths)
    bounds = [0]
    while bounds[-1] < len(lengths):
        row = bounds[-1]
        end = int(np.searchsorted(offsets, offsets[row] + _CHUNK_VALUES, side="right")) - 1
        bounds.append(max(end, row + 1))
    if len(bounds) == 1:
        bounds.append(0)
    chunks = []
    for row, end in itertools.pairwise(bounds):
        base = int(offsets[row])
        if int(offsets[end]) - base > _I32.max:
            raise BatchError(f"a row holds {int(offsets[end]) - base} values, more than a list column can hold")
        off = pa.array((offsets[row : end + 1] - base).astype(np.int32))
        values_ = pa.array(values[base : int(offsets[end])], type=value_type)
        chunks.append(pa.ListArray.from_arrays(off, values_, type=_list(value_type)))
    return pa.chunked_array(chunks, type=_list(value_type))


def _gathered(pool: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The runs ``pool[starts[i] : starts[i] + lengths[i]]`` back to back (one numpy gather)."""
    offsets = _offsets(lengths)
    if not len(lengths) or int(offsets[-1]) == 0:
        return pool[:0]
    index = np.repeat(starts - offsets[:-1], lengths)
    index += np.arange(offsets[-1], dtype=np.int64)
    return pool[index]


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
        self._lp_chunks: list[bytes] = []
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
    ) -> None:
        """One actor row. ``loss_mask`` is one flag for every completion token (what the
        collector records per turn) or one entry per token; ``truncated``: the row's
        segment ends in a truncated leaf."""
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
        prompt_start = self.tokens.add(prompt_ids, "prompt_ids")
        completion_start = self.tokens.add(completion_ids, "completion_ids")
        self._lp_chunks.append(self._logprobs.pack(logprobs))
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
                f"{what} row {index} belongs to collection {r.collection_id!r} iteration {r.iteration}, "
                f"but the batch is {self.collection_id!r} iteration {self.iteration}"
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
        logprobs = np.frombuffer(b"".join(self._lp_chunks), dtype=np.float64)
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
        return actor, critic

    def build(self, stats: dict[str, Any] | None = None) -> Batch:
        actor, critic = self.tables()
        return Batch(self.collection_id, self.iteration, actor, critic, dict(stats or {}))


def _repeat(value: Any, n: int, type_: pa.DataType) -> pa.Array:
    return pa.repeat(pa.scalar(value, type_), n)


def _scalars(values: list[Any], type_: pa.DataType, column: str) -> pa.Array:
    try:
        return pa.array(values, type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise BatchError(f"column {column!r}: {e}") from None


# --- rows from columns ------------------------------------------------------------------------


def _lists(col: pa.ChunkedArray) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    for arr in col.chunks:
        if not len(arr):
            continue
        offsets = arr.offsets.to_numpy()
        flat = arr.values.slice(offsets[0], offsets[-1] - offsets[0]).to_numpy(zero_copy_only=False).tolist()
        o = (offsets - offsets[0]).tolist()
        out += [tuple(flat[o[i] : o[i + 1]]) for i in range(len(arr))]
    return out


def actor_rows(table: pa.Table) -> list[ActorRow]:
    """Typed rows of an actor table of :data:`ACTOR_SCHEMA`."""
    names = [f.name for f in ACTOR_SCHEMA]
    cols = [
        _lists(table.column(k)) if pa.types.is_list(ACTOR_SCHEMA.field(k).type) else table.column(k).to_pylist()
        for k in names
    ]
    return [ActorRow(**dict(zip(names, values, strict=True))) for values in zip(*cols, strict=True)]


def critic_rows(table: pa.Table) -> list[CriticRow]:
    """Typed rows of a critic table of :data:`CRITIC_SCHEMA`."""
    names = [f.name for f in CRITIC_SCHEMA]
    cols = [_lists(table.column(k)) if k == "context_ids" else table.column(k).to_pylist() for k in names]
    return [CriticRow(**dict(zip(names, values, strict=True))) for values in zip(*cols, strict=True)]


# --- the batch --------------------------------------------------------------------------------


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
        if not isinstance(other, Batch):
            return NotImplemented
        return (
            (self.collection_id, self.iteration, self.stats) == (other.collection_id, other.iteration, other.stats)
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
