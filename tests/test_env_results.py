"""What an env's step may return (focus.env.check_step_result), without servers."""

import numpy as np
import pytest

from focus.env import EnvError, StepResult, check_step_result


def test_numpy_bool_done_is_read_as_a_bool_and_other_types_are_refused():
    """gym-style envs compute ``done`` with numpy (``np.bool_``): it is what the env
    meant, so it is taken as a plain bool; a string or a number is still a broken env."""
    for done in (np.True_, np.bool_(False)):
        got = check_step_result(StepResult(None, "o", np.float32(1.0), done), "Env.step")
        assert type(got.done) is bool and got.done == bool(done)
    for bad in ("yes", 1, np.int64(1), None):
        with pytest.raises(EnvError, match=r"Env.step returned done=.*expected a bool"):
            check_step_result(StepResult(None, "o", 0.0, bad), "Env.step")


def test_info_that_is_no_mapping_or_counts_tool_errors_with_no_number_is_refused_naming_the_env():
    """``info=None``, a list, or ``info['tool_error']`` as text failed the rollout's job
    with a bare AttributeError / ValueError from the agent's tool-error count."""
    for info in ({}, {"tool_error": 1}, {"tool_error": np.int64(2)}, {"tool_error": True}, {"other": "text"}):
        assert check_step_result(StepResult(None, "o", 0.0, False, info), "Env.step").info == info
    for info, said in ((None, "info=None"), ([1], r"info=\[1\]"), ("x", "info='x'")):
        with pytest.raises(EnvError, match=rf"^Env.step returned {said}, expected a mapping"):
            check_step_result(StepResult(None, "o", 0.0, False, info), "Env.step")
    for count in ("bad", "1", None, float("nan"), [1]):
        with pytest.raises(
            EnvError, match=r"^Env.step returned info\['tool_error'\]=.*expected a number of tool failures"
        ):
            check_step_result(StepResult(None, "o", 0.0, False, {"tool_error": count}), "Env.step")


def test_an_observation_holding_a_lone_surrogate_is_refused_naming_the_env():
    """A file name or a subprocess's output decoded with surrogateescape is no text a
    codec can encode; found by the codec, the rollout's job failed, its segments lost."""
    name = b"report-\xff.txt".decode("utf-8", errors="surrogateescape")
    with pytest.raises(
        EnvError, match=r"^Env.step returned an observation that is not valid text: '\\udcff' at character 7"
    ):
        check_step_result(StepResult(None, f"{name}", 0.0, False), "Env.step")
    for fine in ("plain", "Grüße, 世界 🙂", ""):
        assert check_step_result(StepResult(None, fine, 0.0, False), "Env.step").observation == fine


def test_opening_messages_whose_text_or_ids_are_not_text_or_ids_are_refused_naming_the_message():
    """``Message("user", task.data.get("question"))`` with the key missing gives None:
    the collection stopped with a bare AttributeError ('NoneType' object has no
    attribute 'encode', from the codec) naming neither env, task nor message."""
    from focus.env import Message, Reset, check_reset

    def reset(*messages):
        return check_reset(Reset(None, messages), "Env.reset")

    assert reset(Message("system", "s"), Message("user", "Grüße")).messages[1].content == "Grüße"
    assert reset(Message("assistant", "x", token_ids=(1, np.int64(2)))).messages[0].token_ids == (1, 2)
    for content, said in ((None, "None"), (42, "42"), (b"bytes", "b'bytes'")):
        with pytest.raises(EnvError, match=rf"^Env.reset returned opening message 1 \('user'\) with content {said}, "):
            reset(Message("system", "s"), Message("user", content))
    with pytest.raises(EnvError, match=r"^Env.reset returned opening message 0 that is not valid text: '\\udcff'"):
        reset(Message("user", b"\xff".decode(errors="surrogateescape")))
    for ids in (("a",), (1.5,), (True,)):
        with pytest.raises(EnvError, match=r"^Env.reset returned opening message 0 with token_ids .*expected ints"):
            reset(Message("assistant", "x", token_ids=ids))


def test_a_task_id_that_is_no_str_is_refused_when_the_task_is_made():
    """A dataset's integer id (``Task(row["id"])``) ran the whole collection, then the
    batch refused it: "column 'task_id': Expected bytes, got a 'int' object"."""
    from focus.env import Task

    for bad in (7, None, ("a",)):
        with pytest.raises(TypeError, match=rf"^Task.id must be a str, got {type(bad).__name__} .*write Task\(str"):
            Task(bad)  # type: ignore[arg-type]
    assert Task("7", {"q": 1}).id == "7"


def test_a_reward_given_as_text_is_refused_naming_the_env():
    """``float()`` read ``"1"`` and ``b"0.5"`` (a judge's answer passed on unparsed) as
    rewards: a collection of them ran to the end and trained on text. Numbers of every
    kind (numpy's, ints, bools, a 0-d array) are still rewards."""
    for reward in (1, True, np.float32(0.5), np.int64(-2), np.bool_(True), np.array(0.25)):
        assert check_step_result(StepResult(None, "o", reward, False), "Env.step").reward == reward
    for bad in ("1", b"0.5"):
        with pytest.raises(EnvError, match=r"^Env.step returned a non-numeric reward "):
            check_step_result(StepResult(None, "o", bad, False), "Env.step")


def test_an_integer_reward_too_large_for_a_float_is_refused_naming_the_env():
    """``float(10**400)`` raises OverflowError, which the check did not catch: the rollout
    failed with a bare "int too large to convert to float", naming no env."""
    with pytest.raises(EnvError, match=r"^Env.step returned the reward 1000.*, not a finite number within ±1e\+60$"):
        check_step_result(StepResult(None, "o", 10**400, False), "Env.step")
    assert check_step_result(StepResult(None, "o", 10**60, False), "Env.step").reward == 10**60
