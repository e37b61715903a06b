"""Python numbers to Arrow columns: the packing behind :class:`focus.batch.BatchBuilder`.

Converting Python ints is most of the work of writing a batch: a batch holds millions
of token ids, and each costs ~15 ns to pack (one compiled ``struct.Struct`` per row
length packs a whole row in one C call) against ~1 ns to gather into the final
columns. :class:`TokenBuffer` packs each distinct token tuple once, however many rows
share it; the list columns are then numpy gathers over that one buffer.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from focus.batch_schema import _NUMPY, BatchError, _list

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
    """Token-id sequences packed as int32 into one growing buffer; each distinct sequence
    object once, and a prompt that extends the run at the buffer's end by its tail alone.

    The same id tuple object recurs in a batch: sibling branches send their checkpoint's
    very prefix, and a critic row's context is the tuple the first turn after that
    checkpoint was sent (pickling keeps that sharing). :meth:`add` returns where a
    sequence lies in the buffer; a sequence met again, by object identity, is not packed
    again. Identity, not equality: looking an object up costs the same whatever its
    length, and the buffer keeps every sequence it has seen alive, so ids stay unique.

    A rollout's prompts grow turn by turn (``Segments``: the next prompt is this one,
    its completion and the observation's ids), and the builder adds each row's prompt
    and then its completion. So :meth:`add` with ``chain=True`` (a prompt) first asks
    whether the sequence starts with the run the buffer ends in - the last chained
    prompt and everything packed after it - and packs only the rest behind it: a
    rollout's prompts then take its transcript's length, not the sum of every turn's
    prompt (20 rollouts of six 100 KB observations: 10 M ids, 38 MiB, where it packed 30 M, 115 MiB).
    The bytes grow in place (a ``bytearray``), so :meth:`values` shares them instead of
    joining a copy.
    """

    def __init__(self, column: str = "token ids") -> None:
        self._packer = _Packer("i", np.int32, column)
        self._data = bytearray()
        self._size = 0
        self._at: dict[int, int] = {}
        self._keep: list[Sequence[int]] = []
        #: The run the buffer ends in: its start and the tuples packed back to back since.
        self._run_start = 0
        self._run: list[tuple[int, ...]] = []
        self._run_len = 0

    def __len__(self) -> int:
        """Ids packed so far (what the buffer holds)."""
        return self._size

    def add(self, seq: Sequence[int], column: str | None = None, *, chain: bool = False) -> int:
        """Start of ``seq`` in the buffer (its length is ``len(seq)``). ``chain``: ``seq``
        may extend the run the buffer ends in (a prompt after the previous turn's prompt
        and completion); a new run starts at it otherwise."""
        start = self._at.get(id(seq))
        if start is not None:
            return start
        if column is not None:
            self._packer.column = column
        if chain and type(seq) is tuple and self._extends(seq):
            start, tail = self._run_start, seq[self._run_len :]
            self._append(tail)
            self._run, self._run_len = [seq], len(seq)
        else:
            start = self._size
            self._append(seq)
            if chain or type(seq) is not tuple:
                self._run_start, self._run, self._run_len = start, [], 0
            if type(seq) is tuple:
                self._run.append(seq)
                self._run_len += len(seq)
        self._at[id(seq)] = start
        self._keep.append(seq)
        return start

    def _extends(self, seq: tuple[int, ...]) -> bool:
        """Whether ``seq`` starts with the run the buffer ends in (and is not shorter)."""
        if not self._run or len(seq) < self._run_len:
            return False
        at = 0
        for part in self._run:
            end = at + len(part)
            if seq[at:end] != part:
                return False
            at = end
        return True

    def _append(self, seq: Sequence[int]) -> None:
        packed = self._packer.pack(seq)
        try:
            self._data += packed
        except BufferError:  # values() handed out a view of the bytes: go on in a copy
            self._data = bytearray(self._data)
            self._data += packed
        self._size += len(seq)

    def values(self) -> np.ndarray:
        """Every id packed so far, a view of the buffer's bytes (no copy)."""
        return np.frombuffer(self._data, dtype=np.int32, count=self._size)


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
        off = _from_numpy((offsets[row : end + 1] - base).astype(np.int32), pa.int32())
        values_ = _from_numpy(values[base : int(offsets[end])], value_type)
        chunks.append(pa.ListArray.from_arrays(off, values_, type=_list(value_type)))
    return pa.chunked_array(chunks, type=_list(value_type))


#: Values gathered per step of :func:`_gathered`: its int64 index is built a block at a
#: time (16 bytes a value with its ``arange``: 1 MiB a block; at ``1 << 20`` the 16 MiB
#: was the largest allocation of preparing a 10k-transition batch, 1.6 KiB a transition).
_GATHER_BLOCK = 1 << 16


def _gathered(pool: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The runs ``pool[starts[i] : starts[i] + lengths[i]]`` back to back: numpy gathers
    into one output array, over blocks of rows of about ``_GATHER_BLOCK`` values. One
    gather over every row would build two int64 indexes of the whole column (16 bytes
    per token beside the 4 of the output: 160 MB for the prompts of a 100k-transition
    batch); blocks keep that to about 1 MiB whatever the batch."""
    offsets = _offsets(lengths)
    total = int(offsets[-1]) if len(lengths) else 0
    if total == 0:
        return pool[:0]
    out = np.empty(total, dtype=pool.dtype)
    row = 0
    while row < len(lengths):
        end = max(int(np.searchsorted(offsets, offsets[row] + _GATHER_BLOCK, side="right")) - 1, row + 1)
        lo, hi = int(offsets[row]), int(offsets[end])
        index = np.repeat(starts[row:end] - offsets[row:end], lengths[row:end])
        index += np.arange(lo, hi, dtype=np.int64)
        np.take(pool, index, out=out[lo:hi])
        row = end
    return out


#: Python values of these exact types convert on the paths below; anything else goes to pyarrow.
_PYTHON: dict[pa.DataType, type] = {
    pa.int32(): int,
    pa.int64(): int,
    pa.float64(): float,
    pa.bool_(): bool,
    pa.string(): str,
}


def _from_numpy(values: np.ndarray, type_: pa.DataType) -> pa.Array:
    """``pa.array(values, type_)`` for a 1-d numpy array, built on its buffer.

    The same array (no validity bitmap, the same values) without ``pa.array``, which
    imports pandas the first time it is called (pyarrow's pandas shim, 0.2-0.3 CPU-s a
    process): a ``focus collect`` imported pandas only to write its batch. A dtype
    other than the type's goes to ``pa.array``, as before."""
    dtype = _NUMPY.get(type_)
    if dtype is None or values.dtype != dtype or values.ndim != 1:
        return pa.array(values, type=type_)
    values = np.ascontiguousarray(values)
    return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(values)])


def _python_values(values: Sequence[Any], type_: pa.DataType) -> pa.Array | None:
    """``pa.array(values, type_)`` for a list of Python values of exactly the type's
    Python type (no ``None``, no subclasses, ints inside the type's range, strings that
    encode to UTF-8), built from buffers (see :func:`_from_numpy`); ``None`` for any other
    list, which ``pa.array`` converts (or refuses) as before."""
    kind = _PYTHON.get(type_)
    # every value's exact type, in one C-level pass (a generator over a column's values
    # was about half of this function's time for the batch's number columns)
    if kind is None or not set(map(type, values)) <= {kind}:
        return None
    if kind is str:
        try:
            data = [v.encode("utf-8") for v in values]
        except UnicodeEncodeError:
            return None
        offsets = _offsets(np.fromiter(map(len, data), dtype=np.int64, count=len(data)))
        if offsets[-1] > _I32.max:
            return None
        buffers = [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(b"".join(data))]
        return pa.Array.from_buffers(type_, len(data), buffers)
    if kind is bool:
        bits = np.packbits(np.array(values, dtype=np.bool_), bitorder="little")
        return pa.Array.from_buffers(type_, len(values), [None, pa.py_buffer(bits)])
    if kind is int:
        info = np.iinfo(_NUMPY[type_])
        if values and not (info.min <= min(values) and max(values) <= info.max):
            return None
    return _from_numpy(np.array(values, dtype=_NUMPY[type_]), type_)


def arrow_scalar(value: Any, type_: pa.DataType) -> pa.Scalar:
    """``pa.scalar(value)`` (its type inferred) for an operand of a compute function;
    a Python value of exactly ``type_``'s Python type is made from a buffer instead
    (the same scalar, without pandas: see :func:`_from_numpy`)."""
    one = _python_values([value], type_)
    return pa.scalar(value) if one is None else one[0]


def _repeat(value: Any, n: int, type_: pa.DataType) -> pa.Array:
    one = _python_values([value], type_)
    return pa.repeat(pa.scalar(value, type_) if one is None else one[0], n)


def _scalars(values: list[Any], type_: pa.DataType, column: str) -> pa.Array:
    fast = _python_values(values, type_)
    if fast is not None:
        return fast
    if pa.types.is_integer(type_):  # pa.array truncates 1.5 to 1, as numpy would
        for i, v in enumerate(values):
            if isinstance(v, float | np.floating) and not float(v).is_integer():
                raise BatchError(f"column {column!r} has the value {v!r}, not an integer (row {i})")
    try:
        return pa.array(values, type_)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as e:
        raise BatchError(f"column {column!r}: {e}") from None


def finite(values: np.ndarray, column: str, what: str, lengths: np.ndarray | None = None) -> None:
    """Refuse a NaN or infinite value of a float column, naming the row: ``lengths``
    are the rows' list lengths where ``values`` is a list column's flat values. A NaN
    advantage or log-prob reaches every weight a trainer updates; a collection never
    makes one, rows handed to the store may hold one."""
    bad = ~np.isfinite(values)
    if not bad.any():
        return
    i = int(np.argmax(bad))
    row = i if lengths is None else int(np.searchsorted(np.cumsum(lengths), i, side="right"))
    raise BatchError(f"{what} row {row}: column {column!r} has the value {float(values[i])!r}, not a finite number")
