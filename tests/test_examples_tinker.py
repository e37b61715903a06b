"""examples/train_tinker without a key: a real batch becomes SDK requests, built with the
SDK's own types and checked as serialised for sending; nothing is sent."""

from __future__ import annotations

import pytest

from examples.train_tinker.run import main
from focus.backends.tinker_backend import TinkerUpdateConfig, build_requests, check_requests
from focus.exporters import TokenSequence, actor_sequences, tinker_datum
from storage import BatchStore

pytestmark = pytest.mark.needs("tinker")


def test_dry_run_converts_a_collected_batch(local_model_server, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    result = main(["--collect-toy", "--model-url", local_model_server.url, "--out", str(tmp_path)])
    assert result["sent"] is False and "TINKER_API_KEY is not set" in result["reason"]
    assert "forward_backward(datums, 'importance_sampling')" in result["reason"]
    batch = BatchStore(str(tmp_path)).read(result["batch"])
    seqs = actor_sequences(batch)
    assert result["datums"] == len(seqs) > 0
    assert result["tokens"] == sum(len(s.tokens) - 1 for s in seqs)
    assert result["tokens_with_advantage"] <= sum(sum(s.mask) for s in seqs)
    assert result["loss_fn_inputs"] == ["advantages", "logprobs", "target_tokens"]
    assert result["requests"]["start"] == "CreateModelRequest" and result["forward_backward_bytes"] > 0
    assert '"sent": false' in capsys.readouterr().out
    # the same batch, addressed by URL, the PPO loss, continuing from a saved state
    again = main(
        ["--store", str(tmp_path), "--batch-url", result["batch"], "--loss-fn", "ppo", "--dry-run"]
        + ["--state", "tinker://run-1/weights/focus-step"]
    )
    assert again["datums"] == result["datums"] and again["loss_fn"] == "ppo" and "--dry-run" in again["reason"]
    assert again["requests"]["start"] == "LoadWeightsRequest"


def test_bad_requests_are_named():
    good = TokenSequence((), (1, 2, 3, 4), (0.0, -0.5, -0.2, -0.1), (0.0, 1.0, 1.0, 1.0), (0, 1, 1, 1), 1)
    cfg = TinkerUpdateConfig()
    with pytest.raises(ValueError, match="nothing to send"):
        check_requests(build_requests([], cfg, base_model="m", name="n"))
    with pytest.raises(ValueError, match="loss inputs"):  # the mask is not an input of the RL losses
        check_requests(build_requests([tinker_datum(good, include_mask=True)], cfg, base_model="m", name="n"))
    nan = TokenSequence((), (1, 2, 3), (0.0, float("nan"), -0.1), (0.0, 1.0, 1.0), (0, 1, 1), 1)
    with pytest.raises(ValueError, match="not finite"):
        check_requests(build_requests([tinker_datum(nan, include_mask=False)], cfg, base_model="m", name="n"))
    with pytest.raises(SystemExit):
        main([])


def test_each_rl_loss_gets_exactly_its_inputs():
    seq = TokenSequence((), (1, 2, 3, 4), (0.0, -0.5, -0.2, -0.1), (0.0, 1.0, 1.0, 1.0), (0, 1, 1, 1), 1)
    for loss_fn in ("importance_sampling", "ppo", "cispo", "gspo"):
        cfg = TinkerUpdateConfig(loss_fn=loss_fn)
        sent = check_requests(build_requests([tinker_datum(seq, loss_fn=loss_fn)], cfg, base_model="m", name="n"))
        assert sent["loss_fn"] == loss_fn and ("sequence_ratio_mask" in sent["loss_fn_inputs"]) == (loss_fn == "gspo")
    # a datum built for another loss is refused before anything is sent (GSPO needs the ratio mask)
    gspo = TinkerUpdateConfig(loss_fn="gspo")
    with pytest.raises(ValueError, match="'gspo' loss takes exactly"):
        check_requests(build_requests([tinker_datum(seq)], gspo, base_model="m", name="n"))


class _Done:
    def __init__(self, value):
        self.value = value

    def result(self):
        return self.value


class _Recorder:
    """Records the calls a TinkerTrainer makes on the service (the service itself needs a key)."""

    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if name.startswith("create_"):
                return _Done(self)
            if name == "forward_backward":
                return _Done(type("Out", (), {"metrics": {"loss:sum": 1.5}})())
            if name in ("save_state", "save_weights_for_sampler"):
                kind = "weights" if name == "save_state" else "sampler_weights"
                return _Done(type("Saved", (), {"path": f"tinker://run/{kind}/{args[0]}"})())
            return _Done(None)

        return call


def test_trainer_step_sends_the_calls_in_order_and_continues_from_the_saved_state():
    from focus.backends.tinker_backend import TinkerTrainer

    seq = TokenSequence((), (1, 2, 3, 4), (0.0, -0.5, -0.2, -0.1), (0.0, 1.0, 1.0, 1.0), (0, 1, 1, 1), 1)
    datums = [tinker_datum(seq, include_mask=False)]
    svc = _Recorder()
    trainer = TinkerTrainer(TinkerUpdateConfig(lora_rank=8, learning_rate=2e-5), "base/m", service=svc)
    first = trainer.step(datums, "v1")
    assert [c[0] for c in svc.calls] == [
        "create_lora_training_client",
        "forward_backward",
        "optim_step",
        "save_state",
        "save_weights_for_sampler",
    ]
    assert svc.calls[0][1] == ("base/m",) and svc.calls[0][2] == {"rank": 8, "seed": 0}
    assert svc.calls[1][1] == (datums, "importance_sampling")
    assert svc.calls[2][1][0].learning_rate == 2e-5
    assert first.sampler_path == "tinker://run/sampler_weights/v1" and first.state_path == "tinker://run/weights/v1"
    assert first.metrics == {"loss:sum": 1.5}
    svc.calls.clear()
    trainer.step(datums, "v2", state_path=first.state_path)
    assert svc.calls[0] == ("create_training_client_from_state_with_optimizer", ("tinker://run/weights/v1",), {})


@pytest.mark.parametrize(
    ("weights", "sent"),
    [(None, False), ("tinker://run/sampler_weights/v1", True)],
    ids=["sampled-by-model.model", "sampled-by-trained-weights"],
)
def test_pipeline_trainer_sends_nothing_for_a_batch_another_base_model_sampled(tmp_path, monkeypatch, weights, sent):
    """model.kind = "tinker" sampling `model.model` (no weights yet) while train.tinker.base_model
    names another model: the batch's ids are the sampler's, not the trained model's, so the step
    is a dry run, as the README says. It was sent. From the trained model's own sampler
    weights (later iterations) it is sent."""
    from focus.backends.tinker_backend import TinkerStep, TinkerTrainer
    from focus.batch import ActorRow, Batch
    from storage.weights import WeightStore
    from tasks.config import load_config
    from tasks.trainers import TrainContext, tinker_trainer

    row = ActorRow("c", 0, "t", "t#0", 0, 0, 0, "v0", (5, 6, 7), (8, 9), (-0.5, -0.25), (1, 1), 0.5, 1.0, "stop")
    cfg = load_config(
        overrides={
            "collection_id": "c",
            "storage.root": str(tmp_path),
            "model.kind": "tinker",
            "model.model": "Qwen/Qwen3-8B",
            "train.trainer": "tinker",
            "train.tinker.base_model": "Qwen/Qwen3-4B-Instruct-2507",
        },
        environ={},
    )
    url = BatchStore(str(tmp_path)).write(Batch("c", 0, [row]))
    steps: list[str] = []

    def step(self, datums, name, state_path=None):
        steps.append(name)
        return TinkerStep("tinker://run/sampler_weights/v2", "tinker://run/weights/v2", {})

    monkeypatch.setattr(TinkerTrainer, "step", step)
    monkeypatch.setenv("TINKER_API_KEY", "test-key")
    out = WeightStore(str(tmp_path)).folder("c", 1)
    ctx = TrainContext(iteration=0, config=cfg, weights=weights, policy_version=None, workdir=str(tmp_path), out=out)
    result = tinker_trainer(url, ctx)
    assert result.metrics["sent"] == float(sent) and len(steps) == int(sent)
    if not sent:
        assert result.weights is None  # the next collection samples the same model again


@pytest.mark.parametrize("advantages", [(0.0, 0.0), (0.5, -0.5)], ids=["every-advantage-0", "advantages-that-cancel"])
def test_pipeline_trainer_sends_nothing_for_a_batch_with_nothing_to_learn(tmp_path, monkeypatch, advantages):
    """Every advantage 0 (each tree's rollouts alike in return), or advantages that cancel
    over identical sequences: the forward_backward is a zero gradient, but the optim_step that follows, from the optimizer state the last step
    saved, still moved the LoRA weights by Adam's momentum, and the loop published them as
    a new version. The step is a dry run; the next collection samples the same weights."""
    from focus.backends.tinker_backend import TinkerStep, TinkerTrainer
    from focus.batch import ActorRow, Batch
    from storage.weights import WeightStore
    from tasks.config import load_config
    from tasks.trainers import TrainContext, tinker_trainer

    rows = [
        ActorRow("c", 0, "t", "t#0", 0, e, 0, "v1", (5, 6, 7), (8, 9), (-0.5, -0.25), (1, 1), adv, 1.0, "stop")
        for e, adv in enumerate(advantages)
    ]
    cfg = load_config(
        overrides={
            "collection_id": "c",
            "storage.root": str(tmp_path),
            "model.kind": "tinker",
            "model.model": "Qwen/Qwen3-8B",
            "train.trainer": "tinker",
        },
        environ={},
    )
    url = BatchStore(str(tmp_path)).write(Batch("c", 0, rows))
    steps: list[str] = []

    def step(self, datums, name, state_path=None):
        steps.append(name)
        return TinkerStep("tinker://run/sampler_weights/v2", "tinker://run/weights/v2", {})

    monkeypatch.setattr(TinkerTrainer, "step", step)
    monkeypatch.setenv("TINKER_API_KEY", "test-key")
    weights, state = "tinker://run/sampler_weights/v1", "tinker://run/weights/v1"
    ctx = TrainContext(
        iteration=1,
        config=cfg,
        weights=weights,
        policy_version=weights,
        workdir=str(tmp_path),
        out=WeightStore(str(tmp_path)).folder("c", 2),
        state=state,
    )
    result = tinker_trainer(url, ctx)
    assert steps == [] and result.metrics["sent"] == 0.0
    assert (result.weights, result.state, result.policy_version) == (weights, state, weights)
