"""A custom part that breaks its contract fails naming the part and what it returned,
instead of somewhere downstream (a ranking, an env, a trainer)."""

from __future__ import annotations

import math
import re

import pytest

from focus.agent import Agent, _call_cause
from focus.batch import BatchError
from focus.branching import BrokenBranchPoints, EveryDecision
from focus.collector import Collector
from focus.context import BrokenContextManager, Segments, Summarize
from focus.critic import ConstantCritic, Critic, CriticError, Prediction
from focus.env import Action, Env, Message, Reset, StepResult, Task
from focus.estimation import DirectBranchTd
from focus.execution import Execution
from focus.format import ActionParser, ByteCodec, PolicyFormat
from focus.policy import Completion, UnreadableAnswers
from focus.priority import Phase, Priority, Selective
from focus.synthetic import SHAPES, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import EnvConformance, PolicyConformance, run
from focus.workspace import MemoryWorkspace

PHASES = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=20, wave_size=4, wave_unit="jobs"))


def collector(**parts) -> tuple[Collector, list[Task]]:  # type: ignore[no-untyped-def]
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical"])]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    col = Collector(agent, critic=ConstantCritic(0.5), execution=Execution(max_concurrency=4), **parts)
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(2)]


class NoScore(Priority):
    def __call__(self, node):  # type: ignore[no-untyped-def]
        return None


class NaNScore(Priority):
    def __call__(self, node):  # type: ignore[no-untyped-def]
        return math.nan


class IntScore(Priority):
    def __call__(self, node):  # type: ignore[no-untyped-def]
        return -node.depth


def test_a_priority_that_returns_no_number_is_named():
    col, tasks = collector(search=NoScore(phases=PHASES))
    with pytest.raises(TypeError, match=r"NoScore\(\) returned None for checkpoint \d+ of tree \d+"):
        run(col.search(tasks))


def test_a_priority_that_returns_nan_is_refused():
    # NaN keys make the rankings' bisect drop the wrong entries: refused, not ranked
    col, tasks = collector(search=NaNScore(phases=PHASES))
    with pytest.raises(ValueError, match=r"NaNScore\(\) returned nan for checkpoint"):
        run(col.search(tasks))


def test_a_priority_may_return_any_real_number():
    col, tasks = collector(search=IntScore(phases=PHASES))
    state = run(col.search(tasks))
    assert state.usage().transitions > 0


class TextParser(ActionParser):
    def parse(self, text):  # type: ignore[no-untyped-def]
        return text  # the text itself, not an Action


def test_a_parser_that_returns_no_action_is_named_in_the_cause():
    # it was handed to the env, whose failure ("env: AttributeError: 'str' object has no
    # attribute 'kind'") blamed the env
    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.agent.format = PolicyFormat(ByteCodec(), TextParser())
    stats = col.prepare(run(col.search(tasks))).stats
    assert stats["failed_rollouts"] == stats["rollouts"] == 4
    (cause,) = stats["failure_causes"]
    assert cause == "error: TextParser.parse returned str, expected an Action or a ParseError"
    assert stats["model_calls"] == 4  # each rollout's one answer was sampled


class NaNTd(DirectBranchTd):
    def advantages(self, edges, values):  # type: ignore[no-untyped-def]
        return {e: math.nan for e in super().advantages(edges, values)}


def test_an_estimator_that_gives_a_nan_advantage_is_named():
    # a NaN advantage went into the batch (and into every trainer's loss)
    col, tasks = collector(search=IntScore(phases=PHASES[:1]), estimator=NaNTd())
    state = run(col.search(tasks))
    with pytest.raises(BatchError, match=r"NaNTd gave segment \d+ of tree t0#0 the advantage nan"):
        col.prepare(state)


class ListTd(DirectBranchTd):
    def advantages(self, edges, values):  # type: ignore[no-untyped-def]
        return list(super().advantages(edges, values).values())


class TextKeyedTd(DirectBranchTd):
    def advantages(self, edges, values):  # type: ignore[no-untyped-def]
        return {str(i): a for i, a in super().advantages(edges, values).items()}  # as from a JSON service


def test_an_estimator_that_returns_no_dict_is_named():
    # a list failed with "AttributeError: 'list' object has no attribute 'get'"
    col, tasks = collector(search=IntScore(phases=PHASES[:1]), estimator=ListTd())
    state = run(col.search(tasks))
    with pytest.raises(BatchError, match=r"ListTd\.advantages returned a list for tree t0#0: it must return a dict"):
        col.prepare(state)


def test_an_estimator_whose_keys_are_no_segment_ids_is_named():
    # keyed by "3" instead of 3, every segment was left out as failed: an empty batch, no error
    col, tasks = collector(search=IntScore(phases=PHASES[:1]), estimator=TextKeyedTd())
    state = run(col.search(tasks))
    with pytest.raises(
        BatchError, match=r"TextKeyedTd\.advantages gave tree t0#0 the key '\d+', not one of its segment ids"
    ):
        col.prepare(state)


class TextValuedTd(DirectBranchTd):
    def advantages(self, edges, values):  # type: ignore[no-untyped-def]
        return {i: str(a) for i, a in super().advantages(edges, values).items()}  # as from a JSON service


def test_an_estimator_whose_advantages_are_not_numbers_is_named():
    # "0.25" went into the batch as the number; other text failed inside the collector as
    # "could not convert string to float", naming no part
    col, tasks = collector(search=IntScore(phases=PHASES[:1]), estimator=TextValuedTd())
    state = run(col.search(tasks))
    with pytest.raises(
        BatchError,
        match=r"TextValuedTd gave segment \d+ of tree t0#0 the advantage '[-0-9.e]+' \(str\): an advantage must",
    ):
        col.prepare(state)


class NoneValuedTd(DirectBranchTd):
    def advantages(self, edges, values):  # type: ignore[no-untyped-def]
        return {i: None for i in super().advantages(edges, values)}  # e.g. a lookup that found nothing


def test_an_estimator_whose_advantage_is_none_is_named():
    # None left its segment out, as a missing key does, though the interface says neither
    # (``dict[int, float]``; "a segment left out gets none"): every segment was dropped
    # and the batch came out empty, with no error
    col, tasks = collector(search=IntScore(phases=PHASES[:1]), estimator=NoneValuedTd())
    state = run(col.search(tasks))
    with pytest.raises(
        BatchError,
        match=r"NoneValuedTd gave segment \d+ of tree t0#0 the advantage None \(NoneType\): an advantage must be a "
        r"number \(leave a segment out to give it none\)",
    ):
        col.prepare(state)


@pytest.mark.parametrize(
    ("part", "value", "says"),
    [
        ("search", Selective, "Collector's search must be an instance of Priority, got the class Selective (call it"),
        ("estimator", DirectBranchTd, "Collector's estimator must be an instance of Estimator, got the class Direct"),
        ("critic", ConstantCritic, "Collector's critic must be an instance of Critic, got the class ConstantCritic"),
        ("execution", {"max_concurrency": 4}, "Collector's execution must be an instance of Execution, got a dict"),
    ],
)
def test_a_part_given_as_its_class_or_of_another_role_is_named(part, value, says):  # type: ignore[no-untyped-def]
    # search=Selective said "Priority.resolved() missing 1 required positional argument:
    # 'estimator'", estimator=DirectBranchTd "AttributeError: gamma"
    col, _ = collector()
    parts = {"search": col.priority, "critic": col.critic, "estimator": col.estimator, "execution": col.execution}
    with pytest.raises(TypeError) as e:
        Collector(col.agent, **{**parts, part: value})
    assert str(e.value).startswith(says)


@pytest.mark.parametrize(
    ("position", "value", "says"),
    [
        ("format", ByteCodec(), "Agent's format must be a PolicyFormat, got a ByteCodec (pair the codec with a parser"),
        ("format", TextParser(), "Agent's format must be a PolicyFormat, got a TextParser (pair it with a codec"),
        ("env", synthetic_format(), "Agent's env must be an instance of Env, got a PolicyFormat"),
        ("context", Segments, "Agent's context must be an instance of ContextManager, got the class Segments (call it"),
        ("branch_points", EveryDecision, "Agent's branch_points must be an instance of BranchPoints, got the class Ev"),
        ("sampling", {"max_tokens": 4}, "Agent's sampling must be an instance of SamplingParams, got a dict"),
    ],
)
def test_an_agent_part_of_another_role_is_named(position, value, says):  # type: ignore[no-untyped-def]
    # Agent(policy, env, ByteCodec()) failed with "'ByteCodec' object has no attribute
    # 'codec'"; context=Segments (the class) was taken and failed in the first rollout
    mdps = [SHAPES["uniform"](0)]
    parts = {"policy": SyntheticPolicy(mdps), "env": SyntheticEnv(mdps), "format": synthetic_format()}
    parts[position] = value
    with pytest.raises(TypeError) as e:
        Agent(parts.pop("policy"), parts.pop("env"), parts.pop("format"), **parts)
    assert str(e.value).startswith(says)


class ByIndexCritic(Critic):
    async def predict(self, contexts):  # type: ignore[no-untyped-def]
        return {i: 0.3 for i in range(len(contexts))}


class PlainDefCritic(Critic):
    def predict(self, contexts):  # type: ignore[no-untyped-def]
        return [0.3] * len(contexts)


class ByIndexStdCritic(Critic):
    async def predict(self, contexts):  # type: ignore[no-untyped-def]
        return [0.3] * len(contexts)

    async def predict_with_std(self, contexts):  # type: ignore[no-untyped-def]
        return {i: Prediction(0.3, 0.1) for i in range(len(contexts))}


class NoReturnCritic(Critic):
    async def predict(self, contexts):  # type: ignore[no-untyped-def]
        [0.3] * len(contexts)  # the `return` forgotten


class OneValueCritic(Critic):
    async def predict(self, contexts):  # type: ignore[no-untyped-def]
        return 0.3


@pytest.mark.parametrize(
    ("critic", "says"),
    [
        # a dict's keys were taken as the values: predictions 0, 1, 2, ... and no error
        (ByIndexCritic(), r"critic ByIndexCritic returned a dict: return a list, one value per context in order"),
        (ByIndexStdCritic(), r"critic ByIndexStdCritic returned a dict: return a list, one value per context in"),
        # "object list can't be used in 'await' expression"
        (PlainDefCritic(), r"PlainDefCritic\.predict returned list, not an awaitable: declare it `async def`"),
        # the collection stopped with "TypeError: 'NoneType' object is not iterable",
        # raised inside focus/critic.py, naming neither the critic nor the method
        (NoReturnCritic(), r"^critic NoReturnCritic returned None: return a list, one value per context in order$"),
        (OneValueCritic(), r"^critic OneValueCritic returned a float: return a list, one value per context in order$"),
    ],
)
def test_a_critic_that_returns_no_list_of_values_is_named(critic, says):  # type: ignore[no-untyped-def]
    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.critic = critic
    with pytest.raises(CriticError) as stopped:
        run(col.collect(tasks))
    assert re.search(says, str(stopped.value)), stopped.value  # the line; a note on what was lost may follow


class TextCritic(Critic):
    async def predict(self, contexts):  # type: ignore[no-untyped-def]
        return ["0.3"] * len(contexts)  # a service's JSON text passed on unparsed


class RaisingCritic(Critic):
    async def predict(self, contexts):  # type: ignore[no-untyped-def]
        return {}["value"]  # a user's bug inside predict


@pytest.mark.parametrize(
    ("critic", "says"),
    [
        # float() read "0.3" as a prediction: the collection ran on text as values
        (TextCritic(), r"^critic TextCritic returned a non-numeric value '0.3' at position 0 \(checkpoint node 0"),
        # the collection stopped with a bare "KeyError: 'value'": the pipeline's one-line
        # error named neither the critic nor that it was scoring
        (RaisingCritic(), r"^critic RaisingCritic raised KeyError: 'value' while scoring \d+ contexts$"),
    ],
)
def test_a_critic_that_answers_text_or_raises_is_named(critic, says):  # type: ignore[no-untyped-def]
    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.critic = critic
    with pytest.raises(CriticError) as stopped:
        run(col.collect(tasks))
    assert re.search(says, str(stopped.value)), stopped.value  # the line; a note on what was lost may follow


class ArrayStdCritic(Critic):
    """Answers ``predict_with_std`` with a numpy array of values, as a batched model does."""

    async def predict(self, contexts):  # type: ignore[no-untyped-def]
        raise AssertionError  # pragma: no cover - predict_with_std is overridden

    async def predict_with_std(self, contexts):  # type: ignore[no-untyped-def]
        import numpy as np

        return np.full(len(contexts), 0.3)


def test_a_critic_answering_predict_with_std_with_a_numpy_array_is_read_as_values_without_std():
    """A numpy float has a ``std`` method, which was read as the prediction's std: the
    collection stopped with "returned a non-numeric value <built-in method std of
    numpy.float64 object ...>" for a plain array of values, which a list of the same
    floats passed."""
    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.critic = ArrayStdCritic()
    batch = run(col.collect(tasks))
    assert batch.critic and {r.prediction for r in batch.critic} == {0.3}


@pytest.mark.needs("torch")
def test_a_critic_answering_predict_with_std_with_torch_scalars_is_read_as_values_without_std():
    """``list(net(x).squeeze(-1))``: 0-d tensors, whose ``std`` method was read as the std
    as a numpy float's was."""
    import torch

    class TorchStdCritic(ArrayStdCritic):
        async def predict_with_std(self, contexts):  # type: ignore[no-untyped-def]
            return list(torch.full((len(contexts),), 0.25, dtype=torch.float64))

    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.critic = TorchStdCritic()
    batch = run(col.collect(tasks))
    assert batch.critic and {r.prediction for r in batch.critic} == {0.25}


class AsyncEligible(EveryDecision):
    async def eligible(self, state):  # type: ignore[no-untyped-def]
        return False


class PlainDefPolicy(SyntheticPolicy):
    def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        return None


def test_a_branch_point_rule_or_policy_of_the_wrong_colour_is_named():
    # an async eligible's coroutine is true: every decision point became a checkpoint,
    # with only "coroutine ... was never awaited" warnings; a plain-def sample failed every
    # rollout with "object Completion can't be used in 'await' expression"
    mdps = [SHAPES["uniform"](0)]
    env, fmt = SyntheticEnv(mdps), synthetic_format()
    with pytest.raises(TypeError, match=r"AsyncEligible\.eligible is `async def`: declare it `def`"):
        Agent(SyntheticPolicy(mdps), env, fmt, branch_points=AsyncEligible())
    with pytest.raises(TypeError, match=r"PlainDefPolicy\.sample is not `async def`: declare it `async def`"):
        Agent(PlainDefPolicy(mdps), env, fmt)


class AsyncExtend(Segments):
    async def extend(self, ctx, codec, completion, text, observations):  # type: ignore[no-untyped-def]
        return super().extend(ctx, codec, completion, text, observations)


class AsyncParser(ActionParser):
    async def parse(self, text):  # type: ignore[no-untyped-def]
        return None


def test_a_context_manager_or_parser_declared_async_is_named():
    # an async extend failed every rollout with "AttributeError: 'coroutine' object has
    # no attribute 'prompt_ids'", naming neither the manager nor the method
    mdps = [SHAPES["uniform"](0)]
    policy, env = SyntheticPolicy(mdps), SyntheticEnv(mdps)
    with pytest.raises(TypeError, match=r"AsyncExtend\.extend is `async def`: declare it `def`"):
        Agent(policy, env, synthetic_format(), context=AsyncExtend())
    with pytest.raises(TypeError, match=r"AsyncParser\.parse is `async def`: declare it `def`"):
        Agent(policy, env, PolicyFormat(ByteCodec(), AsyncParser()))


class NoReturnExtend(Segments):
    def extend(self, ctx, codec, completion, text, observations):  # type: ignore[no-untyped-def]
        super().extend(ctx, codec, completion, text, observations)  # the `return` forgotten


class NoReturnStart(Segments):
    def start(self, codec, opening):  # type: ignore[no-untyped-def]
        super().start(codec, opening)


class NoReturnCompaction(Summarize):
    def needs_compaction(self, ctx):  # type: ignore[no-untyped-def]
        super().needs_compaction(ctx)


class NoReturnCompact(Summarize):
    async def compact(self, ctx, codec, policy, params):  # type: ignore[no-untyped-def]
        await super().compact(ctx, codec, policy, params)


@pytest.mark.parametrize(
    ("manager", "says"),
    [
        # each rollout failed with "error: AttributeError: 'NoneType' object has no
        # attribute 'prompt_ids'" (the batch: every tree failed), naming neither
        (NoReturnExtend(), r"^NoReturnExtend\.extend returned None, expected a Context \(a `return` missing\?\)$"),
        # the collection stopped with that AttributeError itself
        (NoReturnStart(), r"^NoReturnStart\.start returned None, expected a Context"),
        # never compacted, silently
        (NoReturnCompaction(8), r"^NoReturnCompaction\.needs_compaction returned None, expected a truth value"),
        (NoReturnCompact(8), r"^NoReturnCompact\.compact returned None, expected a Compaction"),
    ],
)
def test_a_context_manager_method_that_returns_nothing_stops_the_collection_naming_it(manager, says):  # type: ignore[no-untyped-def]
    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.agent.context = manager
    with pytest.raises(BrokenContextManager, match=says):
        run(col.search(tasks))


class DictPolicy(SyntheticPolicy):
    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        c = await super().sample(prompt_ids, params)
        return {"token_ids": c.token_ids, "logprobs": c.logprobs}


def test_a_policy_that_returns_no_completion_stops_the_collection_naming_it():
    # each rollout failed with "error: AttributeError: 'dict' object has no attribute
    # 'token_ids'", naming neither the policy nor the method, and the collection ended
    # with an empty batch
    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.agent.policy = DictPolicy(col.agent.policy.mdps)
    with pytest.raises(UnreadableAnswers, match=r"^DictPolicy\.sample returned dict, expected a Completion"):
        run(col.search(tasks))


class NoReturnEligible(EveryDecision):
    def eligible(self, state):  # type: ignore[no-untyped-def]
        super().eligible(state)  # the `return` forgotten


def test_a_branch_point_rule_that_returns_nothing_stops_the_collection_naming_it():
    # no decision point became a checkpoint, silently: the search continued from the roots alone
    col, tasks = collector(search=IntScore(phases=PHASES[:1]))
    col.agent.branch_points = NoReturnEligible()
    with pytest.raises(BrokenBranchPoints, match=r"^NoReturnEligible\.eligible returned None, expected a truth value"):
        run(col.search(tasks))


class DropsOnThirdCall(SyntheticPolicy):
    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        if self.calls == 2:
            raise ConnectionError("connection reset by peer")  # a custom client's own error
        return await super().sample(prompt_ids, params)


def test_a_policy_that_raises_its_own_error_ends_the_rollout_keeping_its_segments():
    # the rollout raised and its job came back as a bare failed leaf: the two
    # checkpoints before the failed call were lost
    mdps = [SHAPES["uniform"](0)]
    agent = Agent(DropsOnThirdCall(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    root = run(agent.start(Task("t0", {"mdp": 0})))
    rollout = run(agent.rollout(root, seed=1))
    assert [p.kind for p in rollout.pieces] == ["checkpoint", "checkpoint", "failed"]
    assert rollout.leaf.cause == "error: ConnectionError: connection reset by peer"


class RaisesOnThirdAnswer(ActionParser):
    def __init__(self) -> None:
        self.answers = 0

    def parse(self, text):  # type: ignore[no-untyped-def]
        self.answers += 1
        if self.answers == 3:
            raise KeyError("no such move")  # its contract: return a ParseError, never raise
        return synthetic_format().parser.parse(text)


def test_a_parser_that_raises_ends_the_rollout_naming_it_keeping_its_segments():
    # the rollout raised: its job came back as a bare failed leaf (the two checkpoints
    # before lost), cause "error: KeyError: 'no such move'", naming no parser
    mdps = [SHAPES["uniform"](0)]
    fmt = PolicyFormat(synthetic_format().codec, RaisesOnThirdAnswer())
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), fmt, max_steps=20)
    rollout = run(agent.rollout(run(agent.start(Task("t0", {"mdp": 0}))), seed=1))
    assert [p.kind for p in rollout.pieces] == ["checkpoint", "checkpoint", "failed"]
    says = "error: RaisesOnThirdAnswer.parse raised KeyError: 'no such move' (return a ParseError instead)"
    assert rollout.leaf.cause == says


class RaisesOnSecondQuestion(EveryDecision):
    def __init__(self, error: Exception | None = None) -> None:
        self.questions = 0
        self.error = error if error is not None else KeyError("no such state")

    def eligible(self, state):  # type: ignore[no-untyped-def]
        self.questions += 1
        if self.questions == 2:
            raise self.error
        return True


def test_a_branch_point_rule_that_raises_ends_the_rollout_keeping_its_segments():
    # the rollout raised: its job came back as a bare failed leaf, the checkpoint before lost
    mdps = [SHAPES["uniform"](0)]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    agent.branch_points = RaisesOnSecondQuestion()
    rollout = run(agent.rollout(run(agent.start(Task("t0", {"mdp": 0}))), seed=1))
    assert [p.kind for p in rollout.pieces] == ["checkpoint", "failed"]
    assert rollout.leaf.cause == "error: KeyError: 'no such state'"
    assert len(rollout.leaf.turns) == 1  # the turn after the checkpoint, not lost either


class ForksOnce(MemoryWorkspace):
    forks = 0

    def fork(self):  # type: ignore[no-untyped-def]
        ForksOnce.forks += 1
        if ForksOnce.forks > 1:  # the rollout's own fork passes; its first checkpoint's does not
            raise NotImplementedError("ForksOnce cannot fork twice")
        return ForksOnce()


class ForksOnceEnv(SyntheticEnv):
    def make_workspace(self, task):  # type: ignore[no-untyped-def]
        return ForksOnce()


class NotImplementedOnThirdCall(SyntheticPolicy):
    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        if self.calls == 2:
            raise NotImplementedError("no sampler for this prompt")
        return await super().sample(prompt_ids, params)


@pytest.mark.parametrize(
    ("part", "pieces", "cause"),
    [
        ("branch_points", ["checkpoint", "failed"], "error: NotImplementedError: no rule for this state yet"),
        ("workspace", ["failed"], "error: NotImplementedError: ForksOnce cannot fork twice"),
        ("policy", ["checkpoint", "checkpoint", "failed"], "model: no sampler for this prompt"),
    ],
)
def test_a_not_implemented_error_is_the_models_only_from_the_model_call(part, pieces, cause):  # type: ignore[no-untyped-def]
    # a branch-point rule's or a workspace fork's NotImplementedError was labelled
    # "model: ...", as if the model service had failed; the user's part's error is "error: ..."
    mdps = [SHAPES["uniform"](0)]
    policy = NotImplementedOnThirdCall(mdps) if part == "policy" else SyntheticPolicy(mdps)
    env = ForksOnceEnv(mdps) if part == "workspace" else SyntheticEnv(mdps)
    agent = Agent(policy, env, synthetic_format(), max_steps=20)
    if part == "branch_points":
        agent.branch_points = RaisesOnSecondQuestion(NotImplementedError("no rule for this state yet"))
    ForksOnce.forks = 0
    rollout = run(agent.rollout(run(agent.start(Task("t0", {"mdp": 0}))), seed=1))
    assert [p.kind for p in rollout.pieces] == pieces
    assert rollout.leaf.cause == cause


@pytest.mark.parametrize(
    ("error", "calling", "cause"),
    [
        (NotImplementedError(), True, "model: NotImplementedError"),
        (NotImplementedError(), False, "error: NotImplementedError"),
        (KeyError(), False, "error: KeyError"),
        (ValueError("bad"), False, "error: ValueError: bad"),
    ],
)
def test_an_exception_without_a_message_names_its_type_in_the_cause(error, calling, cause):  # type: ignore[no-untyped-def]
    # a bare `raise NotImplementedError` in a policy gave the cause "model: ", naming nothing
    assert _call_cause(error, calling) == cause


class _MutatingEnv(Env):
    async def reset(self, task, workspace):  # type: ignore[no-untyped-def]
        return Reset({"total": 0}, (Message("user", "count"),))

    async def step(self, state, action, workspace):  # type: ignore[no-untyped-def]
        state["total"] += 1  # in place: a sibling branch's old state changes too
        return StepResult(dict(state), "ok")


class _DictAnswers(SyntheticPolicy):
    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        return {"token_ids": (1,), "logprobs": (-1.0,)}


class _RoundedUp(SyntheticPolicy):
    """A sampled token of probability 1 whose log-prob a server's float rounding put just
    above 0, as Completion accepts (up to 1e-6)."""

    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        return Completion((1, 2), (-0.5, 4e-7), "stop")


def test_the_policy_check_takes_the_log_probs_a_completion_takes():
    """PolicyConformance asked for log-probs <= 0 where Completion (the library's own
    check on every answer) allows rounding up to 1e-6: a policy the collector runs failed
    its conformance test."""

    class PolicyCheck(PolicyConformance):
        def make_policy(self):  # type: ignore[no-untyped-def]
            return _RoundedUp([SHAPES["uniform"](0)])

    PolicyCheck().test_sample_returns_aligned_finite_logprobs()


def test_the_conformance_checks_say_what_a_part_broke():
    # they failed with a bare AssertionError (pytest rewrites no assert of an installed
    # module) or with "'dict' object has no attribute 'token_ids'"
    class EnvCheck(EnvConformance):
        def make_env(self):  # type: ignore[no-untyped-def]
            return _MutatingEnv()

        def make_task(self):  # type: ignore[no-untyped-def]
            return Task("t0")

        def make_action(self):  # type: ignore[no-untyped-def]
            return Action("text", text="1")

    class PolicyCheck(PolicyConformance):
        def make_policy(self):  # type: ignore[no-untyped-def]
            return _DictAnswers([SHAPES["uniform"](0)])

    with pytest.raises(AssertionError, match=r"^step changed the state it was given: return a new state"):
        EnvCheck().test_step_does_not_mutate_the_old_state()
    with pytest.raises(AssertionError, match=r"^sample returned dict, expected a Completion$"):
        PolicyCheck().test_sample_returns_aligned_finite_logprobs()


class _ReturnsEnv(Env):
    """One step that returns ``result`` (its state, observation, reward, done)."""

    def __init__(self, reward, done) -> None:  # type: ignore[no-untyped-def]
        self.reward, self.done = reward, done

    async def reset(self, task, workspace):  # type: ignore[no-untyped-def]
        return Reset(0, (Message("user", "go"),))

    async def step(self, state, action, workspace):  # type: ignore[no-untyped-def]
        return StepResult(state + 1, "ok", self.reward, self.done)


@pytest.mark.parametrize(
    ("reward", "done", "says"),
    [
        (1.0, __import__("numpy").bool_(True), None),  # gym-style: the agent takes it as a bool
        (__import__("numpy").float32(0.5), False, None),
        ("1", False, r"returned a non-numeric reward '1'"),  # the agent refuses it
        (1e61, False, r"returned the reward 1e\+61, not a finite number within"),  # so too
    ],
)
def test_the_env_conformance_check_holds_an_env_to_what_the_agent_accepts(reward, done, says):
    """The mixin asserted ``isinstance(done, bool)``, failing a numpy bool the agent
    accepts, and ``float(reward)`` finite, passing a text reward and one past ±1e60 that
    the agent refuses: an env could pass its conformance test and fail every rollout."""

    class EnvCheck(EnvConformance):
        def make_env(self):  # type: ignore[no-untyped-def]
            return _ReturnsEnv(reward, done)

        def make_task(self):  # type: ignore[no-untyped-def]
            return Task("t0")

        def make_action(self):  # type: ignore[no-untyped-def]
            return Action("text", text="1")

    if says is None:
        EnvCheck().test_step_returns_step_result()
    else:
        with pytest.raises(AssertionError, match=says):
            EnvCheck().test_step_returns_step_result()


def test_the_env_conformance_check_refuses_opening_messages_the_agent_refuses():
    """``Message("user", task.data.get("question"))`` with the key missing passed the
    mixin's reset check (a Reset with messages) and failed every rollout."""

    class NoQuestion(_ReturnsEnv):
        async def reset(self, task, workspace):  # type: ignore[no-untyped-def]
            return Reset(0, (Message("user", task.data.get("question")),))

    class EnvCheck(EnvConformance):
        def make_env(self):  # type: ignore[no-untyped-def]
            return NoQuestion(0.0, False)

        def make_task(self):  # type: ignore[no-untyped-def]
            return Task("t0")

    with pytest.raises(
        AssertionError, match=r"^NoQuestion.reset returned opening message 0 \('user'\) with content None"
    ):
        EnvCheck().test_reset_returns_messages_and_picklable_state()
