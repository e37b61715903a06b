"""focus.batch_columns builds Arrow columns without ``pa.array``/``pa.scalar``/``to_numpy``
(pyarrow imports pandas on their first call, 0.2-0.3 CPU-s a process): the columns and
the Parquet bytes are the ones ``pa.array`` gives, and values it would convert
differently or refuse still go to it."""

from __future__ import annotations

import io
import math
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fixtures.prefect import base_env

from focus.batch_columns import _from_numpy, _repeat, _scalars, arrow_scalar
from focus.batch_schema import BatchError, numpy_of

I32, I64 = np.iinfo(np.int32), np.iinfo(np.int64)

#: (Arrow type, values): lists the buffer path converts
CONVERTED = [
    (pa.string(), ["task-0", "", "é", "雪", "🙂 x", "a" * 1000]),
    (pa.string(), []),
    (pa.int64(), [0, -1, I64.min, I64.max, 7]),
    (pa.int32(), [0, I32.min, I32.max, 3]),
    (pa.float64(), [0.0, -0.0, 1.5, math.inf, -math.inf, math.nan, 1e-300, 5e-324]),
    (pa.bool_(), [True, False, True, True, False, False, True, False, True]),
    (pa.bool_(), []),
]

#: lists the buffer path leaves to pa.array (a None, a subclass, an int in a float column)
LEFT = [
    (pa.float64(), [1.0, None, 2.0]),
    (pa.float64(), [np.float64(0.1), 2.0]),
    (pa.float64(), [1, 2.0]),
    (pa.string(), ["a", None]),
    (pa.bool_(), [True, None]),
]


def parquet_bytes(column: pa.Array) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.table({"c": column}), out)
    return out.getvalue()


@pytest.mark.parametrize(("type_", "values"), CONVERTED + LEFT)
def test_columns_and_parquet_bytes_are_those_of_pa_array(type_, values):
    got, want = _scalars(values, type_, "c"), pa.array(values, type_)
    assert got.type == want.type and got.null_count == want.null_count and len(got) == len(want)
    assert got.to_pylist() == want.to_pylist() or type_ == pa.float64()  # NaN != NaN in a list
    assert parquet_bytes(got) == parquet_bytes(want)


@pytest.mark.parametrize(
    ("type_", "values"),
    [(pa.int32(), [1, I32.max + 1]), (pa.int32(), [I32.min - 1]), (pa.int64(), [2**63]), (pa.int64(), [1, True])],
)
def test_values_pa_array_refuses_are_refused_as_before(type_, values):
    with pytest.raises((pa.ArrowInvalid, pa.ArrowTypeError, OverflowError)) as want:
        pa.array(values, type_)
    with pytest.raises(BatchError) as got:
        _scalars(values, type_, "turn_index")
    assert str(got.value) == f"column 'turn_index': {want.value}"


@pytest.mark.parametrize(("type_", "value"), [(pa.string(), "c-1"), (pa.int64(), 3), (pa.string(), "\ud800")])
def test_repeated_and_operand_scalars_are_those_of_pa_scalar(type_, value):
    if value == "\ud800":  # a lone surrogate: not UTF-8, left to pyarrow, which refuses it
        with pytest.raises(UnicodeEncodeError) as want:
            pa.scalar(value, type_)
        with pytest.raises(UnicodeEncodeError) as got:
            _repeat(value, 2, type_)
        assert str(got.value) == str(want.value)
        return
    assert _repeat(value, 3, type_).equals(pa.repeat(pa.scalar(value, type_), 3))
    assert arrow_scalar(value, type_).equals(pa.scalar(value))


def test_numpy_arrays_and_columns_round_trip_as_pa_array_and_to_numpy_do():
    for dtype, type_ in (
        (np.int8, pa.int8()),
        (np.int32, pa.int32()),
        (np.int64, pa.int64()),
        (np.float64, pa.float64()),
    ):
        values = np.arange(-5, 20, dtype=dtype)
        assert parquet_bytes(_from_numpy(values, type_)) == parquet_bytes(pa.array(values, type_))
        whole = pa.chunked_array([pa.array(values[:7], type_), pa.array(values[7:], type_).slice(3)])
        assert np.array_equal(numpy_of(whole), whole.to_numpy(zero_copy_only=False))
        assert np.array_equal(numpy_of(whole.chunk(1)), whole.chunk(1).to_numpy(zero_copy_only=False))
        assert numpy_of(pa.chunked_array([], type_)).dtype == dtype
    # another dtype than the type's, or nulls: pa.array and to_numpy, as before
    assert _from_numpy(np.arange(3, dtype=np.int64), pa.int32()).equals(pa.array([0, 1, 2], pa.int32()))
    with_null = pa.chunked_array([pa.array([1, None], pa.int64())])
    assert np.array_equal(numpy_of(with_null), with_null.to_numpy(zero_copy_only=False), equal_nan=True)


def test_building_and_writing_a_batch_imports_no_pandas(tmp_path):
    """A ``focus collect`` imported pandas only to build and write its batch (pyarrow's
    pandas shim: ``pa.array``, ``pa.scalar``, ``to_numpy`` and compute functions given a
    Python number import it on first use)."""
    code = (
        "import sys\n"
        "from focus.batch import BatchBuilder\n"
        "from storage import BatchStore\n"
        "b = BatchBuilder('c', 0)\n"
        "for i in range(3):\n"
        "    b.add_turn('t0', 'tree', i, i, 0, 'v0', 'policy', (1, 2, i), (3, 4), [-0.5, -0.25], [1, 0], 0.5, 1.0,"
        " 'stop', False)\n"
        "    b.add_checkpoint('t0', 'tree', i, (1, 2), 0.25, 1.0, 0.5)\n"
        f"url = BatchStore({str(tmp_path / 'runs')!r}).write(b.build())\n"
        "print('pandas' in sys.modules, url)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    imported, url = done.stdout.rstrip("\n").split(" ", 1)  # the URL holds a space where TMPDIR does
    assert imported == "False" and url.endswith("/batches/c/iter-000000")


def test_reading_a_batch_and_its_rows_imports_no_pandas(tmp_path):
    """``focus inspect`` and a trainer that reads its batch imported pandas only to read it:
    ``pq.read_table`` imports ``pyarrow.dataset``, which imports pandas, and ``to_numpy``
    (the summary's columns, the rows' token lists) imports it on first use."""
    from focus.batch import BatchBuilder
    from storage import BatchStore

    b = BatchBuilder("c", 0)
    for i in range(3):
        b.add_turn(
            "t0", "tree", i, i, 0, "v0", "policy", (1, 2, i), (3, 4), [-0.5, -0.25], [1, 0], 0.5, 1.0, "stop", False
        )
        b.add_checkpoint("t0", "tree", i, (1, 2), 0.25, 1.0, 0.5)
    url = BatchStore(str(tmp_path / "runs")).write(b.build())
    code = (
        "import sys\n"
        "from cli.inspect import batch_summary\n"
        "from storage import BatchStore\n"
        f"batch = BatchStore({str(tmp_path / 'runs')!r}).read({url!r})\n"
        "summary = batch_summary(batch)\n"
        "actor, critic = batch.actor, batch.critic\n"
        "print('pandas' in sys.modules, summary['actor_rows'], actor[2].prompt_ids, critic[1].context_ids)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "3", "(1,", "2,", "2)", "(1,", "2)"]
