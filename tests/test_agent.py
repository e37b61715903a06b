"""Agent rollouts with a scripted policy: turns recorded exactly, checkpoints, failures."""

from __future__ import annotations

import pickle

from focus.agent import Agent
from focus.branching import EveryDecision, SparseCheckpoints
from focus.context import AppendOnly, Segments
from focus.env import Env, Message, Reset, Task
from focus.format import ByteCodec, PolicyFormat, XmlToolCallParser
from focus.policy import Completion
from focus.testing import ScriptedPolicy, run
from focus.tools import Tool, ToolEnv
from focus.workspace import MemoryWorkspace


async def _note(args, ctx):
    ctx.workspace.write_text(f"notes/{len(ctx.workspace.list())}", args["text"])
    return f"saved {len(ctx.workspace.list())} notes"


def make_env() -> ToolEnv:
    note = Tool(
        "note",
        "save a note",
        {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
        _note,
    )
    return ToolEnv(
        [note], judge=lambda task, ans: float(ans == task.data["answer"]), workspace_factory=lambda t: MemoryWorkspace()
    )


CALL = '<tool_call>{"name": "note", "arguments": {"text": "x"}}</tool_call>'
TASK = Task("t1", {"prompt": "say 42", "answer": "42"})


def test_tool_rollout_is_token_exact_over_many_turns():
    codec = ByteCodec()
    policy = ScriptedPolicy([CALL] * 5 + ["<answer>42</answer>"], codec)
    agent = Agent(
        policy,
        make_env(),
        PolicyFormat(codec, XmlToolCallParser()),
        context=Segments(),
        branch_points=EveryDecision(),
        max_steps=10,
    )
    root = run(agent.start(TASK))
    ro = run(agent.rollout(root, seed=0))
    turns = ro.turns
    assert [p.kind for p in ro.pieces] == ["checkpoint"] * 5 + ["terminal"]
    assert len(turns) == 6 and turns[-1].reward == 1.0
    # each prompt is exactly the previous prompt + completion + observation ids
    for a, b in zip(turns, turns[1:], strict=False):
        assert b.prompt_ids[: len(a.prompt_ids) + len(a.completion_ids)] == a.prompt_ids + a.completion_ids
    # the policy was sent exactly the recorded prompts
    assert policy.prompts == [t.prompt_ids for t in turns]
    # the checkpoint's recorded prefix is the prompt of the next turn
    assert ro.pieces[2].state.context.prompt_ids == turns[3].prompt_ids
    # the workspace at each checkpoint is a snapshot, not shared with the live branch
    assert len(ro.pieces[0].state.workspace.list()) == 1
    assert len(ro.pieces[3].state.workspace.list()) == 4


def test_continuation_resends_checkpoint_prefix_and_forks_workspace():
    codec = ByteCodec()
    policy = ScriptedPolicy([CALL, CALL, "<answer>7</answer>"], codec)
    agent = Agent(policy, make_env(), PolicyFormat(codec, XmlToolCallParser()), max_steps=10)
    ro = run(agent.rollout(run(agent.start(TASK)), seed=0))
    cp = pickle.loads(pickle.dumps(ro.pieces[0].state))  # survives a trip through bytes
    policy.prompts.clear()
    ro2 = run(agent.rollout(cp, seed=1))
    assert policy.prompts[0] == cp.context.prompt_ids
    assert ro2.turns[0].prompt_ids == ro.turns[1].prompt_ids
    assert cp.workspace.list() == ["notes/0"]  # the continuation forked it


def test_parse_errors_become_observations_and_max_steps_truncates():
    codec = ByteCodec()
    agent = Agent(
        ScriptedPolicy(["<tool_call>{bad json</tool_call>"], codec),
        make_env(),
        PolicyFormat(codec, XmlToolCallParser()),
        branch_points=SparseCheckpoints(every=2),
        max_steps=4,
    )
    ro = run(agent.rollout(run(agent.start(TASK)), seed=0))
    assert ro.leaf.kind == "truncated" and ro.counters["parse_errors"] == 4
    assert all(not t.transition for t in ro.turns)
    assert "not valid JSON" in codec.decode(ro.turns[1].prompt_ids)
    assert [p.kind for p in ro.pieces] == ["checkpoint", "truncated"]


class _Broken(Env):
    async def reset(self, task, workspace):
        return Reset(0, (Message("user", "hi"),))

    async def step(self, state, action, workspace):
        return {"not": "a StepResult"}


def test_env_returning_wrong_type_fails_the_rollout_with_cause():
    codec = ByteCodec()
    agent = Agent(ScriptedPolicy(["Answer: 1"], codec), _Broken(), PolicyFormat(codec, XmlToolCallParser()))
    ro = run(agent.rollout(run(agent.start(TASK)), seed=0))
    assert ro.leaf.kind == "failed" and "expected StepResult" in ro.leaf.cause


def test_append_only_renders_same_ids_as_segments_for_byte_codec():
    codec = ByteCodec()
    outs = []
    for ctx in (AppendOnly(), Segments()):
        agent = Agent(
            ScriptedPolicy([CALL, "<answer>42</answer>"], codec),
            make_env(),
            PolicyFormat(codec, XmlToolCallParser()),
            context=ctx,
        )
        outs.append([t.prompt_ids for t in run(agent.rollout(run(agent.start(TASK)), seed=0)).turns])
    assert outs[0] == outs[1]


def test_summarize_compacts_with_the_summary_ids_verbatim_and_no_transition():
    from focus.context import Summarize

    codec = ByteCodec()
    policy = ScriptedPolicy([CALL, CALL, "SUMMARY-\xff", "<answer>42</answer>"], codec)
    agent = Agent(
        policy,
        make_env(),
        PolicyFormat(codec, XmlToolCallParser()),
        context=Summarize(max_prompt_tokens=400, train_on_summary=True),
        branch_points=EveryDecision(),
        max_steps=10,
    )
    root = run(agent.start(TASK))
    assert len(root.context.prompt_ids) < 400
    ro = run(agent.rollout(root, seed=0))
    kinds = [t.kind for t in ro.turns]
    assert kinds == ["action", "action", "compaction", "action"], kinds
    comp, after = ro.turns[2], ro.turns[3]
    assert not comp.transition and comp.loss_mask == 1  # train_on_summary
    # the compaction prompt asks for a summary of the full context
    assert comp.prompt_ids[: len(ro.turns[1].prompt_ids)] == ro.turns[1].prompt_ids
    # the next prompt restarts from the opening messages and carries the summary ids verbatim
    opening = codec.render(root.context.opening, add_generation_prompt=False)
    assert after.prompt_ids[: len(opening)] == tuple(opening)
    start = after.prompt_ids.index(codec.ASSISTANT, len(opening))
    assert after.prompt_ids[start + 1 : start + 1 + len(comp.completion_ids)] == comp.completion_ids
    assert len(after.prompt_ids) < len(comp.prompt_ids)
    assert ro.leaf.kind == "terminal" and sum(t.transition for t in ro.turns) == 3


def test_summarize_does_not_compact_again_before_the_model_acted():
    # a threshold under the opening + summary: compacting a context that holds only the
    # last summary cannot shrink it, and compactions back to back left the episode no
    # step to act in (every step after the first a compaction, until max_steps)
    from focus.context import Summarize

    codec = ByteCodec()
    policy = ScriptedPolicy([CALL, "SUMMARY", CALL, "SUMMARY", "<answer>42</answer>"], codec)
    agent = Agent(
        policy,
        make_env(),
        PolicyFormat(codec, XmlToolCallParser()),
        context=Summarize(max_prompt_tokens=10),
        max_steps=8,
    )
    root = run(agent.start(TASK))
    assert len(root.context.prompt_ids) > 10  # the opening alone passes the threshold
    ro = run(agent.rollout(root, seed=0))
    kinds = [t.kind for t in ro.turns]
    assert kinds == ["action", "compaction", "action", "compaction", "action"], kinds
    assert ro.leaf.kind == "terminal" and ro.turns[-1].reward == 1.0


class _OutOfVocab(ScriptedPolicy):
    """Answers with one id past the byte codec's vocabulary after the scripted text."""

    async def sample(self, prompt_ids, params):
        c = await super().sample(prompt_ids, params)
        return Completion(
            (*c.token_ids[:-1], self.vocab_size + 7, c.token_ids[-1]), (*c.logprobs, 0.0), c.finish_reason
        )


def test_sampled_id_outside_the_vocabulary_fails_the_rollout_naming_it():
    codec = ByteCodec()
    policy = _OutOfVocab(["Answer: 1"], codec)
    assert policy.vocab_size == codec.vocab_size
    agent = Agent(policy, _Broken(), PolicyFormat(codec, XmlToolCallParser()))
    ro = run(agent.rollout(run(agent.start(TASK)), seed=0))
    assert ro.leaf.kind == "failed" and not ro.turns
    assert f"sampled token id {codec.vocab_size + 7}" in ro.leaf.cause and "outside the vocabulary" in ro.leaf.cause


def test_with_seed_makes_the_copy_model_copy_makes():
    from focus.policy import SamplingParams

    class Tuned(SamplingParams):
        pass

    for base in (SamplingParams(max_tokens=8, stop_token_ids=(3,)), SamplingParams(seed=4), Tuned(top_p=0.5)):
        for seed in (7, None):
            fast, slow = base.with_seed(seed), base.model_copy(update={"seed": seed})
            assert type(fast) is type(slow)
            assert fast == slow and hash(fast) == hash(slow) and fast.seed == seed
            assert fast.model_fields_set == slow.model_fields_set
            assert fast.model_dump(exclude_unset=True) == slow.model_dump(exclude_unset=True)
            assert fast is not base and base.with_seed(base.seed) == base
            if type(base) is SamplingParams:  # a local subclass does not pickle
                assert pickle.loads(pickle.dumps(fast)) == slow


def test_env_steps_that_suspend_finish_fail_or_time_out_as_without_the_fast_path():
    """A step that never suspends skips the timer; one that suspends runs under it."""
    import asyncio

    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Suspends(ReachTarget):  # suspends twice, then answers what ReachTarget answers
        async def step(self, state, action, workspace):
            await asyncio.sleep(0)
            await asyncio.sleep(0.001)
            return await super().step(state, action, workspace)

    class FailsLate(ReachTarget):
        async def step(self, state, action, workspace):
            await asyncio.sleep(0)
            raise ValueError("broken after a suspension")

    class Hangs(ReachTarget):
        async def step(self, state, action, workspace):
            await asyncio.sleep(0)
            await asyncio.sleep(30)

    class Future(ReachTarget):  # step returns an awaitable that is not a coroutine
        def step(self, state, action, workspace):
            return asyncio.ensure_future(ReachTarget.step(self, state, action, workspace))

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]

    def rollout(env, timeout_s=5.0):
        codec = toy_format().codec
        agent = Agent(ScriptedPolicy(["5", "4", "3"], codec), env, toy_format(), env_timeout_s=timeout_s)

        async def go():
            return await agent.rollout(await agent.start(task), seed=0)

        return run(go())

    plain = rollout(ReachTarget())
    assert [t.reward for t in plain.turns] == [0.0, 0.0, 1.0] and plain.leaf.kind == "terminal"
    for env in (Suspends(), Future()):
        other = rollout(env)
        assert other.turns == plain.turns and [p.kind for p in other.pieces] == [p.kind for p in plain.pieces]
    assert rollout(FailsLate()).leaf.cause == "env: ValueError: broken after a suspension"
    hung = rollout(Hangs(), timeout_s=0.05)
    assert hung.leaf.kind == "failed" and hung.leaf.cause == "env: step timed out after 0.05 s"


def test_an_env_s_own_timeout_error_is_named_as_raised_not_as_the_step_timeout():
    """A ``TimeoutError`` the env raises itself (its HTTP client's, ``socket.timeout``)
    is the env's failure: the cause names it, not ``env_timeout_s``, which never ran out."""
    import asyncio

    import pytest

    from focus.env import EnvError
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class OwnTimeout(ReachTarget):
        def __init__(self, suspend: bool) -> None:
            super().__init__()
            self.suspend = suspend

        async def step(self, state, action, workspace):
            if self.suspend:
                await asyncio.sleep(0)
            raise TimeoutError("search API did not answer in 2 s")

    class ResetTimesOut(ReachTarget):
        async def reset(self, task, workspace):
            await asyncio.sleep(0)
            raise TimeoutError("sandbox did not boot in 3 s")

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]
    for env in (OwnTimeout(False), OwnTimeout(True)):
        agent = Agent(ScriptedPolicy(["5"], ByteCodec()), env, toy_format(), env_timeout_s=60.0)

        async def go(agent=agent):
            return await agent.rollout(await agent.start(task), seed=0)

        leaf = run(go()).leaf
        assert leaf.kind == "failed" and leaf.cause == "env: TimeoutError: search API did not answer in 2 s"
    agent = Agent(ScriptedPolicy(["5"], ByteCodec()), ResetTimesOut(), toy_format(), env_timeout_s=60.0)
    with pytest.raises(EnvError) as e:
        run(agent.start(task))
    assert str(e.value) == f"ResetTimesOut.reset of task {task.id!r} failed: TimeoutError: sandbox did not boot in 3 s"

    class Hangs(ReachTarget):
        async def reset(self, task, workspace):
            await asyncio.sleep(30)

    agent = Agent(ScriptedPolicy(["5"], ByteCodec()), Hangs(), toy_format(), env_timeout_s=0.05)
    with pytest.raises(EnvError, match=r"^Hangs.reset of task .* timed out after 0.05 s$"):
        run(agent.start(task))


def test_a_synchronous_env_or_an_unknown_role_fails_naming_the_env_and_what_to_change():
    """``def step`` instead of ``async def step`` failed every rollout with ``TypeError:
    object StepResult can't be used in 'await' expression``; an opening message with a
    role the codec lacks stopped the collection with a bare ``ValueError`` of the codec's."""
    import pytest

    from focus.env import EnvError, StepResult
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class SyncStep(ReachTarget):
        def step(self, state, action, workspace):
            return StepResult(state, "ok", 0.0, True)

    class SyncReset(ReachTarget):
        def reset(self, task, workspace):
            return Reset(None, (Message("user", "hi"),))

    class EnvRole(ReachTarget):
        async def reset(self, task, workspace):
            return Reset((await super().reset(task, workspace)).state, (Message("environment", "hi"),))

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]

    def agent(env):
        return Agent(ScriptedPolicy(["5"], ByteCodec()), env, toy_format())

    a = agent(SyncStep())
    leaf = run(a.rollout(run(a.start(task)), seed=0)).leaf
    assert leaf.kind == "failed"
    assert leaf.cause == "env: SyncStep.step returned StepResult, not an awaitable: declare it `async def`"
    with pytest.raises(EnvError) as e:
        run(agent(SyncReset()).start(task))
    assert str(e.value) == f"task {task.id!r}: SyncReset.reset returned Reset, not an awaitable: declare it `async def`"
    with pytest.raises(EnvError) as e:
        run(agent(EnvRole()).start(task))
    assert str(e.value).startswith(f"the opening messages EnvRole.reset gave task {task.id!r} do not render: ")
    assert "ByteCodec has no role 'environment'" in str(e.value)


def test_a_rollout_s_nodes_count_the_transitions_from_the_root():
    """``Tree.add_node`` counts a segment's task transitions itself (``Edge.k``'s count,
    without its generator): each node's ``transitions`` is its parent's plus its
    segment's, and the nodes and edges are those their constructors make."""
    from focus.tree import Edge, Node, Tree, Turn

    codec = ByteCodec()
    policy = ScriptedPolicy([CALL] * 3 + ["<answer>42</answer>"], codec)
    agent = Agent(policy, make_env(), PolicyFormat(codec, XmlToolCallParser()), branch_points=EveryDecision())
    ro = run(agent.rollout(run(agent.start(TASK)), seed=0))
    compaction = Turn((1,), (2,), (-0.5,), 0, "stop", "compaction", 0.0, False)
    tree = Tree.new(TASK.id, None)
    parent = 0
    for p in ro.pieces:
        parent = tree.add_node(parent, p.turns, p.kind, steps=p.steps, context_ids=p.context_ids, rollout=0).id
    tree.add_node(parent - 1, (compaction, *ro.pieces[-1].turns), "terminal", steps=9, rollout=1)
    assert [n.transitions for n in tree.nodes.values()] == [0, 1, 2, 3, 4, 4]
    for n in tree.nodes.values():
        if n.parent_edge is not None:
            e = tree.edges[n.parent_edge]
            assert n.transitions == tree.nodes[e.parent].transitions + e.k
            assert e == Edge(e.id, e.parent, e.child, e.turns, e.rollout)
            made = Node(n.id, e.id, n.depth, n.transitions, n.steps, n.kind, n.context_ids, cause=n.cause)
            made.children = list(n.children)
            assert n == made
            assert pickle.dumps(e) == pickle.dumps(Edge(e.id, e.parent, e.child, e.turns, e.rollout))


def test_an_env_s_bad_info_or_undecodable_observation_fails_its_rollout_keeping_earlier_segments():
    """Found after the step (the tool-error count, the codec encoding the observation),
    they failed the rollout's job: every finished segment lost, a bare
    AttributeError/UnicodeEncodeError as the cause. A step raising an exception without
    a message is named by its type alone (it read 'env: RuntimeError: ')."""
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class BadAt2(ReachTarget):
        def __init__(self, bad):
            super().__init__()
            self.bad = bad

        async def step(self, state, action, workspace):
            result = await super().step(state, action, workspace)
            if state.turns == 1:
                if self.bad == "raise":
                    raise RuntimeError()
                return result.__class__(**{**result.__dict__, **self.bad})
            return result

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]
    codec = toy_format().codec
    causes = {}
    for name, bad in (
        ("info", {"info": None}),
        ("count", {"info": {"tool_error": "yes"}}),
        ("text", {"observation": b"\xff".decode(errors="surrogateescape")}),
        ("raise", "raise"),
    ):
        agent = Agent(ScriptedPolicy(["5", "4", "3"], codec), BadAt2(bad), toy_format(), branch_points=EveryDecision())
        ro = run(agent.rollout(run(agent.start(task)), seed=0))
        assert [p.kind for p in ro.pieces] == ["checkpoint", "failed"], name
        assert len(ro.pieces[0].turns) == 1, name  # the first step's segment is kept
        causes[name] = ro.leaf.cause
    assert causes == {
        "info": "env: BadAt2.step returned info=None, expected a mapping (a dict; {} for none)",
        "count": "env: BadAt2.step returned info['tool_error']='yes', expected a number of tool failures",
        "text": (
            "env: BadAt2.step returned an observation that is not valid text: '\\udcff' at character 0 is a lone "
            "surrogate (bytes decoded with errors='surrogateescape'?); decode such bytes with errors='replace'"
        ),
        "raise": "env: RuntimeError",
    }


def test_an_env_step_s_own_exception_keeps_its_traceback_in_a_debug_record(caplog):
    """A rollout's cause is one line ('env: KeyError: ...'), naming neither the env nor
    where in it the exception came from; the traceback goes to a DEBUG record of
    ``focus.agent`` (``-vv`` on the command line), so a user debugging the env finds it."""
    import logging

    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Buggy(ReachTarget):
        async def step(self, state, action, workspace):
            return {}["missing_key_in_buggy_step"]

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]
    agent = Agent(ScriptedPolicy(["5"], toy_format().codec), Buggy(), toy_format())
    with caplog.at_level(logging.DEBUG, logger="focus.agent"):
        ro = run(agent.rollout(run(agent.start(task)), seed=0))
    assert ro.leaf.cause == "env: KeyError: 'missing_key_in_buggy_step'"
    (record,) = [r for r in caplog.records if r.name == "focus.agent" and r.exc_info]
    assert record.levelno == logging.DEBUG and "Buggy.step raised" in record.getMessage()
    assert 'return {}["missing_key_in_buggy_step"]' in caplog.text  # the env's own line, from its traceback


def test_an_opening_prompt_over_max_prompt_tokens_fails_its_rollout_as_the_server_s_refusal_does():
    """Over the agent's ``max_prompt_tokens`` at the root, a rollout was a truncated leaf
    without a turn: no failure and no cause, an empty batch with ``truncated_rollouts``
    alone, where the same prompt refused by the server's context fails naming it
    (docs/operations.md). A later prompt over the limit still ends truncated."""
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Verbose(ReachTarget):
        async def step(self, state, action, workspace):
            result = await super().step(state, action, workspace)
            return type(result)(result.state, result.observation + "." * 200, result.reward, result.done)

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]
    codec = toy_format().codec
    opening = len(run(Agent(ScriptedPolicy(["5"], codec), Verbose(), toy_format()).start(task)).context.prompt_ids)

    def rollout(limit):
        agent = Agent(ScriptedPolicy(["5", "4", "3"], codec), Verbose(), toy_format(), max_prompt_tokens=limit)
        return run(agent.rollout(run(agent.start(task)), seed=0))

    root = rollout(opening - 1)
    assert root.leaf.kind == "failed" and not root.turns
    assert root.leaf.cause == f"model: the prompt has {opening} tokens, over max_prompt_tokens {opening - 1}"
    later = rollout(opening + 100)
    assert later.leaf.kind == "truncated" and later.leaf.cause == "context limit" and len(later.turns) == 1


def test_a_policy_that_knows_no_vocabulary_is_checked_against_the_codec_s():
    """``OpenAICompatPolicy(url)`` without ``vocab_size``, as the README builds it: an
    id of another tokenizer failed ``ByteCodec.decode`` outside the rollout's guard (the
    job failed, its finished segments lost, cause 'error: ValueError') and went silently
    into the next prompt and the batch with ``HFChatCodec`` (tests/test_hf_codec.py).
    Now it is a bad response, as where the policy knows its vocabulary."""
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Foreign(ScriptedPolicy):  # the second answer holds an id of a larger vocabulary
        async def sample(self, prompt_ids, params):
            c = await super().sample(prompt_ids, params)
            if len(self.prompts) > 1:
                c = Completion((70000, *c.token_ids), (-1.0, *c.logprobs), c.finish_reason)
            return c

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]
    codec = toy_format().codec
    policy = Foreign(["5", "4", "3"], codec)
    policy.vocab_size = None  # it does not know the vocabulary
    agent = Agent(policy, ReachTarget(), toy_format(), branch_points=EveryDecision())
    ro = run(agent.rollout(run(agent.start(task)), seed=0))
    assert [p.kind for p in ro.pieces] == ["checkpoint", "failed"] and len(ro.turns) == 1
    assert ro.leaf.cause == (
        "bad response: sampled token id 70000 at position 0 is outside the vocabulary [0, 263) "
        "(does the model match the codec?)"
    )


def test_a_completion_s_policy_version_that_is_a_number_is_recorded_as_text():
    """A custom policy's ``Completion(..., policy_version=7)`` ran the whole collection,
    then the batch refused it ("column 'policy_version': Expected bytes, got a 'int'
    object"); the policy's own version was read with str() already."""
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Numbered(ScriptedPolicy):
        async def sample(self, prompt_ids, params):
            c = await super().sample(prompt_ids, params)
            return Completion(c.token_ids, c.logprobs, c.finish_reason, policy_version=7)

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]
    agent = Agent(Numbered(["5", "4", "3"], toy_format().codec), ReachTarget(), toy_format())
    ro = run(agent.rollout(run(agent.start(task)), seed=0))
    assert [t.policy_version for t in ro.turns] == ["7", "7", "7"]


def test_a_completion_s_token_ids_must_be_integers_and_a_custom_policy_s_floats_are_a_bad_response():
    """A custom policy's ``tuple(tensor.float())`` ids failed every rollout's job in the
    codec's decode ('float' object cannot be interpreted as an integer), a warning line
    each, naming neither the policy nor the id; a bool went into the batch as 1."""
    import numpy as np
    import pytest
    import torch

    from focus.policy import BadResponse

    for ids in ((53, 257), tuple(np.array([53, 257])), tuple(torch.tensor([53, 257]))):
        assert Completion(ids, (-1.0, -1.0)).token_ids == ids  # numpy's and torch's integers read as ids
    for ids, said in (((53.0, 257), "53.0"), (tuple(torch.tensor([53.0, 257.0])), "tensor"), ((True, 257), "True")):
        with pytest.raises(BadResponse, match=rf"^completion has token id {said}.* at position 0, not an integer"):
            Completion(ids, (-1.0, -1.0))
    for lp in (None, "-1.0"):  # a TypeError that named no log-prob: "must be real number, not NoneType"
        with pytest.raises(BadResponse, match=rf"^completion has an invalid log-prob {lp!r}, not a number"):
            Completion((53,), (lp,))

    class Floats(ScriptedPolicy):
        async def sample(self, prompt_ids, params):
            c = await super().sample(prompt_ids, params)
            return Completion(tuple(float(t) for t in c.token_ids), c.logprobs, c.finish_reason)

    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    agent = Agent(Floats(["5"], toy_format().codec), ReachTarget(), toy_format())
    ro = run(agent.rollout(run(agent.start(reach_target_tasks(1, seed=3)[0])), seed=0))
    assert ro.leaf.kind == "failed"
    assert ro.leaf.cause == "bad response: completion has token id 53.0 at position 0, not an integer"


def test_a_cancelled_error_of_the_env_s_own_fails_its_rollout_and_a_real_cancel_still_cancels():
    """A CancelledError raised by env code while its rollout was not being cancelled (a
    library's cancel scope, a future cancelled elsewhere) stopped the whole collection
    as a bare CancelledError, read as an interrupt; it is the env's failure now, the
    rollout's earlier segments kept. Cancelling the rollout still cancels it."""
    import asyncio

    import pytest

    from focus.env import EnvError
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Cancels(ReachTarget):
        def __init__(self, where):
            super().__init__()
            self.where = where

        async def reset(self, task, workspace):
            if self.where == "reset":
                raise asyncio.CancelledError("scope closed")
            return await super().reset(task, workspace)

        async def step(self, state, action, workspace):
            if self.where == "hang" and state.turns == 1:
                await asyncio.sleep(30)
            if self.where == "step" and state.turns == 1:
                await asyncio.sleep(0)
                raise asyncio.CancelledError("scope closed")
            return await super().step(state, action, workspace)

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]
    codec = toy_format().codec

    def agent(where):
        return Agent(
            ScriptedPolicy(["5", "4", "3"], codec), Cancels(where), toy_format(), branch_points=EveryDecision()
        )

    step = agent("step")
    ro = run(step.rollout(run(step.start(task)), seed=0))
    assert [p.kind for p in ro.pieces] == ["checkpoint", "failed"]
    assert ro.leaf.cause == "env: Cancels.step raised CancelledError: scope closed"
    with pytest.raises(EnvError, match=r"^task '.*': Cancels.reset raised CancelledError: scope closed$"):
        run(agent("reset").start(task))

    async def cancelled():
        hang = agent("hang")
        job = asyncio.ensure_future(hang.rollout(await hang.start(task), seed=0))
        await asyncio.sleep(0.05)
        job.cancel()
        return await asyncio.gather(job, return_exceptions=True)

    assert isinstance(run(cancelled())[0], asyncio.CancelledError)


def test_a_cancelled_error_of_a_custom_policy_s_own_fails_its_rollout_and_a_real_cancel_still_cancels():
    """A user's Policy that raised its own CancelledError (a client library's cancel
    scope, a future cancelled elsewhere) while its rollout was not being cancelled
    stopped the collection as a bare CancelledError, read as an interrupt, where the
    env's own is its rollout's failure; the policy's is now too (``error:``, as any
    exception of a custom policy's own), the rollout's earlier
    segments kept, its first call gathered with its siblings' or not. Cancelling the
    rollout still cancels it."""
    import asyncio

    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Cancels(ScriptedPolicy):
        def __init__(self, on_call, groups=False, hang=False):
            super().__init__(["5", "4", "3"], toy_format().codec)
            self.on_call, self.groups_siblings, self.hang = on_call, groups, hang

        async def sample(self, prompt_ids, params):
            if len(self.prompts) == self.on_call:
                await asyncio.sleep(30 if self.hang else 0)
                raise asyncio.CancelledError("scope closed")
            return await super().sample(prompt_ids, params)

    task = reach_target_tasks(1, seed=3, low=12, high=12)[0]

    def agent(policy):
        return Agent(policy, ReachTarget(), toy_format(), branch_points=EveryDecision())

    later = agent(Cancels(1))
    ro = run(later.rollout(run(later.start(task)), seed=0))
    assert [p.kind for p in ro.pieces] == ["checkpoint", "failed"]
    assert ro.leaf.cause == "error: Cancels.sample raised CancelledError: scope closed"
    for groups in (False, True):
        first = agent(Cancels(0, groups=groups))
        ro = run(first.rollout(run(first.start(task)), seed=0))
        assert [p.kind for p in ro.pieces] == ["failed"]
        assert ro.leaf.cause == "error: Cancels.sample raised CancelledError: scope closed", ro.leaf.cause

    async def cancelled():
        hang = agent(Cancels(0, hang=True))
        job = asyncio.ensure_future(hang.rollout(await hang.start(task), seed=0))
        await asyncio.sleep(0.05)
        job.cancel()
        return await asyncio.gather(job, return_exceptions=True)

    assert isinstance(run(cancelled())[0], asyncio.CancelledError)


def test_limits_that_could_never_hold_are_refused_where_the_agent_is_made():
    """``env_timeout_s=0``, a negative one or NaN was taken: a step that suspends timed out
    at once, one that does not ran unbounded, and NaN turned the timeout off without a
    word; ``max_prompt_tokens=0`` failed every rollout of the collection ("over
    max_prompt_tokens 0"); ``max_steps=1.5`` or ``True`` was taken as a step budget."""
    import math

    import pytest

    from focus.toy import ReachTarget, toy_format

    def agent(**kw):  # type: ignore[no-untyped-def]
        return Agent(ScriptedPolicy(["3"]), ReachTarget(), toy_format(), **kw)

    for bad in (0, -5.0, math.nan):
        with pytest.raises(ValueError, match=rf"^Agent.env_timeout_s must be a number of seconds > 0, got {bad!r}"):
            agent(env_timeout_s=bad)
    for bad in (0, -3):
        with pytest.raises(
            ValueError, match=rf"^Agent.max_prompt_tokens must be at least 1 \(None: no limit\), got {bad}"
        ):
            agent(max_prompt_tokens=bad)
    for bad in (1.5, True, "8"):
        with pytest.raises(TypeError, match=rf"^Agent.max_steps must be an int, got {bad!r}"):
            agent(max_steps=bad)
    ok = agent(env_timeout_s=math.inf, max_prompt_tokens=1, max_steps=1)
    assert (ok.env_timeout_s, ok.max_prompt_tokens, ok.max_steps) == (math.inf, 1, 1)
