"""What DuckDB, polars and HF ``datasets`` see of a batch whose writer was killed (SIGKILL)
part-way, on a local folder and on S3 (moto's server on loopback).

A batch's files are staged outside ``batches/`` until all are written, so a reader that
globs the batch folder - the way these tools read a folder of Parquet files - finds no
file of an unfinished batch, and after the rerun finds every row exactly once. Readers
that take the file list from the manifest (``BatchStore.parquet_files``) are refused an
unfinished batch in every case, including a kill while S3 copies the staged files into
the batch folder (object stores have no rename; docs/batch-schema.md).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import pytest
from test_storage import batch_from_trees, grow_tree

from focus.batch import Batch
from storage import BatchNotFound, BatchStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]  # a writer process, killed

ROOT = Path(__file__).resolve().parents[1]

#: Runs a batch write and kills itself (SIGKILL) at the N-th call of one storage operation.
KILLER = """
import os, pickle, signal, sys
from storage import BatchStore
from storage.urls import Location
root, data, op, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
batch = pickle.load(open(data, "rb"))
real, calls = getattr(Location, op), [0]
def or_die(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return real(self, *args, **kwargs)
setattr(Location, op, or_die)
BatchStore(root, rows_per_file=3, threads=1).write(batch)
print("finished")
"""


@pytest.fixture(scope="module")
def batch() -> Batch:
    return batch_from_trees([grow_tree("t1"), grow_tree("t2", branches=1)], "c-read", 0)


def killed_write(root: str, batch: Batch, tmp_path: Path, op: str, at: int) -> None:
    """Write ``batch`` under ``root`` in a subprocess killed at call ``at`` of ``Location.<op>``."""
    data, script = tmp_path / "batch.pkl", tmp_path / "killer.py"
    data.write_bytes(pickle.dumps(batch))
    script.write_text(KILLER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script), root, str(data), op, str(at)], env=env, capture_output=True, timeout=120
    )
    assert done.returncode == -signal.SIGKILL, done.stdout.decode()[-1000:] + done.stderr.decode()[-2000:]


# ---- the readers, each reading a folder the way its users do --------------------------


def duckdb_rows(target: str | list[str], s3: Any) -> int:
    """Rows DuckDB reads from a glob or a file list; a glob matching nothing reads 0."""
    con = duckdb.connect()
    if s3 is not None:
        con.register_filesystem(s3.filesystem())  # DuckDB's own S3 reader is a download away
    try:
        return con.sql("select count(*) from read_parquet($files)", params={"files": target}).fetchall()[0][0]
    except duckdb.IOException as e:
        assert "No files found" in str(e)
        return 0


def polars_rows(target: str | list[str], s3: Any) -> int:
    options = s3.polars_options if s3 is not None else None
    try:
        return pl.read_parquet(target, storage_options=options).height
    except pl.exceptions.ComputeError as e:
        assert "expanded paths were empty" in str(e)
        return 0


def datasets_rows(target: str | list[str], s3: Any, cache: Path) -> int:
    import datasets

    options = s3.storage_options if s3 is not None else None
    try:
        ds = datasets.load_dataset(
            "parquet", data_files={"train": target}, split="train", cache_dir=str(cache), storage_options=options
        )
    except FileNotFoundError as e:  # datasets' "no data files" errors are FileNotFoundErrors
        assert "nable to find" in str(e) or "doesn't contain any data files" in str(e), e
        return 0
    except ValueError as e:
        assert "all the data_files are invalid" in str(e), e
        return 0
    return ds.num_rows


def rows_seen(target: str | list[str], s3: Any, cache: Path) -> dict[str, int]:
    return {
        "duckdb": duckdb_rows(target, s3),
        "polars": polars_rows(target, s3),
        "datasets": datasets_rows(target, s3, cache),
    }


# ---- the tests --------------------------------------------------------------------------


def _check(base: str, batch: Batch, s3: Any, tmp_path: Path, kills: list[tuple[str, int]]) -> None:
    n = len(batch.actor)
    for i, (op, at) in enumerate(kills):
        root = f"{base}/kill-{i}"  # a fresh store (readers cache listings: a path reused would test their caches)
        store = BatchStore(root, rows_per_file=3)
        url = store.url_for(batch.collection_id, batch.iteration)
        killed_write(root, batch, tmp_path, op, at)
        staged = store.loc.list_files(store.staging_for(batch.collection_id, batch.iteration), store.retry)
        assert staged, f"kill {op}#{at}: nothing was staged"
        seen = rows_seen(f"{url}/actor/*.parquet", s3, tmp_path / f"cache-{i}-a")
        assert seen == {"duckdb": 0, "polars": 0, "datasets": 0}, f"kill {op}#{at}: an unfinished batch was seen"
        with pytest.raises(BatchNotFound, match="a write was interrupted"):
            store.parquet_files(url)
        store.write(batch)  # the rerun
        assert rows_seen(f"{url}/actor/*.parquet", s3, tmp_path / f"cache-{i}-b") == dict.fromkeys(rows_seen_keys, n)
        listed = store.parquet_files(url, "actor")
        assert rows_seen(listed, s3, tmp_path / f"cache-{i}-c") == dict.fromkeys(rows_seen_keys, n)
        assert store.loc.list_files(store.loc.url("_staging"), store.retry) == []


rows_seen_keys = ("duckdb", "polars", "datasets")


def test_a_killed_local_write_is_invisible_to_duckdb_polars_and_datasets(tmp_path, batch):
    n_files = len(BatchStore(tmp_path, rows_per_file=3).encode(batch))
    assert n_files >= 4
    # after the second staged file; before the staged manifest (everything else staged)
    _check(str(tmp_path / "store"), batch, None, tmp_path, [("put_bytes", 3), ("put_bytes", n_files + 1)])


def test_a_killed_s3_write_is_invisible_to_duckdb_polars_and_datasets(s3_server, s3_bucket, tmp_path, batch):
    n_files = len(BatchStore(s3_bucket, rows_per_file=3).encode(batch))
    # after the second staged file; everything staged, before the first copy into the batch folder
    _check(f"{s3_bucket}/focus", batch, s3_server, tmp_path, [("put_bytes", 3), ("copy", 1)])
    assert n_files >= 4


def test_a_kill_while_s3_publishes_is_refused_by_the_manifest_readers(s3_server, s3_bucket, tmp_path, batch):
    """S3 has no rename: a kill between the copies into the batch folder leaves files
    there without a manifest. Readers going through the manifest never see them; the
    rerun publishes the batch, every row once."""
    root = f"{s3_bucket}/focus"
    store = BatchStore(root, rows_per_file=3)
    url = store.url_for(batch.collection_id, batch.iteration)
    killed_write(root, batch, tmp_path, "copy", 3)
    assert store.loc.list_files(url, store.retry)  # two of the files were copied
    with pytest.raises(BatchNotFound, match="a write was interrupted"):
        store.parquet_files(url)
    store.write(batch)
    files = store.parquet_files(url, "actor")
    n = len(batch.actor)
    assert rows_seen(files, s3_server, tmp_path / "cache") == dict.fromkeys(rows_seen_keys, n)
    assert duckdb_rows(f"{url}/actor/*.parquet", s3_server) == n
