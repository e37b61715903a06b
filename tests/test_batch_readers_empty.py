"""A batch of no rows (every rollout failed) read by the query tools docs/batch-schema.md
names: DuckDB, polars and HF ``datasets``, from the manifest's file list."""

from __future__ import annotations

import duckdb
import polars as pl
import pyarrow.parquet as pq
import pytest

from focus.batch import Batch
from storage import ACTOR_SCHEMA, CRITIC_SCHEMA, BatchStore


def test_a_batch_of_no_rows_reads_as_no_rows_in_every_tool(tmp_path):
    """``datasets`` refused it as a bad file ("ArrowInvalid: BatchSize must be greater than
    0, got 0", streaming too): each table was one row group of 0 rows, and ``datasets``
    reads a file in batches of its first row group's size. An empty table is now written
    as a file with the schema and no row group: streaming reads it as 0 rows, and a
    ``datasets.Dataset`` made from the batch's Arrow table has the schema's columns. A
    non-streaming ``load_dataset`` still refuses it, as it refuses every empty split."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    store = BatchStore(tmp_path / "store")
    url = store.write(Batch("c-empty", 0, [], []))
    back = store.read(url)
    assert back.actor_table.num_rows == back.critic_table.num_rows == 0
    for table, schema in (("actor", ACTOR_SCHEMA), ("critic", CRITIC_SCHEMA)):
        files = store.parquet_files(url, table)
        assert pq.ParquetFile(files[0].removeprefix("file://")).schema_arrow.names == schema.names
        assert duckdb.sql("select count(*) from read_parquet($f)", params={"f": files}).fetchall() == [(0,)]
        assert pl.read_parquet(files).shape == (0, len(schema))
        stream = datasets.load_dataset("parquet", data_files={"train": files}, split="train", streaming=True)
        assert list(stream) == [] and list(stream.features) == schema.names
        whole = datasets.Dataset(back.actor_table if table == "actor" else back.critic_table)
        assert whole.num_rows == 0 and list(whole.features) == schema.names
        # datasets' own rule for an empty split of any format, which docs/batch-schema.md states
        with pytest.raises(ValueError, match='Instruction "train" corresponds to no data'):
            datasets.load_dataset("parquet", data_files={"train": files}, split="train", cache_dir=str(tmp_path / "hf"))
