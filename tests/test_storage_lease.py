"""One writer per collection: the lease, and checkpoints that cannot disagree with their manifests.

The race tests start writers together (a barrier) many times, on a local folder and on a
real S3 server (moto on loopback): exactly one holds the lease at a time, and every
manifest written - with or without a lease - matches its data.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks.writer_race import race
from storage import CheckpointStore, Lease, LeaseHeld, LeaseLost, collection_lease
from storage.lease import LeaseRecord
from storage.urls import TEMP_MARK, Location, Retry

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.timeout(120)


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def lease_doc(root: Path, cid: str) -> dict:
    return json.loads((root / "leases" / f"{cid}.json").read_text(encoding="utf-8"))


def test_a_second_writer_is_refused_in_one_line_naming_owner_and_expiry(tmp_path):
    first = Lease(tmp_path, "c1", ttl_s=30).acquire()
    with pytest.raises(LeaseHeld) as err:
        Lease(tmp_path, "c1").acquire()
    msg = str(err.value)
    assert "\n" not in msg and first.owner in msg and f"pid {os.getpid()}" in msg
    assert "until 20" in msg and "s from now" in msg and "'c1'" in msg
    assert Lease(tmp_path, "c2").acquire().held  # another collection is another lease
    first.release()
    assert not (tmp_path / "leases" / "c1.json").exists()
    second = Lease(tmp_path, "c1").acquire()  # free again
    assert lease_doc(tmp_path, "c1")["owner"] == second.owner
    second.release()


def test_an_expired_lease_is_taken_over_only_after_expiry_and_the_old_owner_is_fenced(tmp_path):
    clock = Clock()
    old = Lease(tmp_path, "c1", ttl_s=10, clock=clock).acquire()
    store = CheckpointStore(tmp_path)
    store.save("c1", 1, 0, "by the first owner")
    clock.t += 9.0  # not yet expired
    with pytest.raises(LeaseHeld, match="1 s from now"):
        Lease(tmp_path, "c1", ttl_s=10, clock=clock).acquire()
    clock.t += 2.0  # expired: the old owner stalled without renewing
    # the old owner is a live process on this host: the taker watches the lease for a
    # whole ttl on its monotonic clock before taking it (a fake clock: no 10 s of waiting)
    mono, slept = Clock(0.0), []

    def sleep(s: float) -> None:
        slept.append(s)
        mono.t += s

    new = Lease(tmp_path, "c1", ttl_s=10, clock=clock, monotonic=mono, sleep=sleep).acquire()
    assert sum(slept) == pytest.approx(10.0)
    assert lease_doc(tmp_path, "c1")["owner"] == new.owner
    with pytest.raises(LeaseLost, match=f"now held by {new.owner}.*stopping before writing more"):
        old.check()  # its late renewal finds the lease taken
    with pytest.raises(LeaseLost, match=f"now held by {new.owner}"):
        old.renew()  # compare-and-swap: the stale owner cannot overwrite the new lease
    assert lease_doc(tmp_path, "c1")["owner"] == new.owner
    old.release()  # releasing a lost lease leaves the new owner's alone
    assert lease_doc(tmp_path, "c1")["owner"] == new.owner
    new.renew()
    assert lease_doc(tmp_path, "c1")["expires_at"] == pytest.approx(clock.t + 10)
    new.release()


def test_the_owner_fences_itself_a_ttl_after_its_last_renewal_even_with_its_clock_set_back(tmp_path):
    clock, mono = Clock(), Clock(0.0)
    lease = Lease(tmp_path, "c1", ttl_s=10, clock=clock, monotonic=mono).acquire()
    mono.t += 8.0
    lease.renew()  # a renewal moves the fence: ttl from when it began
    mono.t += 8.0
    lease.check()
    clock.t -= 3600.0  # the wall clock is stepped back an hour (NTP, a restored VM)
    mono.t += 3.0  # ... and the store stays unreachable past the ttl: a taker elsewhere may own it now
    good_swap = lease._slot.swap
    lease._slot.swap = unreachable  # type: ignore[method-assign]
    with pytest.raises(LeaseLost, match="without a renewal for 10 s"):
        lease.check()
    with pytest.raises(LeaseLost, match="stopping before writing more"):
        CheckpointStore(tmp_path).save("c1", 1, 0, "must not be written")
    lease._slot.swap = good_swap  # type: ignore[method-assign]
    lease.release()


def unreachable(*args: object) -> bool:
    raise OSError("[Errno 111] Connection refused")


def test_a_lease_that_ran_out_while_its_process_was_suspended_is_renewed_if_nobody_took_it(tmp_path, caplog):
    """Ctrl-Z for a minute, then ``fg`` (or a laptop asleep, a paused VM): the next save
    stopped the collection with LeaseLost although no other run had taken the lease.
    Its late renewal is the compare-and-swap of every renewal: nobody took it, so the
    run goes on (one that was taken meanwhile stops: the test above)."""
    clock, mono = Clock(), Clock(0.0)
    lease = Lease(tmp_path, "c1", ttl_s=10, clock=clock, monotonic=mono).acquire()
    store = CheckpointStore(tmp_path)
    store.save("c1", 1, 0, "before")
    clock.t += 60.0
    mono.t += 60.0  # suspended: no renewal, no write, for six times the ttl
    store.save("c1", 1, 1, "after")  # it raised LeaseLost: 'expired ... without a renewal for 10 s'
    assert store.load("c1", 1, 1) == "after" and lease.held
    assert lease_doc(tmp_path, "c1")["expires_at"] == pytest.approx(clock.t + 10)
    assert "the write lease ran out (no renewal for 60 s" in caplog.text
    lease.release()


def test_stores_refuse_to_write_once_the_lease_is_lost(tmp_path):
    clock = Clock()
    lease = Lease(tmp_path, "c1", ttl_s=10, clock=clock).acquire()
    store = CheckpointStore(tmp_path)
    store.save("c1", 1, 0, "fine")
    # another host takes the lease over (as after an expiry seen from its clock)
    doc = lease_doc(tmp_path, "c1")
    doc.update(owner="elsewhere:1:abcd", host="elsewhere", token="x" * 32)
    (tmp_path / "leases" / "c1.json").write_text(json.dumps(doc))
    with pytest.raises(LeaseLost, match="elsewhere:1:abcd"):
        lease.renew()
    with pytest.raises(LeaseLost, match="stopping before writing more"):
        store.save("c1", 1, 1, "must not be written")
    assert not store.exists("c1", 1, 1)
    CheckpointStore(tmp_path).save("c2", 1, 1, "other collections are not fenced")
    lease.release()
    store.save("c1", 1, 1, "a writer without a lease is not fenced")


def test_the_renewer_keeps_the_lease_alive_and_the_context_releases_it(tmp_path):
    with collection_lease(tmp_path, "c1", ttl_s=0.9) as lease:
        first = lease_doc(tmp_path, "c1")["expires_at"]
        assert lease.wait_renewed(timeout_s=30), "the renewer did not renew within 30 s"
        assert lease_doc(tmp_path, "c1")["expires_at"] > first
        lease.check()
    assert not (tmp_path / "leases" / "c1.json").exists()


_HOLD_AND_DIE = """
import os, sys
from storage import Lease
Lease(sys.argv[1], "c1", ttl_s=3600).acquire()
print("held", flush=True)
os._exit(0)  # as if killed: no release
"""


@pytest.mark.integration  # starts a process
def test_a_lease_of_a_process_that_died_on_this_host_is_taken_over_at_once(tmp_path, caplog):
    out = subprocess.run(
        [sys.executable, "-c", _HOLD_AND_DIE, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "held"
    dead = lease_doc(tmp_path, "c1")
    assert dead["expires_at"] > Clock()() and dead["pid"] != os.getpid()
    with caplog.at_level("WARNING", logger="storage.lease"):
        lease = Lease(tmp_path, "c1").acquire()
    assert "has exited" in caplog.text and dead["owner"] in caplog.text
    lease.release()


def test_a_record_from_another_host_is_not_taken_for_dead():
    from storage.lease import _owner_gone

    rec = LeaseRecord("c", "h:1:t", "some-other-host", 1, None, "t", 0.0, 1e12, 30.0)
    assert not _owner_gone(rec)


def test_interrupted_saves_leave_nothing_once_the_lease_is_taken(tmp_path):
    store = CheckpointStore(tmp_path)
    store.save("c1", 1, 0, "finished")
    folder = tmp_path / "checkpoints" / "c1"
    (folder / f"p001-w00000.manifest.json{TEMP_MARK}123-abc").write_bytes(b"{half")
    (folder / "p001-w00001.0123456789abcdef.pkl").write_bytes(pickle.dumps("no manifest"))
    (folder / f"p001-w00002.0123456789abcdef.pkl{TEMP_MARK}9-x").write_bytes(b"half")
    batch = tmp_path / "batches" / "c1" / "iter-000000"
    batch.mkdir(parents=True)
    (batch / f"_manifest.json{TEMP_MARK}77-y").write_bytes(b"{")
    with pytest.raises(Exception, match="interrupted"):
        store.load("c1", 1, 1)
    with collection_lease(tmp_path, "c1"):
        pass
    assert sorted(os.listdir(folder)) == sorted(
        ["p001-w00000.manifest.json", os.path.basename(store.save("c1", 1, 0, "x"))]
    )
    assert os.listdir(batch) == [] and store.load("c1", 1, 0) == "finished"


def test_the_sweep_reads_only_the_manifest_of_a_checkpoint_with_two_data_files(tmp_path, monkeypatch):
    """A resume's sweep read every manifest to find data files none lists (735 GETs on S3
    at 20k transitions); a data file is named after its checkpoint, so the listing tells
    the orphans, and only a race's loser left beside the winner needs its manifest."""
    store = CheckpointStore(tmp_path)
    for w in range(20):
        store.save("c1", 1, w, f"wave {w}")
    folder = tmp_path / "checkpoints" / "c1"
    (folder / "p001-w00020.0123456789abcdef.pkl").write_bytes(pickle.dumps("no manifest"))
    (folder / "p001-w00003.0123456789abcdef.pkl").write_bytes(pickle.dumps("lost a race"))
    read: list[str] = []
    cat, cat_many = store.loc.cat, store.loc.cat_many
    monkeypatch.setattr(store.loc, "cat", lambda url, *a, **k: read.append(url) or cat(url, *a, **k))
    monkeypatch.setattr(store.loc, "cat_many", lambda urls, *a, **k: read.extend(urls) or cat_many(urls, *a, **k))
    removed = store.sweep("c1")
    assert sorted(os.path.basename(u) for u in removed) == [
        "p001-w00003.0123456789abcdef.pkl",
        "p001-w00020.0123456789abcdef.pkl",
    ]
    assert [os.path.basename(u) for u in read] == ["p001-w00003.manifest.json"]
    assert [store.load("c1", 1, w) for w in range(20)] == [f"wave {w}" for w in range(20)]


def test_a_losing_save_keeps_the_first_copy_and_removes_its_own_data(tmp_path):
    a, b = CheckpointStore(tmp_path), CheckpointStore(tmp_path)
    a_url = a.save("c1", 2, 0, "first")
    # a save does not look before it writes (storage.checkpoints), so b's is the race's
    # loser: it writes its data file, then finds a's manifest when it creates its own
    assert b.save("c1", 2, 0, "second") == a_url
    assert b.load("c1", 2, 0) == "first"
    assert sorted(os.listdir(tmp_path / "checkpoints" / "c1")) == sorted(
        ["p002-w00000.manifest.json", os.path.basename(a_url)]
    )


def test_a_save_writes_its_data_file_and_its_manifest_and_reads_nothing(tmp_path, monkeypatch):
    """It read the manifest first, a request per save that missed whenever a journal
    saved (it saves only the steps it did not find): on S3, a third of a save's requests."""
    store, done = CheckpointStore(tmp_path), []
    for name in ("cat", "cat_many", "exists", "list_files", "put_bytes", "remove"):
        real = getattr(Location, name)

        def watched(self, url, *args, _real=real, _name=name, **kwargs):  # type: ignore[no-untyped-def]
            done.append((_name, url.rsplit(".", 2)[-2:] if isinstance(url, str) else url))
            return _real(self, url, *args, **kwargs)

        monkeypatch.setattr(Location, name, watched)
    store.save("c1", 1, 0, {"wave": 0})
    assert [(name, kind[-1]) for name, kind in done] == [("put_bytes", "pkl"), ("put_bytes", "json")]


# --- races ------------------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hundred_racing_writers_on_a_local_folder_never_corrupt_the_store(tmp_path):
    got = race(str(tmp_path), attempts=100)
    assert got["holders_max"] == 1 and got["won"] >= 100 and got["won"] + got["refused"] == 300
    assert got["manifests"] == 100 * 2 * 2 and got["mismatched"] == 0 and got["leftovers"] == 0
    assert all("lease held by" in m for m in got["refusals"])


def test_racing_writers_on_s3_never_corrupt_the_store(s3_bucket):
    """20 attempts here (~0.3 s each on moto); benchmarks/writer_race.py runs 100."""
    got = race(s3_bucket, attempts=20, writers=2)
    assert got["holders_max"] == 1 and got["won"] >= 20 and got["won"] + got["refused"] == 40
    assert got["manifests"] == 20 * 2 * 2 and got["mismatched"] == 0 and got["leftovers"] == 0


_RACER = """
import os, sys, time
from pathlib import Path
from typing import Any
from storage import CheckpointStore, LeaseHeld, collection_lease
root, go = Path(sys.argv[1]), float(sys.argv[2])
while time.time() < go:
    time.sleep(0.001)
def attempted():
    (root / f"attempt-{os.getpid()}").touch()
try:
    with collection_lease(root / "store", "c1"):
        attempted()
        for w in range(3):
            CheckpointStore(root / "store").save("c1", 1, w, {"pid": os.getpid(), "w": w})
        t_end = time.time() + 60  # hold until the other process has tried
        while len(list(root.glob("attempt-*"))) < 2 and time.time() < t_end:
            time.sleep(0.01)
    print("wrote", flush=True)
except LeaseHeld as e:
    attempted()
    print("refused:", e, flush=True)
"""


@pytest.mark.integration  # starts processes
def test_two_processes_started_together_one_writes_the_other_is_refused(tmp_path):
    import time

    go = time.time() + 2.0  # start together (best effort; the winner waits for the other's try)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(tmp_path), str(go)],
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outs = [p.communicate(timeout=90) for p in procs]
    lines = sorted(o.strip() for o, _ in outs)
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    assert lines[0].startswith("refused:") and "lease held by" in lines[0] and lines[1] == "wrote", lines
    store = CheckpointStore(tmp_path / "store")
    writers = {store.load("c1", 1, w)["pid"] for w in range(3)}
    assert len(writers) == 1 and not (tmp_path / "store" / "leases" / "c1.json").exists()


def test_one_renewal_cannot_outlast_the_lease(tmp_path):
    """A renewal's retries against an endpoint that never connects (each attempt waits the
    S3 connect timeout) or never answers (the read timeout) end well before the lease expires, so the renewer tries again at its
    next tick: the stores' patient default (8 attempts, about 14 s of backoff) would take
    about 54 s against the 30 s a lease holds."""
    from storage.urls import Location

    lease = Lease("s3://any-bucket/runs", "c1")  # nothing is asked of the store here
    connect_s = Location.S3_DEFAULTS["config_kwargs"]["connect_timeout"]
    # an endpoint that takes connections and never answers: each attempt waits the read
    # timeout instead (s3fs's 15 s made 3 attempts 45 s)
    read_s = lease.loc.fs.config_kwargs.get("read_timeout", type(lease.loc.fs).read_timeout)
    worst = lease.retry.attempts * max(connect_s, read_s) + lease.retry.total_wait_s()
    # renewed ttl/3 after the last renewal, it must end within the 2/3 of the ttl left
    assert worst < lease.ttl_s * 2 / 3, worst


# --- clocks that disagree between hosts --------------------------------------------------


class Hosts:
    """True time for an owner on host ``node-7`` and a taker here whose clock is off by
    ``skew`` s; the taker's waits advance time (no real sleeping) and let the owner, if it
    is alive, renew every ttl/3 as its renewer thread would."""

    def __init__(self, root: str, skew: float, *, alive: bool, ttl_s: float = 30.0) -> None:
        self.t, self.mono, self.skew, self.alive, self.ttl_s = 1_000_000.0, 0.0, skew, alive, ttl_s
        self.owner = Lease(root, "c1", ttl_s=ttl_s, clock=lambda: self.t)
        self.owner.host, self.owner.owner = "node-7", f"node-7:{self.owner.pid}:{self.owner.token[:8]}"
        self.owner.acquire()
        self.since_renewal = 0.0
        self.taker = Lease(
            root, "c1", ttl_s=ttl_s, clock=lambda: self.t + self.skew, monotonic=lambda: self.mono, sleep=self.sleep
        )

    def sleep(self, dt: float) -> None:
        self.t, self.mono, self.since_renewal = self.t + dt, self.mono + dt, self.since_renewal + dt
        if self.alive and self.since_renewal >= self.ttl_s / 3:
            self.owner.renew()
            self.since_renewal = 0.0


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.integration)])  # s3: moto on loopback
def lease_root(request, tmp_path) -> str:
    return str(tmp_path) if request.param == "local" else request.getfixturevalue("s3_bucket") + "/runs"


def _lease_owner(root: str) -> str:
    cur = Lease(root, "c1")._slot.read()  # nothing else is asked of this Lease
    assert cur is not None
    rec = LeaseRecord.from_json(cur[0])
    assert rec is not None
    return rec.owner


@pytest.mark.parametrize("skew", [45.0, 600.0])
def test_a_taker_whose_clock_runs_ahead_does_not_take_a_live_lease(lease_root, skew, caplog):
    hosts = Hosts(lease_root, skew, alive=True)
    hosts.sleep(5.0)  # the owner has run a while; by the taker's clock its lease expired
    with caplog.at_level("WARNING", logger="storage.lease"), pytest.raises(LeaseHeld) as err:
        hosts.taker.acquire()
    msg = str(err.value)
    assert "\n" not in msg and hosts.owner.owner in msg and "renewed while this run waited" in msg, msg
    # the owner renewed just before the taker's second read: the estimate is the skew itself
    assert f"about {skew:.0f} s ahead of host node-7" in msg, msg
    assert "waiting up to 30 s to be sure it is abandoned" in caplog.text and "node-7" in caplog.text
    assert hosts.mono <= 10.0  # it gave up at the first renewal it saw, not after the window
    assert _lease_owner(lease_root) == hosts.owner.owner and not hosts.taker.held
    hosts.owner.check()
    hosts.owner.renew()  # still the owner's
    hosts.owner.release()


@pytest.mark.parametrize("expired_s", [1.0, 900.0])
def test_an_abandoned_lease_of_another_host_is_taken_after_a_ttl_without_renewal(lease_root, expired_s, caplog):
    hosts = Hosts(lease_root, 0.0, alive=False)
    hosts.t += 30.0 + expired_s  # the owner died without releasing; clocks agree
    with caplog.at_level("WARNING", logger="storage.lease"):
        hosts.taker.acquire()
    assert _lease_owner(lease_root) == hosts.taker.owner and hosts.taker.held
    assert hosts.mono == pytest.approx(30.0)  # watched for exactly one ttl of its own clock
    assert "waiting up to 30 s" in caplog.text and "and was not renewed for 30 s" in caplog.text
    with pytest.raises(LeaseLost):
        hosts.owner.check()  # the dead owner's own fence had long passed
    hosts.taker.release()


def test_a_lease_expired_past_the_skew_margin_is_taken_at_once(lease_root, caplog):
    from storage.lease import SKEW_MARGIN_S

    hosts = Hosts(lease_root, 0.0, alive=False)
    hosts.t += 30.0 + SKEW_MARGIN_S + 1
    with caplog.at_level("WARNING", logger="storage.lease"):
        hosts.taker.acquire()
    assert _lease_owner(lease_root) == hosts.taker.owner and hosts.mono == 0.0
    assert "waiting" not in caplog.text and "took over the write lease (it expired at" in caplog.text
    hosts.taker.release()


def test_a_coroutine_waiting_for_another_hosts_lease_is_cancelled_at_once(tmp_path, monkeypatch):
    """held_lease takes the lease off the event loop: while it watches another host's
    lease (up to its ttl_s), the loop runs, and a cancellation (a command's Ctrl-C) ends
    the wait at once with the other host's lease untouched. collection_lease blocked the
    loop for the whole wait. "At once" is read from the lease's own waits (the abort
    ended the one under way), not wall time: a loaded machine is slow."""
    import asyncio

    from storage import checkpoints, held_lease

    waits: list[tuple[float, bool]] = []  # (seconds asked, whether the abort ended the wait)

    class Watched(checkpoints.Lease):
        def __init__(self, *args: Any, **kw: Any) -> None:
            super().__init__(*args, **kw)
            sleep = self.sleep

            def recorded(seconds: float) -> object:
                woke = sleep(seconds)  # the abort's event: True when abort() ended the wait
                waits.append((seconds, bool(woke)))
                return woke

            self.sleep = recorded

    monkeypatch.setattr(checkpoints, "Lease", Watched)

    now = time.time()
    theirs = {
        "format": "focus-lease",
        "collection_id": "c1",
        "owner": "node-7:42:abcd1234",
        "host": "node-7",
        "pid": 42,
        "pid_start": None,
        "token": "abcd1234",
        "acquired_at": now - 60,
        "expires_at": now - 5,
        "ttl_s": 30.0,
    }  # fmt: skip: expired 5 s ago by this machine's clock
    (tmp_path / "leases").mkdir()
    (tmp_path / "leases" / "c1.json").write_text(json.dumps(theirs), encoding="utf-8")

    async def main() -> None:
        waiting = asyncio.ensure_future(held_lease(tmp_path, "c1").__aenter__())
        ticks = 0
        while ticks < 5:  # the loop runs while the lease is watched
            await asyncio.sleep(0.05)
            ticks += 1
        assert not waiting.done()
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting

    asyncio.run(main())
    # the watch sleeps in steps of ttl_s / 6 (5 s); the abort ended the step under way,
    # where without it the wait ran on for the whole 30 s and then took the lease
    assert waits and waits[-1][1] and not any(woke for _, woke in waits[:-1]), waits
    assert lease_doc(tmp_path, "c1") == theirs


def test_held_lease_holds_the_lease_for_the_block_and_releases_it(tmp_path):
    import asyncio

    from storage import held_lease

    async def main() -> None:
        async with held_lease(tmp_path, "c1") as lease:
            assert lease.held and lease_doc(tmp_path, "c1")["owner"] == lease.owner
            with pytest.raises(LeaseHeld):
                Lease(tmp_path, "c1").acquire()

    asyncio.run(main())
    assert not (tmp_path / "leases" / "c1.json").exists()


def test_a_batch_is_not_published_once_the_store_was_removed_under_the_run(lease_root):
    """A run shorter than the renewer's 10 s whose store was removed under it (``rm -rf
    runs`` while it ran) recreated the folders as it saved, wrote its batch into a store
    without its first steps and records and ended with exit 0; its rerun stopped on the
    missing configuration record. The lease object is read before a batch is published:
    gone, the batch is not written and the run stops, naming the likely cause."""
    from test_storage import batch_from_trees, grow_tree

    from storage import BatchStore

    batch = batch_from_trees([grow_tree()], collection_id="c1")
    lease = Lease(lease_root, "c1").acquire()
    try:
        store = BatchStore(lease_root)
        url = store.write(batch)  # the lease there: published
        loc = Location(lease_root)
        loc.remove_folder(loc.url("leases"), Retry(attempts=1))  # rm -rf of the store takes its leases
        with pytest.raises(LeaseLost) as lost:
            store.write(batch_from_trees([grow_tree()], collection_id="c1", iteration=1))
        assert "the lease object is gone: were the store or its leases folder removed while this run wrote it?" in (
            str(lost.value)
        )
        assert "the batch is not written" in str(lost.value) and "\n" not in str(lost.value)
        assert store.list("c1") == [url]  # iteration 1 never appeared
        with pytest.raises(LeaseLost):  # and nothing more is written
            CheckpointStore(lease_root).save("c1", 1, 0, "must not be written")
    finally:
        lease.release()


def _take_over(root: str) -> None:
    """Another run (host ``elsewhere``) takes the lease over, as after an expiry."""
    slot = Lease(root, "c1")._slot  # nothing else is asked of this Lease
    cur = slot.read()
    assert cur is not None
    doc = json.loads(cur[0])
    doc.update(owner="elsewhere:1:abcd", host="elsewhere", token="x" * 32)
    assert slot.swap(json.dumps(doc).encode(), cur[1])


@pytest.mark.parametrize("when", ["before the write", "during the write"])
def test_a_batch_write_that_lost_its_lease_leaves_no_staging_and_keeps_the_holders(lease_root, when, monkeypatch):
    """``LeaseLost`` while publishing a batch left the whole ``_staging/<id>/iter-<n>``
    folder behind, and the write shared that folder with the run that took the lease
    over: the loser's files mixed with the holder's, and a loser beginning its write
    removed the holder's staged files as leftovers. Each write now stages in a folder of
    its own, removes it when it fails, and removes other writes' leftovers only while it
    still holds the lease."""
    from test_storage import batch_from_trees, grow_tree

    from storage import BatchStore

    batch = batch_from_trees([grow_tree()], collection_id="c1")
    store = BatchStore(lease_root)
    loc, quick = store.loc, Retry(attempts=1)
    holders = f"{store.staging_for('c1', 0)}/w-holder/actor/part-00000.parquet"  # the new holder's write
    lease = Lease(lease_root, "c1").acquire()
    try:
        if when == "before the write":
            _take_over(lease_root)
            loc.put_bytes(holders, b"the holder's staged file", quick)
        else:
            real_put, once = Location.put_bytes, threading.Lock()  # S3's files are written on threads

            def put(self, url, data, retry, **kw):  # the take-over lands while this run stages its files
                if "/_staging/" in url and url != holders and once.acquire(blocking=False):
                    _take_over(lease_root)
                    real_put(self, holders, b"the holder's staged file", quick)
                return real_put(self, url, data, retry, **kw)

            monkeypatch.setattr(Location, "put_bytes", put)
        with pytest.raises(LeaseLost, match="elsewhere:1:abcd"):
            store.write(batch)
        monkeypatch.undo()
        assert loc.list_files(loc.url("_staging"), quick) == [holders]  # the holder's, and only the holder's
        assert loc.cat(holders, quick) == b"the holder's staged file"
        assert store.list("c1") == []
    finally:
        lease.release()


def test_a_weights_save_cut_short_leaves_no_temporary_file_once_the_loop_takes_its_lease(tmp_path):
    """A `focus train` interrupted while its trainer wrote a version's weights (the
    trainer runs in a daemon thread, which the command does not wait for) left
    `weights/<loop>/v000001/optimizer.pt.tmp-<pid>-<hex>` in the store for good: the
    rerun wrote the version again beside it (probed: SIGINT once the trainer's save
    began). Taking the loop's lease removes it, as it removes a collection's."""
    from storage.weights import WeightStore

    weights = WeightStore(tmp_path)
    folder = weights.put(weights.folder("L", 1), {"policy.pt": b"weights"})
    version = Path(folder.removeprefix("file://"))
    (version / f"optimizer.pt{TEMP_MARK}19722-141e799fc1b3").write_bytes(b"half an optimizer")
    other = tmp_path / "weights" / "L2" / "v000001"  # another loop's: its own lease sweeps it
    other.mkdir(parents=True)
    (other / f"policy.pt{TEMP_MARK}1-a").write_bytes(b"half")
    with collection_lease(tmp_path, "L"):
        pass
    assert sorted(os.listdir(version)) == ["_manifest.json", "policy.pt"]
    assert weights.read(f"{folder}/policy.pt") == b"weights"
    assert os.listdir(other) == [f"policy.pt{TEMP_MARK}1-a"]


class SameHost(Hosts):
    """Owner and taker are processes of this host (the owner: this live process), and the
    taker's wall clock reads ``skew`` s ahead of the time the owner last renewed by: the
    clock was stepped forward (NTP correcting a clock that ran behind, a VM resumed)
    between the owner's renewal and the taker's start."""

    def __init__(self, root: str, skew: float, *, alive: bool, ttl_s: float = 30.0) -> None:
        self.t, self.mono, self.skew, self.alive, self.ttl_s = 1_000_000.0, 0.0, skew, alive, ttl_s
        self.owner = Lease(root, "c1", ttl_s=ttl_s, clock=lambda: self.t).acquire()
        self.since_renewal = 0.0
        self.taker = Lease(
            root, "c1", ttl_s=ttl_s, clock=lambda: self.t + self.skew, monotonic=lambda: self.mono, sleep=self.sleep
        )


def test_a_live_run_on_this_host_keeps_its_lease_when_the_clock_jumps_forward(lease_root, caplog):
    """A second run of the collection on the same host, started while the wall clock read
    120 s past the owner's last renewal, took the lease of the live owner at once (the
    owner's process was alive; its lease looked expired): both wrote until the owner's next
    renewal, when the owner, a healthy run, stopped with `LeaseLost` (probed: two `focus
    collect` of one collection, the second with its clock 120 s ahead). A live owner on
    this host is watched as another host's is, and keeps its lease by renewing it."""
    hosts = SameHost(lease_root, 120.0, alive=True)
    hosts.sleep(5.0)
    with caplog.at_level("WARNING", logger="storage.lease"), pytest.raises(LeaseHeld) as err:
        hosts.taker.acquire()
    msg = str(err.value)
    assert "\n" not in msg and hosts.owner.owner in msg and "renewed while this run waited" in msg, msg
    assert "a live process on this host" in msg and "clock was stepped forward" in msg, msg
    assert "is a live process on this host" in caplog.text and "waiting up to 30 s" in caplog.text
    assert hosts.mono <= 10.0  # it gave up at the first renewal it saw
    assert _lease_owner(lease_root) == hosts.owner.owner and not hosts.taker.held
    hosts.owner.check()
    hosts.owner.renew()  # still the owner's
    hosts.owner.release()


def test_a_live_run_on_this_host_that_stopped_renewing_loses_its_lease_after_a_ttl(lease_root, caplog):
    """A live owner that does not renew (suspended with Ctrl-Z, its store unreachable) is
    taken over once its lease stayed unchanged for a ttl on the taker's monotonic clock."""
    hosts = SameHost(lease_root, 0.0, alive=False)
    hosts.t += 31.0
    with caplog.at_level("WARNING", logger="storage.lease"):
        hosts.taker.acquire()
    assert _lease_owner(lease_root) == hosts.taker.owner and hosts.taker.held
    assert hosts.mono == pytest.approx(30.0) and "and was not renewed for 30 s" in caplog.text
    with pytest.raises(LeaseLost):
        hosts.owner.check()
    hosts.taker.release()


def test_a_batch_write_that_fails_removes_its_staging_unless_the_store_is_unreachable(tmp_path, monkeypatch):
    """A full disk: the write's own staged files are removed (they take the space the
    rerun needs). An unreachable store: no removal is tried, which would wait out its
    timeouts again before the line; the next write removes them."""
    from test_storage import batch_from_trees, grow_tree

    from storage import BatchStore
    from storage.errors import StorageFull, StorageUnavailable

    store, real_put = BatchStore(tmp_path, rows_per_file=2), Location.put_bytes
    for error in (StorageFull("write x: no space left"), StorageUnavailable("write x: storage unreachable")):
        seen = []

        def put(self, url, data, retry, error=error, seen=seen, **kw):
            if url.endswith(".parquet") and seen:
                raise error
            seen.append(url)
            return real_put(self, url, data, retry, **kw)

        monkeypatch.setattr(Location, "put_bytes", put)
        with pytest.raises(type(error)):
            store.write(batch_from_trees([grow_tree()], collection_id="c1"))
        monkeypatch.undo()
        left = store.loc.list_files(store.loc.url("_staging"), store.retry)
        if isinstance(error, StorageFull):
            assert left == [], left
        else:
            assert seen[0] in left and all("/_staging/c1/iter-000000/w-" in u for u in left), left
    store.write(batch_from_trees([grow_tree()], collection_id="c1"))  # the next write starts from nothing
    assert store.loc.list_files(store.loc.url("_staging"), store.retry) == []


def test_a_clock_stepped_forward_under_a_running_owner_is_named_as_such(tmp_path, caplog):
    """The wall clock stepped 120 s forward while the run wrote (NTP correcting a clock
    that ran behind): its next save found the lease past its recorded expiry, renewed it
    (nobody had taken it) and said `the write lease ran out (no renewal for 3 s: was this
    process suspended, or the store unreachable?)` on the console: neither had happened.
    It names the clock."""
    clock, mono = Clock(), Clock(0.0)
    lease = Lease(tmp_path, "c1", ttl_s=30, clock=clock, monotonic=mono).acquire()
    store = CheckpointStore(tmp_path)
    clock.t += 120.0
    mono.t += 3.0  # 3 s really passed
    with caplog.at_level("WARNING", logger="storage.lease"):
        store.save("c1", 1, 0, "after the step")
    assert store.load("c1", 1, 0) == "after the step" and lease.held
    assert "the wall clock reads 90 s past the lease's expiry 3 s after its renewal" in caplog.text, caplog.text
    assert "stepped forward" in caplog.text and "suspended" not in caplog.text
    lease.release()
