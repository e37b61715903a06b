"""DaskExecution: shards over a real LocalCluster (worker processes) give exactly the
rollouts in-process execution gives, in job order; a pickled copy reconnects."""

from __future__ import annotations

import asyncio
import pickle

import pytest
from fixtures.prefect import DigitPolicy

from focus.agent import Agent
from focus.dask_execution import DaskExecution
from focus.execution import Execution
from focus.search import RolloutJob
from focus.toy import ReachTarget, reach_target_tasks, toy_format

pytestmark = pytest.mark.timeout(120)


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
