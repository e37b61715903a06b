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
from focus.journal import MemoryJournal
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


def _whitespace_bpe(path, unk_token=None):
    """A word-level BPE (whitespace pre-tokenizer, no byte alphabet) trained on ASCII text,
    as the tokenizers quick tour builds one; without ``unk_token`` it drops what it lacks."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token=unk_token))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    specials = ["<|im_start|>", "<|im_end|>"] + ([unk_token] if unk_token else [])
    tok.train_from_iterator(
        ["say a digit total user assistant tool system 0123456789 ."] * 20,
        trainers.BpeTrainer(vocab_size=120, special_tokens=specials),
    )
    tok.save(str(path))
    return path


class Echo(Env):
    """Shows the model a fixed observation after its first reply (a page, a file)."""

    def __init__(self, observation):
        self.observation = observation

    async def reset(self, task, workspace):
        return Reset(0, (Message("user", task.data.get("prompt", "say a digit")),))

    async def step(self, state, action, workspace):
        return StepResult(state + 1, self.observation, 0.0, state + 1 >= 3)


def test_a_character_the_tokenizer_drops_is_refused_not_lost_silently(tmp_path):
    """A tokenizer that has no token for a character and no fallback (a BPE without an
    unknown token or byte alphabet) encoded an env's ``'total 日本'`` as the ids of
    ``'total'``: the model read another text than the env wrote, and nothing said so. The
    observation now fails its rollout after the turns before it, naming the character; a
    task's opening text stops the collection naming the task."""
    import pytest

    from focus.env import EnvError
    from focus.hf_codec import HFChatCodec

    codec = HFChatCodec(_whitespace_bpe(tmp_path / "tok.json"))
    assert codec.encode_content("total 7 .") and codec.encode_content("say\ta  digit\n")  # whitespace: by design
    policy = ScriptedPolicy(["7"], codec)
    agent = Agent(policy, Echo("total 日本"), PolicyFormat(codec, FinalAnswerParser(require_marker=False)))
    rollout = run(_rollout(agent, Task("t")))
    assert len(rollout.turns) == 1 and rollout.leaf.kind == "failed" and rollout.leaf.steps == 1
    assert rollout.leaf.cause.startswith(
        "error: Segments.extend (HFChatCodec) could not add the 'user' observation of step 0: ValueError: "
        f"tokenizer {codec.path} has no token for '日' (character 6 of the text) and drops it"
    )
    with pytest.raises(EnvError, match="task 'u'.*has no token for 'é' \\(character 4"):
        run(agent.start(Task("u", {"prompt": "say é digit"})))
    assert codec.drops_unknown()
    # a tokenizer with an unknown token shows the model that token: taken as it is
    with_unk = HFChatCodec(_whitespace_bpe(tmp_path / "unk.json", "[UNK]"))
    assert not with_unk.drops_unknown() and len(with_unk.encode_content("total 日本")) == 3


class _Stop(Exception):
    pass


class StopsAfterEvidence(MemoryJournal):
    """A journal whose process dies once the evidence is recorded (a crash, a Ctrl-C)."""

    armed = True

    async def record(self, step, value):
        await super().record(step, value)
        if self.armed and step.kind == "evidence_scores":
            raise _Stop


def test_a_resume_with_other_tasks_is_refused_and_with_the_same_ones_ends_as_a_clean_run():
    """Tasks read from a user's file at each run: the file edited (or its rows reordered)
    between a collection's interruption and its resume, the resume went on with the
    recorded tasks without a word, and its batch was of other tasks than it was given."""
    import pytest

    def collector():
        agent = Agent(ScriptedPolicy(["4", "2", "x"]), JsonlQA(), PolicyFormat(ByteCodec(), FinalAnswerParser(False)))
        phases = [Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=6, wave_size=2)]
        return Collector(agent, search=Selective(phases=phases), seed=3)

    tasks = [Task(f"q{i}", {"prompt": f"{i}+2?", "answer": str(i + 2), "tags": ["a", i]}) for i in range(3)]
    journal = StopsAfterEvidence()
    with pytest.raises(_Stop):
        run(collector().collect(tasks, journal))
    journal.armed = False
    edited = [tasks[0], Task("q1", {**tasks[1].data, "answer": "4"}), tasks[2]]
    with pytest.raises(ValueError, match=r"^task 1 \('q1'\) holds other data than when the collection started"):
        run(collector().collect(edited, journal))
    with pytest.raises(ValueError, match=r"^task 0 of the collection is 'q0', and 'q2' in its resume"):
        run(collector().collect(tasks[::-1], journal))
    with pytest.raises(ValueError, match=r"^the collection started on 3 tasks and is resumed with 2"):
        run(collector().collect(tasks[:2], journal))
    # data that JSON does not hold is not compared (it may not compare alike in another process)
    from flows.errors import exit_code, one_line
    from focus.journal import TasksChanged, check_same_tasks

    changed = TasksChanged("task 1 ('q1') holds other data than when the collection started: ...")
    assert one_line(changed) == str(changed) and exit_code(changed) == 2  # focus collect: the line, exit 2
    check_same_tasks([Task("a", {"x": object()})], [Task("a", {"x": object()})])
    assert run(collector().collect(tasks, journal)) == run(collector().collect(tasks, MemoryJournal()))


class LockInState(Env):
    """Keeps a lock in one task's state (a client made per episode): no plain data."""

    async def reset(self, task, workspace):
        import threading

        state = {"n": 0, "lock": threading.Lock()} if task.id == "u1" else {"n": 0}
        return Reset(state, (Message("user", "say a digit"),))

    async def step(self, state, action, workspace):
        return StepResult({**state, "n": state["n"] + 1}, "ok", 0.5, True)


def test_a_state_that_does_not_pickle_is_named_by_its_task_and_step(tmp_path):
    """A branch state holding a lock stopped a pipeline collection with ``checkpoint
    c/evidence/0: state cannot be pickled: TypeError: cannot pickle '_thread.lock' object``
    and a Dask one with the bare ``TypeError``: neither named the task, the step or that
    the env's state was the part at fault."""
    from types import SimpleNamespace

    import pytest

    from focus.dask_payload import pickled_starts
    from focus.env import EnvError
    from storage import CheckpointStore

    agent = Agent(ScriptedPolicy(["5"]), LockInState(), PolicyFormat(ByteCodec(), FinalAnswerParser(False)))
    state = run(Collector(agent).start([Task("u0"), Task("u1")]))
    named = r"the env state of task 'u1' at step 0 \(TypeError: cannot pickle '_thread.lock' object\) does not pickle"
    with pytest.raises(TypeError, match=r"^checkpoint c/evidence/0: state cannot be pickled: " + named):
        CheckpointStore(str(tmp_path)).save("c", "evidence", 0, state)
    with pytest.raises(EnvError, match="^" + named + ", and Dask ships each checkpoint's state to its workers"):
        pickled_starts([SimpleNamespace(start=s) for tree in state.trees for s in tree.states.values()])


class BadFirst(ScriptedPolicy):
    """Answers with a token id outside the vocabulary (a bad response) while ``bad`` is set."""

    bad = True

    async def sample(self, prompt_ids, params):
        from focus.policy import Completion

        answer = await super().sample(prompt_ids, params)
        return Completion((999,), (-1.0,), "stop") if self.bad else answer


def test_a_resume_of_unfinished_evidence_with_other_tasks_is_refused():
    """Evidence whose rollouts got bad responses is recorded unfinished, before any state
    the resume's task check reads; a resume given the tasks in another order grafted the
    recorded rollouts of one task onto the tree of another."""
    import pytest

    from focus.execution import BadResponses, Execution

    policy = BadFirst(["4"])
    agent = Agent(policy, JsonlQA(), PolicyFormat(ByteCodec(), FinalAnswerParser(False)))

    def collector():
        search = Selective(phases=[Phase("evidence", rollouts_per_task=1)])
        return Collector(agent, search=search, execution=Execution(max_outage_share=1.0), seed=1)

    tasks = [Task("a", {"answer": "4"}), Task("b", {"answer": "5"})]
    journal = MemoryJournal()
    with pytest.raises(BadResponses):
        run(collector().collect(tasks, journal))
    policy.bad = False
    with pytest.raises(ValueError, match=r"^rollout 0 of the unfinished wave 0 of phase 0 is of task 'a', and its job"):
        run(collector().collect(tasks[::-1], journal))
    assert len(run(collector().collect(tasks, journal)).actor) == 2  # the same tasks: the wave run again, finished
