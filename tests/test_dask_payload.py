"""What a Dask wave ships: an unchanged env pickled once for all its waves, each distinct
start once a wave (focus/dask_payload.py), and the rollouts in-process execution gives."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from fixtures.prefect import DigitPolicy

from focus.agent import Agent
from focus.dask_execution import DaskExecution
from focus.dask_payload import APART_START_BYTES, load_shard, pickled_shard, pickled_starts
from focus.execution import Execution
from focus.search import RolloutJob
from focus.toy import ReachTarget, reach_target_tasks, toy_format
from focus.workspace import MemoryWorkspace

pytestmark = pytest.mark.timeout(120)


def turns(rollouts: list[Any]) -> list[Any]:
    return [[(t.prompt_ids, t.completion_ids, t.logprobs) for t in r.turns] + [r.leaf.kind] for r in rollouts]


#: Times the env below was pickled (in this process: the caller's).
PICKLED: list[float] = []


class SlowToPickle(ReachTarget):
    """A toy env whose ``__getstate__`` takes a while (a dataset packed, a model's config
    read), as a user's env may."""

    def __getstate__(self) -> dict[str, Any]:
        PICKLED.append(1)
        time.sleep(0.05)
        return dict(self.__dict__)


def sizes(args: Any) -> int:
    """Bytes among a call's arguments (lists followed)."""
    if isinstance(args, bytes | bytearray):
        return len(args)
    return sum(map(sizes, args)) if isinstance(args, list | tuple) else 0


def counting(client: Any) -> list[int]:
    """Bytes in each ``client.submit`` and ``client.scatter`` call from now on."""
    sent: list[int] = []
    for name in ("submit", "scatter"):
        call = getattr(client, name)
        setattr(client, name, lambda *a, _call=call, **kw: sent.append(sizes(a)) or _call(*a, **kw))
    return sent


@pytest.mark.integration  # starts a cluster
def test_an_unchanged_env_is_pickled_once_for_all_waves_and_again_when_rebound():
    """An env slow to pickle paid it on every wave (0.3 s a wave: 5.7 s of a 6.8 s
    collection of 19 waves); it is pickled once while it is the same object with the
    same attributes, and again once one is rebound."""
    agent = Agent(DigitPolicy(), SlowToPickle(), toy_format(), max_steps=6)
    starts = [asyncio.run(agent.start(t)) for t in reach_target_tasks(2, seed=1)]
    jobs = [RolloutJob(i % 2, 0, 1000 + i, starts[i % 2]) for i in range(6)]
    local = turns(asyncio.run(Execution().run(agent, jobs)))
    PICKLED.clear()
    with DaskExecution(n_workers=1, threads_per_worker=2, processes=False, shard_size=3) as ex:
        for _ in range(3):
            assert turns(asyncio.run(ex.run(agent, jobs))) == local
        assert len(PICKLED) == 1, PICKLED
        agent.env.note = "rebound"  # a changed env is shipped anew
        assert turns(asyncio.run(ex.run(agent, jobs))) == local
        assert len(PICKLED) == 2, PICKLED
        other = Agent(DigitPolicy(), SlowToPickle(), toy_format(), max_steps=6)  # another env object
        assert turns(asyncio.run(ex.run(other, jobs))) == local
        assert len(PICKLED) == 3, PICKLED


@pytest.mark.integration  # starts a cluster
def test_a_start_shared_by_siblings_in_several_shards_is_sent_once_a_wave():
    """Siblings are dealt to different shards, and each shard's pickle carried its own
    copy of their start, workspace and all: 3 shards sent 3 copies of each workspace."""
    agent = Agent(DigitPolicy(), ReachTarget(), toy_format(), max_steps=6)
    blob = bytes(range(256)) * (APART_START_BYTES // 256 + 1)
    starts = [
        asyncio.run(agent.start(t)).evolve(workspace=MemoryWorkspace({"blob": blob + bytes([k])}))
        for k, t in enumerate(reach_target_tasks(2, seed=1))
    ]
    jobs = [RolloutJob(i // 3, 0, 1000 + i, starts[i // 3]) for i in range(6)]
    local = turns(asyncio.run(Execution().run(agent, jobs)))
    with DaskExecution(n_workers=1, threads_per_worker=3, processes=False, shard_size=2) as ex:
        assert [{jobs[i].start is starts[0] for i in s} for s in ex.shards(jobs, 3)] == [{True, False}] * 3
        sent = counting(ex.client())
        assert turns(asyncio.run(ex.run(agent, jobs))) == local
    distinct = 2 * len(blob)
    assert distinct < sum(sent) < distinct + 100_000, (sum(sent), distinct)


def test_siblings_in_a_shard_share_one_start_object_as_in_process():
    """Execution keeps the jobs of one start state together by its identity; a shard's
    jobs unpickled apart from their starts still share them."""
    agent = Agent(DigitPolicy(), ReachTarget(), toy_format())
    a, b = (asyncio.run(agent.start(t)) for t in reach_target_tasks(2, seed=1))
    jobs = [RolloutJob(0, 0, 1, a), RolloutJob(1, 0, 2, b), RolloutJob(0, 0, 3, a), RolloutJob(0, 0, 4, a)]
    starts, index = pickled_starts(jobs)
    assert len(starts) == 2
    part, needed = pickled_shard([jobs[1], jobs[2], jobs[3]], index)
    assert needed == [1, 0]  # b first, as the shard meets it
    out = load_shard(part, [starts[k] for k in needed])
    assert out == [jobs[1], jobs[2], jobs[3]]
    assert out[1].start is out[2].start and out[0].start is not out[1].start


@pytest.mark.integration  # listens on a port, starts a cluster
def test_a_local_cluster_prints_nothing_when_port_8787_is_taken():
    """The LocalCluster has no dashboard, but its scheduler's HTTP server took :8787 and
    warned "Port 8787 is already in use. Perhaps you already have a cluster running?"
    (four lines on the terminal) when another cluster (another collection) held it."""
    import socket
    import warnings

    taken = socket.socket()
    try:
        taken.bind(("", 8787))
        taken.listen()
    except OSError:
        pass  # held by another process: taken all the same
    try:
        with warnings.catch_warnings(record=True) as seen, DaskExecution(n_workers=1, processes=False) as ex:
            warnings.simplefilter("always")
            ex.client()
    finally:
        taken.close()
    assert not [str(w.message) for w in seen if "8787" in str(w.message)]


@pytest.mark.integration  # starts a cluster of worker processes
def test_a_worker_killed_holding_a_large_start_reruns_the_wave_to_the_same_rollouts():
    """A worker process killed (kill -9) mid-wave while it holds a large start (a task of
    its own, which the scheduler can compute again; the shards on the other worker may
    hold copies too): the wave's shards rerun to the rollouts in-process execution gives."""
    import os
    import signal
    import threading

    agent = Agent(DigitPolicy(latency_s=0.3), ReachTarget(), toy_format(), max_steps=6)
    blob = bytes(range(256)) * (APART_START_BYTES // 128)
    starts = [
        asyncio.run(agent.start(t)).evolve(workspace=MemoryWorkspace({"blob": blob + bytes([k])}))
        for k, t in enumerate(reach_target_tasks(4, seed=1))
    ]
    jobs = [RolloutJob(i // 4, 0, 1000 + i, starts[i // 4]) for i in range(16)]
    local = turns(asyncio.run(Execution().run(agent, jobs)))
    out: dict[str, Any] = {}
    with DaskExecution(n_workers=2, threads_per_worker=1, shard_size=4) as ex:
        client = ex.client()
        pids = client.run(os.getpid)
        wave = threading.Thread(target=lambda: out.update(rollouts=asyncio.run(ex.run(agent, jobs))))
        wave.start()
        deadline = time.monotonic() + 60
        while not (held := [w for k, ws in client.who_has().items() if "_held" in str(k) for w in ws]):
            assert time.monotonic() < deadline and wave.is_alive(), "no start was held"
            time.sleep(0.02)
        while not any(client.processing().values()):
            assert time.monotonic() < deadline and wave.is_alive(), "the shards never ran"
            time.sleep(0.02)
        os.kill(pids[held[0]], signal.SIGKILL)
        wave.join(timeout=90)
        assert not wave.is_alive(), "the wave did not finish after the worker was killed"
        assert pids[held[0]] not in client.run(os.getpid).values()  # it died (its nanny started another)
    assert turns(out["rollouts"]) == local


class BlobEnv(ReachTarget):
    """A toy env with a large attribute: its pickle is scattered to the workers."""

    def __init__(self, blob: bytes) -> None:
        super().__init__()
        self.blob = blob


@pytest.mark.integration  # starts a cluster of worker processes
def test_a_wave_whose_scattered_env_died_with_its_only_worker_reruns_to_the_same_rollouts():
    """A large env is scattered to the workers; killed with the only worker holding it (its
    nanny starts another), the wave failed with "FutureCancelledError: ... cancelled for
    reason: already forgotten". It is shipped once more, and its rollouts are in-process's."""
    import os
    import signal
    import threading

    from focus.dask_execution import INLINE_AGENT_BYTES

    # calls of 0.15 s: two shards of four rollouts, one after the other on the one worker
    # thread, outlast the kill 0.3 s after the first shard began
    agent = Agent(DigitPolicy(latency_s=0.15), BlobEnv(bytes(INLINE_AGENT_BYTES + 1)), toy_format(), max_steps=6)
    starts = [asyncio.run(agent.start(t)) for t in reach_target_tasks(2, seed=1)]
    jobs = [RolloutJob(i % 2, 0, 1000 + i, starts[i % 2]) for i in range(8)]
    local = turns(asyncio.run(Execution().run(agent, jobs)))
    out: dict[str, Any] = {}
    with DaskExecution(n_workers=1, threads_per_worker=1, shard_size=4) as ex:
        client = ex.client()
        assert turns(asyncio.run(ex.run(agent, jobs))) == local  # the env is scattered, and kept
        (pid,) = client.run(os.getpid).values()

        def wave() -> None:
            try:
                out["rollouts"] = asyncio.run(ex.run(agent, jobs))
            except Exception as e:  # noqa: BLE001 - the failure is what the test reports
                out["error"] = e

        runner = threading.Thread(target=wave)
        runner.start()
        deadline = time.monotonic() + 60
        while not any(client.processing().values()):
            assert time.monotonic() < deadline and runner.is_alive(), "the shards never ran"
            time.sleep(0.02)
        time.sleep(0.3)
        os.kill(pid, signal.SIGKILL)
        runner.join(timeout=90)
        assert not runner.is_alive(), "the wave did not finish after the worker was killed"
    assert "error" not in out, repr(out["error"])
    assert turns(out["rollouts"]) == local
