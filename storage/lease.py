"""One writer per collection: a lease object in the store, renewed while its run lives.

Two runs writing one collection (same id, same store) would interleave their waves: a
resume would replay checkpoints from both and, before checkpoints were written by
content, one run's data could sit under the other's manifest. So a run takes the
collection's lease before it writes anything and holds it until it ends::

    <root>/leases/<collection_id>.json   {"owner", "host", "pid", "expires_at", ...}

- **Taking it** is an atomic create of that object, which exactly one of any number of
  racing runs wins: on a local disk a hard link of a fully written temporary file (fails
  if the name exists, like ``O_CREAT|O_EXCL``), on S3 a conditional PUT
  (``If-None-Match: *``). A run that finds the lease held by someone else fails at once
  with :class:`LeaseHeld`, one line naming the owner and the expiry.
- **Keeping it**: a background thread renews the expiry every ``ttl_s / 3`` seconds.
  Renewal (and release) are compare-and-swap: on S3 a PUT with ``If-Match: <etag>``, on
  a local disk a replace under an exclusive ``flock`` of the leases folder. A renewal
  that finds another owner marks the lease lost; the stores then refuse to write
  (:func:`check_writer`, called before every checkpoint and batch manifest).
- **Taking over** happens at once when the owner is a process on this host that no
  longer exists (a run killed with ``kill -9`` and resumed here), or after expiry. The
  expiry is the owner's clock plus ``ttl_s``, so a taker trusts it alone only when the
  owner ran on this host (one clock) or it is past by more than :data:`SKEW_MARGIN_S`.
  Otherwise the taker's clock may simply run ahead of the owner's (a minute between a
  laptop and a cluster node is common): it says so in one line and watches the lease
  for ``ttl_s`` on its own monotonic clock. A live owner renews every ``ttl_s / 3``,
  which changes the object's version: the taker then stops with :class:`LeaseHeld`
  (naming the clock difference). Unchanged for ``ttl_s``, the owner has stopped writing
  (its own :meth:`Lease.check` fences it ``ttl_s`` after its last renewal, on its own
  monotonic clock, so a wall clock set back cannot keep it writing), and the taker
  takes over. The take-over is the same compare-and-swap, so two runs racing for
  a dead lease cannot both win.

Other fsspec stores (``memory://``, GCS, Azure ...) get a check-then-write: atomic within
one process, not between processes (see ``Location.put_bytes(exclusive=True)``).

The pipeline holds the lease for the whole flow run through :func:`storage.checkpoints.collection_lease`,
which also removes what interrupted writes left behind (``CheckpointStore.sweep``):
with the lease held nobody else is writing, so anything half-written is a leftover.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from storage.errors import LeaseAborted, LeaseHeld, LeaseLost
from storage.lease_object import FORMAT, LeaseRecord
from storage.lease_object import owner_gone as _owner_gone
from storage.lease_object import pid_state as _pid_state
from storage.lease_object import quick_reads as _quick_reads
from storage.lease_object import slot_for as _slot
from storage.urls import Location, Retry, check_id

__all__ = ["DEFAULT_TTL_S", "FORMAT", "LEASES", "SKEW_MARGIN_S", "Lease", "LeaseRecord", "check_writer"]

log = logging.getLogger(__name__)
#: Marks a log record for the command's quiet console (flows/logs.py).
_CONSOLE = {"focus_console": True}

LEASES = "leases"
#: What to do once a lease is lost: the steps saved under it are kept.
_AGAIN = "rerun with the same collection id to resume from its last saved step once no other run writes it"
#: Default time a lease stays valid without renewal.
DEFAULT_TTL_S = 30.0
#: A lease of another host whose expiry is past by more than this on the taker's clock
#: is taken over at once; a younger one is watched for ``ttl_s`` first (see the module
#: docstring). An hour: clocks without NTP, or a VM resumed from suspend, can be minutes
#: apart, and the wait it saves is only ``ttl_s``.
SKEW_MARGIN_S = 3600.0


# --- the lease -----------------------------------------------------------------------------

#: Leases held by this process, by (store root, collection id): the stores' fence.
_HELD: dict[tuple[str, str], Lease] = {}
_HELD_LOCK = threading.Lock()


def check_writer(root: str, collection_id: str, *, confirm: bool = False) -> None:
    """Raise :class:`LeaseLost` if this process holds the collection's lease and lost it.

    Called by the stores before a manifest goes out; costs a dict look-up (the renewer
    thread keeps the lease's state). Writers that hold no lease are not fenced. With
    ``confirm`` (before a batch's manifest, once a collection) the lease object is read
    too (:meth:`Lease.confirm`).
    """
    lease = _HELD.get((root, collection_id))
    if lease is not None:
        lease.check()
        if confirm:
            lease.confirm()


class Lease:
    """The write lease of one collection in one store (see the module docstring): ``acquire``
    and ``release`` by hand, or a context manager, which also runs the background renewer.
    ``clock``, ``monotonic`` and ``sleep`` are for tests (``sleep``: a wait :meth:`abort` ends)."""

    def __init__(
        self,
        root: str | os.PathLike[str],
        collection_id: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        storage_options: dict[str, Any] | None = None,
        retry: Retry | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], object] | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError(f"ttl_s must be positive, got {ttl_s}")
        self.collection_id = check_id(collection_id, "collection id")
        self.loc = Location(root, _quick_reads(root, storage_options))
        # quick, unlike the steps' patient default: the renewer tries again every ttl/3,
        # and one renewal must not outlast the lease (8 attempts behind 5 s connect
        # timeouts could take about 54 s against the 30 s it holds)
        self.retry = retry or Retry(attempts=3, backoff_s=0.2, max_backoff_s=2.0)
        self.patient = retry or Retry()  # taking the lease has no such bound: see acquire()
        self.ttl_s = float(ttl_s)
        self._aborted = threading.Event()  # abort(): an acquire waiting on another host's lease gives up
        # the wait for an abandoned lease sleeps on the abort, so a Ctrl-C ends it at once
        self.clock, self.monotonic = clock, monotonic
        self.sleep: Callable[[float], object] = sleep if sleep is not None else self._aborted.wait
        self.url = self.loc.url(LEASES, f"{collection_id}.json")
        self.token = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.owner = f"{self.host}:{self.pid}:{self.token[:8]}"
        self._slot = _slot(self.loc, self.url, self.retry)
        self._version: str | None = None  # of the object as this lease last wrote it
        self._expires_at = 0.0
        self._fence_at = 0.0  # this host's monotonic clock: ttl_s after the last write began
        self._lost: str | None = None
        self._stop = threading.Event()
        self._renewed = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # renewals from the thread vs. release

    def __repr__(self) -> str:
        return f"Lease({self.url!r}, owner={self.owner!r}, held={self.held})"

    @property
    def root(self) -> str:
        return self.loc.root

    @property
    def held(self) -> bool:
        return self._version is not None and self._lost is None

    def _record(self, acquired_at: float | None = None) -> LeaseRecord:
        now = self.clock()
        state = _pid_state(self.pid)
        return LeaseRecord(
            collection_id=self.collection_id,
            owner=self.owner,
            host=self.host,
            pid=self.pid,
            pid_start=state[1] if state and state[1] else None,
            token=self.token,
            acquired_at=now if acquired_at is None else acquired_at,
            expires_at=now + self.ttl_s,
            ttl_s=self.ttl_s,
        )

    def acquire(self) -> Lease:
        """Take the lease, or raise :class:`LeaseHeld` naming its owner and expiry. Its
        requests are retried as a step's save is (``patient``): with the renewals' quick
        retries a store that throttled for a second (503 SlowDown) as a run began stopped it."""
        self._slot.retry = self.patient
        try:
            return self._acquire()
        finally:
            self._slot.retry = self.retry

    def _acquire(self) -> Lease:
        for _ in range(5):  # only a lease released or taken over mid-way makes this loop
            rec = self._record()
            data = rec.to_json()
            started = self.monotonic()
            if self._slot.create(data):
                return self._took(rec, data, None, started)
            cur = self._slot.read()
            if cur is None:
                continue  # released in between: try to create again
            other = LeaseRecord.from_json(cur[0])
            now = self.clock()
            if other is not None and other.token != self.token:
                gone = _owner_gone(other)
                if other.expires_at > now and not gone:
                    raise LeaseHeld(
                        f"collection {self.collection_id!r} in {self.root} is being written by another run: "
                        f"lease held by {other.owner} (host {other.host}, pid {other.pid}) until "
                        f"{other.until(now)}; wait for that run to end, or for the lease to expire"
                    )
                why = f"its owner {other.owner} has exited" if gone else f"it expired at {other.until(now)}"
                # a live owner on this host looked expired only if its clock was stepped
                # forward or it did not run (suspended): watched too, whatever the margin
                here = other.host == self.host
                if not gone and (here or now - other.expires_at <= SKEW_MARGIN_S):
                    if not self._unchanged(other, cur[1], now):
                        continue  # released or taken by another run meanwhile: look again
                    why = f"it expired at {other.until(self.clock())} and was not renewed for {other.ttl_s:.0f} s"
            else:
                why = "it was unreadable" if other is None else "it was this lease's own"
            started = self.monotonic()
            if self._slot.swap(data, cur[1]):
                return self._took(rec, data, why, started)
        raise LeaseHeld(
            f"collection {self.collection_id!r} in {self.root}: the lease changed hands five times while "
            "this run tried to take it; another run is starting the same collection"
        )

    def _unchanged(self, other: LeaseRecord, version: str, now: float) -> bool:
        """Whether the lease stays at ``version`` for the owner's ``ttl_s`` on this host's
        monotonic clock (then it is abandoned); ``False`` if it is released or changes hands
        meanwhile. :class:`LeaseHeld` if its owner renews it: it only looked expired because
        this host's clock runs ahead of the owner's (another host), or was stepped forward
        since the owner's renewal (this host)."""
        window = max(other.ttl_s, self.ttl_s)
        here = other.host == self.host
        why = (
            f"its owner {other.owner} is a live process on this host (was the clock stepped forward, or the owner "
            "suspended?)"
            if here
            else f"the clocks of two machines may disagree: it was last renewed by host {other.host} ({other.owner})"
        )
        log.warning(
            "collection %s: the lease expired at %s by this machine's clock, but %s; waiting up to %.0f s to be "
            "sure it is abandoned",
            self.collection_id, other.until(now), why, window,
            extra=_CONSOLE,  # the run is silent meanwhile: say why on the console, not in the log file alone
        )  # fmt: skip
        start = self.monotonic()
        while (left := window - (self.monotonic() - start)) > 0:
            self.sleep(min(left, window / 6))
            if self._aborted.is_set():
                raise LeaseAborted(f"collection {self.collection_id!r}: stopped waiting for the lease of {other.owner}")
            cur = self._slot.read()
            if cur is None:
                return False  # released: create it
            if cur[1] == version:
                continue
            rec = LeaseRecord.from_json(cur[0])
            if rec is None or rec.token != other.token:
                return False
            ahead = self.clock() - (rec.expires_at - rec.ttl_s)
            cause = (
                "it is a live process on this host, and this host's clock was stepped forward since it last renewed "
                "the lease (NTP, a VM resumed); wait for that run to end"
                if here
                else f"this machine's clock is about {ahead:.0f} s ahead of host {rec.host}'s; "
                "wait for that run to end (and set both clocks right, e.g. with NTP)"
            )
            raise LeaseHeld(
                f"collection {self.collection_id!r} in {self.root} is being written by another run: lease held by "
                f"{rec.owner} (host {rec.host}, pid {rec.pid}), renewed while this run waited although it looked "
                f"expired: {cause}"
            )
        return True

    def _took(self, rec: LeaseRecord, data: bytes, takeover: str | None, started: float) -> Lease:
        # read back: the create or swap was ours only if the object now holds our token
        cur = self._slot.read()
        got = LeaseRecord.from_json(cur[0]) if cur is not None else None
        if cur is None or got is None or got.token != self.token:
            owner = got.owner if got is not None else "nobody"
            raise LeaseHeld(
                f"collection {self.collection_id!r} in {self.root}: another run took the lease at the same "
                f"moment (now held by {owner}); this store's writes may not be atomic"
            )
        self._version, self._expires_at, self._lost = cur[1], rec.expires_at, None
        self._fence_at = started + self.ttl_s
        if takeover:
            log.warning("collection %s: took over the write lease (%s)", self.collection_id, takeover)
        with _HELD_LOCK:
            _HELD[(self.root, self.collection_id)] = self
        return self

    def abort(self) -> None:
        """End a wait of :meth:`acquire` for another host's lease at once, from another
        thread (the run was interrupted): it raises :class:`LeaseAborted`, the lease not taken."""
        self._aborted.set()

    def renew(self) -> None:
        """Push the expiry ``ttl_s`` ahead; :class:`LeaseLost` if another run owns it now."""
        with self._lock:
            if self._version is None:
                raise LeaseLost(f"collection {self.collection_id!r}: the lease is not held")
            rec = self._record()
            data = rec.to_json()
            started = self.monotonic()
            # the version this swap wrote: reading it back cost two requests more on S3
            # each renewal, and took a version another run wrote meanwhile for this one's
            version = self._slot.swap(data, self._version)
            if version is None:
                cur = self._slot.read()
                other = LeaseRecord.from_json(cur[0]) if cur is not None else None
                who = f"now held by {other.owner}" if other is not None else "the lease object is gone"
                self._lost = (
                    f"collection {self.collection_id!r} in {self.root}: this run's write lease was lost ({who})"
                )
                raise LeaseLost(self._lost)
            self._version, self._expires_at, self._fence_at = version, rec.expires_at, started + self.ttl_s
        self._renewed.set()

    def wait_renewed(self, timeout_s: float) -> bool:
        """Wait until the next successful renewal (for tests and diagnostics)."""
        self._renewed.clear()
        return self._renewed.wait(timeout_s)

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the lease was lost or ran out without renewal.

        Out means ``ttl_s`` since the last successful write began on this host's monotonic
        clock (what a taker on another host waits, on its own), or the recorded expiry
        past on the wall clock (what a taker on this host trusts): whichever comes first.
        The wall clock alone let a clock set back (NTP stepping it, a VM restored) keep
        a run writing after a taker elsewhere had rightly taken the lease over.
        """
        if self._lost is not None:
            raise LeaseLost(self._lost + f"; stopping before writing more ({_AGAIN})")
        if self._version is not None and (self.clock() > self._expires_at or self.monotonic() > self._fence_at):
            if self._renewed_late():
                return
            raise LeaseLost(
                f"collection {self.collection_id!r} in {self.root}: this run's write lease expired at "
                f"{datetime.fromtimestamp(self._expires_at, UTC).isoformat(timespec='seconds')} without a renewal "
                f"for {self.ttl_s:.0f} s (was the store unreachable?); stopping before writing more ({_AGAIN})"
            )

    def confirm(self) -> None:
        """:class:`LeaseLost` unless the lease object is still the one this run last wrote:
        the renewer reads it every 10 s, and a shorter run whose store was removed under it
        published its batch into what was left and ended with exit 0 (one read a batch)."""
        with self._lock:
            if self._version is None or self._lost is not None:
                return  # not held, or lost: check() says so
            slot = _slot(self.loc, self.url, self.patient)  # a batch waits out a throttle, as its files do
            if slot.version() == self._version:  # on S3 a HEAD: the body only names another owner
                return
            cur = slot.read()
            other = LeaseRecord.from_json(cur[0]) if cur is not None else None
            if other is not None:
                who = f"now held by {other.owner}"
            else:
                who = "the lease object is gone: were the store or its leases folder removed while this run wrote it?"
            self._lost = f"collection {self.collection_id!r} in {self.root}: this run's write lease was lost ({who})"
        raise LeaseLost(
            f"{self._lost}; the batch is not written ({_AGAIN}; if the store was removed, start over at a new "
            "storage root or under a new collection id)"
        )

    def _renewed_late(self) -> bool:
        """Whether a lease past its time, that no other run took meanwhile, is renewed now.

        A process that did not run for longer than ``ttl_s`` - suspended with Ctrl-Z and
        brought back with ``fg``, a laptop asleep, a paused VM, a debugger - found its
        lease out at its next save and stopped with :class:`LeaseLost`, though nobody had
        taken the lease. The renewal is the same compare-and-swap as every renewal: it
        succeeds only if the lease object is still the version this run last wrote, so a
        run that took the lease over meanwhile keeps it (:class:`LeaseLost` here), and
        one that is watching it before a take-over sees it renewed and stops. ``False``
        when the store cannot be reached: the fence holds."""
        idle = self.monotonic() - (self._fence_at - self.ttl_s)
        past = self.clock() - self._expires_at
        try:
            self.renew()
        except LeaseLost:
            raise LeaseLost(f"{self._lost}; stopping before writing more ({_AGAIN})") from None
        except Exception:  # noqa: BLE001 - unreachable: the lease ran out, as check() says
            return False
        if idle < self.ttl_s:  # in time on the monotonic clock: only the wall clock moved
            log.warning(
                "collection %s: the wall clock reads %.0f s past the lease's expiry %.0f s after its renewal: it was "
                "stepped forward (NTP, a VM resumed); no other run had taken the lease, so it is renewed and the "
                "run goes on",
                self.collection_id, past, idle,
            )  # fmt: skip
            return True
        log.warning(
            "collection %s: the write lease ran out (no renewal for %.0f s: was this process suspended, or the "
            "store unreachable?); no other run had taken it, so it is renewed and the run goes on",
            self.collection_id, idle,
        )  # fmt: skip
        return True

    def release(self) -> None:
        """Give the lease up (if still ours); stops the renewer."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None
        with _HELD_LOCK:
            if _HELD.get((self.root, self.collection_id)) is self:
                del _HELD[(self.root, self.collection_id)]
        with self._lock:
            version, self._version = self._version, None
            if version is None or self._lost is not None:
                return
            try:
                if not self._slot.delete(version):
                    log.warning("collection %s: the write lease was no longer ours at release", self.collection_id)
            except Exception as e:  # noqa: BLE001 - it expires on its own
                # never raised: release runs as the run ends, often because the store failed,
                # and an error here replaced the run's own (an expired token's bare 'OSError:
                # [Errno 22] Bad Request' from this read instead of the step's line)
                log.warning("collection %s: could not release the write lease (%s)", self.collection_id, e)

    # --- the renewer ------------------------------------------------------------------------

    def start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name=f"focus-lease-{self.collection_id}", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 3):
            try:
                self.renew()
            except LeaseLost as e:
                log.error("%s", e)
                return
            except Exception as e:  # noqa: BLE001 - try again next tick; check() fences at expiry
                log.warning("collection %s: renewing the write lease failed: %s", self.collection_id, e)

    def __enter__(self) -> Lease:
        self.acquire()
        self.start_renewing()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
