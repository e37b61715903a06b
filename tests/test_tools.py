"""ToolEnv: tool failures become observations; the Env contract holds."""

from __future__ import annotations

import asyncio

from focus.env import Action, Task
from focus.testing import EnvConformance, run
from focus.tools import Tool, ToolEnv
from focus.workspace import MemoryWorkspace

SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


async def _double(args, ctx):
    return str(args["n"] * 2)


async def _slow(args, ctx):
    await asyncio.sleep(5)
    return "late"


def _raises(args, ctx):
    raise ValueError("boom")


def _wrong(args, ctx):
    return 12


def make_env():
    tools = [
        Tool("double", "x2", SCHEMA, _double),
        Tool("slow", "sleeps", {}, _slow, timeout_s=0.05),
        Tool("raises", "fails", {}, _raises),
        Tool("wrong", "returns int", {}, _wrong),
    ]
    return ToolEnv(
        tools,
        judge=lambda t, a: float(a == t.data["answer"]),
        max_tool_calls=3,
        workspace_factory=lambda t: MemoryWorkspace(),
    )


class TestToolEnv(EnvConformance):
    def make_env(self):
        return make_env()

    def make_task(self):
        return Task("t", {"prompt": "double 2", "answer": "4"})

    def make_action(self):
        return Action("tool", name="double", arguments={"n": 2})


def _step(action):
    env = make_env()
    task = Task("t", {"prompt": "p", "answer": "4"})
    reset = run(env.reset(task, None))
    return run(env.step(reset.state, action, None))


def test_tool_call_and_answer():
    assert _step(Action("tool", name="double", arguments={"n": 2})).observation == "4"
    r = _step(Action("answer", text="4"))
    assert r.done and r.reward == 1.0


def test_tool_failures_are_observations():
    cases = [
        (Action("tool", name="nope"), "Unknown tool"),
        (Action("tool", name="double", arguments={}), "needs the argument 'n'"),
        (Action("tool", name="double", arguments={"n": "2"}), "must be of type integer"),
        (Action("tool", name="slow"), "timed out"),
        (Action("tool", name="raises"), "ValueError: boom"),
        (Action("tool", name="wrong"), "returned int"),
    ]
    for action, text in cases:
        r = _step(action)
        assert text in r.observation and r.info["tool_error"] == 1 and not r.done, (action, r)


def test_missing_prompt_field_names_the_field():
    env = make_env()
    try:
        run(env.reset(Task("t9", {}), None))
    except KeyError as e:
        assert "prompt" in str(e) and "t9" in str(e)
    else:
        raise AssertionError("expected KeyError")


def test_a_judge_with_a_third_parameter_reads_the_branchs_workspace():
    # a reward that depends on what the episode wrote (files, a ledger, a repository)
    # needs the branch's workspace; a judge of (task, answer) alone could not see it
    async def _save(args, ctx):
        ctx.workspace.write_text("out.txt", str(args["n"]))
        return "saved"

    def judge(task, answer, ctx):
        return float(ctx.workspace.read_text("out.txt") == task.data["want"] and answer == "done")

    env = ToolEnv([Tool("save", "write n", SCHEMA, _save)], judge, workspace_factory=lambda task: MemoryWorkspace())
    task = Task("t", {"prompt": "save 7", "want": "7"})
    ws = env.make_workspace(task)
    reset = run(env.reset(task, ws))
    state = run(env.step(reset.state, Action("tool", name="save", arguments={"n": 7}), ws)).state
    other = ws.fork()
    other.write_text("out.txt", "8")
    assert run(env.step(state, Action("answer", text="done"), ws)).reward == 1.0
    assert run(env.step(state, Action("answer", text="done"), other)).reward == 0.0
    # a judge of two parameters is called as before
    assert run(ToolEnv([], lambda task, answer: 0.5).step(state, Action("answer", text="x"), None)).reward == 0.5


def test_a_tool_s_own_timeout_error_is_its_failure_not_the_tool_timeout():
    """``socket.timeout`` is ``TimeoutError``: a tool whose client gave up on its own (or a
    synchronous tool, which no timer bounds) failed with that error; the observation must
    not claim the tool's ``timeout_s`` ran out, nor count a tool timeout."""

    def sync_timeout(args, ctx):
        raise TimeoutError("timed out")  # what urllib / socket raise

    async def async_timeout(args, ctx):
        await asyncio.sleep(0)
        raise TimeoutError("upstream read timed out")

    env = ToolEnv(
        [Tool("s", "", {}, sync_timeout, timeout_s=30), Tool("a", "", {}, async_timeout, timeout_s=30)],
        judge=lambda t, a: 0.0,
    )
    state = run(env.reset(Task("t", {"prompt": "p"}), None)).state
    for name, text in (("s", "timed out"), ("a", "upstream read timed out")):
        r = run(env.step(state, Action("tool", name=name), None))
        assert r.observation == f"Tool {name} failed: TimeoutError: {text}", r.observation
        assert r.info == {"tool_error": 1}


def test_a_tool_s_text_from_undecodable_bytes_reaches_the_model_with_those_bytes_replaced():
    """A file listing with a name that is not UTF-8 (``os.listdir`` gives it with lone
    surrogates) could not be encoded by any codec: the observation was refused and the
    rollout failed. The model now reads the listing, each such byte as U+FFFD."""
    import os

    from focus.env import check_step_result
    from focus.tools import readable

    name = os.fsdecode(b"report-\xff.txt")  # as os.listdir gives it
    listing = Tool("ls", "list", {}, lambda args, ctx: f"notes.md\n{name}\n")
    env = ToolEnv([listing], judge=lambda t, a: 0.0)
    reset = run(env.reset(Task("t", {"prompt": "p"}), None))
    result = check_step_result(run(env.step(reset.state, Action("tool", name="ls"), None)), "ToolEnv.step")
    assert result.observation == "notes.md\nreport-\ufffd.txt\n" and result.info == {} and not result.done
    assert readable("a\ud800b") == "a\ufffd\ufffd\ufffdb"  # a surrogate that escapes no byte
    for text in ("plain", "Grüße, 世界 🙂"):
        assert readable(text) is text


def test_a_judge_that_returns_no_number_fails_naming_the_judge_and_the_task():
    """A judge without its ``return`` (None), or one returning a dict, failed the
    rollout with "TypeError: float() argument must be a string or a real number, not
    'NoneType'", naming neither the judge nor the task."""
    import pytest

    from focus.env import EnvError

    def judge_returning(out):
        return lambda task, answer: out

    for out, said in ((None, "None"), ({"score": 1}, r"\{'score': 1\}"), ("yes", "'yes'")):
        env = ToolEnv([], judge=judge_returning(out))
        reset = run(env.reset(Task("t7", {"prompt": "p"}), None))
        with pytest.raises(EnvError, match=rf"^the judge of ToolEnv returned {said} for task 't7', expected a number"):
            run(env.step(reset.state, Action("answer", text="42"), None))
    env = ToolEnv([], judge=lambda t, a: True)
    assert (
        run(env.step(run(env.reset(Task("t", {"prompt": "p"}), None)).state, Action("answer", text="4"), None)).reward
        == 1.0
    )


def test_a_tool_timeout_or_call_limit_that_could_never_hold_is_refused_where_it_is_made():
    """``timeout_s=0`` or below timed every call of a tool that suspends out at once, and
    NaN turned its timeout off, without a word; ``max_tool_calls=-1`` ended an episode at
    its first call, as 0 does (0: no tool call allowed, still taken)."""
    import math

    import pytest

    from focus.tools import Tool, ToolEnv

    async def fn(args, ctx):  # type: ignore[no-untyped-def]
        return "ok"

    for bad in (0, -1.0, math.nan):
        with pytest.raises(ValueError, match=rf"^Tool 'x': timeout_s must be a number of seconds > 0, got {bad!r}$"):
            Tool("x", "d", {"type": "object"}, fn, timeout_s=bad)
    ok = Tool("x", "d", {"type": "object"}, fn, timeout_s=math.inf)
    with pytest.raises(ValueError, match=r"^ToolEnv.max_tool_calls must be >= 0 \(None: no limit\), got -1$"):
        ToolEnv([ok], judge=lambda t, a: 1.0, max_tool_calls=-1)
    assert ToolEnv([ok], judge=lambda t, a: 1.0, max_tool_calls=0).max_tool_calls == 0


def test_a_plain_def_tool_is_not_timed_out_and_its_declaration_says_so():
    """``Tool.timeout_s`` bounds an ``async`` call; a plain ``def`` ran to its end past it
    with no word anywhere (the type allows both), so a user's blocking tool held every
    rollout while it ran. The behaviour stays (a thread cannot be stopped); the
    declaration says it and what to write instead."""
    import time

    from focus.tools import ToolState

    def slow(args, ctx):
        time.sleep(0.3)
        return "done"

    env = ToolEnv([Tool("slow", "", {"type": "object"}, slow, timeout_s=0.05)], lambda t, a: 0.0)
    result = asyncio.run(env.step(ToolState(Task("t", {"prompt": "x"})), Action("tool", name="slow"), None))
    assert result.observation == "done" and "tool_timeout" not in result.info
    doc = " ".join((Tool.__doc__ or "").split())
    assert "``timeout_s`` bounds an ``async`` call only" in doc and "asyncio.to_thread" in doc
