"""Envs, tasks and formats as a user writes them from the docs, driven through the public API.

Each test holds its own small env; what it checks is a case the project's envs do not
reach: a factory option whose name an internal argument also has, a codec that cannot
render an observation the env returned.
"""

from __future__ import annotations

import json

from focus.env import Env, Message, Reset, StepResult, Task
from focus.format import ByteCodec, FinalAnswerParser, PolicyFormat
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
