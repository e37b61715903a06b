"""train_loop: collect -> train -> publish -> collect with the shipped local trainer on
the embedded model: weights and critic go to the store beside the batches, the server
loads them without a restart, the next batch is sampled by them; the Tinker trainer's
dry run builds and checks every request; a user trainer is an import path."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
from pathlib import Path

import pytest
from fixtures.loop import TINY_LOOP

from storage import BatchStore, CheckpointStore
from storage.weights import WeightStore
from tasks.config import load_config

pytestmark = pytest.mark.timeout(240)


LOOP_TOML = Path(__file__).resolve().parents[1] / "configs" / "loop.toml"


def loop_config(root: str, **extra):
    """configs/loop.toml (what `focus train -c configs/loop.toml` runs), made small."""
    return load_config(
        LOOP_TOML,
        overrides={
            "collection_id": "loop",
            **TINY_LOOP,
            "storage.root": root,
            "train.iterations": 2,
            "train.eval_tasks": 0,
            **extra,
        },
        environ={},
    )


@pytest.mark.integration  # starts the embedded model server
@pytest.mark.needs("torch")  # a LocalCritic
def test_local_trainer_publishes_weights_the_next_collection_samples_from(tmp_path):
    """On the direct path (``focus train`` without a Prefect server); the ``train_loop``
    flow runs the same loop (tests below and tests/test_train_resume.py)."""
    from flows.loop import train_direct as train_loop
    from focus.tinylm.model import weights_version

    cfg = loop_config(str(tmp_path / "store"), **{"train.eval_tasks": 4})
    records = asyncio.run(train_loop(cfg))
    assert [r["iteration"] for r in records] == [0, 1, 2]  # the last one evaluates the final weights
    assert "batch_url" not in records[2] and records[2]["eval"]["episodes"] == 4
    batches = [BatchStore(cfg.storage.root).read(r["batch_url"]) for r in records[:2]]
    weights = WeightStore(cfg.storage.root)
    for i, (rec, batch) in enumerate(zip(records, batches, strict=False)):
        trained = rec["train"]
        # version i+1 lives in the store beside the batches: policy, critic, optimizer state
        assert trained["weights"] == f"{cfg.storage.root}/weights/loop/v{i + 1:06d}/policy.pt"
        assert trained["critic"].endswith(f"v{i + 1:06d}/critic.pt") and trained["state"].endswith("optimizer.pt")
        local = weights.local_copy(trained["weights"])
        assert weights_version(local) == trained["policy_version"]
        assert batch.iteration == i and batch.collection_id == f"loop-it{i}"
        assert {r.policy_version for r in batch.actor} == {rec["policy_version"]}
        assert trained["metrics"]["critic_fitted"] == 1.0
    # iteration 1 sampled from what iteration 0 trained, and the final eval used version 2
    assert records[1]["policy_version"] == records[0]["train"]["policy_version"] != records[0]["policy_version"]
    assert records[2]["policy_version"] == records[1]["train"]["policy_version"]
    assert len({r["eval"]["policy_version"] for r in records}) == 3
    # fresh tasks each iteration
    assert {r.task_id for r in batches[0].actor}.isdisjoint({r.task_id for r in batches[1].actor})

    # rerunning reuses every collection, training step and evaluation
    again = asyncio.run(train_loop(cfg))
    assert [r["train"]["reused"] for r in again[:2]] == [True, True]
    assert all(r["eval"]["reused"] for r in again)
    assert [r["stats"]["steps_reused"] == r["stats"]["steps"] for r in again[:2]] == [True, True]
    assert again[1]["train"]["weights"] == records[1]["train"]["weights"]

    # one more iteration, another evaluation size: the finished iterations are reused
    more = asyncio.run(train_loop(cfg.with_updates(**{"train.iterations": 3, "train.eval_tasks": 2})))
    assert [r["train"]["reused"] for r in more[:3]] == [True, True, False]
    assert more[2]["policy_version"] == records[2]["policy_version"]
    assert [r["eval"]["episodes"] for r in more] == [2, 2, 2, 2] and not more[0]["eval"]["reused"]


@pytest.mark.needs("torch")  # a LocalCritic
def test_tinker_trainer_dry_run_checks_every_request(prefect_api, tmp_path, monkeypatch):
    from flows.train_loop import train_loop
    from focus.exporters import actor_sequences

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    cfg = loop_config(
        str(tmp_path / "store"),
        **{"train.trainer": "tinker", "train.iterations": 1, "train.tinker.base_model": "Qwen/Qwen3-4B-Instruct-2507"},
    )
    (rec,) = asyncio.run(train_loop(cfg))
    m = rec["train"]["metrics"]
    batch = BatchStore(cfg.storage.root).read(rec["batch_url"])
    seqs = actor_sequences(batch)
    assert m["sent"] == 0.0 and m["datums"] == len(seqs) > 0
    assert m["tokens"] == sum(len(s.tokens) - 1 for s in seqs)
    assert m["forward_backward_bytes"] > m["tokens"]  # ids, log-probs and advantages all serialised
    folder = WeightStore(cfg.storage.root).folder("loop", 1)
    report = json.loads(WeightStore(cfg.storage.root).read(f"{folder}/requests.json"))
    assert "TINKER_API_KEY is not set" in report["reason"] and report["sent"] is False
    assert report["requests"] == {
        "forward_backward": "ForwardBackwardRequest",
        "start": "CreateModelRequest",
        "optim_step": "OptimStepRequest",
        "save_state": "SaveWeightsRequest",
        "save_for_sampler": "SaveWeightsForSamplerRequest",
    }
    assert report["optim_step"]["adam_params"]["learning_rate"] == cfg.train.tinker.learning_rate
    # nothing was trained: the policy and its version stay
    assert rec["train"]["weights"] is None and rec["train"]["policy_version"] == rec["policy_version"]
    assert CheckpointStore(cfg.storage.root).exists("loop", "train", 0)


def test_loop_refuses_the_local_trainer_for_a_remote_model(tmp_path):
    from flows.train_loop import _check
    from tasks.config import ConfigError

    cfg = loop_config(str(tmp_path), **{"model.kind": "openai", "model.url": "http://127.0.0.1:9"})
    with pytest.raises(ConfigError, match="trains the embedded model"):
        _check(cfg)
    bad = loop_config(str(tmp_path), **{"train.trainer": "no_such_module_xyz:train"})
    with pytest.raises(ConfigError, match="cannot import module 'no_such_module_xyz'"):
        _check(bad)


def test_a_loop_the_local_trainer_cannot_train_is_refused_before_the_first_collection(tmp_path):
    """``agent.sampling.top_p`` below 1 was refused by the local trainer only once the
    first collection had run; a greedy collection (``temperature = 0``) was trained
    without a word at temperature 1 (the trainer read 0 as unset), its ratios comparing
    distributions the batch was not sampled from. An explicit ``train.local.temperature``
    is the user's choice."""
    from flows.train_loop import _check
    from tasks.config import ConfigError
    from tasks.trainers import TrainContext, local_trainer

    top_p = loop_config(str(tmp_path), **{"agent.sampling.top_p": 0.9})
    greedy = loop_config(str(tmp_path), **{"agent.sampling.temperature": 0.0})
    for cfg, says in (
        (top_p, r"^the local trainer needs agent.sampling.top_p = 1 \(its ratio assumes full softmax sampling\)"),
        (greedy, r"^the local trainer needs agent.sampling.temperature > 0"),
    ):
        with pytest.raises(ConfigError, match=says):
            _check(cfg)
        ctx = TrainContext(0, cfg, None, None, str(tmp_path / "work"))
        with pytest.raises(ConfigError, match=says):
            local_trainer(str(tmp_path / "no-batch"), ctx)
    _check(loop_config(str(tmp_path), **{"agent.sampling.temperature": 0.0, "train.local.temperature": 1.0}))


def test_collect_toml_runs(prefect_api, tmp_path):
    from flows.collect import collect

    cfg = load_config(
        LOOP_TOML.parent / "collect.toml",
        overrides={
            "collection_id": "c",
            "env.n_tasks": 2,
            "agent.max_steps": 3,
            "agent.sampling.max_tokens": 4,
            "search.phases.1.transitions": 4,
            "execution.kind": "local",
            "storage.root": str(tmp_path),
            "progress": False,
        },
        environ={},
    )
    out = asyncio.run(collect(cfg))
    assert BatchStore(cfg.storage.root).read(out["batch_url"]).actor


USER_TRAINER = """
import json, pathlib
from tasks.trainers import local_trainer

def train(batch_url, ctx, note):
    result = local_trainer(batch_url, ctx)
    pathlib.Path("called.json").write_text(json.dumps({"note": note, "batch": batch_url, "out": ctx.out}))
    return result
"""


@pytest.mark.integration  # the command starts the embedded model server
@pytest.mark.needs("torch")  # a LocalCritic
def test_focus_train_runs_a_user_trainer_from_the_users_folder(tmp_path):
    """As the installed `focus` command runs: the script is elsewhere, the user's folder
    (holding the trainer module) is the current directory and on no import path. On the
    direct path (no Prefect server configured); a user's trainer found so by a
    ``train_loop`` flow run: tests/test_train_resume.py (the run that finishes the loop
    killed with kill -9) and tests/test_interrupts.py (focus train stopped with Ctrl-C),
    whose flow runs cost this test 3-4 s more and checked nothing more here."""
    import subprocess
    import sys

    from fixtures.prefect import base_env

    user = tmp_path / "user"
    user.mkdir()
    (user / "mytrainer.py").write_text(USER_TRAINER)
    launcher = tmp_path / "bin" / "focus_cli.py"
    launcher.parent.mkdir()
    launcher.write_text("import sys\nfrom cli.app import app\nsys.argv[0] = 'focus'\napp()\n")
    root = tmp_path / "store"
    sets = {
        "collection_id": "mine",
        "env.n_tasks": 2,
        "agent.max_steps": 3,
        "search.phases.0.rollouts_per_task": 2,
        "search.phases.1.transitions": 4,
        "critic.options": '{"buckets": 64, "hidden": 4}',
        "storage.root": str(root),
        "train.iterations": 1,
        "train.eval_tasks": 2,
        "train.options": '{"note": "hello"}',
    }
    cmd = [sys.executable, str(launcher), "train", "-c", str(LOOP_TOML), "--trainer", "mytrainer:train", "--json"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    done = subprocess.run(
        cmd, cwd=user, env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=200
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    records = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["iteration"] for r in records] == [0, 1] and "eval" in records[1]
    called = json.loads((user / "called.json").read_text(encoding="utf-8"))
    assert called["note"] == "hello" and called["batch"] == records[0]["batch_url"]
    assert records[0]["train"]["weights"] == called["out"] + "/policy.pt"
    assert records[1]["policy_version"] == records[0]["train"]["policy_version"]


@pytest.mark.needs("torch")
def test_focus_train_prints_a_table_per_version(monkeypatch, tmp_path):
    """The command's output (the loop itself is exercised above). With no Prefect server
    configured it runs the loop directly and starts nothing (the loop is replaced here)."""
    from typer.testing import CliRunner

    import flows.loop
    from cli.app import app

    seen = {}

    async def fake_loop(cfg, allow_config_change=False):
        seen["cfg"] = cfg
        train = {"metrics": {"train_loss": -0.125}, "reused": False, "weights": "file:///s/weights/x/v000001/policy.pt"}
        return [
            {
                "run_id": "x",
                "iteration": 0,
                "policy_version": "abc",
                "eval": {"success_rate": 0.25},
                "stats": {"transitions": 40},
                "train": train,
                "batch_url": "file:///s/batches/x-it0/iter-000000",
            },
            {"run_id": "x", "iteration": 1, "policy_version": "def", "eval": {"success_rate": 0.5}},
        ]

    monkeypatch.setattr(flows.loop, "train_direct", fake_loop)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    out = CliRunner().invoke(
        app, ["train", "-c", str(LOOP_TOML), "--iterations", "1", "--set", f"storage.root={tmp_path}"], env={}
    )
    assert out.exit_code == 0, out.output
    assert seen["cfg"].train.iterations == 1 and seen["cfg"].train.trainer == "local"
    assert "0.250" in out.output and "0.500" in out.output and "-0.125" in out.output
    assert "weights: file:///s/weights/x/v000001/policy.pt" in out.output
    words = ["-c", str(LOOP_TOML), "--iterations", "1", "--set", f"storage.root={tmp_path}"]
    rerun = f"rerun or resume: {shlex.join(['focus', 'train', *words, '--collection-id', seen['cfg'].collection_id])}\n"
    assert rerun in out.output
    # the tests' folder has a space: the files' URLs are quoted, ready to paste, as the batch's
    folder = f"file://{os.path.realpath(tmp_path)}/weights/x"
    assert f"metrics per iteration (JSON lines): {shlex.quote(folder + '/metrics.jsonl')}\n" in out.output
    assert f"held-out success per version: {shlex.quote(folder + '/success.png')}\n" in out.output
    monkeypatch.chdir(tmp_path)  # the default storage root, runs/, is in the working folder: not the checkout's
    js = CliRunner().invoke(app, ["train", "-c", str(LOOP_TOML), "--json"], env={})
    assert [json.loads(line)["iteration"] for line in js.output.splitlines()] == [0, 1]


def test_loop_refuses_the_tinker_trainer_without_a_model_to_fine_tune_before_collecting(tmp_path):
    """train.tinker.base_model and model.model unset: the trainer said so after the first
    collection had run (every rollout of it, for nothing); the loop's check says it first."""
    from flows.train_loop import _check
    from tasks.config import ConfigError

    cfg = loop_config(str(tmp_path), **{"train.trainer": "tinker"})
    assert not cfg.model.model and not cfg.train.tinker.base_model
    with pytest.raises(ConfigError, match=r"^the tinker trainer needs train.tinker.base_model \(or model.model\)"):
        _check(cfg)
    _check(loop_config(str(tmp_path), **{"train.trainer": "tinker", "train.tinker.base_model": "Qwen/Qwen3-4B"}))
