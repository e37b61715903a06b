"""Bit-identical resume with the real embedded model.

The other resume tests drive a deterministic fake policy; these run the ``collect``
flow against the tiny model's HTTP server, whose ids and log-probs must not depend on
its prefix cache or on what else it decodes (:mod:`focus.tinylm.numerics`), and whose
sampling is seeded per (collection seed, tree, node, branch, step). Batches are compared
bit for bit: every column, floats as their 8 bytes, and the Parquet files' checksums.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import struct
import subprocess
import sys

import httpx
import pytest
from fixtures.prefect import base_env, using_api
from fixtures.resume import crash_at, mismatches

from focus.backends import LocalModelServer
from storage import BatchStore, CheckpointStore
from tasks.config import load_config

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

CID = "real-model"
PHASES = [
    {"name": "evidence", "rollouts_per_task": 2},
    {"name": "continue", "transitions": 30, "wave_size": 4, "max_depth": 6},
]


def settings(root: str, url: str | None, **more) -> dict:
    """The collection: 3 toy tasks, about 40 model turns, 6 continuation waves."""
    out = {
        "collection_id": CID,
        "seed": 13,
        "model.kind": "local",
        "env.n_tasks": 3,
        "agent.sampling.max_tokens": 16,
        "search.phases": PHASES,
        "critic.kind": "factory",
        "critic.factory": "fixtures.resume:varied_critic",
        "execution.kind": "local",
        "storage.root": root,
        "progress": False,
        **more,
    }
    if url is not None:
        out["model.url"] = url
    return out


def collect_in_process(root: str, url: str | None, **more):
    """An uninterrupted run of the flow in this process; returns (batch, manifest)."""
    from flows.collect import collect

    cfg = load_config(overrides=settings(root, url, **more), environ={})
    out = asyncio.run(collect(cfg))
    store = BatchStore(root)
    return store.read(out["batch_url"]), store.manifest(out["batch_url"])


def cli_args(root: str, url: str, **more) -> list[str]:
    args = ["collect", "--json"]
    for key, value in settings(root, url, **more).items():
        args += ["--set", f"{key}={json.dumps(value)}"]
    return args


def cache_hits(url: str) -> float:
    """Prompt tokens the server found in its prefix cache (vLLM's counter)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith("vllm:prefix_cache_hits"))


def assert_bit_identical(got, want, what: str) -> None:
    (a, ma), (b, mb) = got, want
    assert len(a.actor) >= 30 and len(a.critic) >= 8, f"{what}: too small a batch to say anything"
    diff = mismatches(a, b)
    print(f"{what}: {len(a.actor)} actor rows, {len(a.critic)} critic rows compared; rows that differ: {diff}")
    assert diff == {"actor": 0, "critic": 0}, what
    # the same Parquet bytes: the manifest's fingerprint is the digest of the table files
    assert ma.fingerprint == mb.fingerprint, what


#: The reference is served one request at a time without a prefix cache: every prompt
#: position computed by a cold prefill, every decode step a batch of one - the opposite
#: of how the runs compared with it are served (warm caches, many sequences per step).
ONE_AT_A_TIME = ["--prefix-cache-tokens", "0", "--max-num-seqs", "1"]


@pytest.fixture(scope="module")
def reference(prefect_server, tmp_path_factory):
    """(batch, manifest) of an uninterrupted run against a one-at-a-time server."""
    tmp = tmp_path_factory.mktemp("reference")
    with using_api(prefect_server, tmp / "prefect"), LocalModelServer(extra_args=ONE_AT_A_TIME) as server:
        return collect_in_process(str(tmp / "store"), server.url, **{"execution.max_concurrency": 1})


def test_two_uninterrupted_runs_are_bit_identical_and_carry_the_models_own_logprobs(prefect_api, reference, tmp_path):
    """The flow's own server (prefix cache on, up to 64 sequences per decode step, rollouts
    all in flight together) gives the reference's batch bit for bit."""
    batched = collect_in_process(str(tmp_path / "store"), None)
    assert_bit_identical(batched, reference, "two uninterrupted runs")

    # The stored log-probs are the model's, bit for bit, through JSON and Parquet: a
    # fresh engine scores each turn's completion after its prompt in one prefill (where
    # the runs decoded the completion token by token).
    from focus.tinylm.engine import Engine, GenRequest

    engine = Engine(prefix_cache_tokens=0)
    try:
        for r in batched[0].actor:
            res = engine.generate(GenRequest(tuple(r.prompt_ids) + tuple(r.completion_ids), 0, prompt_logprobs=0))
            assert res.prompt_logprobs is not None
            scored = [d.logprob for d in res.prompt_logprobs[len(r.prompt_ids) :] if d is not None]
            assert [struct.pack("<d", x) for x in scored] == [struct.pack("<d", x) for x in r.logprobs]
    finally:
        engine.close()


#: (name, where the run stops, what the store must then hold, what it must not, more settings)
CRASHES = [
    ("mid-evidence", "call:4", [], [("evidence", 0)], {}),
    ("after evidence, before its scoring", "saved:evidence:0", [("evidence", 0)], [("evidence.score", 0)], {}),
    ("mid-continuation wave", "call:3", [("evidence.score", 0)], [("1.continue", 0)], {}),
    (
        "between waves, on Dask workers",
        "saved:1.continue.score:1",
        [("1.continue.score", 1)],
        [("1.continue", 2)],
        {"execution.kind": "dask", "execution.n_workers": 2},
    ),
    (
        "after a wave, before its scoring, with the model server",
        "saved:1.continue:2",
        [("1.continue", 2)],
        [("1.continue.score", 2)],
        {},
    ),
    ("during export", "batch-file:actor", [("1.continue.end", 0)], [("export", 0)], {}),
]


def test_kill_9_at_six_points_resumes_to_the_uninterrupted_batch_bit_for_bit(prefect_env, reference, tmp_path):
    """One collection killed (SIGKILL to its process group) six times, each run resuming
    the previous one's checkpoints, then finished: its batch equals the uninterrupted
    reference's bit for bit. The server keeps its warm cache across the kills, except at
    the fifth, where it is killed too and a fresh one (cold cache, new port) serves the rest.

    The killed runs take the direct path (no Prefect API configured) and the run that
    finishes is a ``collect`` flow run, as the reference is: both paths are the one loop
    over one journal, so either resumes the other."""
    direct_env = base_env(tmp_path / "prefect-home")
    server = LocalModelServer().start()
    try:
        root = str(tmp_path / "crashed")
        store = CheckpointStore(root)
        for name, spec, present, absent, more in CRASHES:
            where = crash_at(spec, cli_args(root, server.url, **more), direct_env, tmp_path)
            held = set(store.list(CID))
            assert set(present) <= held and not set(absent) & held, f"{name} ({where}): store holds {sorted(held)}"
            print(f"killed {name}: at {where}, {len(held)} checkpoints stored")
            if name.endswith("with the model server"):
                assert cache_hits(server.url) > 0  # resumed runs until now met a warm cache
                os.kill(server.pid, signal.SIGKILL)
                server.stop()
                server = LocalModelServer().start()
        # the kill during export left staged files, and nothing a reader globbing the batch folder sees
        batch_dir = tmp_path / "crashed" / "batches" / CID / "iter-000000"
        assert list((tmp_path / "crashed" / "_staging" / CID / "iter-000000").glob("w-*/actor/*.parquet"))
        assert not batch_dir.exists()

        before = [k for k in store.list(CID) if k[0] not in ("config", "critic")]  # not steps
        done = subprocess.run(
            [sys.executable, "-m", "cli", *cli_args(root, server.url)],
            env=prefect_env,
            capture_output=True,
            text=True,
            timeout=180,
        )
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["stats"]["steps_reused"] == len(before) + 1  # every finished step (and the config check)
        got = BatchStore(root)
        assert_bit_identical((got.read(result["batch_url"]), got.manifest(result["batch_url"])), reference, "resumed")
    finally:
        server.stop()
