"""Infrastructure faults: a Dask worker killed mid-shard, the object store unreachable for
a while (a cuttable TCP relay in front of the loopback S3 server), and the process
killed between two writes (a real SIGKILL at every boundary between storage writes).

After each: no row lost, none duplicated, and the batch reads back through schema
validation (and DuckDB agrees on the row counts).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pytest
from fixtures.journal import AfterStep, run_collect
from fixtures.prefect import DigitPolicy

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.collector import Collector
from focus.execution import Execution
from focus.format import ByteCodec
from focus.journal import wave_step
from focus.policy import SamplingParams
from focus.priority import Phase, Selective
from focus.testing.faults import FaultProxy
from focus.toy import ReachTarget, reach_target_tasks, toy_format
from storage import BatchNotFound, BatchStore, CheckpointNotFound, CheckpointStore, Retry, StorageUnavailable
from tasks.config import load_config
from tasks.journal import CheckpointJournal

pytestmark = pytest.mark.timeout(150)

ROOT = Path(__file__).resolve().parents[1]
QUICK = Retry(attempts=3, backoff_s=0.05, max_backoff_s=0.1)


def row_keys(batch):
    return [(r.tree_id, r.edge_id, r.turn_index) for r in batch.actor]


def rows(batch):
    actor = [
        (*k, r.completion_ids, r.logprobs, round(r.advantage, 12))
        for k, r in zip(row_keys(batch), batch.actor, strict=True)
    ]
    critic = [(r.tree_id, r.node_id, round(r.target, 12), r.weight) for r in batch.critic]
    return actor, critic


def config(root: str, cid: str, transitions: int = 24):
    return load_config(
        overrides={
            "collection_id": cid,
            "seed": 5,
            "model.kind": "factory",
            "model.factory": "fixtures.digits:digit_policy",
            "env.n_tasks": 3,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": transitions, "wave_size": 4, "max_depth": 6},
            ],
            "execution.kind": "local",
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


def digit_batch():
    cfg = config("memory://unused", "digits")
    agent, tasks = cfg.build_agent(DigitPolicy())
    return asyncio.run(cfg.build_collector(agent).collect(tasks))


def check_complete(store: BatchStore, url: str, want, s3_server) -> None:
    """Schema-validated read equals ``want``; DuckDB sees each row exactly once."""
    got = store.read(url)
    assert rows(got) == rows(want)
    con = duckdb.connect()
    con.register_filesystem(s3_server.filesystem())
    n, distinct = con.sql(
        f"select count(*), count(distinct (tree_id, edge_id, turn_index)) from read_parquet('{url}/actor/*.parquet')"
    ).fetchall()[0]
    assert n == distinct == len(want.actor)  # lost: 0, duplicated: 0


# ---- Dask: a worker process killed while it runs a shard ----


def test_a_dask_worker_killed_mid_shard_loses_and_duplicates_nothing(local_model_server):
    from focus.dask_execution import DaskExecution

    tasks = reach_target_tasks(4, seed=3)
    phases = [Phase("evidence", rollouts_per_task=4)]

    def make_collector(url: str, execution) -> Collector:
        policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size, config=HttpConfig(max_retries=2))
        agent = Agent(policy, ReachTarget(), toy_format(), max_steps=6, sampling=SamplingParams(max_tokens=8))
        return Collector(agent, search=Selective(phases=phases), execution=execution, collection_id="dask", seed=1)

    # every model call waits 0.15 s at the proxy, so each shard runs for a second or more
    with FaultProxy(local_model_server.url, latency_s=0.15) as proxy:
        ex = DaskExecution(n_workers=2, threads_per_worker=1, shard_size=4, max_concurrency=2)
        with ex:
            client = ex.client()
            before = client.run(os.getpid)
            col = make_collector(proxy.url, ex)
            out: dict[str, object] = {}
            runner = threading.Thread(target=lambda: out.update(state=asyncio.run(col.search(tasks))))
            runner.start()
            deadline = time.monotonic() + 60
            while not any(client.processing().values()) or proxy.requests < 3:
                assert time.monotonic() < deadline and runner.is_alive(), "shards never started"
                time.sleep(0.02)
            victim_addr, victim = next((a, before[a]) for a, jobs in client.processing().items() if jobs)
            os.kill(victim, signal.SIGKILL)
            runner.join(timeout=120)
            assert not runner.is_alive(), "the wave did not finish after the worker was killed"
            after = client.run(os.getpid)
        assert victim not in after.values()  # the worker really died (the nanny started a new one)
    state = out["state"]
    clean_col = make_collector(local_model_server.url, Execution(max_concurrency=8))
    clean = asyncio.run(clean_col.search(tasks))
    got, want = clean_col.prepare(state), clean_col.prepare(clean)
    assert got.stats["rollouts"] == want.stats["rollouts"] == 16 and got.stats["failed_rollouts"] == 0
    assert rows(got) == rows(want)
    assert len(set(row_keys(got))) == len(got.actor)


# ---- the object store unreachable for a while ----


@pytest.fixture
def relay_store(s3_server, s3_relay):
    """(bucket URL, storage options that go through the cuttable relay)."""
    bucket = s3_server.make_bucket("focus-outage")
    opts = {"key": s3_server.key, "secret": s3_server.secret, "endpoint_url": s3_relay.url}
    return bucket, opts


def test_batch_write_during_an_outage_fails_fast_and_leaves_no_batch(s3_server, s3_relay, relay_store):
    bucket, opts = relay_store
    batch = digit_batch()
    store = BatchStore(f"{bucket}/out", storage_options=opts, retry=QUICK, rows_per_file=20, threads=1)
    s3_relay.cut()
    t0 = time.monotonic()
    with pytest.raises(StorageUnavailable, match="unreachable after 3 attempt"):
        store.write(batch)
    assert time.monotonic() - t0 < 15
    s3_relay.restore()
    url = store.url_for(batch.collection_id, batch.iteration)
    assert not store.exists(url)
    assert store.write(batch) == url
    check_complete(store, url, batch, s3_server)


def test_an_outage_in_the_middle_of_a_write_is_repaired_by_writing_again(s3_server, s3_relay, relay_store, monkeypatch):
    """The relay is cut right after the second file reached the store."""
    from storage.urls import Location

    bucket, opts = relay_store
    batch = digit_batch()
    store = BatchStore(f"{bucket}/out", storage_options=opts, retry=QUICK, rows_per_file=20, threads=1)
    assert len(store.encode(batch)) >= 4
    put = Location.put_bytes
    calls = []

    def cut_after_two(self, *args, **kwargs):
        result = put(self, *args, **kwargs)
        calls.append(args[0])
        if len(calls) == 2:
            s3_relay.cut()
        return result

    monkeypatch.setattr(Location, "put_bytes", cut_after_two)
    with pytest.raises(StorageUnavailable):
        store.write(batch)
    monkeypatch.setattr(Location, "put_bytes", put)
    s3_relay.restore()
    url = store.url_for(batch.collection_id, batch.iteration)
    with pytest.raises(BatchNotFound, match="a write was interrupted"):
        store.read(url)
    store.write(batch)
    check_complete(store, url, batch, s3_server)


def test_a_collection_survives_an_outage_between_waves(s3_server, s3_relay, relay_store):
    bucket, opts = relay_store
    root = f"{bucket}/runs"

    stores = {
        "store": CheckpointStore(root, storage_options=opts, retry=QUICK),
        "batch_store": BatchStore(root, storage_options=opts, retry=QUICK),
    }

    class Unleased(AfterStep):
        """No lease: its release would go through the cut relay (the checkpoints are the point here)."""

        def lease(self):  # type: ignore[no-untyped-def]
            return contextlib.nullcontext()

    def run(cid: str, journal: type = Unleased, **kwargs) -> tuple[CheckpointJournal, dict]:  # type: ignore[no-untyped-def]
        cfg = config(root, cid, transitions=10)
        steps = journal(cfg, **kwargs, **stores)
        return steps, run_collect(cfg, steps, execution=Execution(max_concurrency=8))

    _, clean = run("clean", step=None)
    # the store goes away once the first wave is saved: saving its scores fails
    with pytest.raises(StorageUnavailable):
        run("outage", step=wave_step(1, 0), then=s3_relay.cut)
    s3_relay.restore()
    cfg = config(root, "outage", transitions=10)
    assert CheckpointJournal(cfg, **stores).load(("1.continue.score", 0)) is None
    again, result = run("outage", step=None)  # a rerun: finished steps are reused
    assert [r.reused for r in again.records if r.kind == "wave"][0]
    store = BatchStore(root, storage_options=opts)
    got, want = store.read(result["batch_url"]), store.read(clean["batch_url"])
    assert rows(got) == rows(want) and len(got.actor) > 0
    check_complete(store, result["batch_url"], want, s3_server)


# ---- the process killed (SIGKILL) between two storage writes ----

KILLER = """
import os, pickle, signal, sys
from storage import BatchStore, CheckpointStore
from storage.urls import Location
mode, root, data, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
obj = pickle.load(open(data, "rb"))
put, calls = Location.put_bytes, [0]
def put_or_die(self, *args, **kwargs):
    calls[0] += 1
    if calls[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    return put(self, *args, **kwargs)
Location.put_bytes = put_or_die
if mode == "batch":
    BatchStore(root, rows_per_file=20, threads=1).write(obj)
else:
    CheckpointStore(root).save("killed", "1.continue", 3, obj)
print("finished")
"""


def test_sigkill_between_any_two_writes_loses_and_duplicates_nothing(s3_server, tmp_path):
    bucket = s3_server.make_bucket("focus-kill")
    batch = digit_batch()
    data = tmp_path / "batch.pkl"
    data.write_bytes(pickle.dumps(batch))
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    n_files = len(BatchStore(bucket, rows_per_file=20, threads=1).encode(batch))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # kill before write k: 1 (nothing written), 2 (one part), the last part, the manifest;
    # for a checkpoint, between its data file and its manifest
    runs = {
        (mode, k): subprocess.Popen(
            [sys.executable, str(script), mode, f"{bucket}/{mode}-{k}", str(data), str(k)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        for mode, ks in (("batch", sorted({1, 2, n_files, n_files + 1})), ("checkpoint", (2,)))
        for k in ks
    }
    for (mode, k), proc in runs.items():
        out = proc.communicate(timeout=90)[0].decode()
        assert proc.returncode == -signal.SIGKILL, f"{mode} k={k}: {out[-2000:]}"
    for mode, k in runs:
        root = f"{bucket}/{mode}-{k}"
        if mode == "checkpoint":
            store = CheckpointStore(root)
            with pytest.raises(CheckpointNotFound):
                store.load("killed", "1.continue", 3)
            store.save("killed", "1.continue", 3, batch)
            assert rows(store.load("killed", "1.continue", 3)) == rows(batch)
            assert store.list("killed") == [("1.continue", 3)]
            continue
        store = BatchStore(root, rows_per_file=20)
        url = store.url_for(batch.collection_id, batch.iteration)
        assert not store.exists(url) and store.list() == []  # a half-written batch does not exist
        store.write(batch)
        check_complete(store, url, batch, s3_server)
