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

#: The context of :func:`short_server` (``--max-model-len``): the embedded model reads
#: 4,096 tokens (one per byte), whose prefills near the end take seconds each; a quarter
#: of it is outgrown the same way, in a sixteenth of the attention work.
CONTEXT = 1024
#: Bytes of padding per observation: the third or fourth model call of an episode no
#: longer fits in :data:`CONTEXT`.
PAD = 400


@pytest.fixture(scope="module")
def short_server():  # type: ignore[no-untyped-def]
    """The embedded model served with a context of :data:`CONTEXT` tokens."""
    from focus.backends import LocalModelServer

    with LocalModelServer(extra_args=["--max-model-len", str(CONTEXT)]) as server:
        yield server


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


def test_a_context_shorter_than_the_weights_is_served_and_refused_past():
    """``--max-model-len`` (vLLM's flag): the engine refuses a prompt past it, in vLLM's
    words, and never serves more than the weights' own context."""
    from focus.tinylm.engine import Engine, EngineError, GenRequest
    from focus.tinylm.server import build_parser

    assert build_parser().parse_args(["--max-model-len", "1024"]).max_model_len == 1024
    served = {}
    for asked in (None, 10**6, CONTEXT):
        engine = Engine(max_model_len=asked)
        served[asked] = engine.max_len
        engine.close()
    assert served == {None: 4096, 10**6: 4096, CONTEXT: CONTEXT}
    engine = Engine(max_model_len=CONTEXT)
    try:
        engine.check(GenRequest((1,) * (CONTEXT - 8), max_tokens=8))
        with pytest.raises(EngineError, match=f"maximum context length is {CONTEXT} tokens") as refused:
            engine.check(GenRequest((1,) * (CONTEXT - 7), max_tokens=8))
        assert is_context_limit(400, str(refused.value))
    finally:
        engine.close()


@pytest.mark.integration
@pytest.mark.parametrize("backend", [OpenAICompatPolicy, SGLangPolicy])
def test_an_episode_past_the_context_ends_in_a_truncated_leaf(short_server, backend):
    policy = backend(short_server.url, vocab_size=ByteCodec.vocab_size, config=HttpConfig(outage_wait_s=0))
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
    assert batch.actor and all(len(r.prompt_ids) + 8 <= CONTEXT for r in batch.actor)
    assert max(len(r.prompt_ids) for r in batch.actor) > CONTEXT - PAD - 100


#: The context of the cutting server below: the third call of a Verbose episode is longer.
CUT_AT = 625


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


@pytest.mark.integration
@pytest.mark.parametrize("backend", [OpenAICompatPolicy, SGLangPolicy])
def test_a_server_that_cuts_a_prompt_over_its_context_ends_the_episode_truncated(short_server, backend):
    """The answer to a cut prompt was recorded as the next turn of the whole one: its
    tokens and log-probs belong to another context than the recorded one."""
    cuts: list[int] = []

    async def go():  # type: ignore[no-untyped-def]
        runner, url = await cutting_server(short_server.url, cuts)
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


# ---- a task whose opening prompt is over the context, among others ----


def _wordy(
    url: str,
    root: str,
    long: list[int],
    n_tasks: int = 4,
    wave_size: int = 2,
    kind: str = "selective",
    obs_pad: int = 0,
    transitions: int = 24,
) -> object:
    """A collection of the toy's tasks from :mod:`fixtures.wordy` (those at ``long`` over
    the embedded model's context at their opening prompt; with ``obs_pad``, every
    observation padded) through the pipeline's loop."""
    from tasks.config import load_config

    return load_config(
        overrides={
            "collection_id": "wordy",
            "model.kind": "openai",
            "model.url": url,
            "model.http": {"outage_wait_s": 0},
            "env.kind": "factory",
            "env.factory": "fixtures.wordy:wordy_env",
            "env.options": {"long": long, "obs_pad": obs_pad},
            "env.n_tasks": n_tasks,
            "agent.sampling.max_tokens": 8,
            "search.kind": kind,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 2},
                {"name": "continue", "transitions": transitions, "wave_size": wave_size},
            ],
            "execution.kind": "local",
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


#: (tasks over the context, search kind, wave size): with these, before, the refused roots
#: were started again (uniform), and a wave of nothing else stopped the collection (selective).
LEFT_OUT = [([1], "uniform", 4), ([1, 2, 3], "selective", 2)]


@pytest.mark.parametrize(("long", "kind", "wave_size"), LEFT_OUT)
def test_a_task_over_the_context_among_good_ones_is_left_out_in_one_line(
    local_model_server, tmp_path, caplog, long, kind, wave_size
):
    """A task whose opening prompt can never fit was started again (its root kept its
    branch state), and a wave of nothing else stopped the whole collection, though the
    other tasks had good data. Now it is refused once, named in one warning line, and
    the collection finishes with the other tasks' batch."""
    import logging

    from fixtures.journal import run_collect

    from storage import BatchStore

    cfg = _wordy(local_model_server.url, str(tmp_path), long=long, wave_size=wave_size, kind=kind)
    with caplog.at_level(logging.WARNING):
        out = run_collect(cfg)
    batch = BatchStore(str(tmp_path)).read(out["batch_url"])
    refused = [f"reach-0-{i}" for i in long]
    assert batch.stats["failed_rollouts"] == 2 * len(long)  # their evidence rollouts, and no restart after them
    assert batch.stats["refused_tasks"] == len(long) and batch.stats["refused_task_ids"] == refused
    assert {r.task_id for r in batch.actor} == {f"reach-0-{i}" for i in range(4)} - set(refused)
    assert batch.stats["transitions"] >= 24
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    named = [line for line in lines if refused[0] in line]
    assert len(named) == 1, lines
    head = f"{len(long)} task(s) left out, their opening prompt over the model's context: task 'reach-0-1' ("
    assert named[0].startswith(head), named[0]
    assert all(f"task {t!r} (50" in named[0] for t in refused) and "the limit is 4096" in named[0], named[0]
    assert "\n" not in named[0]


@pytest.mark.integration
def test_continuations_past_the_context_end_truncated_without_a_line_or_a_stop(short_server, tmp_path, caplog):
    """Every task's opening fits, but a page of output each step fills the context a few
    turns in: continuations from the deep checkpoints go over it. Each such rollout is
    counted truncated (its turns before kept), none failed, no task left out, no warning,
    and the collection finishes with every task's rows."""
    import logging

    from fixtures.journal import run_collect

    from storage import BatchStore

    cfg = _wordy(short_server.url, str(tmp_path), long=[], n_tasks=2, obs_pad=PAD)
    with caplog.at_level(logging.WARNING):
        out = run_collect(cfg)
    stats = BatchStore(str(tmp_path)).read(out["batch_url"]).stats
    continued = stats["phases"][1]  # the continuations, from checkpoints a few turns in
    assert continued["truncated_rollouts"] > 0 and continued["transitions"] >= 24, continued
    assert (
        stats["failed_rollouts"] == stats["excluded_segments"] == stats["refused_tasks"] == stats["failed_trees"] == 0
    )
    assert out["stats"]["tasks"] == 2
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_every_task_over_the_context_stops_the_collection_in_one_line(local_model_server, tmp_path):
    from fixtures.journal import run_collect

    from flows.errors import exit_code, one_line
    from focus.refusals import RequestsRefused
    from storage import CheckpointStore

    cfg = _wordy(local_model_server.url, str(tmp_path), long=[0, 1], n_tasks=2)
    with pytest.raises(RequestsRefused) as stopped:
        run_collect(cfg)
    line = one_line(stopped.value)
    assert line.startswith("every task's opening prompt (2 of 2) was refused as over the model's context: "), line
    assert "task 'reach-0-0' (" in line and "task 'reach-0-1' (" in line and "the limit is 4096" in line, line
    assert "\n" not in line and exit_code(stopped.value) == 2
    assert ("evidence", 0) not in CheckpointStore(str(tmp_path)).list("wordy")


def test_a_collection_with_a_task_over_the_context_resumes_to_the_uninterrupted_batch(local_model_server, tmp_path):
    """Planning reads the refused root from the trees alone (its branch state taken when
    it was grafted), so a collection stopped after a wave and resumed plans the same
    waves and writes the same batch, bit for bit."""
    from fixtures.journal import StopAfter, Stopped, run_collect

    from focus.journal import wave_step
    from storage import BatchStore

    url, ref, cut = local_model_server.url, str(tmp_path / "ref"), str(tmp_path / "cut")
    want = run_collect(_wordy(url, ref, long=[1], wave_size=4, kind="uniform"))
    cfg = _wordy(url, cut, long=[1], wave_size=4, kind="uniform")
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, 1)))
    got = run_collect(cfg)
    assert got["stats"]["steps_reused"] >= 2, got["stats"]
    fingerprint = BatchStore(ref).verify(want["batch_url"]).fingerprint
    assert BatchStore(cut).verify(got["batch_url"]).fingerprint == fingerprint


@pytest.mark.parametrize(("long", "code"), [([1], 0), ([0, 1, 2, 3], 2)])
def test_focus_collect_names_a_task_over_the_context_once_and_stops_only_when_every_task_is(
    local_model_server, tmp_path, long, code
):
    """What ``focus collect`` prints: one warning line naming a task left out (its
    failed rollouts not counted again in a failure line), the batch of the others and
    exit 0; with every task over the context, one error line and exit 2."""
    import json
    import subprocess
    import sys

    from fixtures.prefect import base_env

    args = ["collect", "--store", str(tmp_path / "runs"), "--model-url", local_model_server.url, "--tasks", "4"]
    args += ["--transitions", "24", "--set", "env.kind=factory", "--set", "env.factory=fixtures.wordy:wordy_env"]
    args += ["--set", f"env.options={json.dumps({'long': long})}", "--set", "agent.sampling.max_tokens=8"]
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        env=base_env(tmp_path / "prefect"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == code, done.stdout[-2000:] + done.stderr[-3000:]
    lines = [x for x in done.stderr.splitlines() if "reach-0-1" in x]
    assert len(lines) == 1, done.stderr[-3000:]
    if code == 0:
        assert lines[0].startswith("warning: 0.evidence: 1 task(s) left out, their opening prompt over the model"), (
            lines
        )
        assert "rollouts failed" not in done.stderr and "the collection goes on with the other 3" in lines[0]
        assert "refused_tasks" in done.stdout
    else:
        assert lines[0].startswith("error: every task's opening prompt (4 of 4) was refused"), lines


#: How a server words a prompt over its context (vLLM), as the agent's cause carries it.
OVER = "POST http://x/v1/completions was rejected with status 400: This model's maximum context length is 4096 tokens"


def test_a_task_refused_after_a_first_rollout_that_failed_otherwise_is_left_out_in_one_line(caplog):
    """Whether a task is over the context was read from its root's first rollout only: a
    first one that failed otherwise (a refusal of its own, the queue full) left the task
    counted as a failed tree, its root started again in later waves, each refused, each
    wave a failure line. The first refusal at the opening prompt, with no turn before it,
    decides."""
    import logging

    from fixtures.wordy import PAD, WordyReachTarget

    from focus.env import Task
    from focus.policy import PolicyError
    from focus.refusals import refused_task
    from focus.testing import ScriptedPolicy, run

    class QueueFullOnce(ScriptedPolicy):
        long_calls = 0

        async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
            if len(prompt_ids) > 4096:
                self.long_calls += 1
                if self.long_calls == 1:
                    raise PolicyError("POST http://x/v1/completions was rejected with status 400: request queue full")
                raise ContextLimit(f"{OVER}. However, you requested {len(prompt_ids) + 8} tokens")
            return await super().sample(prompt_ids, params)

    fmt = toy_format()
    tasks = reach_target_tasks(3, seed=0)
    tasks[1] = Task(tasks[1].id, {**tasks[1].data, "pad": PAD})
    policy = QueueFullOnce(["3", "4", "2"], fmt.codec)
    agent = Agent(policy, WordyReachTarget(), fmt, max_steps=6)
    phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=16, wave_size=3))
    col = Collector(agent, Selective(phases=phases), ConstantCritic(0.5), execution=Execution(max_concurrency=1))
    with caplog.at_level(logging.WARNING):
        state = run(col.search(tasks))
    stats = col.prepare(state).stats
    assert [refused_task(t) is not None for t in state.trees] == [False, True, False]
    assert stats["refused_task_ids"] == ["reach-0-1"] and stats["failed_rollouts"] == 2
    assert policy.long_calls == 2  # its two evidence rollouts; its root is not started again
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([line for line in lines if "left out" in line]) == 1, lines
    assert not [line for line in lines if line.startswith("phase continue")], lines
