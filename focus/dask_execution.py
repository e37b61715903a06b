"""Rollouts fanned out over a Dask cluster, in shards.

One Prefect task per rollout would cost ~85 ms of orchestration each; a plain
``distributed`` future costs ~1-2 ms. So a wave's jobs are cut into shards, each shard
is one Dask task, and a worker runs its shard on its own asyncio loop
(:meth:`Execution.run`), keeping up to ``max_concurrency`` model calls in flight.

The agent travels as cloudpickled bytes, its env apart and pickled once for the waves
that ship it unchanged (:mod:`focus.dask_payload`), inside each shard's task when small,
scattered to the workers when large, once for all the waves that ship the same bytes, and
is unpickled inside every shard: each shard gets its own policy client bound to its own
event loop, and no state is shared between shards or with the caller's process. Branch
states travel with the jobs, each distinct start pickled once a wave, as bytes as well,
and come back inside the rollouts: the scheduler unpickles a task's arguments, and a
scheduler without the user's env module refused the whole wave with Dask's "Error during
deserialization of the task graph". ``distributed`` is imported only
when a cluster is first needed, so ``import focus`` stays free of Dask.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from pydantic import Field, PrivateAttr

from focus.dask_checks import SchedulerUnreachable, answers, check_workers
from focus.dask_checks import WorkerMismatch as WorkerMismatch
from focus.dask_payload import (
    APART_START_BYTES,
    EnvCache,
    load,
    load_shard,
    pickled_agent,
    pickled_shard,
    pickled_starts,
)
from focus.dask_payload import WorkerImportError as WorkerImportError
from focus.dask_payload import digest as payload_digest
from focus.execution import Execution
from focus.local_limits import local_error

if TYPE_CHECKING:
    from focus.agent import Agent, Rollout


class ShardOutOfMemory(RuntimeError):
    """A shard's workers were restarted by their nannies for memory until Dask gave up."""


class NoDaskWorkers(RuntimeError):
    """The scheduler has had no workers for longer than the execution allows."""


def workerless_since(
    since: float | None, n_workers: int, now: float, timeout_s: float, address: str | None = None
) -> float | None:
    """When the scheduler last had workers, or ``None`` while it has some (pure).

    Raises :class:`NoDaskWorkers` once it has had none for ``timeout_s``: Dask keeps the
    tasks waiting for a worker forever, so a cluster whose workers all died (or whose
    scheduler restarted, which closes its workers) hung the collection without a line.
    Workers that join within ``timeout_s`` pick the tasks up.
    """
    if n_workers > 0:
        return None
    if since is None:
        return now
    if now - since >= timeout_s:
        raise NoDaskWorkers(
            f"the Dask scheduler {address or ''} has had no workers for {now - since:.0f} s while rollouts waited "
            f"(execution.no_workers_timeout_s = {timeout_s:g}); start workers (dask worker {address or '<scheduler>'}), "
            "then rerun with the same collection id to resume"
        )
    return since


def _run_shard(
    agent_bytes: bytes,
    env_bytes: bytes,
    jobs_bytes: bytes,
    starts: list[bytes],
    max_concurrency: int,
    max_outage_share: float = 1.0,
    freeze_gc: bool = True,
) -> list[Rollout]:
    """Body of one Dask task: unpickle the agent (its env apart) and the jobs (their
    distinct starts apart, :mod:`focus.dask_payload`) and run the shard on a fresh loop.

    The shard leaves the worker's thread pool first (``secede``): it mostly waits on the
    model service, and a wave planned ahead must be able to start its shards while this
    one still runs, instead of queueing behind it for a thread.
    """
    released = _released_check()
    try:
        from distributed import secede

        secede()
    except ValueError:  # not inside a Dask worker (called directly)
        pass
    agent = load(agent_bytes, {"env": load(env_bytes)})
    jobs = load_shard(jobs_bytes, starts)
    out: list[Rollout] = []

    async def go() -> None:
        # The result leaves through ``out``, not as the coroutine's return value: on
        # Python 3.11 ``asyncio.run`` formats the repr of its finished main task (result
        # included) while restoring the SIGINT handler, which for a shard of rollouts
        # cost ~0.5 s of CPU per shard.
        ex = Execution(max_concurrency=max_concurrency, max_outage_share=max_outage_share, freeze_gc=freeze_gc)
        run = asyncio.ensure_future(ex.run(agent, jobs))
        watch = asyncio.ensure_future(_stop_when(released, run)) if released is not None else None
        try:
            out.extend(await run)
        except asyncio.CancelledError:
            if watch is None or not watch.done():
                raise
            raise ShardReleased("the shard's result is no longer wanted (its wave was cancelled)") from None
        finally:
            if watch is not None:
                watch.cancel()
            await agent.policy.aclose()

    asyncio.run(go())
    return out


class ShardReleased(RuntimeError):
    """A running shard stopped because its client let it go (its wave was cancelled, or the
    command that ran the collection stopped): nobody reads its result."""


#: Seconds between a running shard's looks at whether it is still wanted.
RELEASE_POLL_S = 1.0


def _released_check() -> Callable[[], bool] | None:
    """In a Dask task: whether the worker has let this task go (the client cancelled it, or
    its client is gone); ``None`` elsewhere. Dask cannot stop a task that runs: a cancelled
    shard went on calling the model service until its rollouts ended, after a Ctrl-C up to
    ``outage_wait_s`` (300 s) against the embedded server the command had stopped."""
    try:
        from distributed import get_worker
        from distributed.worker import thread_state

        worker, key = get_worker(), thread_state.key
        tasks = worker.state.tasks
    except (ImportError, ValueError, AttributeError):  # not a worker's task, or another distributed
        return None

    def released() -> bool:
        ts = tasks.get(key)
        return ts is None or ts.state in ("cancelled", "released", "forgotten")

    return released


async def _stop_when(released: Callable[[], bool], run: asyncio.Future[Any]) -> None:
    """Cancel ``run`` once ``released()`` says nobody wants its result."""
    while not run.done():
        await asyncio.sleep(RELEASE_POLL_S)
        if released():
            run.cancel()
            return


#: Pickled agents up to this size travel inside every shard's task instead of being scattered.
INLINE_AGENT_BYTES = 1 << 20

#: Held while a large start is submitted: the filter that hides Dask's warning is global.
_APART_LOCK = threading.Lock()


def _held(data: bytes) -> bytes:
    """The task that holds a large pickled start on a worker for the shards that need it."""
    return data


def _apart(client: Any, data: bytes) -> Any:
    """A pickled start as the shards get it: ``data`` itself when small; a large one as a
    task of its own (:mod:`focus.dask_payload`), which the scheduler can run again when the
    worker holding it dies. Dask's "Sending large graph" warning (a start over 10 MB), which
    advises what this does, is not printed."""
    import warnings

    if len(data) < APART_START_BYTES:
        return data
    with _APART_LOCK, warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sending large graph", category=UserWarning)
        return client.submit(_held, data, pure=False)


def _scattered_lost(client: Any, payload: Any) -> bool:
    """Whether a wave failed because the agent it shipped scattered died with the workers
    that held it (a single worker restarted by its nanny, all of them killed): Dask cancels
    its shards ("FutureCancelledError: ... cancelled for reason: already forgotten"), where a
    worker lost with shards alone has them rerun. The wave is then shipped once more, its
    agent scattered anew: its rollouts rerun with the same seeds, as Dask reruns a shard."""
    parts, _starts = payload
    scattered = [p for p in parts if not isinstance(p, bytes)]
    return client.status == "running" and any(f.status != "finished" for f in scattered)


class DaskExecution(Execution):
    """Run rollout jobs as shards on a ``distributed`` cluster.

    ``address`` connects to an existing scheduler (``tcp://host:port``); without one a
    ``LocalCluster`` with ``n_workers`` worker processes is started on first use and
    closed by :meth:`close`. ``shard_size`` is the number of jobs per Dask task; the
    default splits a wave evenly over the workers' threads. Results come back in job
    order, whatever order the shards finish in. A pickled copy keeps the scheduler
    address and reconnects; the client and cluster stay with the process that made them.
    """

    address: str | None = None
    n_workers: int = Field(2, ge=1)
    threads_per_worker: int = Field(1, ge=1)
    processes: bool = True
    shard_size: int | None = Field(None, ge=1)
    #: Seconds to reach the scheduler; ``None``: Dask's ``distributed.comm.timeouts.connect``
    #: (30 s unless the user's Dask configuration says otherwise), which a fixed 10 s overrode.
    connect_timeout_s: float | None = Field(None, gt=0)
    #: How long a wave waits while the scheduler has no workers before it fails.
    no_workers_timeout_s: float = Field(300.0, gt=0)

    _client: Any = PrivateAttr(None)
    _cluster: Any = PrivateAttr(None)
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _threads: Any = PrivateAttr(None)
    #: Workers whose focus and Python were found to be the caller's (:func:`check_workers`).
    _checked: set[str] = PrivateAttr(default_factory=set)
    #: (digest, future) of the large pickled agent (slot "agent") or env (slot "env") last
    #: scattered, which later waves reuse.
    _shipped: dict[str, Any] = PrivateAttr(default_factory=dict)
    #: The env pickled last, which later waves reuse while it is unchanged.
    _envs: EnvCache = PrivateAttr(default_factory=EnvCache)

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        fields = dict(state["__dict__"])
        fields["address"] = self.scheduler_address
        return {
            **state,
            "__dict__": fields,
            "__pydantic_private__": {
                "_client": None,
                "_cluster": None,
                "_limits": {},
                "_threads": None,
                "_checked": set(),
                "_shipped": {},
                "_envs": None,  # made anew by __setstate__ (it holds a lock)
            },
        }

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        private: dict[str, Any] = {
            "_client": None,
            "_cluster": None,
            "_lock": threading.Lock(),
            "_limits": {},
            "_threads": None,
            "_checked": set(),
            "_shipped": {},
            "_envs": EnvCache(),
        }
        object.__setattr__(self, "__pydantic_private__", private)

    @property
    def scheduler_address(self) -> str | None:
        """The scheduler in use (the LocalCluster's once started)."""
        if self._cluster is not None:
            return str(self._cluster.scheduler_address)
        return self.address

    def client(self) -> Any:
        """The ``distributed.Client``, connecting (or starting a LocalCluster) on first use."""
        with self._lock:
            if self._client is None:
                from focus.extras import require

                require("pipeline", "DaskExecution", ("distributed",))
                from distributed import Client, LocalCluster

                if self.address is None:
                    # Worker threads talk in-process (inproc://), which takes no host. Worker
                    # processes leave a terminal's Ctrl-C and hang-up to this one (focus.dask_preload).
                    own = {"host": "127.0.0.1", "preload": ["focus.dask_preload"]} if self.processes else {}
                    if self.processes:
                        from focus.dask_preload import tracker_ignores_hangup

                        tracker_ignores_hangup()
                    self._cluster = LocalCluster(
                        n_workers=self.n_workers,
                        threads_per_worker=self.threads_per_worker,
                        processes=self.processes,
                        dashboard_address=None,
                        # no dashboard, but the scheduler's HTTP server (health, metrics) still
                        # took :8787 and, that port taken (another cluster), printed "Port 8787
                        # is already in use. Perhaps you already have a cluster running?"
                        scheduler_kwargs={"dashboard_address": ":0"},
                        **own,
                    )
                    self._client = Client(self._cluster)
                else:
                    timeout_s, setting = self._connect_timeout()
                    answers(self.address, timeout_s, setting)
                    try:
                        self._client = Client(self.address, timeout=f"{timeout_s}s")
                    except OSError as e:
                        raise local_error(
                            e, f" connecting to the Dask scheduler at {self.address!r}"
                        ) or SchedulerUnreachable(f"cannot reach the Dask scheduler at {self.address!r}: {e}") from e
            return self._client

    def _connect_timeout(self) -> tuple[float, str]:
        """Seconds to reach the scheduler, and the setting they come from."""
        if self.connect_timeout_s is not None:
            return self.connect_timeout_s, "DaskExecution.connect_timeout_s"
        import dask.config
        from dask.utils import parse_timedelta

        key = "distributed.comm.timeouts.connect"
        return float(parse_timedelta(dask.config.get(key), default="s")), key

    def shards(self, jobs: list[Any], workers: int) -> list[list[int]]:
        """Indices of the jobs of each shard (pure: same jobs, same shards).

        Jobs are dealt out round-robin, in order of the steps their start has taken
        (fewest first), so every shard gets the same mix of long and short rollouts and
        the workers finish a wave together. Consecutive slices of a plan, which lists
        jobs by priority, gave one worker most of the long rollouts while the other
        idled at the end of the wave.
        """
        if not jobs:
            return []
        size = self.shard_size or max(1, math.ceil(len(jobs) / max(1, workers)))
        n = math.ceil(len(jobs) / size)
        order = sorted(range(len(jobs)), key=lambda i: jobs[i].start.steps)
        return [order[k::n] for k in range(n)]

    async def run(self, agent: Agent, jobs: list[Any]) -> list[Rollout]:
        if not jobs:
            return []
        jobs = list(jobs)
        loop = asyncio.get_running_loop()
        pool = self._pool()
        for again in (False, True):
            client, shards, futures, payload = await loop.run_in_executor(pool, self._submit, agent, jobs)
            try:
                results = await loop.run_in_executor(pool, self._gather, client, futures)
                break
            except Exception:
                if again or not _scattered_lost(client, payload):
                    raise
            finally:
                # also when this wave is cancelled (another wave hit an outage, the run
                # ends): the thread blocked in gather returns, and running shards stop at
                # their next look (_released_check: Dask cannot stop a running task)
                await loop.run_in_executor(pool, client.cancel, futures)
        out: list[Any] = [None] * len(jobs)
        for shard, rollouts in zip(shards, results, strict=True):
            for i, rollout in zip(shard, rollouts, strict=True):
                out[i] = rollout
        return out

    def _gather(self, client: Any, futures: list[Any]) -> list[Any]:
        """``client.gather``, failing with one line when the scheduler stays without workers."""
        from distributed import wait

        since: float | None = None
        while True:
            try:
                wait(futures, timeout=1.0)
                break
            except TimeoutError:
                if any(f.status == "error" for f in futures):
                    break  # a shard failed: say so now, not when the others finish
            except Exception:  # noqa: BLE001 - cancelled (the scheduler is gone, the wave stopped): gather says why
                break
            try:
                n_workers = len(client.nthreads())
            except OSError:  # the scheduler is gone: the futures say so on the next turn
                continue
            since = workerless_since(
                since, n_workers, time.monotonic(), self.no_workers_timeout_s, self.scheduler_address
            )
        try:
            return list(client.gather(futures))
        except Exception as e:
            if type(e).__name__ == "KilledWorker":
                raise _out_of_memory(client, e) or e from None
            raise

    def _pool(self) -> ThreadPoolExecutor:
        """Threads that wait on the cluster, one per wave in flight: not the event loop's
        default executor, which planning uses and which has only a few threads."""
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(max_workers=32, thread_name_prefix="focus-dask")
            return self._threads

    def _submit(self, agent: Agent, jobs: list[Any]) -> tuple[Any, list[list[int]], list[Any], Any]:
        client = self.client()
        nthreads = client.nthreads()
        check_workers(client, set(nthreads) - self._checked, _worker_versions())
        self._checked.update(nthreads)
        threads = sum(nthreads.values()) or 1
        shards = self.shards(jobs, threads)
        agent_data, env_data, env_digest = pickled_agent(agent, self._envs)
        payload = (self._payload(client, "agent", agent_data), self._payload(client, "env", env_data, env_digest))
        starts, index = pickled_starts(jobs)
        sent = [_apart(client, data) for data in starts]
        futures = []
        for shard in shards:
            part, needed = pickled_shard([jobs[i] for i in shard], index)
            futures.append(
                client.submit(
                    _run_shard,
                    *payload,
                    part,
                    [sent[k] for k in needed],
                    self.max_concurrency,
                    self.max_outage_share,
                    self.freeze_gc,
                    pure=False,
                )
            )
        return client, shards, futures, (payload, sent)

    def _payload(self, client: Any, slot: str, data: bytes, digest: bytes | None = None) -> Any:
        """What the shards get of the pickled agent (``slot``: the agent without its env, or
        the env): ``data`` itself when small, so the scheduler can rerun a shard whatever
        workers die; a large one scattered to every worker, and kept there for the next
        waves while they ship the same bytes (``digest``, when known). Each wave scattered
        it anew: a 50 MB env cost 0.27 s a wave, 5.5 s of a 6.1 s collection of 20 waves. A
        changed one is scattered again; one lost with its last worker too (data that lives on
        workers dies with them), and the wave it was lost in is shipped again (:func:`_scattered_lost`)."""
        if len(data) <= INLINE_AGENT_BYTES:
            return data
        digest = digest or payload_digest(data)
        shipped = self._shipped.get(slot)
        if shipped is not None and shipped[0] == digest and shipped[1].status == "finished":
            return shipped[1]
        future = client.scatter(data, broadcast=True, hash=False)
        self._shipped[slot] = (digest, future)  # the previous one is released once no wave holds it
        return future

    def close(self) -> None:
        """Close the client, and the LocalCluster if this object started it."""
        with self._lock:
            self._shipped = {}
            if self._threads is not None:
                self._threads.shutdown(wait=False)
                self._threads = None
            if self._client is not None:
                self._client.close()
                self._client = None
            if self._cluster is not None:
                self._cluster.close()
                self._cluster = None

    def __enter__(self) -> DaskExecution:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _worker_versions() -> Any:
    """A function that says which Python, focus and Dask packages (:data:`WIRE`) its process
    runs, or why focus does not import there. A local function, so cloudpickle ships it by
    value: it runs on a worker that lacks focus, where a module-level one would not even
    unpickle."""

    def versions() -> tuple[str, str, str, dict[str, str]]:
        import sys
        from importlib.metadata import version

        python = f"{sys.version_info[0]}.{sys.version_info[1]}"
        packages = {name: version(name) for name in ("dask", "distributed", "cloudpickle")}  # WIRE
        try:
            import focus.dask_execution  # noqa: F401 - what the shards import
            from focus import __version__
        except BaseException as e:  # noqa: BLE001 - any failure is the answer
            return python, "", f"{type(e).__name__}: {e}", packages
        return python, __version__, "", packages

    return versions


def _out_of_memory(client: Any, err: Exception) -> ShardOutOfMemory | None:
    """The line for a shard whose workers died (``KilledWorker``) because their nanny
    restarted them for memory, or ``None`` when the scheduler recorded no such restart of
    the last one. Dask's own line sent the user to the workers' logs, and the library's
    said "rerun to resume", which died again the same way."""
    worker = err.last_worker  # type: ignore[attr-defined]
    try:
        events = client.get_events("worker-restart-memory")
    except Exception:  # noqa: BLE001 - the scheduler is gone too: Dask's line stands
        return None
    rss = [e.get("rss", 0) for _, e in events if e.get("worker") == worker.address]
    if not rss:
        return None
    limit = getattr(worker, "memory_limit", 0)
    return ShardOutOfMemory(
        f"a shard of rollouts ran its Dask workers out of memory (the last, {worker.address}, at "
        f"{max(rss) / 2**20:.0f} MiB of its {limit / 2**20:.0f} MiB memory limit; its nanny restarts a worker past "
        "95%); give the workers more memory (dask worker --memory-limit) or run fewer rollouts per shard "
        "(execution.shard_size, max_concurrency), then rerun with the same collection id"
    )
