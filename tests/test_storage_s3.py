"""Stores against a real S3-compatible HTTP server on loopback (moto server mode).

DuckDB's own S3 reader (the httpfs extension) must be downloaded, which is impossible
offline, so DuckDB reads the bucket through an fsspec filesystem registered with it;
polars reads the bucket with its native object-store client.
"""

from __future__ import annotations

import socket
import time

import duckdb
import polars as pl
import pytest
from test_storage import batch_from_trees, grow_tree

from focus.batch import Batch
from storage import BatchNotFound, BatchStore, CheckpointStore, Retry, RootNotFound, StorageUnavailable


@pytest.fixture(scope="module")
def s3_batch() -> Batch:
    return batch_from_trees([grow_tree("t1"), grow_tree("t2", branches=1)], "c-s3", 2)


def test_batch_round_trip_through_s3_using_the_environment(s3_bucket, s3_batch):
    store = BatchStore(f"{s3_bucket}/focus")  # endpoint and credentials from AWS_* variables
    url = store.write(s3_batch)
    assert url == f"{s3_bucket}/focus/batches/c-s3/iter-000002"
    assert store.write(s3_batch) == url  # idempotent against S3 too
    back = store.read(url)
    assert back.actor == s3_batch.actor and back.critic == s3_batch.critic and back.stats == s3_batch.stats
    assert store.list() == [url]


def test_duckdb_and_polars_read_a_batch_straight_from_the_bucket(s3_server, s3_bucket, s3_batch):
    url = BatchStore(s3_bucket).write(s3_batch)
    n_rows, n_tokens = len(s3_batch.actor), s3_batch.n_tokens
    adv = sum(r.advantage * sum(r.loss_mask) for r in s3_batch.actor)

    df = pl.read_parquet(f"{url}/actor/*.parquet", storage_options=s3_server.polars_options)
    assert df.height == n_rows
    assert df.select(pl.col("completion_ids").list.len().sum()).item() == n_tokens
    assert df["logprobs"].to_list() == [list(r.logprobs) for r in s3_batch.actor]

    con = duckdb.connect()
    con.register_filesystem(s3_server.filesystem())
    got = con.sql(
        f"select count(*), sum(len(completion_ids)), sum(advantage * list_sum(loss_mask)) "
        f"from read_parquet('{url}/actor/*.parquet')"
    ).fetchall()[0]
    assert got[:2] == (n_rows, n_tokens) and got[2] == pytest.approx(adv)
    critic = con.sql(f"select count(*), count(prediction) from read_parquet('{url}/critic/*.parquet')").fetchall()[0]
    assert critic == (len(s3_batch.critic), sum(r.prediction is not None for r in s3_batch.critic))


def test_checkpoints_on_s3(s3_bucket):
    tree = grow_tree("t3")
    store = CheckpointStore(s3_bucket)
    store.save("c-s3", 0, 0, {"trees": [tree]})
    store.save("c-s3", 1, 0, {"trees": [tree], "wave": 0})
    assert store.latest("c-s3") == (1, 0)
    back = store.load("c-s3", 0, 0)["trees"][0]
    assert back.edges == tree.edges
    assert {n: s.workspace.snapshot() for n, s in back.states.items()} == {
        n: s.workspace.snapshot() for n, s in tree.states.items()
    }


def test_a_missing_batch_or_bucket_is_a_clear_error(s3_server, s3_bucket, s3_batch):
    store = BatchStore(s3_bucket)
    with pytest.raises(BatchNotFound):
        store.read(store.url_for("c-s3", 9))
    with pytest.raises(RootNotFound, match="s3://focus-no-such-bucket/.*create the bucket"):
        BatchStore("s3://focus-no-such-bucket").write(s3_batch)


def test_an_unreachable_endpoint_fails_after_bounded_retries(s3_server, s3_batch):
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {**s3_server.storage_options, "endpoint_url": f"http://127.0.0.1:{port}"}
    store = BatchStore("s3://focus-unreachable/x", storage_options=options, retry=Retry(attempts=2, backoff_s=0.05))
    t0 = time.perf_counter()
    with pytest.raises(StorageUnavailable, match=r"unreachable after 2 attempt\(s\)"):
        store.write(s3_batch)
    with pytest.raises(StorageUnavailable, match="focus-unreachable"):
        store.read(store.url_for("c-s3", 2))
    assert time.perf_counter() - t0 < 20


def count_s3_requests(fs, monkeypatch) -> list[str]:  # type: ignore[no-untyped-def]
    """The S3 operations ``fs`` (an s3fs file system) calls from now on, in order."""
    calls: list[str] = []
    real = fs._call_s3

    async def counted(method: str, *args: object, **kwargs: object) -> object:
        calls.append(method)
        return await real(method, *args, **kwargs)

    monkeypatch.setattr(fs, "_call_s3", counted)
    return calls


def test_a_checkpoint_costs_one_request_per_object_on_s3(s3_bucket, monkeypatch):
    """s3fs (2025.x) sized every file before reading it: a saved checkpoint cost a HEAD
    and a LIST (is the missing manifest a folder?) besides its two PUTs, a loaded one two
    HEADs besides its two GETs: 2,815 PUTs came with 1,427 LISTs (billed as PUTs) and
    1,407 HEADs in a 20k-transition collection. Now one request per object, and a save
    no longer reads its (absent) manifest first."""
    store = CheckpointStore(s3_bucket)
    calls = count_s3_requests(store.loc.fs, monkeypatch)
    store.save("c", "wave", 3, {"rollouts": list(range(100))})
    assert calls == ["put_object", "put_object"]  # the data, the manifest (a save does not look first)
    calls.clear()
    assert store.load("c", "wave", 3) == {"rollouts": list(range(100))}
    assert calls == ["get_object", "get_object"]


def test_a_lease_asks_s3_only_what_it_needs(s3_bucket, monkeypatch):
    """Requests per lease operation on S3. A read of the lease object was a HEAD for its
    ETag, a HEAD of s3fs's to size the body and a GET; a renewal (every ``ttl_s / 3``) read
    the object back after its PUT for the new ETag, which the PUT's answer holds; a
    batch's confirm and a release read the whole object to compare its ETag. Taking the
    lease still reads it back (the create was this run's only if the object holds its
    token: a store whose writes are not atomic), and each version taken is the one S3
    compares: a second renewal's ``If-Match`` succeeds, and confirm finds the lease its own."""
    from storage.lease import Lease

    lease = Lease(s3_bucket + "/runs", "c1")
    calls = count_s3_requests(lease.loc.fs, monkeypatch)

    def asked(step) -> list[str]:  # type: ignore[no-untyped-def]
        calls.clear()
        step()
        return list(calls)

    assert asked(lease.acquire) == ["put_object", "head_object", "get_object"]  # was 2 HEADs
    assert asked(lease.renew) == ["put_object"]  # was PUT, 2 HEADs, GET
    assert lease._version == lease.loc.fs.info(lease._slot.path, refresh=True)["ETag"]
    assert asked(lease.renew) == ["put_object"] and lease.held  # the If-Match of the version the PUT gave
    assert asked(lease.confirm) == ["head_object"]  # was 2 HEADs, GET
    assert asked(lease.release) == ["head_object", "delete_objects"]  # was 2 HEADs, GET, DELETE
    assert not lease.loc.fs.exists(lease._slot.path)
