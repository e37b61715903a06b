"""The scale benchmark's arms without HTTP: what the rollout bucket costs apart from the client.

``benchmarks/scale.py`` runs each arm against the simulated server in its own process,
so each arm's CPU per transition moves with the machine's load by more than the
differences between FOCUS's rollout path and the loop's (0.30-0.53 ms/t within one
commit, benchmarks/README.md). Here the same arms (``scale.ARMS``, with their meters:
search and prepare timed apart, the rest is the rollout bucket) run in this process
against :class:`SimPolicy`, which answers each call as the simulated server would
(:func:`focus.testing.simserver.sample`: the same ids for the same seed and stop ids),
after one turn of the event loop instead of an HTTP round trip. The rollouts, plans
and batches are those of the HTTP run (same transitions and rollouts); what is left out
is the client, the sockets and the waiting, so the rollout bucket here is the agent,
the env, the execution service, the collector's glue and the event loop, and the arms
can be compared to a few microseconds per transition. :class:`SimPolicy` answers every
call alone, so what siblings save over HTTP by sharing a request (:mod:`focus.siblings`)
is not in these figures.

    python -m benchmarks.scale_inproc [--arms focus,tuned] [--transitions 10000] [--tasks 40] [--repeats 3]

Prints, per arm, the median over the repeats of CPU per transition (µs) in total and
per bucket and inside the cyclic garbage collector (in whichever bucket it ran), with
each repeat's rollout bucket, the mean prompt length per call, and the
transitions and rollouts (equal across repeats: the runs are deterministic).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Sequence
from typing import Any

from benchmarks import scale
from focus.agent import Agent
from focus.format import ByteCodec
from focus.policy import Completion, Policy, SamplingParams
from focus.testing.simserver import sample
from focus.toy import ReachTarget, reach_target_tasks, toy_format


class SimPolicy(Policy):
    """The simulated server's answers (``completion_tokens`` per call) in process."""

    def __init__(self, completion_tokens: int = 3) -> None:
        self.vocab_size = ByteCodec.vocab_size
        self.completion_tokens = completion_tokens
        self.calls = self.prompt_tokens = 0

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.check_prompt(prompt_ids)  # as the HTTP policy does before it sends
        self.calls += 1
        self.prompt_tokens += len(prompt_ids)
        await asyncio.sleep(0)  # one turn of the loop, as an answer arriving later takes
        ids, lps, finish = sample(
            prompt_ids, self.completion_tokens, params.max_tokens, params.stop_token_ids, params.seed
        )
        return Completion(tuple(ids), tuple(lps), finish)


def run_arm(arm: str, transitions: int, tasks: int, concurrency: int = 512) -> dict[str, Any]:
    """One arm in this process: CPU per transition (µs) in total and per bucket."""
    policy = SimPolicy()
    # the agent of benchmarks.engine.make_agent, over SimPolicy instead of HTTP
    agent = Agent(policy, ReachTarget(), toy_format(), max_steps=16, sampling=SamplingParams(max_tokens=8))
    todo = reach_target_tasks(tasks, seed=1, low=scale.TARGETS[0], high=scale.TARGETS[1])
    cfg = {"arm": arm, "transitions": transitions, "tasks": tasks, "concurrency": concurrency}
    with scale.GcMeter() as gc_meter:
        c0 = time.process_time()
        figures, _batch = scale.ARMS[arm](agent, todo, cfg)
        cpu = time.process_time() - c0
    n = max(1, figures["transitions"])
    search, prepare = sum(figures["search_cpu_s"].values()), figures["prepare_cpu_s"]
    return {
        "transitions": figures["transitions"],
        "rollouts": figures["rollouts"],
        "prompt_tokens_per_call": policy.prompt_tokens / max(1, policy.calls),
        "cpu_us": 1e6 * cpu / n,
        "rollout_us": 1e6 * (cpu - search - prepare) / n,
        "search_us": 1e6 * search / n,
        "prepare_us": 1e6 * prepare / n,
        # inside Python's cyclic collector, wherever it ran (in any bucket; the tuned arm's is off)
        "gc_us": 1e6 * gc_meter.cpu / n,
    }


def main(argv: list[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arms", default="focus,tuned", help="comma-separated: focus, baseline, tuned")
    ap.add_argument("--transitions", type=int, default=10_000)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=512)
    ap.add_argument("--repeats", type=int, default=3, help="the arms in turn, this many times")
    args = ap.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    scale.warm_up()
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    for _ in range(args.repeats):
        for arm in arms:
            runs[arm].append(run_arm(arm, args.transitions, args.tasks, args.concurrency))
    for arm, done in runs.items():
        med = {
            k: statistics.median(r[k] for r in done)
            for k in ("cpu_us", "rollout_us", "search_us", "prepare_us", "gc_us")
        }
        print(
            f"{arm}: {done[0]['transitions']} transitions, {done[0]['rollouts']} rollouts, "
            f"{done[0]['prompt_tokens_per_call']:.1f} prompt tokens per call; CPU µs per transition (median of "
            f"{len(done)}) {med['cpu_us']:.1f} = rollout {med['rollout_us']:.1f} + search {med['search_us']:.1f} "
            f"+ prepare {med['prepare_us']:.1f} (GC {med['gc_us']:.1f} of it all); rollout each run {[round(r['rollout_us'], 1) for r in done]}"
        )
    return runs


if __name__ == "__main__":
    main()
