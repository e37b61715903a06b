"""Reading a resume's checkpoints ahead of its replay.

A resumed collection replays its saved steps one after another (:mod:`focus.journal`):
each is a checkpoint load, a manifest and then its data file, so on S3 two round trips
per step, four per wave, with nothing else in flight (16,500 sequential GETs before the
first new wave at 100k transitions over 2,000 tasks in waves of 16). The steps it will
replay are known before it starts (:func:`tasks.gaps.replay_order`), so
:class:`ReadAhead` loads them in a few threads while the replay consumes them in order.

What is read ahead is checked exactly as :meth:`storage.CheckpointStore.load` checks it
(the same :meth:`~storage.CheckpointStore.manifest_of` and
:meth:`~storage.CheckpointStore.fetch`: the size and SHA-256 against the manifest); it is
unpickled by the taker, in order. A read that failed for any reason (a missing or
damaged checkpoint, a store that did not answer) is not reported from the thread: the
taker loads that checkpoint again itself with :meth:`~storage.CheckpointStore.read`, so
what it raises, and when, is what a resume without read-ahead raises. Memory is bounded
by a window: at most ``window`` keys ahead of the taker have their manifest read, and
their data files are read in order while the bytes read and not yet taken stay within
``max_bytes`` (one file is always read, however large). Checkpoints the caller has
loaded already (``known``: a resume reads its phase ends before it knows what it
replays, :func:`tasks.gaps.mend`) are handed out as they are, not read again.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.checkpoints import CheckpointStore

Key = tuple[int | str, int]
#: The default sizes (the pipeline's are ``storage.read_ahead`` in the configuration):
#: threads, keys ahead of the taker whose manifest is read, bytes of data read and not taken.
THREADS, WINDOW, MAX_BYTES = 8, 32, 64 * 2**20


class ReadAhead:
    """The checkpoints ``keys`` of ``collection_id`` in ``store``, read in ``threads``
    threads ahead of :meth:`take`, which expects them in this order (see the module
    docs). :meth:`close` stops it; it stops by itself once every key is taken."""

    def __init__(
        self,
        store: CheckpointStore,
        collection_id: str,
        keys: Sequence[Key],
        *,
        threads: int = THREADS,
        window: int = WINDOW,
        max_bytes: int = MAX_BYTES,
        known: Mapping[Key, Any] | None = None,
    ) -> None:
        if threads < 1 or window < 1 or max_bytes < 0:
            raise ValueError(f"threads and window must be at least 1, max_bytes not negative: {threads}, {window}")
        self.store, self.cid, self.keys = store, collection_id, list(keys)
        self.window, self.max_bytes = window, max_bytes
        self._known = {k: v for k, v in (known or {}).items() if k in self.keys}
        self._at: dict[Key, int] = {}
        for i, k in enumerate(self.keys):
            self._at.setdefault(k, i)
        self._next = 0  # the next key to be taken
        self._sent = 0  # keys [0, _sent) have a job
        self._admit = self._unknown(0)  # the next key whose data file may be read (in order)
        self._held = 0  # bytes of the data files admitted and not yet taken
        self._sizes: dict[int, int] = {}
        self._jobs: dict[int, Future[tuple[str, bytes] | None]] = {}
        self._cond = threading.Condition()
        self._pool: ThreadPoolExecutor | None = None
        if self.keys:
            self._pool = ThreadPoolExecutor(threads, thread_name_prefix="focus-read-ahead")
            with self._cond:
                self._top_up()

    def _top_up(self) -> None:
        """Give every key in the window a job (hold the lock)."""
        while self._pool is not None and self._sent < min(len(self.keys), self._next + self.window):
            if self.keys[self._sent] not in self._known:
                self._jobs[self._sent] = self._pool.submit(self._read, self._sent)
            self._sent += 1

    def _unknown(self, i: int) -> int:
        """The first key from ``i`` on that is not :attr:`_known` (its data file is read)."""
        while i < len(self.keys) and self.keys[i] in self._known:
            i += 1
        return i

    def _read(self, i: int) -> tuple[str, bytes] | None:
        """Key ``i``'s data file, (URL, checked bytes); ``None`` if no longer wanted."""
        base, m = self.store.manifest_of(self.cid, *self.keys[i])
        size = m.files[0].bytes
        with self._cond:
            while self._pool is not None and i >= self._next and not self._fits(i, size):
                self._cond.wait()
            if self._pool is None or i < self._next:
                return None
            self._admit, self._held, self._sizes[i] = self._unknown(i + 1), self._held + size, size
            self._cond.notify_all()
        return self.store.fetch(base, m)

    def _fits(self, i: int, size: int) -> bool:
        return i == self._admit and (self._held == 0 or self._held + size <= self.max_bytes)

    def take(self, key: Key) -> tuple[bool, Any]:
        """``(True, checkpoint)`` for ``key`` if it is one of the keys still to come (those
        before it are dropped), loaded again here if reading it ahead failed; ``(False,
        None)`` for any other key, which the caller loads itself."""
        with self._cond:
            i = self._at.get(key, -1)
            if i < self._next or self._pool is None:
                return False, None
            for j in range(self._next, i):  # skipped: the caller took another way
                self._drop(j)
            self._cond.notify_all()  # their jobs, waiting to be admitted, end
            self._next, self._sent, self._admit = i, max(self._sent, i), max(self._admit, self._unknown(i))
            self._top_up()
            job = self._jobs.get(i)  # none for a known key
        try:
            got = None if job is None else job.result()
        except Exception:
            got = None
        finally:
            with self._cond:
                self._drop(i)
                self._next, self._admit = i + 1, max(self._admit, self._unknown(i + 1))
                self._cond.notify_all()
                self._top_up()
                if self._next >= len(self.keys):
                    self.close()
        if job is None:
            return True, self._known[key]
        if got is None:  # as a load without read-ahead: its error, raised from here
            return True, self.store.read(self.cid, *key)
        return True, self.store.unpickle(*got)

    def _drop(self, i: int) -> None:
        """Forget key ``i``'s job and the bytes it holds (hold the lock)."""
        job = self._jobs.pop(i, None)
        if job is not None:
            job.cancel()
        self._held -= self._sizes.pop(i, 0)

    def close(self) -> None:
        """Stop reading ahead: queued reads are cancelled, running ones end unused."""
        with self._cond:
            pool, self._pool = self._pool, None
            for i in list(self._jobs):
                self._drop(i)
            self._cond.notify_all()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def __enter__(self) -> ReadAhead:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
