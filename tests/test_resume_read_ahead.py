"""A resume reads its saved steps ahead of the replay (:class:`storage.read_ahead.ReadAhead`).

Before, the replay loaded one checkpoint after another, a manifest and then its data
file, so on S3 every saved wave cost four round trips with nothing else in flight
(16,500 sequential GETs before the first new wave at 100k transitions). Now the loads run
in a few threads ahead of the replay, which still takes them in order. Moto's S3 on
loopback behind :class:`focus.testing.s3faults.S3FaultProxy`, which holds every request
the tests look at 50 ms (a store farther away than loopback; what only sets the scene goes
at loopback speed) and records when each was in flight.
"""

from __future__ import annotations

import pickle
import time
from collections import Counter

import pytest
from fixtures.journal import StopAfter, Stopped, run_collect
from fixtures.resume import mismatches
from test_faults_infra import config

from focus.journal import end_step, wave_step
from focus.testing.s3faults import S3FaultProxy, peak_in_flight
from storage import BatchStore, CheckpointNotFound, CheckpointStore, CorruptDataError
from storage.read_ahead import ReadAhead
from storage.urls import Location
from tasks.config import StorageConfig
from tasks.journal import CheckpointJournal

pytestmark = pytest.mark.timeout(180)

DELAY_S = 0.05


@pytest.fixture
def slow_s3(s3_server):
    """(bucket URL, storage options through the proxy, the proxy holding each request 50 ms)."""
    with S3FaultProxy(s3_server.endpoint_url) as proxy:
        proxy.delay_s = DELAY_S
        opts = {"key": s3_server.key, "secret": s3_server.secret, "endpoint_url": proxy.url}
        yield s3_server.make_bucket("focus-ahead"), opts, proxy


def gets(proxy: S3FaultProxy, since: float, part: str = "/checkpoints/") -> list:
    return [r for r in proxy.served if r[0] >= since and r[2] == "GET" and part in r[3]]


def saved_store(bucket: str, opts: dict, n: int, proxy: S3FaultProxy) -> tuple[CheckpointStore, list, list]:
    """A store holding ``n`` checkpoints of collection ``c``: (store, keys, values). The
    saves go at loopback speed (only the reads are looked at), the reads after are held."""
    store = CheckpointStore(f"{bucket}/runs", storage_options=opts)
    keys = [(f"1.continue{'.score' if i % 2 else ''}", i // 2) for i in range(n)]
    values = [{"i": i, "pad": bytes(100 * i)} for i in range(n)]
    proxy.delay_s = 0.0
    for key, value in zip(keys, values, strict=True):
        store.save("c", *key, value)
    proxy.delay_s = DELAY_S
    return store, keys, values


def test_the_loads_overlap_within_their_window_and_come_in_order(slow_s3):
    bucket, opts, proxy = slow_s3
    store, keys, values = saved_store(bucket, opts, 24, proxy)
    t0 = time.monotonic()
    ahead = ReadAhead(store, "c", keys, threads=8, window=8, max_bytes=1)
    deadline = time.monotonic() + 30
    while len(gets(proxy, t0)) < 9 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(5 * DELAY_S)  # anything beyond the window would have started by now
    early = gets(proxy, t0)
    # nothing taken yet: 8 manifests (the window) and 1 data file (max_bytes=1 admits one at a time)
    assert sum(r[3].endswith(".manifest.json") for r in early) == 8
    assert sum(r[3].endswith(".pkl") for r in early) == 1
    got = [ahead.take(key) for key in keys]
    assert got == [(True, v) for v in values]
    assert len(gets(proxy, t0)) == 2 * len(keys)  # each checkpoint read once
    assert peak_in_flight(gets(proxy, t0)) >= 2
    assert ahead.take(keys[0]) == (False, None)  # every key taken: the caller loads for itself


def test_a_damaged_or_missing_checkpoint_is_reported_as_a_load_reports_it(slow_s3, s3_server):
    bucket, opts, proxy = slow_s3
    store, keys, values = saved_store(bucket, opts, 10, proxy)
    fs = s3_server.filesystem()
    folder = f"{bucket.removeprefix('s3://')}/runs/checkpoints/c"
    (data,) = fs.glob(f"{folder}/n-1.continue-w00001.*.pkl")
    fs.pipe(data, fs.cat(data)[:-1] + b"\x00")  # the second wave's data file damaged
    fs.rm(f"{folder}/n-1.continue.score-w00003.manifest.json")  # the fourth wave's scores gone
    errors = {}
    for key in (keys[2], keys[7]):
        with pytest.raises((CorruptDataError, CheckpointNotFound)) as direct:
            store.load("c", *key)
        errors[key] = (type(direct.value), str(direct.value))
    ahead = ReadAhead(store, "c", keys, threads=4, window=4)
    for key, value in zip(keys, values, strict=True):
        if key in errors:
            with pytest.raises(errors[key][0]) as raised:
                ahead.take(key)
            assert str(raised.value) == errors[key][1]
        else:
            assert ahead.take(key) == (True, value)
    assert "checksum differs from the manifest" in errors[keys[2]][1]


def test_a_resume_on_s3_reads_ahead_and_gives_the_uninterrupted_batch(slow_s3, tmp_path):
    """Stopped after its sixth continuation wave was saved, then resumed: the replay's
    checkpoint reads overlap (they were one at a time), and the batch is the clean run's,
    every row bit for bit and the same Parquet files."""
    bucket, opts, proxy = slow_s3

    def journal(root: str, stop: int | None = None, options: dict | None = opts) -> tuple:
        cfg = config(root, "ahead", transitions=48)
        stores = {
            "store": CheckpointStore(root, storage_options=options),
            "batch_store": BatchStore(root, storage_options=options),
        }
        if stop is None:
            return cfg, CheckpointJournal(cfg, **stores)
        return cfg, StopAfter(cfg, wave_step(1, stop), **stores)

    # the uninterrupted run in a local folder (the same batch wherever it is stored: the
    # Parquet files' checksums are compared below; on moto it cost the test 5 s), and the
    # run to stop at loopback speed: only the resume's reads are looked at, and they alone
    # are held
    clean_root = str(tmp_path / "clean")
    clean = run_collect(*journal(clean_root, options=None))  # the same collection id in another root
    proxy.delay_s = 0.0
    root = f"{bucket}/resumed"
    with pytest.raises(Stopped):
        run_collect(*journal(root, stop=5))
    store = CheckpointStore(root, storage_options=opts)
    before = {store.loc.path(u) for u in store.loc.list_files(f"{root}/checkpoints/ahead", store.retry)}
    proxy.delay_s = DELAY_S
    t0 = time.monotonic()
    out = run_collect(*journal(root))
    proxy.delay_s = 0.0  # the batches' reads below are not looked at
    replayed = [r for r in gets(proxy, t0) if r[3].lstrip("/") in before]
    assert len(replayed) >= 2 * 14  # the evidence, its scores and 6 waves with their scores, at least
    assert peak_in_flight(replayed) >= 2
    assert out["stats"]["steps_reused"] >= 14
    batches = BatchStore(clean_root)
    want, want_manifest = batches.read(clean["batch_url"]), batches.manifest(clean["batch_url"])
    resumed = BatchStore(root, storage_options=opts)
    got = resumed.read(out["batch_url"])
    assert len(want.actor) >= 40
    assert mismatches(got, want) == {"actor": 0, "critic": 0}
    assert resumed.manifest(out["batch_url"]).fingerprint == want_manifest.fingerprint


def test_the_loop_takes_every_step_read_ahead_in_the_planned_order(tmp_path, monkeypatch):
    """The plan (:func:`tasks.gaps.replay_order`) is the order the loop asks in: a step
    taken out of order would be loaded again, one at a time, as before."""
    plans, served = [], []
    start, take = ReadAhead.__init__, ReadAhead.take

    def planned(self, store, cid, keys, **window):  # type: ignore[no-untyped-def]
        plans.append(list(keys))
        start(self, store, cid, keys, **window)

    def watched(self, key):  # type: ignore[no-untyped-def]
        found, value = take(self, key)
        served.extend([key] if found else [])
        return found, value

    monkeypatch.setattr(ReadAhead, "__init__", planned)
    monkeypatch.setattr(ReadAhead, "take", watched)
    cfg = config(str(tmp_path / "store"), "order", transitions=48)
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, 5)))
    assert plans == [[]] and served == []  # a first run replays nothing
    run_collect(cfg)
    (plan,) = plans[1:]
    # the evidence and its scores, waves 0-4 with their scores, wave 5 (stopped before its scores)
    assert plan[:3] == [("evidence", 0), ("evidence.score", 0), ("1.continue", 0)]
    assert len(plan) == 13 and plan[-1] == ("1.continue", 5)
    assert served == plan


def test_a_store_reading_ahead_pickles_without_its_threads(tmp_path):
    """A store is shipped to other processes (its :class:`storage.urls.Location` opens its
    own connection there); one reading ahead goes without the read-ahead."""
    store = CheckpointStore(str(tmp_path))
    store.save("c", "1.continue", 0, {"x": 1})
    with store.reading_ahead("c", [("1.continue", 0)]):
        copy = pickle.loads(pickle.dumps(store))
        assert copy._ahead is None and copy.load("c", "1.continue", 0) == {"x": 1}
        assert store.load("c", "1.continue", 0) == {"x": 1}
    assert store._ahead is None


def test_a_resume_reads_each_checkpoint_file_once_and_lists_the_collection_three_times(tmp_path, monkeypatch):
    """Stopped right after its phase's end was saved, then resumed: the phase end, read
    to find gaps (:func:`tasks.gaps.mend`), was read again by the replay, and every step
    the loop asked for and found missing (the tree picture, the export) listed the whole
    collection to word an error nobody saw. Now each checkpoint file is read once, and the
    collection is listed by the records' check, the lease's sweep and the mend alone."""
    cfg = config(str(tmp_path / "store"), "once", transitions=24)
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, end_step(1)))
    reads: Counter[str] = Counter()
    listings: list[str] = []
    cat, list_files = Location.cat, Location.list_files

    def counted_cat(self, url, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads[url] += 1
        return cat(self, url, *args, **kwargs)

    def counted_list(self, url, *args, **kwargs):  # type: ignore[no-untyped-def]
        listings.append(url)
        return list_files(self, url, *args, **kwargs)

    monkeypatch.setattr(Location, "cat", counted_cat)
    monkeypatch.setattr(Location, "list_files", counted_list)
    out = run_collect(cfg)
    assert out["stats"]["steps_reused"] >= 10, out["stats"]
    data = [u for u in reads if "/checkpoints/once/" in u and u.endswith(".pkl")]
    assert any(".end-w" in u for u in data) and len(data) >= 10
    assert [u for u, n in reads.items() if "/checkpoints/" in u and n > 1] == []
    assert sum(u.endswith("/checkpoints/once") for u in listings) == 3, listings


def test_a_resume_reads_ahead_with_the_configured_sizes(tmp_path, monkeypatch):
    """``storage.read_ahead`` sizes the resume's read-ahead (they were keyword defaults:
    8 threads, a window of 32 steps, 64 MiB); the replay and its batch are the same."""
    sizes = []
    start = ReadAhead.__init__

    def sized(self, store, cid, keys, **options):  # type: ignore[no-untyped-def]
        sizes.append({k: options[k] for k in ("threads", "window", "max_bytes")})
        start(self, store, cid, keys, **options)

    monkeypatch.setattr(ReadAhead, "__init__", sized)
    base = config(str(tmp_path / "store"), "sized", transitions=24)
    read_ahead = {"threads": 2, "window": 3, "max_mib": 0.5}
    cfg = base.model_copy(update={"storage": StorageConfig(root=base.storage.root, read_ahead=read_ahead)})
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, 2)))
    out = run_collect(cfg)
    assert sizes == [{"threads": 2, "window": 3, "max_bytes": 2**19}] * 2
    assert out["stats"]["steps_reused"] >= 6
    default = config(str(tmp_path / "other"), "sized").storage.read_ahead.options()
    assert default == {"threads": 8, "window": 32, "max_bytes": 64 * 2**20}


def test_checkpoints_the_caller_loaded_are_handed_out_unread(tmp_path, monkeypatch):
    """``known`` (what a resume's gap search read: its phase ends) comes back as given
    and in its place, with no read of its files; the others are read ahead as before,
    one data file at a time here (``max_bytes=1``), past the known ones."""
    store = CheckpointStore(str(tmp_path))
    keys = [("1.continue", w) for w in range(6)]
    for i, key in enumerate(keys):
        store.save("c", *key, {"i": i})
    known = {keys[0]: "first", keys[3]: "fourth", ("other", 0): "not a key"}
    reads: list[str] = []
    cat = Location.cat

    def counted(self, url, *args, **kwargs):  # type: ignore[no-untyped-def]
        reads.append(url.rsplit("/", 1)[1])
        return cat(self, url, *args, **kwargs)

    monkeypatch.setattr(Location, "cat", counted)
    with ReadAhead(store, "c", keys, threads=2, window=3, max_bytes=1, known=known) as ahead:
        got = [ahead.take(key) for key in keys]
    assert got == [(True, "first"), (True, {"i": 1}), (True, {"i": 2}), (True, "fourth"), (True, {"i": 4}),
                   (True, {"i": 5})]  # fmt: skip
    assert sorted(r.rsplit(".", 2)[0] for r in reads) == sorted(
        ["n-1.continue-w0000" + str(w) for w in (1, 2, 4, 5)] * 2
    )
