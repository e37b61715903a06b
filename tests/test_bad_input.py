"""Bad input fails early with an error naming its cause, before rollouts are spent.

Configs (invalid values, unknown fields and backends, malformed URLs), storage roots,
token ids outside the vocabulary and envs returning the wrong types. Where the check
can run before any model call, the tests prove that no request reached the model
server (the fault proxy counts every generation request).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys

import pytest

from focus.agent import Agent
from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.collector import Collector
from focus.critic import HttpCritic
from focus.env import Env, EnvError, Reset, Task
from focus.execution import Execution
from focus.format import ByteCodec, PolicyFormat
from focus.policy import PolicyError, SamplingParams
from focus.priority import Phase, Selective
from focus.toy import FirstDigitParser, ReachTarget, reach_target_tasks, toy_format
from storage import BatchStore, CheckpointStore
from tasks.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(60)

FAST = HttpConfig(backoff_s=0.01, backoff_max_s=0.02, max_retries=2, timeout_s=5)


def config_error(**overrides) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides, environ={})
    return str(e.value)


# ---- configuration ----


def test_invalid_values_are_all_named_at_once():
    msg = config_error(**{"agent.max_steps": 0, "search.phases.1.transitions": -5, "execution.max_concurrency": 0})
    for field in ("agent.max_steps", "search.phases.1.transitions", "execution.max_concurrency"):
        assert field in msg


@pytest.mark.parametrize(
    "overrides,names",
    [
        ({"model.kind": "vllm"}, ["model.kind", "'openai'"]),
        ({"critic.kind": "oracle"}, ["critic.kind"]),
        ({"execution.kind": "ray"}, ["execution.kind"]),
        ({"model.urll": "http://x"}, ["model.urll", "unknown field"]),
        ({"model.kind": "openai"}, ["model.url is required"]),
        ({"model.kind": "factory", "model.factory": "no_colon"}, ["model.factory", "package.module:name"]),
        ({"model.kind": "openai", "model.url": "localhost:8000"}, ["'localhost:8000'", "http://"]),
        ({"critic.kind": "http", "critic.url": "ftp://scores"}, ["critic", "'ftp://scores'", "http://"]),
        ({"storage.root": "nope://bucket/x"}, ["storage.root", "'nope'"]),
        ({"storage.root": "s3:/bucket/x"}, ["storage.root", "'s3:/bucket/x'", "://"]),
        ({"collection_id": "../other"}, ["collection_id"]),
        # both ran: 's3://' stopped mid-run with a path 'outside the store's root 's3:'',
        # 's3//bucket' collected into the local folder ./s3/bucket
        ({"storage.root": "s3://"}, ["storage.root", "'s3://' names no bucket"]),
        ({"storage.root": "s3:///runs"}, ["storage.root", "'s3://runs'"]),
        ({"storage.root": "memory://"}, ["storage.root", "names no bucket"]),
        (
            {"storage.root": "s3//bucket/runs"},
            ["storage.root", "did you mean 's3://bucket/runs'?", "'./s3//bucket/runs'"],
        ),
    ],
)
def test_bad_config_names_the_field_and_cause(overrides, names):
    msg = config_error(**overrides)
    for name in names:
        assert name in msg, msg


def test_env_variable_overrides_are_named_as_the_source():
    with pytest.raises(ConfigError) as e:
        load_config(environ={"FOCUS_AGENT__MAX_STEPS": "-1"})
    assert "FOCUS_AGENT__MAX_STEPS" in str(e.value) and "agent.max_steps" in str(e.value)


def test_unimportable_factory_fails_when_built_naming_the_path():
    cfg = load_config(overrides={"env.kind": "factory", "env.factory": "no_such_module:make"}, environ={})
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module'"):
        cfg.build_env()


def test_an_env_factory_that_raises_or_returns_the_wrong_parts_is_named_in_one_line():
    """A user's env factory that raises, or returns (format, env, tasks) or dicts as tasks,
    failed as ``RuntimeError: ...`` or ``AttributeError: 'X' object has no attribute
    'codec'`` from deep in the agent, naming neither the factory nor what was wrong."""
    from flows.errors import one_line

    def built(factory):
        cfg = load_config(overrides={"env.kind": "factory", "env.factory": f"fixtures.failing:{factory}"}, environ={})
        with pytest.raises(Exception) as e:
            cfg.build_env()
        return e.value, one_line(e.value)

    err, line = built("unreadable_tasks")
    assert isinstance(err, EnvError)
    assert line == "env.factory 'fixtures.failing:unreadable_tasks' raised FileNotFoundError: tasks.jsonl is not there"
    err, line = built("swapped_parts")
    assert isinstance(err, ConfigError)
    assert line == (
        "env.factory 'fixtures.failing:swapped_parts' must return (env, format, tasks): its env is a "
        "PolicyFormat, not a focus.env.Env; its format is a ReachTarget, not a focus.format.PolicyFormat"
    )
    err, line = built("dict_tasks")
    assert line.endswith("must return (env, format, tasks): its task 0 is a dict, not a focus.env.Task"), line
    # no tasks at all stopped the collection later with 'ValueError: Collector needs at least one task'
    err, line = built("no_tasks")
    assert isinstance(err, ConfigError)
    assert (
        line
        == "env.factory 'fixtures.failing:no_tasks' returned no tasks (with n_tasks=8, seed=0): nothing to collect on"
    )


@pytest.mark.slow  # starts the focus command
def test_an_env_factory_with_fewer_tasks_than_asked_for_is_refused_in_one_line(tmp_path):
    """A factory that returned 3 tasks where ``--tasks 64`` asked for 64 (a filter too
    strict, a short data file) was accepted without a word: the collection ran on 3 and
    looked like a finished one of 64."""
    from pathlib import Path

    tests = str(Path(__file__).resolve().parent)  # fixtures.failing
    out = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--store", str(tmp_path / "runs"), "--tasks", "64",
         "--set", "env.kind=factory", "--set", "env.factory=fixtures.failing:three_tasks", "--collection-id", "few"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**os.environ, "PYTHONPATH": tests},
    )  # fmt: skip
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2 and lines == [
        "error: env.factory 'fixtures.failing:three_tasks' returned 3 tasks where 64 were asked for "
        "(with n_tasks=64, seed=0): its code or its data falls short; to collect on those 3, "
        "ask for 3 (--tasks 3, env.n_tasks; a train loop's held-out evaluation: train.eval_tasks)"
    ], (out.returncode, lines)
    assert not CheckpointStore(str(tmp_path / "runs")).list("few")  # refused before anything ran
    # asked for the 3 it has, the factory is taken
    cfg = load_config(
        overrides={"env.kind": "factory", "env.factory": "fixtures.failing:three_tasks", "env.n_tasks": 3}, environ={}
    )
    assert len(cfg.build_env()[2]) == 3


def test_a_model_or_critic_factory_that_returns_something_else_is_named_in_one_line():
    """A model factory that returned no Policy stopped the collection with
    ``AttributeError: 'str' object has no attribute 'aclose'``, a critic factory's with
    ``TypeError: Collector's critic must be an instance of Critic, got a float``: neither
    named the factory."""
    for section, factory, build, got, wanted in [
        ("model", "text_policy", "build_policy", "str", "focus.policy.Policy"),
        ("critic", "number_critic", "build_critic", "float", "focus.critic.Critic"),
    ]:
        name = f"fixtures.failing:{factory}"
        cfg = load_config(overrides={f"{section}.kind": "factory", f"{section}.factory": name}, environ={})
        with pytest.raises(ConfigError) as e:
            getattr(cfg, build)()
        assert str(e.value) == f"{section}.factory {name!r} returned a value of type {got}, not a {wanted}"


def test_a_factory_that_passes_its_options_on_names_a_misspelt_option_in_one_line():
    """A factory taking ``**options`` passes the check of its signature; the class it
    hands them to refused one, and a Custom run with ``model.options = {"nope": 1}``
    failed with ``TypeError: DigitPolicy.__init__() got an unexpected keyword argument
    'nope'``, naming neither the field nor the factory."""
    name = "fixtures.digits:digit_policy"
    cfg = load_config(
        overrides={"model.kind": "factory", "model.factory": name, "model.options": {"nope": 1}}, environ={}
    )
    with pytest.raises(ConfigError) as e:
        cfg.build_policy()
    line = str(e.value)
    assert (
        line.startswith(f"model.factory {name!r} raised TypeError: ") and "(called with model.options nope=1)" in line
    )


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("critic.value", float("inf"), "critic.value: must be finite and within ±1e+60, got inf"),
        ("critic.value", float("nan"), "critic.value: must be finite and within ±1e+60, got nan"),
        ("agent.sampling.stop_token_ids", [0, -1], "agent.sampling.stop_token_ids.1: Input should be greater than"),
    ],
)
def test_a_value_no_part_can_use_is_refused_naming_its_field(field, value, why):
    """``critic.value = inf`` passed the configuration and failed once the critic was
    built (``ValueError: ConstantCritic value must be finite ...``, no field named); a
    negative stop token id passed both and every request of the collection was refused
    by the model server (400 ``stop_token_ids must be non-negative``)."""
    with pytest.raises(ConfigError, match=re.escape(why)):
        load_config(overrides={field: value}, environ={})


def test_cli_reports_a_bad_config_file_without_a_traceback(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[model]\nkind = "vllm"\n[agent]\nmax_steps = 0\n')
    out = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--config", str(bad)], capture_output=True, text=True, timeout=60
    )
    text = out.stdout + out.stderr
    assert out.returncode != 0
    assert "model.kind" in text and "agent.max_steps" in text and str(bad) in text
    assert "Traceback" not in text


@pytest.mark.integration
def test_cli_names_a_missing_or_broken_weights_file_in_one_line(tmp_path):
    """A missing file, a folder or a file that is no weights file is refused before
    anything starts (exit 2), and the line says why (torch's paragraph about
    ``weights_only`` is not it)."""
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    cases = [
        (tmp_path / "missing.pt", 2, "no such file"),
        (tmp_path, 2, "a folder"),
        (garbage, 2, "not a tinylm weights file: not a torch checkpoint"),
    ]
    for weights, code, cause in cases:
        out = subprocess.run(
            [sys.executable, "-m", "cli", "collect", "--store", str(tmp_path / "runs"),
             "--set", f"model.weights={weights}", "--log-file", str(tmp_path / "log")],
            capture_output=True, text=True, timeout=60, cwd=tmp_path,
        )  # fmt: skip
        lines = (out.stdout + out.stderr).strip().splitlines()
        assert out.returncode == code and len(lines) == 1, lines
        assert cause in lines[0] and str(weights) in lines[0] and "weights_only" not in lines[0], lines[0]
    # the training loop checks the same before it starts anything
    out = subprocess.run(
        [sys.executable, "-m", "cli", "train", "--iterations", "1", "--set", f"storage.root={tmp_path / 'runs'}",
         "--set", f"model.weights={garbage}", "--log-file", str(tmp_path / "log")],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
    )  # fmt: skip
    lines = (out.stdout + out.stderr).strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "not a tinylm weights file" in lines[0], lines


@pytest.mark.integration
def test_a_model_server_that_cannot_start_says_why_and_keeps_its_log(tmp_path):
    """Past the preflight (the library used directly), the server's own first line of
    failure is the error, and its log travels with it as a note."""
    from focus.backends import LocalModelServer
    from focus.policy import PolicyError

    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    with pytest.raises(PolicyError, match="did not start: ValueError: .*not a tinylm weights file") as err:
        LocalModelServer(garbage).start()
    assert any("server log:" in note and "Traceback" in note for note in err.value.__notes__)


# ---- URLs given to the library directly ----


@pytest.mark.parametrize("url", ["localhost:8000", "127.0.0.1:8000/v1", "ws://127.0.0.1:1"])
@pytest.mark.parametrize("cls", [OpenAICompatPolicy, SGLangPolicy])
def test_policy_rejects_a_malformed_url_at_construction(cls, url):
    with pytest.raises(ValueError, match="http:// or https://"):
        cls(url)


def test_http_critic_rejects_a_malformed_url_at_construction():
    with pytest.raises(ValueError, match="http:// or https://"):
        HttpCritic("scores.internal/predict")


@pytest.mark.parametrize("store", [BatchStore, CheckpointStore])
@pytest.mark.parametrize(
    "root,cause",
    [("nope://bucket/x", "'nope'"), ("s3:/bucket/x", "://"), ("s3://", "names no bucket"), ("gs//b/x", "did you mean")],
)
def test_stores_reject_unknown_protocols_and_malformed_urls_at_construction(store, root, cause):
    with pytest.raises(ValueError) as e:
        store(root)
    assert cause in str(e.value) and root in str(e.value)


# ---- token ids and env types, checked before the first model call ----


class WideCodec(ByteCodec):
    """A codec whose ids do not fit the model's vocabulary (the wrong codec for the model)."""

    def render(self, messages):
        return [300 + t for t in super().render(messages)]


def toy_collector(url: str, *, env: Env | None = None, fmt: PolicyFormat | None = None) -> Collector:
    policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size, config=FAST)
    agent = Agent(policy, env or ReachTarget(), fmt or toy_format(), max_steps=4, sampling=SamplingParams(max_tokens=4))
    search = Selective(phases=[Phase("evidence", rollouts_per_task=2)])
    return Collector(agent, search=search, execution=Execution(max_concurrency=4), collection_id="bad")


def run_collect(col: Collector, tasks):
    async def go():
        try:
            return await col.collect(tasks)
        finally:
            await col.agent.policy.aclose()

    return asyncio.run(go())


def test_prompt_ids_outside_the_vocabulary_fail_before_any_model_call(fault_proxy):
    col = toy_collector(fault_proxy.url, fmt=PolicyFormat(WideCodec(), FirstDigitParser()))
    tasks = reach_target_tasks(2, seed=1)
    with pytest.raises(PolicyError) as e:
        run_collect(col, tasks)
    msg = str(e.value)
    assert (
        tasks[0].id in msg
        and f"outside the vocabulary [0, {ByteCodec.vocab_size})" in msg
        and "prompt token id 556 at position 0" in msg
    )
    assert fault_proxy.requests == 0


def test_a_server_rejecting_ids_outside_its_vocabulary_is_not_retried(fault_proxy):
    policy = OpenAICompatPolicy(fault_proxy.url, config=FAST)  # vocab unknown to the client

    async def go():
        try:
            return await policy.sample([1, 2, 100_000], SamplingParams(max_tokens=4))
        finally:
            await policy.aclose()

    with pytest.raises(PolicyError, match="rejected with status 400") as e:
        asyncio.run(go())
    assert "100000" in str(e.value)
    assert fault_proxy.requests == 1 and policy.http.retries == {}


class BadReset(Env):
    def __init__(self, mode: str) -> None:
        self.mode = mode

    async def reset(self, task, workspace):
        if self.mode == "dict":
            return {"state": 0, "messages": ["hi"]}
        if self.mode == "no_messages":
            return Reset(0, ())
        if self.mode == "hang":
            await asyncio.sleep(30)
        raise LookupError("dataset row missing")

    async def step(self, state, action, workspace):  # pragma: no cover - never reached
        raise AssertionError


@pytest.mark.parametrize(
    "mode,cause",
    [
        ("dict", "BadReset.reset returned dict, expected Reset"),
        ("no_messages", "no opening messages"),
        ("raise", "LookupError: dataset row missing"),
        ("hang", "timed out after 0.3 s"),
    ],
)
def test_an_env_reset_breaking_its_contract_fails_before_any_model_call(fault_proxy, mode, cause):
    col = toy_collector(fault_proxy.url, env=BadReset(mode))
    col.agent.env_timeout_s = 0.3
    with pytest.raises(EnvError) as e:
        run_collect(col, [Task("task-7")])
    assert cause in str(e.value) and "'task-7'" in str(e.value)
    assert fault_proxy.requests == 0


def test_tasks_of_the_wrong_type_are_refused_before_any_work(fault_proxy):
    col = toy_collector(fault_proxy.url)
    with pytest.raises(TypeError, match="focus.env.Task"):
        run_collect(col, [{"id": "t", "target": 5}])
    with pytest.raises(ValueError, match="at least one task"):
        run_collect(col, [])
    assert fault_proxy.requests == 0
