"""DaskExecution: shards over a real LocalCluster (worker processes) give exactly the
rollouts in-process execution gives, in job order; a pickled copy reconnects."""

from __future__ import annotations

import asyncio
import pickle
from typing import Any

import pytest
from fixtures.prefect import DigitPolicy

from focus.agent import Agent
from focus.dask_execution import DaskExecution
from focus.execution import Execution
from focus.search import RolloutJob
from focus.toy import ReachTarget, reach_target_tasks, toy_format

pytestmark = pytest.mark.timeout(120)


def start_cluster(address: str, log: Any, *worker_args: str, scheduler_env: Any = None, **worker: Any) -> list[Any]:
    """A Dask scheduler at ``address`` and one single-threaded worker, each a process on
    127.0.0.1 (an external cluster, as a user starts one), logging to ``log``."""
    import subprocess
    import sys

    scheduler = subprocess.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
         "--port", address.rsplit(":", 1)[1], "--dashboard-address", ":0"], env=scheduler_env, stdout=log, stderr=log,
    )  # fmt: skip
    args = ["--nthreads", "1", "--host", "127.0.0.1", "--dashboard-address", ":0", *worker_args]
    return [
        scheduler,
        subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", address, *args], stdout=log, stderr=log, **worker
        ),
    ]


def stop_cluster(ex: DaskExecution, procs: list[Any]) -> None:
    """Close the client, then kill the processes of :func:`start_cluster`."""
    ex.close()
    for p in procs:
        p.kill()
        p.wait()


def turns(rollouts):
    return [[(t.prompt_ids, t.completion_ids, t.logprobs) for t in r.turns] + [r.leaf.kind] for r in rollouts]


@pytest.mark.integration  # starts a server
def test_shards_on_worker_processes_match_in_process_and_keep_order():
    agent = Agent(DigitPolicy(latency_s=0.002), ReachTarget(), toy_format(), max_steps=6)
    starts = [asyncio.run(agent.start(t)) for t in reach_target_tasks(3, seed=1)]
    jobs = [RolloutJob(i % 3, 0, 1000 + i, starts[i % 3]) for i in range(23)]
    local = asyncio.run(Execution(max_concurrency=8).run(agent, jobs))
    with DaskExecution(n_workers=2, shard_size=5) as ex:
        shards = ex.shards(jobs, 2)
        assert [len(s) for s in shards] == [5, 5, 5, 4, 4] and sorted(i for s in shards for i in s) == list(range(23))
        # dealt round-robin by steps taken: every shard gets a like mix of long and short rollouts
        steps = [[jobs[i].start.steps for i in s] for s in shards]
        assert max(map(sum, steps)) - min(map(sum, steps)) <= max(j.start.steps for j in jobs)
        remote = asyncio.run(ex.run(agent, jobs))
        assert turns(remote) == turns(local)
        # checkpoint branch states came back through pickling and can be continued
        cp = next(p.state for r in remote for p in r.pieces if p.kind == "checkpoint")
        assert (
            cp.context.prompt_ids
            == next(p.state for r in local for p in r.pieces if p.kind == "checkpoint").context.prompt_ids
        )
        copy = pickle.loads(pickle.dumps(ex))
        assert copy.address == ex.scheduler_address and copy.address.startswith("tcp://127.0.0.1:")
        try:
            assert turns(asyncio.run(copy.run(agent, jobs[:4]))) == turns(local[:4])
        finally:
            copy.close()
    assert asyncio.run(DaskExecution().run(agent, [])) == []


def test_unreachable_scheduler_is_named():
    from fixtures.prefect import free_port

    ex = DaskExecution(address=f"tcp://127.0.0.1:{free_port()}", connect_timeout_s=1.0)
    agent = Agent(DigitPolicy(), ReachTarget(), toy_format())
    start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
    with pytest.raises(RuntimeError, match="cannot reach the Dask scheduler"):
        asyncio.run(ex.run(agent, [RolloutJob(0, 0, 1, start)]))


#: Model calls in flight in this process, and the most seen (worker threads share them).
CALLS = {"now": 0, "max": 0}


class CountingPolicy(DigitPolicy):
    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        CALLS["now"] += 1
        CALLS["max"] = max(CALLS["max"], CALLS["now"])
        try:
            return await super().sample(prompt_ids, params)
        finally:
            CALLS["now"] -= 1


@pytest.mark.integration  # starts a server
def test_waves_in_flight_overlap_on_one_worker_thread_and_give_the_in_process_batch():
    """The next wave's shards start while the current ones run (shards leave the
    worker's thread pool), and the collection is the one in-process execution gives."""
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.priority import Phase, Selective

    phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=40, wave_size=4, max_depth=6))

    def collect(execution):  # type: ignore[no-untyped-def]
        agent = Agent(CountingPolicy(latency_s=0.01), ReachTarget(), toy_format(), max_steps=6)
        search = Selective(phases=phases, waves_in_flight=2)
        col = Collector(agent, search, ConstantCritic(0.5), execution=execution, collection_id="d", seed=2)
        return col.prepare(asyncio.run(col.search(reach_target_tasks(3, seed=1))))

    def key(batch):  # type: ignore[no-untyped-def]
        return [(r.tree_id, r.edge_id, r.turn_index, r.completion_ids, round(r.advantage, 12)) for r in batch.actor]

    # one worker thread, shards of one job: without leaving the thread pool, one model
    # call at a time; with it, the shards of both waves in flight call together
    with DaskExecution(n_workers=1, threads_per_worker=1, processes=False, shard_size=1, max_concurrency=4) as ex:
        remote = collect(ex)
    assert CALLS["max"] > 1
    assert key(remote) == key(collect(Execution(max_concurrency=4)))


def test_workerless_since_fails_only_after_the_timeout_and_resets_when_workers_join():
    from focus.dask_execution import NoDaskWorkers, workerless_since

    assert workerless_since(None, 2, 10.0, 5.0) is None
    assert workerless_since(None, 0, 10.0, 5.0) == 10.0
    assert workerless_since(10.0, 0, 14.9, 5.0) == 10.0
    assert workerless_since(10.0, 1, 20.0, 5.0) is None  # a worker joined late: the wait starts over
    with pytest.raises(NoDaskWorkers, match=r"no workers for 5 s .*dask worker tcp://h:1"):
        workerless_since(10.0, 0, 15.0, 5.0, "tcp://h:1")


@pytest.mark.integration  # starts a scheduler
def test_a_scheduler_without_workers_fails_the_wave_with_one_line_instead_of_hanging():
    """All workers dead (or the scheduler restarted, which closes them): Dask waits for a
    worker forever, and the collection hung without a word."""
    from distributed import LocalCluster

    from flows.errors import one_line
    from focus.dask_execution import NoDaskWorkers

    agent = Agent(DigitPolicy(), ReachTarget(), toy_format())
    start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
    with LocalCluster(n_workers=0, processes=False, dashboard_address=None) as cluster:
        ex = DaskExecution(address=cluster.scheduler_address, no_workers_timeout_s=1.0)
        try:
            with pytest.raises(NoDaskWorkers) as err:
                asyncio.run(asyncio.wait_for(ex.run(agent, [RolloutJob(0, 0, 1, start)]), 20))
        finally:
            ex.close()
    line = one_line(err.value)
    assert line.startswith(f"the Dask scheduler {cluster.scheduler_address} has had no workers for ")
    assert "rerun with the same collection id" in line


ENV_MODULE = """
from dataclasses import dataclass

from focus.env import Reset
from focus.toy import ReachState, ReachTarget


@dataclass(frozen=True)
class WorkerlessState(ReachState):
    pass


class WorkerlessEnv(ReachTarget):
    async def reset(self, task, workspace):
        r = await super().reset(task, workspace)
        return Reset(WorkerlessState(r.state.target), r.messages)
"""


@pytest.mark.integration  # starts a cluster
def test_a_worker_without_the_env_module_is_named_in_one_line(tmp_path, monkeypatch):
    """The user's env module is importable where the collection runs, not on the workers
    (started before it was on the path): one line naming the module and the workers,
    not Dask's "Error during deserialization" (the branch states travel as bytes, so the
    scheduler never unpickles them either)."""
    import sys

    from flows.errors import one_line
    from focus.dask_execution import WorkerImportError

    with DaskExecution(n_workers=1) as ex:
        ex.client()  # the workers start without tmp_path on their path
        (tmp_path / "h38d_worker_env.py").write_text(ENV_MODULE)
        monkeypatch.syspath_prepend(str(tmp_path))
        from h38d_worker_env import WorkerlessEnv  # type: ignore[import-not-found]

        agent = Agent(DigitPolicy(), WorkerlessEnv(), toy_format())
        start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
        with pytest.raises(WorkerImportError) as err:
            asyncio.run(ex.run(agent, [RolloutJob(0, 0, 1, start)]))
    sys.modules.pop("h38d_worker_env", None)
    line = one_line(err.value)
    assert "a Dask worker" in line and "No module named 'h38d_worker_env'" in line
    assert "install it in the workers' environment" in line


def test_the_config_reaches_the_dask_execution():
    from tasks.collect import make_execution
    from tasks.config import ExecutionConfig

    cfg = ExecutionConfig(
        kind="dask", address="tcp://127.0.0.1:1", shard_size=3, no_workers_timeout_s=7, max_concurrency=5
    )
    ex = make_execution(cfg)
    assert isinstance(ex, DaskExecution)
    assert (ex.address, ex.shard_size, ex.no_workers_timeout_s, ex.max_concurrency) == ("tcp://127.0.0.1:1", 3, 7.0, 5)


@pytest.mark.integration  # starts a scheduler and a worker process
def test_a_scheduler_killed_mid_wave_is_named_in_one_line(tmp_path):
    """``dask scheduler`` + ``dask worker`` on loopback, the scheduler killed (SIGKILL)
    while a wave runs: the one line says the scheduler is gone, not Dask's exception."""
    import os
    import threading
    import time
    from pathlib import Path

    from fixtures.prefect import free_port

    from flows.errors import one_line

    address = f"tcp://127.0.0.1:{free_port()}"
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tests), str(tests.parent)])}
    log = open(tmp_path / "dask.log", "w")  # noqa: SIM115 - closed below
    scheduler, worker = start_cluster(address, log, "--no-nanny", scheduler_env=env, env=env)
    ex = DaskExecution(address=address, connect_timeout_s=20)
    try:
        client = ex.client()
        client.wait_for_workers(1, timeout=30)
        agent = Agent(DigitPolicy(latency_s=3.0), ReachTarget(), toy_format())
        start = asyncio.run(agent.start(reach_target_tasks(1)[0]))

        def kill_once_running() -> None:  # the shard runs on the worker, then the scheduler dies
            while not any(client.processing().values()):
                time.sleep(0.05)
            scheduler.kill()

        threading.Thread(target=kill_once_running, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(Exception) as err:  # noqa: B017, PT011 - which one is what the line is about
            asyncio.run(asyncio.wait_for(ex.run(agent, [RolloutJob(0, 0, 1, start)]), 30))
        assert time.monotonic() - t0 < 20
    finally:
        ex.close()
        for p in (worker, scheduler):
            p.kill()
            p.wait()
        log.close()
    assert one_line(err.value).startswith("the Dask scheduler is gone: "), one_line(err.value)


def test_an_agent_that_does_not_pickle_is_named_by_its_part_with_the_remedy():
    """An env holding a lock (or a client, an open file) stopped a --dask collection with
    ``TypeError: cannot pickle '_thread.lock' object``, naming neither the env nor why
    it must pickle."""
    import threading

    from focus.dask_payload import EnvCache, load, pickled_agent
    from focus.env import EnvError

    def _pickled_agent(agent):  # type: ignore[no-untyped-def]
        return pickled_agent(agent, EnvCache())

    class Locked(ReachTarget):
        def __init__(self) -> None:
            super().__init__()
            self.lock = threading.Lock()

    agent = Agent(DigitPolicy(), Locked(), toy_format())
    with pytest.raises(EnvError) as e:
        _pickled_agent(agent)
    assert str(e.value).startswith(
        "the env (Locked) does not pickle (TypeError: cannot pickle '_thread.lock' object); Dask ships the agent"
    )
    assert "--local" in str(e.value)
    agent = Agent(DigitPolicy(), ReachTarget(), toy_format())
    agent.policy.lock = threading.Lock()
    with pytest.raises(TypeError, match=r"^the policy \(DigitPolicy\) does not pickle"):
        _pickled_agent(agent)
    del agent.policy.lock
    rest, env, _ = _pickled_agent(agent)
    assert load(rest, {"env": load(env)}).env.__class__ is ReachTarget


STARTED: list[int] = []
ANSWERED: list[int] = []


class SlowDigits(DigitPolicy):
    """The digit policy, counting the calls it starts and those it answers."""

    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        STARTED.append(1)
        out = await super().sample(prompt_ids, params)
        ANSWERED.append(1)
        return out


@pytest.mark.integration  # starts a cluster (its dashboard listens)
def test_a_cancelled_wave_stops_its_running_shards(monkeypatch):
    """Dask cannot stop a task that runs: a wave cancelled (a Ctrl-C, another wave's
    outage) left its shards calling the model service until their rollouts ended, on an
    external cluster up to outage_wait_s (300 s) against the embedded server the command
    had stopped. A shard now looks every second (RELEASE_POLL_S) whether it is still
    wanted, and cancels its rollouts when not: calls that take 4 s are never answered."""
    from distributed import LocalCluster

    from focus import dask_execution

    # the shards look four times as often as by default (the workers are threads of this
    # process), so calls of 2 s, not 4, are still far longer than the look plus the cancel
    monkeypatch.setattr(dask_execution, "RELEASE_POLL_S", 0.25)
    agent = Agent(SlowDigits(latency_s=2.0), ReachTarget(), toy_format(), max_steps=20)
    start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
    jobs = [RolloutJob(0, 0, 1000 + i, start) for i in range(8)]
    STARTED.clear()
    ANSWERED.clear()
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        ex = DaskExecution(address=cluster.scheduler_address, max_concurrency=8, shard_size=4)

        async def main() -> None:
            run = asyncio.ensure_future(ex.run(agent, jobs))
            while len(STARTED) < len(jobs):  # every rollout's first call is waiting
                assert not run.done()
                await asyncio.sleep(0.01)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            await asyncio.sleep(3.0)  # past the calls' 2 s: answered, had the shards run on

        try:
            asyncio.run(main())
        finally:
            ex.close()
    assert (len(STARTED), len(ANSWERED)) == (len(jobs), 0), (len(STARTED), len(ANSWERED))


@pytest.mark.integration  # listens on a port
def test_an_address_that_accepts_but_never_answers_fails_in_one_line_instead_of_hanging():
    """``Client(address, timeout=...)`` bounds the TCP connect only: a port that accepts
    and stays silent (another service, a stopped scheduler) hung the run forever."""
    import socket
    import time

    agent = Agent(DigitPolicy(), ReachTarget(), toy_format())
    start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        ex = DaskExecution(address=f"tcp://127.0.0.1:{silent.getsockname()[1]}", connect_timeout_s=0.3)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match=r"accepted a connection but did not answer as a Dask scheduler"):
            asyncio.run(asyncio.wait_for(ex.run(agent, [RolloutJob(0, 0, 1, start)]), 10))
        assert time.monotonic() - t0 < 5
        # the user's Dask configuration sets the wait when the execution does not (a fixed 10 s overrode it)
        import dask.config

        ex = DaskExecution(address=f"tcp://127.0.0.1:{silent.getsockname()[1]}")
        t0 = time.monotonic()
        with dask.config.set({"distributed.comm.timeouts.connect": "0.5s"}), pytest.raises(RuntimeError) as err:
            asyncio.run(asyncio.wait_for(ex.run(agent, [RolloutJob(0, 0, 1, start)]), 20))
        assert time.monotonic() - t0 < 20  # not Dask's 30 s default (a bound a loaded machine keeps)
        assert "within 1.5 s (distributed.comm.timeouts.connect + 1)" in str(err.value), str(err.value)
    for address in ("tcp://127.0.0.1", "foo://x:1"):
        with pytest.raises(RuntimeError, match=r"is not one Dask takes"):
            DaskExecution(address=address).client()


@pytest.mark.integration  # starts a scheduler and worker processes
def test_a_worker_whose_focus_does_not_import_or_differs_is_named_in_one_line(tmp_path):
    """A worker that cannot import focus could not unpickle a shard: it left, and the wave
    waited no_workers_timeout_s (300 s) for a line saying to start workers; a worker on
    another focus ran the shards with other code without a word."""
    import os
    import time
    from pathlib import Path

    from fixtures.prefect import free_port

    import focus
    from flows.errors import one_line

    real = Path(focus.__file__).parent
    (tmp_path / "broken" / "focus").mkdir(parents=True)
    (tmp_path / "broken" / "focus" / "__init__.py").write_text("raise ImportError('this focus is broken')\n")
    (tmp_path / "other" / "focus").mkdir(parents=True)
    (tmp_path / "other" / "focus" / "__init__.py").write_text(
        f"__path__.append({str(real)!r})\nexec(open({str(real / '__init__.py')!r}).read())\n__version__ = '9.9.9'\n"
    )
    agent = Agent(DigitPolicy(), ReachTarget(), toy_format())
    start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
    log = open(tmp_path / "dask.log", "w")  # noqa: SIM115 - closed below
    for shadow, line in (
        ("broken", "cannot import focus: ImportError: this focus is broken"),
        ("other", "runs focus 9.9.9"),
    ):
        address = f"tcp://127.0.0.1:{free_port()}"
        env = {**os.environ, "PYTHONPATH": str(tmp_path / shadow)}
        procs = start_cluster(address, log, "--no-nanny", env=env, cwd=tmp_path)
        ex = DaskExecution(address=address, connect_timeout_s=20, no_workers_timeout_s=5)
        try:
            ex.client().wait_for_workers(1, timeout=30)
            t0 = time.monotonic()
            with pytest.raises(Exception) as err:  # noqa: B017, PT011 - which one is what the line is about
                asyncio.run(asyncio.wait_for(ex.run(agent, [RolloutJob(0, 0, 1, start)]), 30))
            assert time.monotonic() - t0 < 5
            assert type(err.value).__name__ == "WorkerMismatch", one_line(err.value)
            assert line in one_line(err.value) and "\n" not in one_line(err.value), one_line(err.value)
        finally:
            stop_cluster(ex, procs)
    log.close()


@pytest.mark.integration  # starts a scheduler and worker processes
def test_a_worker_or_scheduler_on_other_dask_packages_is_named_in_one_line(tmp_path):
    """Dask only logs "Mismatched versions found" in the worker's log: a worker on another
    distributed could not unpickle a shard's task and left (the wave waited
    no_workers_timeout_s for workers), a client failed against a scheduler on another
    distributed with "TypeError: Scheduler.identity() got an unexpected keyword argument".
    Here the other version is an older cloudpickle's, as that process reads it."""
    import os
    import time
    from pathlib import Path

    from fixtures.prefect import free_port

    from flows.errors import one_line

    other = tmp_path / "other"
    (other / "cloudpickle-2.2.1.dist-info").mkdir(parents=True)
    (other / "cloudpickle-2.2.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: cloudpickle\nVersion: 2.2.1\n"
    )
    # distributed 2024.8 reads a module's __version__ (later ones the installed metadata)
    (other / "sitecustomize.py").write_text("import cloudpickle\ncloudpickle.__version__ = '2.2.1'\n")
    agent = Agent(DigitPolicy(), ReachTarget(), toy_format())
    start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
    log = open(tmp_path / "dask.log", "w")  # noqa: SIM115 - closed below
    tests = Path(__file__).parent  # the worker can import the policy: only the versions differ
    shadow = {**os.environ, "PYTHONPATH": os.pathsep.join([str(other), str(tests), str(tests.parent)])}
    for who, line in (("worker", "a Dask worker (tcp://"), ("scheduler", "the Dask scheduler at tcp://")):
        address = f"tcp://127.0.0.1:{free_port()}"
        procs = start_cluster(address, log, "--no-nanny", cwd=tmp_path, **({"env": shadow} if who == "worker" else {}),
                              scheduler_env=shadow if who == "scheduler" else None)  # fmt: skip
        ex = DaskExecution(address=address, connect_timeout_s=20, no_workers_timeout_s=5)
        try:
            t0 = time.monotonic()
            with pytest.raises(Exception) as err:  # noqa: B017, PT011 - which one is what the line is about
                ex.client().wait_for_workers(1, timeout=30)
                asyncio.run(asyncio.wait_for(ex.run(agent, [RolloutJob(0, 0, 1, start)]), 30))
            assert time.monotonic() - t0 < 30
            assert type(err.value).__name__ == "WorkerMismatch", one_line(err.value)
            assert one_line(err.value).startswith(line) and "runs dask " in one_line(err.value), one_line(err.value)
            assert "cloudpickle 2.2, this process dask " in one_line(err.value), one_line(err.value)
        finally:
            stop_cluster(ex, procs)
    log.close()


HOG = """
import asyncio

from fixtures.prefect import DigitPolicy

HELD = []


class HogPolicy(DigitPolicy):
    async def sample(self, prompt_ids, params):
        HELD.append(bytearray(400 << 20))
        for i in range(0, len(HELD[-1]), 4096):
            HELD[-1][i] = 1
        await asyncio.sleep(2)
        return await super().sample(prompt_ids, params)
"""


@pytest.mark.integration  # starts a scheduler and a worker process
def test_a_shard_past_its_workers_memory_limit_is_named_with_the_remedy(tmp_path, monkeypatch):
    """A nanny restarts its worker past 95% of the memory limit; a shard that needs more
    kills every worker it runs on, and the line was Dask's KilledWorker, which sends the
    user to the workers' logs, ending "rerun to resume": the rerun died the same way."""
    import os
    from pathlib import Path

    from fixtures.prefect import free_port

    from flows.errors import one_line

    (tmp_path / "hog.py").write_text(HOG)
    monkeypatch.syspath_prepend(str(tmp_path))
    from hog import HogPolicy  # type: ignore[import-not-found]

    address = f"tcp://127.0.0.1:{free_port()}"
    tests = Path(__file__).parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(tests), str(tests.parent)])}
    log = open(tmp_path / "dask.log", "w")  # noqa: SIM115 - closed below
    # the shard is given up after it killed 2 workers, not Dask's default 4 (each a worker
    # restart and 400 MB touched, 2-3 s on a loaded machine): the same KilledWorker and line
    scheduler_env = {**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"}
    procs = start_cluster(address, log, "--memory-limit", "300MB", env=env, scheduler_env=scheduler_env)
    agent = Agent(HogPolicy(), ReachTarget(), toy_format())
    start = asyncio.run(agent.start(reach_target_tasks(1)[0]))
    ex = DaskExecution(address=address, connect_timeout_s=20, no_workers_timeout_s=30)
    try:
        ex.client().wait_for_workers(1, timeout=30)
        with pytest.raises(Exception) as err:  # noqa: B017, PT011 - which one is what the line is about
            asyncio.run(asyncio.wait_for(ex.run(agent, [RolloutJob(0, 0, 1, start)]), 60))
    finally:
        stop_cluster(ex, procs)
        log.close()
    line = one_line(err.value)
    assert line.startswith("a shard of rollouts ran its Dask workers out of memory (the last, tcp://127.0.0.1:"), line
    assert "of its 286 MiB memory limit" in line and "--memory-limit" in line and "shard_size" in line, line


class BlobEnv(ReachTarget):
    """A toy env with a large workspace-like attribute: its agent pickles past INLINE_AGENT_BYTES."""

    def __init__(self, blob: bytes) -> None:
        super().__init__()
        self.blob = blob


@pytest.mark.integration  # starts a cluster
def test_a_large_agent_is_scattered_once_for_the_waves_that_ship_it_unchanged():
    """A large agent was pickled and scattered to every worker again for every wave: a
    50 MB env cost 0.27 s a wave. The same bytes are now scattered once; a changed agent
    is scattered again, and every wave gives the in-process rollouts."""
    from distributed import LocalCluster

    from focus.dask_execution import INLINE_AGENT_BYTES

    agent = Agent(DigitPolicy(), BlobEnv(bytes(INLINE_AGENT_BYTES + 1)), toy_format(), max_steps=6)
    starts = [asyncio.run(agent.start(t)) for t in reach_target_tasks(2, seed=1)]
    jobs = [RolloutJob(i % 2, 0, 1000 + i, starts[i % 2]) for i in range(6)]
    local = turns(asyncio.run(Execution().run(agent, jobs)))
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False, dashboard_address=None) as cluster:
        ex = DaskExecution(address=cluster.scheduler_address, shard_size=3)
        try:
            client = ex.client()
            scatter, scattered = client.scatter, []
            client.scatter = lambda data, **kw: scattered.append(len(data)) or scatter(data, **kw)
            for _ in range(3):
                assert turns(asyncio.run(ex.run(agent, jobs))) == local
            assert len(scattered) == 1, scattered
            agent.env.blob = bytes(INLINE_AGENT_BYTES + 2)  # changed between waves: shipped anew
            assert turns(asyncio.run(ex.run(agent, jobs))) == local
            assert len(scattered) == 2, scattered
        finally:
            ex.close()
