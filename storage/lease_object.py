"""The lease object: what it holds (:class:`LeaseRecord`), whether its owner still
lives on this host, and the atomic operations on it per kind of store (create,
compare-and-swap, delete: a hard link and a ``flock`` on a local disk, conditional
PUTs on S3). Split from :mod:`storage.lease`, which decides when to take, renew, watch
or give the lease up, by role; that module re-exports :class:`LeaseRecord`.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from storage.manifest import sha256
from storage.urls import Location, Retry, retrying

FORMAT = "focus-lease"


@dataclass(frozen=True)
class LeaseRecord:
    """What the lease object holds: who writes the collection and until when."""

    collection_id: str
    owner: str  # "host:pid:token", unique per Lease object
    host: str
    pid: int
    #: Start time of the owner process (``/proc/<pid>/stat``), to tell a reused pid apart.
    pid_start: str | None
    token: str
    acquired_at: float
    expires_at: float  # Unix time
    ttl_s: float

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LeaseRecord | None:
        """The record, or ``None`` if ``data`` is not a lease (treated as stale)."""
        try:
            doc = json.loads(data.decode())
            if doc.pop("format", None) != FORMAT:
                return None
            return cls(**doc)
        except (UnicodeDecodeError, ValueError, TypeError):
            return None

    def until(self, now: float) -> str:
        at = datetime.fromtimestamp(self.expires_at, UTC).isoformat(timespec="seconds")
        left = self.expires_at - now
        return f"{at} ({left:.0f} s from now)" if left >= 0 else f"{at} ({-left:.0f} s ago)"


def pid_state(pid: int) -> tuple[str, str] | None:
    """(state letter, start time) of a live process on this host, ``None`` if there is none."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return fields[0], fields[19]  # state, starttime (fields 3 and 22 of stat)
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass
    return "?", ""


def owner_gone(rec: LeaseRecord) -> bool:
    """Whether the owner was a process on this host that has exited (or is a zombie)."""
    if rec.host != socket.gethostname():
        return False
    state = pid_state(rec.pid)
    if state is None or state[0] in ("Z", "X"):
        return True
    return rec.pid_start is not None and state[1] != "" and state[1] != rec.pid_start


# --- the lease object's atomic operations, per kind of store ------------------------------


class Slot:
    """The lease object at ``url`` and the atomic operations a lease needs: ``read`` gives
    the content and a version (``version`` the version alone); ``swap`` and ``delete`` act
    only if the object is still at that version (compare-and-swap). ``swap`` gives the
    version it wrote: a renewal read the object back for it, two requests more on S3
    every ``ttl_s / 3``."""

    def __init__(self, loc: Location, url: str, retry: Retry) -> None:
        self.loc, self.url, self.retry = loc, url, retry
        self.path = loc.path(url)

    def create(self, data: bytes) -> bool:
        return self.loc.put_bytes(self.url, data, self.retry, exclusive=True)

    def read(self) -> tuple[bytes, str] | None:
        try:
            data = self.loc.cat(self.url, self.retry)
        except FileNotFoundError:
            return None
        return data, sha256(data)

    def version(self) -> str | None:
        """The object's version (``None`` if there is none), as :meth:`read` gives it."""
        cur = self.read()
        return None if cur is None else cur[1]

    def swap(self, data: bytes, version: str) -> str | None:
        """Write ``data`` if the object is still at ``version``: the version written, or
        ``None`` if it is not (another writer's, or gone)."""
        with self._mutex():
            if self.version() != version:
                return None
            self.loc.put_bytes(self.url, data, self.retry, atomic=True)
            return sha256(data)

    def delete(self, version: str) -> bool:
        with self._mutex():
            if self.version() != version:
                return False
            self.loc.remove(self.url, self.retry)
            return True

    @contextlib.contextmanager
    def _mutex(self) -> Iterator[None]:
        """Check-then-act made atomic: within the process for stores without conditional
        writes; on a local disk also between processes (``flock`` of the leases folder)."""
        with PROCESS_MUTEX:
            if not self.loc.is_local:
                yield
                return
            folder = os.path.dirname(self.path)
            os.makedirs(folder, exist_ok=True)
            fd = os.open(folder, os.O_RDONLY)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # closing drops the lock


PROCESS_MUTEX = threading.RLock()


class S3Slot(Slot):
    """S3 conditional writes: ``If-None-Match: *`` to create, ``If-Match: <etag>`` to swap.
    The version is the ETag: a ``HEAD`` alone where only the version is asked (a batch's
    :meth:`Lease.confirm`, a release), the ``PUT``'s own answer after a swap."""

    def read(self) -> tuple[bytes, str] | None:
        def get() -> tuple[bytes, str] | None:
            fs = self.loc.fs
            try:
                # the ETag first: if the object changes before the read, the swap with
                # this (older) ETag fails, so a decision is never based on a newer body.
                # One GET for the body (s3fs sized it with a HEAD of its own first)
                etag = str(fs.info(self.path, refresh=True)["ETag"])
                return fs.cat_file(self.path, **self.loc.one_get()), etag
            except FileNotFoundError:
                return None

        return retrying(get, f"read {self.url}", self.retry)

    def version(self) -> str | None:
        def head() -> str | None:
            try:
                return str(self.loc.fs.info(self.path, refresh=True)["ETag"])
            except FileNotFoundError:
                return None

        return retrying(head, f"stat {self.url}", self.retry)

    def swap(self, data: bytes, version: str) -> str | None:
        def put() -> str | None:
            try:
                out = self.loc.fs.pipe_file(self.path, data, IfMatch=version)
            except FileNotFoundError:
                return None
            except OSError as e:
                text = str(e).lower()
                if e.errno == errno.EINVAL and ("pre-condition" in text or "precondition" in text):
                    return None  # If-Match failed: the object changed since it was read
                raise
            # the ETag S3 gave the object this PUT wrote (asked again only if it said none)
            return str(out["ETag"]) if isinstance(out, dict) and out.get("ETag") else self.version()

        return retrying(put, f"renew {self.url}", self.retry)

    def delete(self, version: str) -> bool:
        # S3 general-purpose buckets have no conditional delete in every deployment; a
        # holder deletes only its own unexpired lease, which nobody else may take.
        if self.version() != version:
            return False
        self.loc.remove(self.url, self.retry)
        return True


#: Seconds a lease request waits for an answer on S3 (s3fs waits 15): a lease object is
#: a few hundred bytes, and a renewal's 3 attempts must end well within the 20 s left of
#: the lease when it starts. Behind a store that takes connections and never answers,
#: 3 attempts of 15 s took 45 s, so the lease ran out while one renewal was under way.
LEASE_READ_TIMEOUT_S = 5.0


def quick_reads(root: str | os.PathLike[str], options: dict[str, Any] | None) -> dict[str, Any] | None:
    """``options`` with :data:`LEASE_READ_TIMEOUT_S` as the S3 read timeout (unless set)."""
    if Location(root).protocol not in ("s3", "s3a"):
        return options
    out = dict(options or {})
    config = {**Location.S3_DEFAULTS["config_kwargs"], **out.get("config_kwargs", {})}
    config.setdefault("read_timeout", LEASE_READ_TIMEOUT_S)
    out["config_kwargs"] = config
    return out


def slot_for(loc: Location, url: str, retry: Retry) -> Slot:
    return S3Slot(loc, url, retry) if loc.is_s3 else Slot(loc, url, retry)
