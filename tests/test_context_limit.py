"""An episode that outgrows the model's context ends truncated, not failed.

vLLM (and the embedded server, which words it the same) refuses a request whose prompt
plus ``max_tokens`` exceeds the model's context length with a 400. The agent used to
record that as a failed leaf, whose segment gets no advantage: the turns the rollout
took since its checkpoint were lost to training. It is the same fact as the agent's own
``max_prompt_tokens``: the episode is longer than the model can read, so the rollout
ends in a truncated leaf that bootstraps on the critic, and the batch keeps its turns.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from aiohttp import web

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.backends.llamacpp import LlamaCppPolicy
from focus.backends.wire import is_context_limit
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import ContextLimit, SamplingParams
from focus.priority import Phase, Selective
from focus.toy import ReachTarget, reach_target_tasks, toy_format

pytestmark = pytest.mark.timeout(120)

#: Bytes of padding per observation: the embedded model reads 4,096 tokens (one per
#: byte), so the third or fourth model call of an episode no longer fits.
PAD = 1500


class Verbose(ReachTarget):
    """The toy with long observations (a tool that prints a page each step)."""

    async def step(self, state, action, workspace):  # type: ignore[no-untyped-def]
        result = await super().step(state, action, workspace)
        return type(result)(result.state, result.observation + "." * PAD, result.reward, result.done, result.info)


def test_servers_wording_of_a_prompt_over_the_context_is_recognised():
    vllm = "This model's maximum context length is 4096 tokens. However, you requested 4100 tokens"
    sglang = "The input (5000 tokens) is longer than the model's context length (4096 tokens)."
    openai = '{"error": {"code": "context_length_exceeded"}}'
    # vLLM's engine (vllm/v1/engine/input_processor.py), for a prompt that fills the context by itself
    engine = (
        "The decoder prompt (length 5000) is longer than the maximum model length of 4096. "
        "Make sure that `max_model_len` is no smaller than the number of text tokens."
    )
    full = "The decoder prompt (length 4096) plus the number of requested output tokens (at least 1) is longer than "
    full += "the maximum model length of 4096."
    # SGLang's scheduler (validate_input_length), where the KV cache holds less than the context
    pool = "Input length (5000 tokens) exceeds the maximum allowed length (4095 tokens). Use a shorter input or "
    pool += "enable --allow-auto-truncate."
    assert all(is_context_limit(400, text) for text in (vllm, sglang, openai, engine, full, pool))
    assert not is_context_limit(400, "The title exceeds the maximum allowed length of 80 characters.")
    assert is_context_limit(413, vllm)
    assert not is_context_limit(400, "invalid temperature -1")  # another refusal stays one
    assert not is_context_limit(404, vllm)  # a refused path or model name is never this


@pytest.mark.parametrize("backend", [OpenAICompatPolicy, SGLangPolicy])
def test_an_episode_past_the_context_ends_in_a_truncated_leaf(local_model_server, backend):
    policy = backend(local_model_server.url, vocab_size=ByteCodec.vocab_size, config=HttpConfig(outage_wait_s=0))
    agent = Agent(policy, Verbose(), toy_format(), max_steps=12, sampling=SamplingParams(max_tokens=8))
    # two continuation waves of 3: enough for checkpoints whose next prompt does not fit
    # to be met and not continued again (6 of them; a budget of 12 in waves of 4 met 10,
    # in a third more time: each prompt near the context is a long prefill)
    col = Collector(
        agent,
        search=Selective(
            phases=[Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=6, wave_size=3)]
        ),
        critic=ConstantCritic(0.5),
        estimator=DirectBranchTd(),
        execution=Execution(max_concurrency=4),
        collection_id="context",
        seed=1,
    )

    async def go():  # type: ignore[no-untyped-def]
        try:
            return await col.search(reach_target_tasks(1, seed=2, low=40, high=45))
        finally:
            await policy.aclose()

    state = asyncio.run(go())
    batch = col.prepare(state)
    (tree,) = state.trees
    leaves = [n for n in tree.nodes.values() if n.kind in ("truncated", "failed", "terminal")]
    assert len(leaves) >= 4  # targets of 40+ are not reached in the 2-3 turns that fit
    assert {(leaf.kind, leaf.cause) for leaf in leaves} == {("truncated", "context limit")}
    assert batch.stats["failed_rollouts"] == 0
    # a checkpoint whose next prompt does not fit is continued no more: each has at most
    # one child without a transition, and the continuation budget went to transitions
    empty = [tree.edges[e].parent for e in tree.edges if tree.edges[e].k == 0]
    assert empty and len(empty) == len(set(empty))
    assert state.usage(1).transitions >= 6
    # every turn before the refused call is in the batch, each prompt within the context
    assert batch.actor and all(len(r.prompt_ids) + 8 <= 4096 for r in batch.actor)
    assert max(len(r.prompt_ids) for r in batch.actor) > 4096 - PAD - 100


#: The context of the cutting server below: the third call of a Verbose episode is longer.
CUT_AT = 2500


async def cutting_server(upstream: str, cuts: list[int]) -> tuple[web.AppRunner, str]:
    """A server in front of the embedded one that does not refuse a prompt over its
    context of :data:`CUT_AT` tokens but keeps its first ones, as SGLang started with
    ``--allow-auto-truncate`` does (on ``/generate`` and ``/v1/completions``, which
    does not echo the prompt): the answer is a real sample, of the cut prompt, and its
    ``prompt_tokens`` say how many tokens it read. ``cuts``: the lengths it cut."""
    session = aiohttp.ClientSession()

    async def forward(request: web.Request) -> web.Response:
        body = await request.json()
        key = "input_ids" if request.path == "/generate" else "prompt"
        if len(body[key]) > CUT_AT:
            cuts.append(len(body[key]))
            body[key] = body[key][:CUT_AT]
        async with session.post(upstream + request.path, json=body) as resp:
            status, answer = resp.status, await resp.json()
        for choice in answer.get("choices", []) if isinstance(answer, dict) else []:
            choice.pop("prompt_token_ids", None)
        return web.json_response(answer, status=status)

    app = web.Application()
    app.router.add_post("/generate", forward)
    app.router.add_post("/v1/completions", forward)
    app.on_cleanup.append(lambda _: session.close())
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}"


@pytest.mark.parametrize("backend", [OpenAICompatPolicy, SGLangPolicy])
def test_a_server_that_cuts_a_prompt_over_its_context_ends_the_episode_truncated(local_model_server, backend):
    """The answer to a cut prompt was recorded as the next turn of the whole one: its
    tokens and log-probs belong to another context than the recorded one."""
    cuts: list[int] = []

    async def go():  # type: ignore[no-untyped-def]
        runner, url = await cutting_server(local_model_server.url, cuts)
        policy = backend(url, vocab_size=ByteCodec.vocab_size, config=HttpConfig(outage_wait_s=0))
        agent = Agent(policy, Verbose(), toy_format(), max_steps=12, sampling=SamplingParams(max_tokens=8))
        try:
            (task,) = reach_target_tasks(1, seed=2, low=40, high=45)
            return await agent.rollout(await agent.start(task), seed=3)
        finally:
            await policy.aclose()
            await runner.cleanup()

    rollout = asyncio.run(go())
    assert cuts  # the episode reached the cut
    assert (rollout.leaf.kind, rollout.leaf.cause) == ("truncated", "context limit")
    turns = rollout.turns
    assert len(turns) >= 2 and max(len(t.prompt_ids) for t in turns) <= CUT_AT


@pytest.mark.integration
def test_llama_server_out_of_context_during_an_answer_ends_the_episode_truncated(scripted):
    """llama-server's ``truncated``: the context ran out during the answer (with its
    context shift, the later tokens were sampled after a context missing its middle)."""
    answer = {
        "content": "ab",
        "tokens": [97, 98],
        "completion_probabilities": [{"id": 97, "logprob": -0.5}, {"id": 98, "logprob": -0.25}],
        "stop_type": "limit",
        "tokens_evaluated": 5,
        "truncated": True,
        "timings": {"cache_n": 0},
    }
    scripted.answers = [(200, {}, answer), (200, {}, {**answer, "truncated": False})]

    async def go():  # type: ignore[no-untyped-def]
        policy = LlamaCppPolicy(scripted.url, config=HttpConfig(outage_wait_s=0))
        try:
            with pytest.raises(ContextLimit, match=r"ran out of context during the answer .*\(truncated: "):
                await policy.sample([1, 2, 3, 4, 5], SamplingParams(max_tokens=2, seed=1))
            return await policy.sample([1, 2, 3, 4, 5], SamplingParams(max_tokens=2, seed=1))
        finally:
            await policy.aclose()

    completion = asyncio.run(go())
    assert (completion.token_ids, completion.logprobs, completion.finish_reason) == ((97, 98), (-0.5, -0.25), "length")
    assert len(scripted.paths) == 2  # not retried
