"""An API key for the model service: named by ``model.api_key_env``, read from the
environment where the client is built, sent as vLLM's ``--api-key`` expects, and never
written to the configuration, its record, the batch or the output."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures.prefect import base_env
from test_cli import focus

from focus.backends.retry import HttpConfig
from focus.testing.simserver import SimConfig, SimServerProcess
from tasks.config import ConfigError, FocusConfig
from tasks.config.build import api_key

KEY = "sk-test-5f1e2d-not-a-real-key"
SMALL = ["--tasks", "2", "--transitions", "6", "--set", "agent.max_steps=3", "--set", "model.model=sim"]


def test_the_key_comes_from_the_named_variable_and_a_missing_one_says_which(monkeypatch):
    monkeypatch.setenv("FOCUS_TEST_KEY", KEY)
    assert api_key("FOCUS_TEST_KEY") == KEY and api_key(None) is None
    monkeypatch.delenv("FOCUS_TEST_KEY")
    with pytest.raises(ConfigError, match="model.api_key_env names FOCUS_TEST_KEY, which is not set"):
        api_key("FOCUS_TEST_KEY")
    with pytest.raises(ValueError, match="not an environment variable's name"):
        FocusConfig.model_validate({"model": {"kind": "openai", "url": "http://h:1", "api_key_env": KEY}})


def test_the_key_stays_out_of_reprs():
    assert KEY not in repr(HttpConfig(api_key=KEY)) and KEY not in str(HttpConfig(api_key=KEY))


def _files_holding(root: Path, text: str) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file() and text.encode() in p.read_bytes()]


@pytest.mark.integration
def test_focus_collect_sends_the_key_a_server_asks_for_and_writes_it_nowhere(tmp_path):
    with SimServerProcess(SimConfig(slots=8, latency_s=0.0, api_key=KEY)) as server:
        env = base_env(tmp_path / "prefect")
        args = ["collect", "--model-url", server.url, *SMALL, "--store", str(tmp_path / "store")]
        # without the key the server refuses every request: one line, exit 2
        refused = focus([*args, "--collection-id", "nokey"], env, tmp_path)
        assert refused.returncode == 2 and "401" in refused.stderr, refused.stderr[-2000:]
        # the variable named but not set: one line naming it, before anything runs
        unset = focus([*args, "--collection-id", "unset", "--set", "model.api_key_env=FOCUS_TEST_KEY"], env, tmp_path)
        assert unset.returncode == 2 and "FOCUS_TEST_KEY, which is not set" in unset.stderr, unset.stderr[-2000:]
        assert len(unset.stderr.strip().splitlines()) == 1
        done = focus(
            [*args, "--collection-id", "withkey", "--json", "--set", "model.api_key_env=FOCUS_TEST_KEY"],
            {**env, "FOCUS_TEST_KEY": KEY},
            tmp_path,
        )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["stats"]["failed_rollouts"] == 0
    assert KEY not in done.stdout + done.stderr + refused.stderr + unset.stderr
    assert _files_holding(tmp_path, KEY) == [], "the key was written to disk"
    assert os.environ.get("FOCUS_TEST_KEY") is None


def test_the_critic_service_gets_its_own_key(monkeypatch):
    import asyncio

    import httpx

    from focus.critic import HttpCritic
    from tasks.config import load_config

    seen: list[str | None] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(200, json={"values": [0.5]})

    critic = HttpCritic(
        "http://critic.invalid/score", config=HttpConfig(api_key=KEY), transport=httpx.MockTransport(handler)
    )
    assert [p.value for p in asyncio.run(critic.predict_with_std([[1, 2]]))] == [0.5]
    assert seen == [f"Bearer {KEY}"]

    over = {"critic.kind": "http", "critic.url": "http://127.0.0.1:9/score", "critic.api_key_env": "FOCUS_CRITIC_KEY"}
    monkeypatch.setenv("FOCUS_CRITIC_KEY", KEY)
    assert load_config(overrides=over).build_critic().http.config.api_key == KEY
    monkeypatch.delenv("FOCUS_CRITIC_KEY")
    with pytest.raises(ConfigError, match="critic.api_key_env names FOCUS_CRITIC_KEY, which is not set"):
        load_config(overrides=over).build_critic()
