"""One usage record: counted once per rollout, summed everywhere usage is shown.

Batch statistics, the planner's budget, the pipeline's step records and progress all
read ``focus.usage.Usage``; these tests pin its counting rules (transitions, the budget
rule, failures by kind, retries the client reports) and that the running totals the
pipeline keeps equal a full recount.
"""

from __future__ import annotations

import dataclasses

import pytest

from focus.agent import Agent, Piece, Rollout
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.env import Env, Message, Reset, StepResult, Task
from focus.execution import Execution
from focus.format import ByteCodec, FinalAnswerParser, PolicyFormat
from focus.policy import Completion
from focus.priority import Phase, Selective
from focus.synthetic import SHAPES, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import ScriptedPolicy, run
from focus.tree import Turn
from focus.usage import Usage, failure_kind


def turn(tokens: int, *, transition: bool = True, kind: str = "action") -> Turn:
    return Turn((1,), (2,) * tokens, (-0.5,) * tokens, 1, "stop", kind, 0.0, transition)


def test_a_rollout_is_counted_once_from_its_turns():
    pieces = (
        Piece((turn(3), turn(2, transition=False)), "checkpoint", 2, (1,)),  # a parse error: no transition
        Piece((turn(4, kind="compaction", transition=False), turn(1)), "failed", 4, (1,), cause="env: Boom"),
    )
    u = Usage.of_rollout(Rollout("t", pieces, wall_s=1.5, counters={"parse_errors": 1, "tool_errors": 0}))
    assert (u.rollouts, u.failed_rollouts, u.transitions, u.rollout_steps, u.model_calls) == (1, 1, 2, 4, 4)
    assert (u.tokens, u.compactions, u.budget_spent) == (10, 1, 2)
    assert (u.rollout_wall_s, u.failed_wall_s, u.failures) == (1.5, 1.5, (("env", 1),))
    # a rollout without a transition still spends one unit of budget, so a phase ends
    idle = Usage.of_rollout(Rollout("t", (Piece((turn(1, transition=False),), "truncated", 1, (1,)),)))
    assert (idle.transitions, idle.budget_spent, idle.failed_rollouts) == (0, 1, 0) == (0, Usage.spend(0), 0)


def test_a_rollout_usage_is_the_record_its_constructor_makes():
    """of_rollout fills the instance's fields without __init__: every field, as __init__ sets them."""
    pieces = (Piece((turn(3),), "checkpoint", 1, (1,)), Piece((turn(2),), "failed", 2, (1,), cause="model service: x"))
    counters = {"retried_calls": 1, "retries": 3, "retry_ms": 250, "retries:timeout": 2, "retries:server error": 1}
    for ro in (Rollout("t", pieces, 0.5, counters), Rollout("t", pieces[:1] + (Piece((), "terminal", 1, ()),))):
        u = Usage.of_rollout(ro)
        made = Usage(**{f.name: getattr(u, f.name) for f in dataclasses.fields(Usage)})
        assert u.__getstate__() == made.__getstate__() and u == made and hash(u) == hash(made)
        assert [type(getattr(u, f.name)) for f in dataclasses.fields(Usage)] == [
            type(getattr(made, f.name)) for f in dataclasses.fields(Usage)
        ]
        with pytest.raises(dataclasses.FrozenInstanceError):
            u.rollouts = 2  # type: ignore[misc]
    assert (u.retries, u.retried_calls, u.retry_s, u.failures) == (0, 0, 0.0, ())
    failed = Usage.of_rollout(Rollout("t", pieces, 0.5, counters))
    assert failed.retry_causes == (("server error", 1), ("timeout", 2)) and failed.retry_s == 0.25
    assert failed.failures == (("model service", 1),) and failed.failed_wall_s == 0.5


def test_usages_add_up_field_by_field_and_failures_by_kind():
    a = Usage(rollouts=1, transitions=3, budget_spent=3, failures=(("env", 1),), retry_causes=(("timeout", 2),))
    b = Usage(rollouts=2, failed_rollouts=2, failures=(("env", 1), ("model service", 1)), retry_causes=(("5xx", 1),))
    total = Usage.total([a, b, Usage()])
    assert total == a + b
    assert (total.rollouts, total.transitions, total.failed("env"), total.failed("model service")) == (3, 3, 2, 1)
    assert total.as_dict()["failures"] == {"env": 2, "model service": 1}
    assert total.as_dict()["retry_causes"] == {"5xx": 1, "timeout": 2}
    assert set(total.as_dict()) == {f.name for f in dataclasses.fields(Usage)}
    assert [failure_kind(c) for c in ("model service: x", "model: y", "env: z", "oops")] == [
        "model service",
        "model",
        "env",
        "error",
    ]


class RetriedPolicy(SyntheticPolicy):
    """Reports, as an HTTP client would in ``Completion.meta``, that every other call
    needed a retry after a timeout, which took 0.25 s."""

    async def sample(self, prompt_ids, params):  # type: ignore[no-untyped-def]
        c = await super().sample(prompt_ids, params)
        if (params.seed or 0) % 2:
            return Completion(
                c.token_ids, c.logprobs, c.finish_reason, meta={"retries": {"timeout": 1}, "retry_s": 0.25}
            )
        return c


def collector(policy_cls=SyntheticPolicy) -> tuple[Collector, list[Task]]:  # type: ignore[no-untyped-def]
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long"])]
    agent = Agent(policy_cls(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=40, wave_size=4, wave_unit="jobs"))
    col = Collector(agent, Selective(phases=phases), ConstantCritic(0.5), execution=Execution(max_concurrency=4))
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(3)]


def test_retries_the_client_reports_reach_the_statistics():
    col, tasks = collector(RetriedPolicy)
    state = run(col.search(tasks))
    stats = col.prepare(state).stats
    usage = state.usage()
    assert usage.retried_calls > 0 and usage.retries == usage.retried_calls == dict(usage.retry_causes)["timeout"]
    assert usage.retry_s == pytest.approx(0.25 * usage.retried_calls)
    assert stats["retries"] == usage.retries and stats["retry_causes"] == {"timeout": usage.retries}
    assert 0 < usage.retried_calls < usage.model_calls


def test_running_totals_equal_a_full_recount_wave_after_wave():
    """The pipeline's step records keep usage as running totals (tasks.records.Tally):
    after the last wave they equal a recount of every rollout in the trees."""
    from focus.journal import MemoryJournal
    from tasks.records import Tally

    col, tasks = collector()
    tally, seen = Tally(), []

    class Tallied(MemoryJournal):
        async def record(self, step, value):  # type: ignore[no-untyped-def]
            await super().record(step, value)
            if figures := tally.step(step, value):
                seen.append(figures)

    state = run(col.search(tasks, Tallied()))
    checked = len(seen)
    last = seen[-1]
    assert last["usage"].rollouts == state.usage().rollouts and last["usage"].transitions == state.usage().transitions
    assert last["phase_usage"].budget_spent == state.usage(1).budget_spent
    assert last["usage"].rollout_wall_s == pytest.approx(state.usage().rollout_wall_s)
    assert checked >= 4
    stats = col.prepare(state).stats
    assert stats["budget_spent"] == state.usage().budget_spent >= stats["transitions"]
    assert stats["phases"][1]["budget_spent"] == state.facts(0).spent.get(1, 0) + sum(
        state.facts(i).spent.get(1, 0) for i in range(1, len(state.trees))
    )


def test_total_is_the_sequential_sum():
    """``Usage.total`` sums field by field in one pass; it gives what ``+`` one record after
    another gives (the same float sums in the same order, failures and retry causes merged)."""
    import functools
    import random

    rng = random.Random(1)
    kinds = [(), (("env", 1),), (("bad response", 1), ("model", 2))]
    records = [
        Usage(
            rollouts=1,
            transitions=rng.randint(0, 9),
            rollout_wall_s=rng.random(),
            retry_s=rng.random() / 7,
            failures=rng.choice(kinds),
            retry_causes=rng.choice([(), (("timeout", 3),)]),
        )
        for _ in range(500)
    ]
    assert Usage.total(iter(records)) == functools.reduce(lambda a, b: a + b, records, Usage())
    assert Usage.total([]) == Usage() and Usage.total(records[:1]) == Usage() + records[0]


class _BreaksOnSecondStep(Env):
    """Env whose second step raises: the rollout's second model answer is never recorded."""

    async def reset(self, task: Task, workspace: object) -> Reset:
        return Reset(0, (Message("user", "go"),))

    async def step(self, state: int, action: object, workspace: object) -> StepResult:
        if state >= 1:
            raise RuntimeError("judge broke")
        return StepResult(state + 1, "next")


def test_a_model_call_whose_env_step_failed_counts_as_a_call_and_its_tokens():
    # docs/pipeline.md: model_calls are "requests sent to the model service", tokens the
    # sampled tokens; the answer whose env step raised was sampled but is in no turn
    policy = ScriptedPolicy(["abc"])
    agent = Agent(policy, _BreaksOnSecondStep(), PolicyFormat(ByteCodec(), FinalAnswerParser(require_marker=False)))
    col = Collector(agent, Selective(phases=(Phase("evidence", rollouts_per_task=2),)), ConstantCritic(0.0))
    stats = col.prepare(run(col.search([Task("t0")]))).stats
    assert len(policy.prompts) == 4  # two rollouts, each: a step that worked, one that raised
    assert stats["failed_env"] == 2 and stats["transitions"] == 2
    assert stats["model_calls"] == 4 and stats["tokens"] == 4 * len(b"abc") + 4  # + the stop id of each answer
    assert stats["rollout_steps"] == 2  # the failed step is no rollout step


def test_totals_by_key_are_each_keys_total_and_the_whole():
    """``Usage.totals_by`` reads each record once and gives :meth:`Usage.total` of all of
    them and of each key's, bit for bit (the same float sums in the same order)."""
    import random

    rng = random.Random(2)
    kinds = [(), (("env", 1),), (("bad response", 1), ("model", 2))]
    items = [
        (
            rng.randint(0, 3),
            Usage(
                rollouts=1,
                transitions=rng.randint(0, 9),
                rollout_wall_s=rng.random(),
                failed_wall_s=rng.random() / 3,
                retry_s=rng.random() / 7,
                failures=rng.choice(kinds),
                retry_causes=rng.choice([(), (("timeout", 3),), (("server error", 1),)]),
            ),
        )
        for _ in range(400)
    ]
    whole, by_key = Usage.totals_by(iter(items))
    assert whole == Usage.total(u for _, u in items)
    assert by_key == {k: Usage.total(u for key, u in items if key == k) for k in dict.fromkeys(k for k, _ in items)}
    assert Usage.totals_by([]) == (Usage(), {})


class _FailsEverySeventhStep(SyntheticEnv):
    """Every seventh env step raises: some rollouts of every phase fail."""

    steps = 0

    async def step(self, state, action, workspace):  # type: ignore[no-untyped-def]
        type(self).steps += 1
        if type(self).steps % 7 == 0:
            raise RuntimeError(f"broke at {type(self).steps}")
        return await super().step(state, action, workspace)


def _former_statistics(phases, trees):  # type: ignore[no-untyped-def]
    """What focus.statistics computed before it read the records in one pass (a pass per
    phase and one for the total, every edge's rewards summed for the returns)."""
    from collections import Counter

    from focus.statistics import flat
    from focus.sums import left_sum
    from focus.usage import wall_of

    records = [r for t in trees for r in t.log]
    per_phase = []
    for pi, phase in enumerate(phases):
        recs = [r for r in records if r.phase == pi]
        per_phase.append(
            {
                "name": phase.name,
                "index": pi,
                "transition_budget": phase.transitions if not phase.is_evidence else None,
                "rollouts_per_task": phase.rollouts_per_task,
                "waves": len({r.wave for r in recs}),
                **flat(Usage.of_records(recs)),
                "wall_s": wall_of(recs),
            }
        )
    returns: list[float] = []
    for t in trees:
        got: dict[int, float] = {}
        for e in t.edges.values():
            got[e.rollout] = got.get(e.rollout, 0.0) + left_sum(e.rewards)
        returns += [
            got.get(r.rollout, 0.0)
            for r in t.log
            if r.node == t.ROOT and not r.failed and r.phase < len(phases) and phases[r.phase].is_evidence
        ]
    failed_trees = [t.task_id for t in trees if t.rollouts and not t.reaches_valid_leaf(t.ROOT)]
    return {
        "trees": len(trees),
        "failed_trees": len(failed_trees),
        "failed_tree_ids": failed_trees,
        "refused_tasks": 0,  # (no task of these trees was refused at its opening prompt)
        "refused_task_ids": [],
        **flat(Usage.of_records(records)),
        "wall_s": wall_of(records),
        "excluded_segments": 0,
        "evidence_rollouts": len(returns),
        "return_mean": left_sum(returns) / len(returns) if returns else None,
        "checkpoints": sum(1 for t in trees for _ in t.checkpoints()),
        "phases": per_phase,
        "failure_causes": dict(Counter(r.cause for r in records if r.failed).most_common(10)),
    }


def test_statistics_in_one_pass_are_the_per_phase_recount():
    """The collection's statistics read each rollout record once; every figure (floats
    bit for bit, failure causes in their order) is what a recount per phase gives."""
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long", "uniform", "critical"])]
    agent = Agent(RetriedPolicy(mdps), _FailsEverySeventhStep(mdps), synthetic_format(), max_steps=20)
    phases = (Phase("evidence", rollouts_per_task=3), Phase("continue", transitions=60, wave_size=4, wave_unit="jobs"))
    col = Collector(agent, Selective(phases=phases), ConstantCritic(0.5), execution=Execution(max_concurrency=4))
    state = run(col.search([Task(f"t{i}", {"mdp": i}) for i in range(5)]))
    stats = col.statistics(state.trees)
    assert stats == _former_statistics(phases, state.trees)
    assert stats["failed_env"] > 0 and stats["retries"] > 0 and stats["phases"][1]["waves"] > 1
    assert stats["phases"][0]["failed_env"] > 0 and stats["phases"][1]["failed_env"] > 0


def test_parse_and_tool_errors_reach_the_statistics(capsys):
    """The agent counts each rollout's parse errors and tool errors; the batch's
    statistics (per phase and in total), the pipeline's step records and ``focus
    collect``'s table read them from the one usage record per rollout."""
    from fixtures.failing import ToolFailsReachTarget

    from cli.collect import print_result
    from focus.toy import reach_target_tasks, toy_format

    fmt = toy_format()
    policy = ScriptedPolicy(["3", "what?", "4", "2", "no", "5"], fmt.codec)  # "what?" and "no" do not parse
    agent = Agent(policy, ToolFailsReachTarget(), fmt, max_steps=6)
    phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=8, wave_size=2))
    col = Collector(agent, Selective(phases=phases), ConstantCritic(0.5), execution=Execution(max_concurrency=1))
    state = run(col.search(reach_target_tasks(2, seed=0)))
    batch = col.prepare(state)
    stats = batch.stats
    turns = [t for tree in state.trees for e in tree.edges.values() for t in e.turns]
    parse_errors = sum(1 for t in turns if t.kind == "action" and not t.transition)
    assert parse_errors > 0 and stats["parse_errors"] == parse_errors
    assert stats["tool_errors"] == stats["transitions"] > 0  # one a step, as the env reported them
    assert sum(p["parse_errors"] for p in stats["phases"]) == parse_errors
    assert sum(p["tool_errors"] for p in stats["phases"]) == stats["tool_errors"]
    assert state.usage().parse_errors == parse_errors  # the record the step records and progress sum
    # the pipeline's result (focus collect --json, the stats artifact) is the batch's summary
    assert (batch.summary()["parse_errors"], batch.summary()["tool_errors"]) == (parse_errors, stats["tool_errors"])
    print_result({"collection_id": "c", "stats": stats, "batch_url": "file:///b"})
    shown = capsys.readouterr().out
    assert "parse_errors" in shown and "tool_errors" in shown, shown
    # a record of a collection recorded before these counts (resumed) reads 0 for them
    made = Usage.of_rollout(Rollout("t", (Piece((turn(1),), "terminal", 1, ()),), counters={"parse_errors": 2}))
    old_dict = {f.name: getattr(made, f.name) for f in dataclasses.fields(Usage)}
    for name in ("parse_errors", "tool_errors"):
        old_dict.pop(name)
    before = Usage.__new__(Usage)
    before.__setstate__(old_dict)  # as a pickle of the record from before these counts loads
    assert (before.parse_errors, Usage.total([before, state.usage()]).parse_errors) == (0, parse_errors)
