"""A model server started again on other weights under the same served name.

vLLM names no weights version, only the served model (``--served-model-name``), and
SGLang's ``weight_version`` is ``"default"`` for every checkpoint: a server killed
mid-collection and started again on the same port with another checkpoint answered
under the same version, and one batch mixed two policies' samples without a word (the
project's own server names a weights hash and was caught). The client now reads where
the server loaded its weights (vLLM's ``/v1/models`` ``root``, SGLang's ``model_path``)
at first contact and again after failures a restart gives, and each answer's
``policy_version`` carries it (``sim@/ckpt/a``). Real loopback servers
(focus/testing/simserver.py, in processes of their own) killed with SIGKILL and started
again on their port.
"""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fixtures.prefect import base_env
from test_cli import focus
from test_fleet import collect, rows

from focus.backends import HttpConfig, OpenAICompatPolicy, SGLangPolicy
from focus.format import ByteCodec
from focus.policy import SamplingParams
from focus.testing.faults import ServerRestart
from focus.testing.simserver import SimConfig, SimServerProcess

pytestmark = [pytest.mark.timeout(180), pytest.mark.integration]

SIM = SimConfig(slots=4, latency_s=0.02, completion_tokens=3, cache_block_tokens=4, root="/ckpt/a")
HTTP = HttpConfig(max_retries=3, backoff_s=0.01, backoff_max_s=0.05, timeout_s=10, outage_wait_s=30)


def policy(url: str) -> OpenAICompatPolicy:
    return OpenAICompatPolicy(url, "sim", vocab_size=ByteCodec.vocab_size, config=HTTP)


def restarted(root: str):  # type: ignore[no-untyped-def]
    """The 12-task collection with its server killed after 20 answers and started again,
    0.3 s later, on weights loaded from ``root``; and the server's answers in all."""
    with SimServerProcess(SIM) as server:
        server.config = SIM.model_copy(update={"root": root})  # what start() will run
        with ServerRestart(server, after_requests=20, down_s=0.3) as restart:
            batch = collect(policy(server.url), tasks=12)
        assert restart.up_at is not None  # mid-collection
    return batch


@pytest.fixture(scope="module")
def clean():  # type: ignore[no-untyped-def]
    with SimServerProcess(SIM) as server:
        return collect(policy(server.url), tasks=12)


def test_each_answer_names_the_weights_the_server_loaded(clean):
    assert {r.policy_version for r in clean.actor} == {"sim@/ckpt/a"}


def test_a_restart_on_the_same_weights_changes_nothing(clean):
    batch = restarted("/ckpt/a")
    assert rows(batch) == rows(clean) and batch.stats["failed_rollouts"] == 0
    assert {r.policy_version for r in batch.actor} == {"sim@/ckpt/a"}


def test_a_restart_on_other_weights_under_the_same_name_reports_another_version(clean):
    """Before: every row said ``sim``. The library's collector records what each answer
    says; the collection's journal refuses the step (the subprocess test below)."""
    batch = restarted("/ckpt/b")
    versions = [r.policy_version for r in batch.actor]
    assert set(versions) == {"sim@/ckpt/a", "sim@/ckpt/b"}, set(versions)


def test_the_weights_are_asked_at_first_contact_and_after_an_outage_only():
    """One ``GET /v1/models`` before the first answer is recorded, one after the restart;
    none per call."""
    asked: list[str] = []
    down = {"left": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            asked.append(request.url.path)
            return httpx.Response(200, json={"data": [{"id": "m", "root": f"/w{len(asked)}"}]})
        if down["left"]:
            down["left"] -= 1
            raise httpx.ConnectError("refused")
        answer = {"model": "m", "choices": [{"token_ids": [5], "logprobs": {"token_logprobs": [-0.5]}}]}
        answer["choices"][0]["finish_reason"] = "stop"
        return httpx.Response(200, json=answer)

    p = OpenAICompatPolicy("http://m", "m", config=HTTP, transport=httpx.MockTransport(handler))

    async def go() -> list[str | None]:
        params = SamplingParams(max_tokens=1, seed=1)
        out = [(await p.sample([1, 2], params)).policy_version for _ in range(3)]
        down["left"] = 2
        out += [(await p.sample([1, 2], params)).policy_version for _ in range(3)]
        await p.aclose()
        return out

    assert asyncio.run(go()) == ["m@/w1"] * 3 + ["m@/w2"] * 3
    assert len(asked) == 2


@pytest.mark.parametrize(
    ("info", "version"),
    [
        ({"model_path": "/ckpt/a", "weight_version": "default"}, "default@/ckpt/a"),  # SGLang's default
        ({"model_path": "/ckpt/a", "weight_version": "step-7"}, "step-7"),  # it names its weights itself
        (None, "default"),  # no /model_info: as before
    ],
)
def test_sglang_adds_its_model_path_while_its_weight_version_is_the_default(info, version):
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/model_info", "/get_model_info"):
            return httpx.Response(404) if info is None else httpx.Response(200, json=info)
        wv = (info or {}).get("weight_version", "default")
        meta = {"output_token_logprobs": [[-0.5, 5, None]], "finish_reason": {"type": "stop"}, "weight_version": wv}
        return httpx.Response(200, json={"output_ids": [5], "meta_info": meta})

    p = SGLangPolicy("http://s", config=HTTP, transport=httpx.MockTransport(handler))

    async def go() -> str | None:
        try:
            return (await p.sample([1, 2], SamplingParams(max_tokens=1))).policy_version
        finally:
            await p.aclose()

    assert asyncio.run(go()) == version


SMALL = ["--tasks", "6", "--transitions", "60", "--set", "agent.max_steps=4", "--set", "model.model=sim"]


def test_focus_collect_refuses_a_restart_on_other_weights_in_one_line_exit_2(tmp_path):
    """The collection stops at the step that would mix them, with one ``PolicyChanged``
    line naming both versions, and writes no batch."""
    slow = SIM.model_copy(update={"latency_s": 0.05})
    with SimServerProcess(slow) as server:
        server.config = slow.model_copy(update={"root": "/ckpt/b"})
        env = base_env(tmp_path / "prefect")
        args = ["collect", "--model-url", server.url, *SMALL, "--store", str(tmp_path / "store")]
        with ServerRestart(server, after_requests=15, down_s=0.3) as restart:
            done = focus([*args, "--collection-id", "swap", "--json"], env, tmp_path)
        assert restart.up_at is not None
    lines = [ln for ln in done.stderr.strip().splitlines() if "sim@/ckpt/a" in ln and "sim@/ckpt/b" in ln]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "batch_url" not in done.stdout, done.stdout[-2000:]
    assert not [p for p in (tmp_path / "store").rglob("*.parquet") if "batch" in str(p)]
