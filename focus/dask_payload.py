"""What a wave of :class:`focus.dask_execution.DaskExecution` ships to its Dask workers,
pickled as few times as the wave allows.

The env is pickled once for the waves that ship it unchanged, apart from the rest of the
agent: an env whose ``__getstate__`` took 0.3 s paid it every wave, 5.7 s of a 6.8 s
collection of 19 waves. An env is stateless (:mod:`focus.env`), so "unchanged" is the same
object with the same attributes (each the same object as before): one rebound
(``env.data = ...``) is pickled again; one changed in place is not seen, as no rollout
may rely on it. The policy, format and the rest of the agent are pickled every wave (they
are small, and a policy may change between waves).

A start state shared by sibling jobs is pickled once a wave, apart from the jobs: the
shards are dealt round-robin, so siblings land in different shards, and each shard's
pickle carried its own copy of the start, workspace and all (80 MiB sent a wave for
20 MiB of distinct workspaces). A large start travels as a Dask task of its own that the
shards needing it depend on (the client sends it once, a worker fetches it once); it is
a task, not scattered data, so the scheduler can run it again when the worker holding it
dies and rerun the wave's shards elsewhere.
"""

from __future__ import annotations

import functools
import hashlib
import io
import pickle
import threading
from typing import Any

#: A start state pickled to at least this many bytes travels as a task of its own.
APART_START_BYTES = 64 << 10


class WorkerImportError(RuntimeError):
    """A Dask worker cannot import a module the agent or the branch states need."""


@functools.cache
def _ref_pickler() -> Any:
    """cloudpickle's pickler, writing the objects of its ``refs`` (``id(obj) -> token``) as
    their token (a class made on first use: ``import focus`` stays free of cloudpickle)."""
    import cloudpickle

    class RefPickler(cloudpickle.CloudPickler):  # type: ignore[misc]
        refs: dict[int, Any] = {}

        def persistent_id(self, obj: Any) -> Any:
            return self.refs.get(id(obj))

    return RefPickler


def _dumps(obj: Any, refs: dict[int, Any] | None = None) -> bytes:
    import cloudpickle

    if not refs:
        return bytes(cloudpickle.dumps(obj))
    buf = io.BytesIO()
    pickler = _ref_pickler()(buf, protocol=cloudpickle.DEFAULT_PROTOCOL)
    pickler.refs = refs
    pickler.dump(obj)
    return buf.getvalue()


class _RefUnpickler(pickle.Unpickler):
    def __init__(self, data: bytes, refs: dict[Any, Any]) -> None:
        super().__init__(io.BytesIO(data))
        self._refs = refs

    def persistent_load(self, pid: Any) -> Any:
        return self._refs[pid]


def load(data: bytes, refs: dict[Any, Any] | None = None) -> Any:
    """Unpickle what the caller sent (its tokens read from ``refs``), naming a module this
    worker lacks in one line."""
    import socket

    try:
        return _RefUnpickler(data, refs or {}).load()
    except ImportError as e:
        raise WorkerImportError(
            f"a Dask worker (host {socket.gethostname()}) cannot import what the rollouts need: {e}; install it "
            "in the workers' environment (or put it on their PYTHONPATH), then rerun with the same collection id"
        ) from None


def digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class EnvCache:
    """The env pickled last, kept while the agent's env is the same object with the same
    attributes (module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # waves in flight submit from their own threads
        self._env: Any = None
        self._attrs: dict[str, Any] | None = None
        self._pickled: tuple[bytes, bytes] | None = None

    def pickled(self, env: Any) -> tuple[bytes, bytes]:
        """``env`` pickled, and the digest of those bytes."""
        with self._lock:
            return self._pickled_locked(env)

    def _pickled_locked(self, env: Any) -> tuple[bytes, bytes]:
        attrs = _attributes(env)
        if self._pickled is not None and env is self._env and attrs is not None and _same(attrs, self._attrs):
            return self._pickled
        data = _checked(env, "env", None)
        self._env, self._attrs, self._pickled = env, attrs, (data, digest(data))
        return self._pickled


def _attributes(env: Any) -> dict[str, Any] | None:
    attrs = getattr(env, "__dict__", None)
    return dict(attrs) if isinstance(attrs, dict) else None


def _same(now: dict[str, Any], before: dict[str, Any] | None) -> bool:
    return before is not None and now.keys() == before.keys() and all(now[k] is before[k] for k in now)


def pickled_agent(agent: Any, envs: EnvCache) -> tuple[bytes, bytes, bytes]:
    """``agent`` pickled for the workers as (the agent without its env, the env, the env's
    digest); :func:`load` the env first and give it to the agent's load as ``{"env": env}``."""
    env, env_digest = envs.pickled(agent.env)
    return _checked(agent, "agent", {id(agent.env): "env"}), env, env_digest


def _checked(obj: Any, part: str, refs: dict[int, Any] | None) -> bytes:
    """``_dumps(obj, refs)``; a part that does not pickle is named (an env holding a lock, a
    client or an open file, mostly), with the remedy, instead of ``TypeError: cannot pickle
    '_thread.lock' object``."""
    from focus.env import EnvError

    try:
        return _dumps(obj, refs)
    except Exception as e:
        what = f"the env ({type(obj).__name__})"
        if part == "agent":
            parts = {"policy": obj.policy, "format": obj.format, "context": obj.context}
            part = next((name for name, o in parts.items() if not _pickles(o)), "agent")
            what = f"the {part} ({type(parts.get(part, obj)).__name__})"
        line = (
            f"{what} does not pickle ({type(e).__name__}: {e}); Dask ships the agent to its workers: open "
            "clients, locks and files on first use in the worker (not in __init__), or drop them in __getstate__, "
            "or run the rollouts in-process (execution.kind = local, --local)"
        )
        raise (EnvError(line) if part == "env" else TypeError(line)) from e


def _pickles(obj: Any) -> bool:
    import cloudpickle

    try:
        cloudpickle.dumps(obj)
    except Exception:
        return False
    return True


def pickled_starts(jobs: list[Any]) -> tuple[list[bytes], dict[int, int]]:
    """Each distinct start state of ``jobs`` pickled once (by identity: sibling jobs share
    their start object), and ``id(start) -> its index`` in that list."""
    index: dict[int, int] = {}
    out: list[bytes] = []
    for job in jobs:
        if id(job.start) not in index:
            index[id(job.start)] = len(out)
            try:
                out.append(_dumps(job.start))
            except Exception as e:
                from focus.env import EnvError
                from focus.pickling import REMEDY, unpicklable_part

                part = unpicklable_part(job.start)
                if part is None:
                    raise
                raise EnvError(
                    f"{part} does not pickle, and Dask ships each checkpoint's state to its workers: {REMEDY}"
                ) from e
    return out, index


def pickled_shard(jobs: list[Any], index: dict[int, int]) -> tuple[bytes, list[int]]:
    """A shard's jobs pickled with their starts left out, and the indices (into
    :func:`pickled_starts`) of the starts it needs, in the order its tokens count them."""
    mine: dict[int, int] = {}
    for job in jobs:
        mine.setdefault(id(job.start), len(mine))
    needed = [index[k] for k in mine]
    return _dumps(jobs, mine), needed


def load_shard(jobs_bytes: bytes, starts: list[bytes]) -> list[Any]:
    """The jobs of :func:`pickled_shard`, each distinct start unpickled once (siblings in a
    shard share their start object, as in-process)."""
    return list(load(jobs_bytes, {k: load(data) for k, data in enumerate(starts)}))
