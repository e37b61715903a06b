"""No foreign ids: a model service that samples ids outside the vocabulary fails those
rollouts as bad responses, naming the id: the collection stops at their wave, a rerun
against a fixed server replays them, and the Parquet batch holds none of them.

The model service is the real tiny model server behind a loopback proxy that replaces a
sampled id by 70000 or -5 in every third answer (in ``token_ids`` and in the
``token_id:<n>`` log-prob entries alike, as a server with another tokenizer would).
The policy is built the way the pipeline builds it (``FocusConfig.build_policy`` and
``build_agent``), for the embedded kind (vocabulary from the server) and the
OpenAI-compatible kind (vocabulary from the env codec's tokenizer).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from focus.execution import BadResponses
from focus.format import ByteCodec
from focus.journal import MemoryJournal
from focus.testing.faults import GENERATION_PATHS, FaultProxy
from storage import BatchStore
from tasks.config import ConfigError, load_config, served_vocab_size, vocab_size_for

pytestmark = pytest.mark.timeout(180)

FOREIGN = (70000, -5)


class ForeignIdProxy(FaultProxy):
    """Forwards to the model server; every ``every``-th generation answer gets its first
    sampled id replaced, alternately by 70000 and -5."""

    def __init__(self, upstream: str, every: int = 3) -> None:
        super().__init__(upstream)
        self.every = every
        self.answers = 0
        self.replaced: list[int] = []

    async def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes, fault: str | None) -> Any:
        status, payload, ctype, extra = await super()._answer(method, path, headers, body, fault)
        if path.split("?")[0] in GENERATION_PATHS and status == 200:
            self.answers += 1
            if self.answers % self.every == 0:
                data = json.loads(payload)
                bad = FOREIGN[len(self.replaced) % 2]
                ch = data["choices"][0]
                if ch.get("token_ids"):
                    ch["token_ids"][0] = bad
                    ch["logprobs"]["tokens"][0] = f"token_id:{bad}"
                    self.replaced.append(bad)
                    payload = json.dumps(data).encode()
        return status, payload, ctype, extra


def collect_through(proxy: ForeignIdProxy, kind: str, root: str) -> tuple[Any, BadResponses, Any]:
    """The collection through ``proxy`` (stopped by the foreign ids: they are bad
    responses), then rerun with the same journal once the proxy replaces no more ids."""
    cfg = load_config(
        overrides={
            "collection_id": f"foreign-{kind}",
            "seed": 5,
            "model.kind": kind,
            "model.url": proxy.url,
            "env.n_tasks": 2,
            "agent.max_steps": 3,
            "agent.sampling.max_tokens": 8,
            "search.phases": [
                {"name": "evidence", "rollouts_per_task": 3},
                {"name": "continue", "transitions": 6, "wave_size": 3, "max_depth": 4},
            ],
            "execution.kind": "local",
            # a third of answers bad would fail the wave by default (bad responses count
            # against the outage share): stop on the bad responses themselves
            "execution.max_outage_share": 1.0,
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )
    policy = cfg.build_policy()
    agent, tasks = cfg.build_agent(policy)
    journal = MemoryJournal()

    async def go() -> Any:
        collector = cfg.build_collector(agent)
        try:
            with pytest.raises(BadResponses) as stopped:
                await collector.search(tasks, journal)
            proxy.every = 10**9  # the server is fixed: the rerun runs the stopped rollouts again
            return stopped.value, collector.prepare(await collector.search(tasks, journal))
        finally:
            await policy.aclose()

    stopped, batch = asyncio.run(go())
    return policy, stopped, batch


@pytest.mark.parametrize("kind", ["local", "openai"])
def test_sampled_ids_outside_the_vocabulary_fail_their_rollout_and_never_reach_the_batch(
    local_model_server, tmp_path, kind, monkeypatch
):
    # a bad response is run again before it fails; here each must fail as it comes, so
    # which rollouts fail does not depend on which answers the reruns meet
    monkeypatch.setattr("focus.execution.BAD_RESPONSE_RERUNS", 0)
    with ForeignIdProxy(local_model_server.url) as proxy:
        policy, stopped, batch = collect_through(proxy, kind, str(tmp_path))
    assert policy.vocab_size == ByteCodec.vocab_size  # local: from the server; openai: from the codec
    assert set(proxy.replaced) == set(FOREIGN)  # both kinds of foreign id were sent
    causes = [r.leaf.cause for r in stopped.rollouts if r.leaf.kind == "failed"]
    # an id past the vocabulary fails its rollout; a negative one is no token id at all: the
    # answer is malformed and asked again (focus.backends.openai_compat), so it fails nothing
    assert any("sampled token id 70000 at position 0 is outside the vocabulary [0, 263)" in c for c in causes)
    assert not any("-5" in c for c in causes)
    assert causes and all(c.startswith("bad response: ") for c in causes)
    assert f"bad responses: {len(causes)} of 6 rollouts of phase evidence wave 0" in str(stopped)
    assert batch.stats["failed_rollouts"] == 0  # replayed, not kept
    url = BatchStore(tmp_path).write(batch)
    path = url.removeprefix("file://")
    actor = pq.read_table(f"{path}/actor")
    critic = pq.read_table(f"{path}/critic")
    assert actor.num_rows > 0
    for table, column in ((actor, "prompt_ids"), (actor, "completion_ids"), (critic, "context_ids")):
        ids = pc.list_flatten(table.column(column))
        assert pc.min(ids).as_py() >= 0 and pc.max(ids).as_py() < ByteCodec.vocab_size, column
        assert not pc.any(pc.is_in(ids, value_set=__import__("pyarrow").array(FOREIGN, "int32"))).as_py()


def test_the_embedded_server_reports_its_vocabulary(local_model_server):
    assert served_vocab_size(local_model_server.url) == ByteCodec.vocab_size
    assert served_vocab_size(local_model_server.url + "/v1") == ByteCodec.vocab_size
    assert served_vocab_size("http://127.0.0.1:9") is None  # unreachable: not known


def test_a_vocabulary_nobody_knows_must_be_configured():
    class NoVocab:
        pass

    with pytest.raises(ConfigError, match="model.vocab_size is required.*'openai'.*NoVocab"):
        vocab_size_for(NoVocab(), "openai")
    assert vocab_size_for(ByteCodec(), "sglang") == 263
    cfg = load_config(overrides={"model.kind": "openai", "model.url": "http://x", "model.vocab_size": 300}, environ={})
    assert cfg.build_policy().vocab_size == 300
    with pytest.raises(ConfigError, match="vocab_size"):
        load_config(overrides={"model.vocab_size": 0}, environ={})


def test_the_byte_codec_never_drops_an_id_silently():
    c = ByteCodec()
    assert c.decode([104, 105, c.EOT]) == "hi"  # role markers are not text
    for bad in FOREIGN:
        with pytest.raises(ValueError, match=f"token id {bad}: outside its vocabulary"):
            c.decode([104, bad, 105])
