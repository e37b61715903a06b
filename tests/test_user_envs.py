"""Envs, tasks and formats as a user writes them from the docs, driven through the public API.

Each test holds its own small env; what it checks is a case the project's envs do not
reach: a factory option whose name an internal argument also has, a codec that cannot
render an observation the env returned.
"""

from __future__ import annotations

import json

from focus.agent import Agent
from focus.collector import Collector
from focus.env import Env, Message, Reset, StepResult, Task
from focus.format import ByteCodec, FinalAnswerParser, JsonToolCallParser, PolicyFormat
from focus.priority import Phase, Selective
from focus.testing import ScriptedPolicy, run
from tasks.config import load_config
from tasks.config.build import check_factories


class JsonlQA(Env):
    """One question per task, read from the task's ``prompt``; the answer ends the episode."""

    async def reset(self, task, workspace):
        return Reset(task.data.get("answer", ""), (Message("user", task.data.get("prompt", "")),))

    async def step(self, state, action, workspace):
        return StepResult(state, "", float(action.text.strip() == state), True)


def jsonl_factory(n_tasks, seed, path):
    """A factory whose option is ``path``, the JSONL file of its tasks (what a user names it)."""
    with open(path, encoding="utf-8") as f:
        tasks = [Task(str(row["id"]), row) for row in map(json.loads, f)]
    return JsonlQA(), PolicyFormat(ByteCodec(), FinalAnswerParser(require_marker=False)), tasks[:n_tasks]


def test_an_env_factory_option_named_path_reaches_the_factory(tmp_path):
    """``env.options.path`` (the data file a factory reads) stopped ``focus collect`` with
    ``TypeError: _env_from_factory() got multiple values for argument 'path'``: the
    builder took the factory's import path as a keyword argument named ``path``."""
    data = tmp_path / "tasks.jsonl"
    data.write_text("".join(json.dumps({"id": i, "prompt": f"{i}+1?", "answer": str(i + 1)}) + "\n" for i in range(3)))
    cfg = load_config(
        overrides={
            "env.kind": "factory",
            "env.factory": f"{__name__}:jsonl_factory",
            "env.options": {"path": str(data)},
            "env.n_tasks": 3,
        },
        environ={},
    )
    check_factories(cfg)  # the options bind to the factory's signature
    env, fmt, tasks = cfg.build_env()
    assert isinstance(env, JsonlQA) and [t.id for t in tasks] == ["0", "1", "2"]
    assert tasks[2].data["prompt"] == "2+1?"


class NoToolRole(ByteCodec):
    """A chat format without a ``tool`` role (a template written for plain chat)."""

    _ROLES = {"system": ByteCodec.SYSTEM, "user": ByteCodec.USER, "assistant": ByteCodec.ASSISTANT}


class Calculator(Env):
    """A tool call is answered with its result (a ``tool`` observation); an answer ends it."""

    async def reset(self, task, workspace):
        return Reset(0, (Message("user", "What is 1+2?"),))

    async def step(self, state, action, workspace):
        if action.kind == "answer":
            return StepResult(state, "", float(action.text == "3"), True)
        return StepResult(state + 1, "3", 0.0, False)


def test_an_observation_the_codec_cannot_render_fails_its_rollout_keeping_the_turns_before():
    """The agent adds a tool's result as a ``tool`` message; a codec without that role
    raised in the context's extend, outside the rollout's guards: the rollout's job failed
    as ``error: ValueError: ByteCodec has no role 'tool'`` at the step it started from
    (step 0), and its finished turns (a reply shown back as a parse error, the tool call)
    were lost. Now its leaf is failed after them, the cause naming the observation, the
    step and the codec."""
    codec = NoToolRole()
    policy = ScriptedPolicy(["hmm", '{"name": "add", "arguments": {}}'], codec)
    agent = Agent(policy, Calculator(), PolicyFormat(codec, JsonToolCallParser()), max_steps=6)
    rollout = run(_rollout(agent, Task("q1")))
    assert [t.transition for t in rollout.turns] == [False, True]  # the parse error, the tool call
    assert rollout.counters["parse_errors"] == 1
    leaf = rollout.leaf
    assert leaf.kind == "failed" and leaf.steps == 2
    assert leaf.cause == (
        "error: Segments.extend (NoToolRole) could not add the 'tool' observation of step 1: ValueError: "
        "ByteCodec has no role 'tool'; known: ['assistant', 'system', 'user']"
    )
    # in a collection: the segment before the failed one is trained on, the failure counted once
    collector = Collector(agent, search=Selective(phases=[Phase("evidence", rollouts_per_task=1)]), seed=0)
    batch = run(collector.collect([Task("q1")]))
    assert len(batch.actor) == 1 and batch.stats["failed_rollouts"] == 1
    assert batch.stats["rollout_steps"] == 2 and batch.stats["failed_error"] == 1


async def _rollout(agent, task):
    return await agent.rollout(await agent.start(task), 0)
