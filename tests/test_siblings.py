"""Sibling rollouts' first calls in one request (focus.siblings): the grouping, the
policy's ``sample_siblings`` (vLLM's rule: sample ``i`` with ``seed + i``), the HTTP
client's one request and its once-per-policy check of the rule, and the batch of a
collection over HTTP, which must not depend on whether calls went together."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import httpx
import pytest

from focus.agent import Agent, derive_seed
from focus.backends import HttpConfig, OpenAICompatPolicy
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import Completion, Policy, SamplingParams
from focus.priority import Phase, Selective
from focus.search import rollout_seed
from focus.siblings import FIRST_GATHER_S, GATHER_SHARE, MAX_GATHER_S, SiblingCalls, consecutive_runs
from focus.testing import run
from focus.testing.simserver import SimConfig, SimServerProcess, sample
from focus.toy import ReachTarget, reach_target_tasks, toy_format

pytestmark = pytest.mark.timeout(120)

PROMPT = (72, 105, 33, 10)
OTHER = (72, 105, 63, 10)
PARAMS = SamplingParams(max_tokens=4, seed=1000, stop_token_ids=(10,))
FAST = HttpConfig(max_retries=1, backoff_s=0.001, backoff_max_s=0.01, timeout_s=5, adaptive_hedge=False)


def test_consecutive_runs() -> None:
    assert consecutive_runs([]) == []
    assert consecutive_runs([7]) == [[0]]
    assert consecutive_runs([5, 3, 4, 9, 10, 12]) == [[1, 2, 0], [3, 4], [5]]
    assert consecutive_runs([4, 4, 5]) == [[0], [1, 2]]  # a repeated seed starts a new run


def test_a_continuation_s_seed_is_its_checkpoint_s_plus_its_branch() -> None:
    base = rollout_seed(7, 2, 5, 0)
    assert [rollout_seed(7, 2, 5, b) for b in range(4)] == [base + b for b in range(4)]
    assert base == derive_seed(7, 2, 5) and rollout_seed(7, 2, 6, 0) != base


class Recording(Policy):
    """Answers every call with the simulated server's sample for its seed; records the
    calls (seed, route) and the sibling groups it was asked for."""

    groups_siblings = True

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, tuple[Hashable, ...]]] = []
        self.groups: list[list[int | None]] = []

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        raise AssertionError("the agent calls sample_on_route")

    async def sample_on_route(
        self, prompt_ids: Sequence[int], params: SamplingParams, route: tuple[Hashable, ...]
    ) -> Completion:
        self.calls.append((params.seed, route))
        await asyncio.sleep(0)
        ids, lps, finish = sample(prompt_ids, 3, params.max_tokens, params.stop_token_ids, params.seed)
        return Completion(tuple(ids), tuple(lps), finish)

    async def sample_siblings(
        self, prompt_ids: Sequence[int], params: SamplingParams, routes: Sequence[tuple[Hashable, ...]]
    ) -> list[Completion]:
        self.groups.append([None if params.seed is None else params.seed + i for i in range(len(routes))])
        return await super().sample_siblings(prompt_ids, params, routes)


def test_the_default_sample_siblings_is_one_call_per_seed() -> None:
    policy = Recording()
    routes = [("t", 1), ("t", 2), ("t", 3)]
    got = run(policy.sample_siblings(PROMPT, PARAMS, routes))
    assert policy.calls == [(1000, ("t", 1)), (1001, ("t", 2)), (1002, ("t", 3))]
    alone = [run(policy.sample_on_route(PROMPT, PARAMS.with_seed(1000 + i), ("x",))) for i in range(3)]
    assert got == alone and len({c.token_ids for c in got}) > 1


def test_calls_gathered_by_start_go_in_runs_of_consecutive_seeds() -> None:
    policy = Recording()

    async def go() -> list[Completion]:
        calls = SiblingCalls(policy, asyncio.get_running_loop())
        seeds = [1002, 1000, 7, 1001, 1004]  # 1000-1002 together; 1004 and 7 alone
        futures = [calls.sample(PROMPT, PARAMS.with_seed(s), ("t", s)) for s in seeds]
        other = calls.sample(OTHER, PARAMS.with_seed(1003), ("u", 1003))  # another prompt: alone
        return list(await asyncio.gather(*futures, other))

    got = run(go())
    assert policy.groups == [[1000, 1001, 1002]]
    assert sorted(s for s, _ in policy.calls) == [7, 1000, 1001, 1002, 1003, 1004]
    # each call got the sample of its own seed, and its own route went with it
    for c, p, s in zip(got, [PROMPT] * 5 + [OTHER], [1002, 1000, 7, 1001, 1004, 1003], strict=True):
        assert c.token_ids == tuple(sample(p, 3, 4, (10,), s)[0])
    assert ((1001, ("t", 1001))) in policy.calls


def test_the_gathering_follows_how_long_first_calls_take() -> None:
    class Slow(Recording):
        async def sample_on_route(self, prompt_ids, params, route):  # type: ignore[no-untyped-def]
            await asyncio.sleep(0.03)
            return await super().sample_on_route(prompt_ids, params, route)

    async def go() -> tuple[float, float, float, float]:
        calls = SiblingCalls(Slow(), asyncio.get_running_loop())
        first = calls.gather_s
        await calls.sample(PROMPT, PARAMS, ("t",))
        took, after = calls.call_s or 0.0, calls.gather_s
        calls.call_s = 60.0  # a call that took a minute: the wait stays bounded
        return first, took, after, calls.gather_s

    first, took, after, bounded = run(go())
    assert first == FIRST_GATHER_S
    assert took >= 0.03 and after == min(MAX_GATHER_S, GATHER_SHARE * took)  # a tenth of the call's time
    assert bounded == MAX_GATHER_S


def test_a_cancelled_sibling_leaves_the_others_their_answers() -> None:
    class Slow(Recording):
        started: list[int | None] = []

        async def sample_on_route(self, prompt_ids, params, route):  # type: ignore[no-untyped-def]
            self.started.append(params.seed)
            await asyncio.sleep(0.05)
            return await super().sample_on_route(prompt_ids, params, route)

    policy = Slow()

    async def sent(n: int) -> None:  # until n samples are with the model (not answered)
        while len(policy.started) < n:
            await asyncio.sleep(0.001)

    async def go() -> tuple[list[Any], list[Any]]:
        calls = SiblingCalls(policy, asyncio.get_running_loop())
        tasks = [asyncio.ensure_future(calls.sample(PROMPT, PARAMS.with_seed(s), (s,))) for s in (1, 2, 3)]
        await sent(3)
        tasks[1].cancel()
        some = await asyncio.gather(*tasks, return_exceptions=True)
        # every caller gone: the request is dropped, no answer is waited for
        lone = [asyncio.ensure_future(calls.sample(OTHER, PARAMS.with_seed(s), (s,))) for s in (8, 9)]
        await sent(5)
        for t in lone:
            t.cancel()
        rest = await asyncio.gather(*lone, return_exceptions=True)
        await asyncio.sleep(0.06)
        return some, rest

    some, rest = run(go())
    assert isinstance(some[1], asyncio.CancelledError)
    assert [c.token_ids for c in (some[0], some[2])] == [tuple(sample(PROMPT, 3, 4, (10,), s)[0]) for s in (1, 3)]
    assert all(isinstance(r, asyncio.CancelledError) for r in rest)
    assert [s for s, _ in policy.calls] == [1, 2, 3]  # the cancelled pair's request never reached the model


def test_a_failed_group_request_fails_each_call() -> None:
    class Broken(Recording):
        async def sample_siblings(self, prompt_ids, params, routes):  # type: ignore[no-untyped-def]
            raise RuntimeError("down")

    async def go() -> list[Any]:
        calls = SiblingCalls(Broken(), asyncio.get_running_loop())
        futures = [calls.sample(PROMPT, PARAMS.with_seed(s), (s,)) for s in (1, 2)]
        return list(await asyncio.gather(*futures, return_exceptions=True))

    assert [str(e) for e in run(go())] == ["down", "down"]


# -- the HTTP client against servers of each kind (in-process transport) ------------------


def server(rule: Callable[[int, int], int] | None, n_ok: bool = True) -> tuple[httpx.MockTransport, list[dict]]:
    """A completions server sampling choice ``j`` with ``rule(seed, j)`` (vLLM: ``seed +
    j``), one choice only when not ``n_ok``; records each request's body."""
    bodies: list[dict] = []

    def reply(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        bodies.append(body)
        n = body.get("n", 1) if n_ok else 1
        choices = []
        for j in range(n):
            seed = body["seed"] if rule is None else rule(body["seed"], j)
            ids, lps, finish = sample(body["prompt"], 3, body["max_tokens"], body.get("stop_token_ids", []), seed)
            tokens = [f"token_id:{t}" for t in ids]
            choices.append({"index": j, "finish_reason": finish, "logprobs": {"tokens": tokens, "token_logprobs": lps}})
        return httpx.Response(200, json={"model": "m", "choices": choices})

    return httpx.MockTransport(reply), bodies


def siblings_and_alone(transport: httpx.MockTransport, n: int = 3, config: HttpConfig = FAST) -> tuple[Any, Any, Any]:
    policy = OpenAICompatPolicy("http://127.0.0.1:1", config=config, transport=transport)

    async def go() -> tuple[list[Completion], list[Completion]]:
        try:
            together = await policy.sample_siblings(PROMPT, PARAMS, [("t", i) for i in range(n)])
            again = await policy.sample_siblings(PROMPT, PARAMS, [("t", i) for i in range(n)])
            assert again == together
            alone = [await policy.sample(PROMPT, PARAMS.with_seed(1000 + i)) for i in range(n)]
            return together, alone
        finally:
            await policy.aclose()

    together, alone = run(go())
    return together, alone, policy


def test_one_request_for_siblings_on_a_server_with_vllm_s_rule() -> None:
    transport, bodies = server(lambda seed, j: seed + j)
    together, alone, policy = siblings_and_alone(transport)
    assert [(c.token_ids, c.logprobs) for c in together] == [(c.token_ids, c.logprobs) for c in alone]
    # the first group: one request with n = 3 beside one alone for its last sample (the
    # check); the second group: one request; then the three alone
    sent = [(b.get("n"), b["seed"]) for b in bodies]
    assert sorted(sent[:2]) == [(1, 1002), (3, 1000)] and sent[2:] == [(3, 1000), (1, 1000), (1, 1001), (1, 1002)]
    assert policy.groups_siblings and all("http" in c.meta for c in together)


@pytest.mark.parametrize(
    ("rule", "n_ok", "why"),
    [(lambda seed, j: seed * 7 + j, True, "differs from a request with seed + 2"), (None, False, "it ignored n")],
)
def test_a_server_that_breaks_the_rule_gets_one_warning_and_calls_alone(rule, n_ok, why, caplog) -> None:  # type: ignore[no-untyped-def]
    transport, bodies = server(rule, n_ok)
    with caplog.at_level(logging.WARNING, logger="focus.backends.http_policy"):
        together, alone, policy = siblings_and_alone(transport)
    assert [(c.token_ids, c.logprobs) for c in together] == [(c.token_ids, c.logprobs) for c in alone]
    assert not policy.groups_siblings
    assert [r.getMessage() for r in caplog.records if why in r.getMessage()] and len(caplog.records) == 1
    assert [b.get("n") for b in bodies][2:] == [1] * 9  # after the check: every call alone


def test_group_siblings_off_sends_every_call_alone() -> None:
    transport, bodies = server(lambda seed, j: seed + j)
    together, alone, policy = siblings_and_alone(transport, config=FAST.model_copy(update={"group_siblings": False}))
    assert together == alone and not policy.groups_siblings
    assert [b.get("n") for b in bodies] == [1] * 9


# -- a collection over HTTP: the batch is the same whether calls went together ----------


SIM = SimConfig(slots=16, latency_s=0.005, completion_tokens=3)


def collect(url: str, group: bool) -> tuple[Any, int]:
    config = HttpConfig(max_retries=2, timeout_s=10, group_siblings=group)
    policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size, config=config)
    agent = Agent(policy, ReachTarget(), toy_format(), max_steps=8, sampling=SamplingParams(max_tokens=8))
    phases = (Phase("evidence", rollouts_per_task=3), Phase("continue", transitions=150, wave_size=24, max_depth=6))
    col = Collector(
        agent, Selective(phases=phases), ConstantCritic(0.5), execution=Execution(max_concurrency=24),
        collection_id="siblings", seed=4,
    )  # fmt: skip

    async def go() -> Any:
        try:
            return await col.collect(reach_target_tasks(6, seed=3))
        finally:
            await policy.aclose()

    return run(go()), policy.stats()["calls"]


@pytest.mark.integration
def test_a_collection_s_batch_does_not_depend_on_grouping() -> None:
    with SimServerProcess(SIM) as sim:
        together, sent_together = collect(sim.url, True)
        served_together = sim.stats()
        sim.reset()
        alone, sent_alone = collect(sim.url, False)
        served_alone = sim.stats()
    rows = lambda b: (b.actor, b.critic)  # noqa: E731
    assert rows(together) == rows(alone) and together.stats["failed_rollouts"] == 0
    calls = together.stats["model_calls"]
    assert served_alone["requests"] == sent_alone == calls
    # the evidence's three rollouts per task start together (at least those go as one
    # request, less one request beside the first to check vLLM's rule)
    assert served_together["requests"] == sent_together <= calls - 6 * 2 + 1


@pytest.mark.integration
def test_the_embedded_server_answers_siblings_bit_for_bit_as_alone(local_model_server) -> None:  # type: ignore[no-untyped-def]
    from focus.env import Message
    from focus.toy import opening_text

    prompt = ByteCodec().render([Message("user", opening_text(17))])
    params = SamplingParams(max_tokens=6, seed=41)
    policy = OpenAICompatPolicy(local_model_server.url, vocab_size=ByteCodec.vocab_size, config=FAST)

    async def go() -> tuple[list[Completion], list[Completion]]:
        try:
            together = await policy.sample_siblings(prompt, params, [("t", i) for i in range(4)])
            return together, [await policy.sample(prompt, params.with_seed(41 + i)) for i in range(4)]
        finally:
            await policy.aclose()

    together, alone = run(go())
    assert policy.groups_siblings  # the rule held at the check
    assert [(c.token_ids, c.logprobs, c.finish_reason) for c in together] == [
        (c.token_ids, c.logprobs, c.finish_reason) for c in alone
    ]
    assert len({c.token_ids for c in together}) > 1
