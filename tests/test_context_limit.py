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

import pytest

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.backends.wire import is_context_limit
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.format import ByteCodec
from focus.policy import SamplingParams
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
    assert all(is_context_limit(400, text) for text in (vllm, sglang, openai, engine, full))
    assert is_context_limit(413, vllm)
    assert not is_context_limit(400, "invalid temperature -1")  # another refusal stays one
    assert not is_context_limit(404, vllm)  # a refused path or model name is never this


@pytest.mark.parametrize("backend", [OpenAICompatPolicy, SGLangPolicy])
def test_an_episode_past_the_context_ends_in_a_truncated_leaf(local_model_server, backend):
    policy = backend(local_model_server.url, vocab_size=ByteCodec.vocab_size, config=HttpConfig(outage_wait_s=0))
    agent = Agent(policy, Verbose(), toy_format(), max_steps=12, sampling=SamplingParams(max_tokens=8))
    col = Collector(
        agent,
        search=Selective(phases=[Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=12, wave_size=4)]),
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
    assert state.usage(1).transitions >= 12
    # every turn before the refused call is in the batch, each prompt within the context
    assert batch.actor and all(len(r.prompt_ids) + 8 <= 4096 for r in batch.actor)
    assert max(len(r.prompt_ids) for r in batch.actor) > 4096 - PAD - 100
