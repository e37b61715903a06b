"""examples/math: the equivalence verifier, the env, and a run on the embedded model."""

from __future__ import annotations

import pytest

from examples.math import MathEnv, answers_equivalent, generate_problems, math_tasks
from examples.math.env import MathState
from examples.math.run import MathConfig, main, make_codec
from focus.env import Action, Task
from focus.format import ByteCodec
from focus.testing import EnvConformance, run


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("0.5", "\\frac{1}{2}"),
        ("1/2", "\\frac{1}{2}"),
        ("1+x", "x + 1"),
        ("(x-2)(x+2)", "x^2 - 4"),
        ("\\boxed{7}", "7"),
        ("x = -1", "-1"),
        ("2\\sqrt{2}", "\\sqrt{8}"),
        ("9.2", "\\frac{46}{5}"),
    ],
)
def test_equivalent_forms_are_accepted(pred, gold):
    assert answers_equivalent(pred, gold)


@pytest.mark.parametrize(
    ("pred", "gold"), [("3", "4"), ("x - 1", "x + 1"), ("", "4"), ("banana", "4"), ("1" * 300, "1")]
)
def test_wrong_or_unparsable_answers_are_rejected(pred, gold):
    assert not answers_equivalent(pred, gold)


def test_string_equality_is_not_the_criterion():
    # same characters would be needed by string equality; the verifier needs meaning
    assert "0.50" != "\\frac{1}{2}" and answers_equivalent("0.50", "\\frac{1}{2}")


def test_unparsable_gold_is_a_clear_error():
    with pytest.raises(ValueError, match="gold answer"):
        answers_equivalent("1", "")


def test_problem_set_is_deterministic_and_self_consistent():
    a, b = generate_problems(25, seed=1), generate_problems(25, seed=1)
    assert a == b != generate_problems(25, seed=2)
    assert {p.kind for p in a} == {"fraction_sum", "linear_equation", "expand", "percent", "lcm"}
    for p in a:
        assert answers_equivalent(p.answer, p.answer), p
    with pytest.raises(ValueError, match="unknown problem kinds"):
        generate_problems(3, kinds=("geometry",))


class TestMathEnvConformance(EnvConformance):
    def make_env(self):
        return MathEnv()

    def make_task(self):
        return math_tasks(generate_problems(1))[0]

    def make_action(self):
        return Action("answer", text="42")


def test_env_rewards_correct_answer_and_allows_retries():
    env = MathEnv(max_attempts=2)
    task = Task("t", {"question": "Compute 1/4 + 1/4.", "answer": "\\frac{1}{2}"})
    reset = run(env.reset(task, None))
    assert reset.state == MathState("\\frac{1}{2}") and reset.messages[-1].content == "Compute 1/4 + 1/4."
    wrong = run(env.step(reset.state, Action("answer", text="0.25"), None))
    assert (wrong.reward, wrong.done) == (0.0, False) and "Try again" in wrong.observation
    right = run(env.step(wrong.state, Action("answer", text="0.5"), None))
    assert (right.reward, right.done) == (1.0, True)
    last = run(env.step(wrong.state, Action("answer", text="3"), None))
    assert (last.reward, last.done) == (0.0, True)
    with pytest.raises(ValueError, match="needs a non-empty string 'answer'"):
        run(env.reset(Task("t", {"question": "?"}), None))


def test_codec_choice(tmp_path):
    assert isinstance(make_codec(MathConfig()), ByteCodec)
    with pytest.raises(FileNotFoundError, match="no tokenizer file"):
        make_codec(MathConfig(model_url="http://127.0.0.1:1", tokenizer=str(tmp_path / "missing.json")))


def test_run_on_embedded_model_writes_a_readable_batch(local_model_server, tmp_path, capsys):
    import duckdb

    from storage import BatchStore

    out = tmp_path / "store"
    result = main(
        [
            "--model-url",
            local_model_server.url,
            "--problems",
            "3",
            "--rollouts-per-task",
            "2",
            "--transitions",
            "4",
            "--out",
            str(out),
        ]
    )
    assert result["tasks"] == 3 and result["actor_rows"] > 0 and 0.0 <= result["solve_rate"] <= 1.0
    assert '"batch"' in capsys.readouterr().out
    batch = BatchStore(str(out)).read(result["batch"])
    assert len(batch.actor) == result["actor_rows"]
    assert all(len(r.logprobs) == len(r.completion_ids) for r in batch.actor)
    # prompts are the env's question rendered by the byte codec, exactly
    questions = {p.question for p in generate_problems(3)}
    first_prompts = {ByteCodec().decode(r.prompt_ids) for r in batch.actor if r.turn_index == 0 and r.node_id == 0}
    assert any(any(q in p for q in questions) for p in first_prompts)
    n = duckdb.sql(f"select count(*) from read_parquet('{out}/batches/math/iter-000000/actor/*.parquet')").fetchall()[0]
    assert n == (result["actor_rows"],)


def test_tokenizer_without_url_is_refused():
    with pytest.raises(SystemExit):
        main(["--tokenizer", "x.json"])


def test_the_digit_sum_difficulty_draws_single_digit_sums():
    from examples.math.env import default_tasks
    from examples.math.problems import DIFFICULTIES, generate_problems

    problems = generate_problems(40, 3, DIFFICULTIES["digit_sum"])
    for p in problems:
        a, b = (int(x) for x in p.question.removeprefix("Compute ").rstrip(".").split(" + "))
        assert p.kind == "digit_sum" and 1 <= a and 1 <= b and int(p.answer) == a + b <= 9
    assert [t.data["kind"] for t in default_tasks(5, 0)] == list(DIFFICULTIES["standard"])  # unchanged default
    with pytest.raises(ValueError, match="unknown difficulty"):
        default_tasks(2, 0, "hard")


def _example(tmp_path, *args: str):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "examples.math.run", "--problems", "2", "--out", str(tmp_path / "out"), *args]
    return subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=90)


@pytest.mark.integration  # subprocesses, a loopback server
def test_a_model_url_that_is_no_model_server_is_one_line_and_exit_2(tmp_path):
    """A closed port waited `outage_wait_s` (300 s), a progress line every 10 s; a web
    server that is no model service (its 501 to a POST) ended in a traceback of forty
    lines, exit 1. Each is one line naming the cause now, exit 2, asked before the run
    starts (`--debug` has no traceback to show there)."""
    import threading
    from http.server import HTTPServer, SimpleHTTPRequestHandler

    from fixtures.prefect import free_port

    closed = _example(tmp_path, "--model-url", f"http://127.0.0.1:{free_port()}")
    assert closed.returncode == 2 and closed.stderr.splitlines() == [closed.stderr.strip()], closed.stderr
    assert closed.stderr.startswith("error: cannot reach the model service at http://127.0.0.1:") and (
        "check --model-url," in closed.stderr
    ), closed.stderr
    web = HTTPServer(("127.0.0.1", 0), SimpleHTTPRequestHandler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{web.server_address[1]}"
        refused = _example(tmp_path, "--model-url", url)
        debug = _example(tmp_path, "--model-url", url, "--debug")
    finally:
        web.shutdown()
        web.server_close()
    # before the model is asked anything (it refused every rollout of the first wave, a progress line each)
    assert refused.returncode == 2 and refused.stderr.splitlines() == [refused.stderr.strip()], refused.stderr
    assert refused.stderr.startswith(f"error: the server at {url} (--model-url) answers HTTP but not as a model")
    assert "status 501" in refused.stderr and debug.returncode == 2, debug.stderr


def test_a_flag_out_of_range_is_one_line_naming_the_flag(capsys):
    """`--problems 0` printed pydantic's ValidationError with its traceback, naming the
    field `problems`, not the flag."""
    with pytest.raises(SystemExit) as e:
        main(["--problems", "0", "--max-tokens", "0"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "error: --problems: Input should be greater than or equal to 1; --max-tokens: Input should be greater than 0"
        "; python -m examples.math.run -h lists the options"
    ], err  # one line: argparse's usage came first
