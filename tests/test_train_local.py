"""focus.train_local: the clipped policy-gradient update, prefix packing, bit-for-bit
reproducible updates that resume from saved state, the report of each optimizer step,
and one training iteration against a real embedded model server (weights change, the
served version advances)."""

from __future__ import annotations

import asyncio
import dataclasses
import math

import pytest

try:
    import torch
except ModuleNotFoundError:  # pip install focus-rl without [train]
    pytest.skip("torch is not installed (the [train] extra)", allow_module_level=True)

from focus.batch import ActorRow, Batch
from focus.env import Message
from focus.exporters import NothingToTrain, TokenSequence, actor_sequences
from focus.format import ByteCodec
from focus.tinylm.model import load, prompt_logprobs
from focus.train_local import (
    PolicyTrainer,
    UpdateConfig,
    UpdateStep,
    clipped_loss,
    evaluate,
    pack_prefixes,
    pad_sequences,
    toy_agent,
    train_iteration,
)
from storage import BatchStore

CODEC = ByteCodec()


def seq(tokens, mask, adv=1.0):
    n = len(tokens)
    return TokenSequence((), tuple(tokens), tuple(-0.5 * m for m in mask), tuple(adv * m for m in mask), tuple(mask), n)


def test_pack_merges_prefixes_and_keeps_collisions_apart():
    parent = seq([1, 2, 3, 4], [0, 0, 1, 1], adv=0.5)
    child = seq([1, 2, 3, 4, 5, 6, 7], [0, 0, 0, 0, 0, 1, 1], adv=-1.0)
    sibling = seq([1, 2, 3, 9, 9], [0, 0, 0, 0, 1], adv=2.0)
    clash = seq([1, 2, 3, 4, 5, 6], [0, 0, 0, 0, 0, 1], adv=3.0)  # its trained position is the child's too
    packed = pack_prefixes([parent, child, sibling, clash])
    assert len(packed) == 3
    long = next(p for p in packed if len(p.tokens) == 7)
    assert long.mask == (0, 0, 1, 1, 0, 1, 1)
    assert long.advantages == (0.0, 0.0, 0.5, 0.5, 0.0, -1.0, -1.0)
    # every trained token of the input appears exactly once in the output
    assert sum(sum(p.mask) for p in packed) == sum(sum(s.mask) for s in (parent, child, sibling, clash))


def test_pad_and_clipped_loss():
    p = pad_sequences([seq([1, 2, 3], [0, 1, 1]), seq([4, 5], [0, 1])], ByteCodec.PAD)
    assert p.inputs.tolist() == [[1, 2], [4, ByteCodec.PAD]]
    assert p.targets.tolist() == [[2, 3], [5, ByteCodec.PAD]]
    assert p.mask.tolist() == [[1, 1], [1, 0]]
    # ratio 1: the loss is minus the mean advantage over trained tokens
    loss, stats = clipped_loss(p.old_logprobs.clone(), p, 0.2)
    assert math.isclose(float(loss), -1.0, rel_tol=1e-6) and math.isclose(stats["ratio"], 1.0)
    # a ratio far above 1+clip with a positive advantage is clipped: no gradient
    new = (p.old_logprobs + 1.0).requires_grad_()
    loss, stats = clipped_loss(new, p, 0.2)
    loss.backward()
    assert stats["clip_fraction"] == 1.0 and float(new.grad.abs().sum()) == 0.0
    with pytest.raises(ValueError, match="fewer than 2 tokens"):
        pad_sequences([seq([1], [1])], ByteCodec.PAD)


def _row(prompt, completion, logprobs, adv, edge):
    return ActorRow(
        "c",
        0,
        "t",
        "t#0",
        0,
        edge,
        0,
        "v0",
        tuple(prompt),
        tuple(completion),
        tuple(logprobs),
        (1,) * len(completion),
        adv,
        0.0,
        "stop",
    )


def test_update_moves_probability_toward_positive_advantages():
    model = load()
    prompt = CODEC.render([Message("user", "Reach 7. Total 0.")])
    good, bad = [ord("7"), ByteCodec.EOT], [ord("3"), ByteCodec.EOT]

    def lp(m, completion):
        full = prompt_logprobs(m, prompt + completion)
        return [float(full[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]

    before_good, before_bad = lp(model, good), lp(model, bad)
    batch = Batch("c", 0, [_row(prompt, good, before_good, 1.0, 0), _row(prompt, bad, before_bad, -1.0, 1)])
    trainer = PolicyTrainer(config=UpdateConfig(rule="adam", target_kl=None, lr=3e-3, epochs=4, scale_advantages=False))
    stats = trainer.update(batch)
    assert stats.sequences == 2 and stats.tokens == 4 and math.isfinite(stats.loss)
    assert lp(trainer.model, good)[0] > before_good[0] + 0.05
    assert lp(trainer.model, bad)[0] < before_bad[0] - 0.05
    # as every exporter refuses it: NothingToTrain (a ValueError) naming why
    with pytest.raises(NothingToTrain, match=r"^batch 'c' iteration 1 has no actor rows: nothing to train on"):
        trainer.update(Batch("c", 1, []))
    untrained = [dataclasses.replace(r, loss_mask=(0, 0)) for r in batch.actor]
    with pytest.raises(NothingToTrain, match=r"2 actor row\(s\), none with a trained token"):
        trainer.update(Batch("c", 1, untrained))


@pytest.mark.parametrize("rule", ["adam", "sgd"])
def test_an_advantage_beyond_float32_is_refused_and_task_scaling_brings_it_within(rule):
    """An advantage of 1e39 (rewards are collected up to 1e60) became inf in the float32
    tensors: ``adam`` stopped with TrainingDiverged telling the user to lower the
    learning rate, ``sgd`` and ``natural`` took no step and said nothing. Scaled per task
    first (in float64), the same advantages train."""
    big = _toy_batch(0, [("7", 1e39), ("3", -1e39)])
    kl = {"target_kl": 0.01} if rule != "adam" else {}
    with pytest.raises(ValueError, match=r"^actor row \(task .*\) has the advantage 1e\+39, beyond float32"):
        PolicyTrainer(config=UpdateConfig(rule=rule, **kl)).update(big)
    stats = PolicyTrainer(config=UpdateConfig(rule=rule, scale_advantages="task", **kl)).update(big)
    assert stats.steps == 1 and math.isfinite(stats.loss)


def test_a_batch_of_another_model_s_token_ids_is_refused_naming_the_row_and_the_vocabulary():
    """A batch sampled by another model (a Qwen tokenizer's ids behind vLLM) handed to the
    local trainer, which trains the embedded byte-level model: the update stopped with a
    bare IndexError "index out of range in self" from the embedding."""
    good = _toy_batch(0, [("7", 1.0)])
    r = good.actor[0]
    foreign = Batch("c", 0, [dataclasses.replace(r, completion_ids=(151643,) + r.completion_ids[1:])])
    said = (
        rf"^actor row \(task {r.task_id!r}, edge {r.edge_id}, turn 0\) holds the token id 151643, outside the "
        r"embedded model's vocabulary of \d+ ids"
    )
    with pytest.raises(ValueError, match=said):
        PolicyTrainer().update(foreign)


def test_a_sequence_longer_than_the_model_s_context_is_refused_naming_the_row_and_the_limit():
    """A batch sampled by a custom policy (or a server without the embedded model's
    4096-token context) whose tool observations made a prompt longer than the model's
    context: the update failed deep in the forward pass with "position 5292 exceeds the
    model's max_len 4096", naming no row and not what to change."""
    good = _toy_batch(0, [("7", 1.0)])
    r = good.actor[0]
    limit = load().cfg.max_len
    long = dataclasses.replace(r, prompt_ids=r.prompt_ids + (ord("a"),) * limit)
    said = (
        rf"^actor row \(task {r.task_id!r}, edge {r.edge_id}, turn 0\) ends a sequence of {limit + len(r.prompt_ids) + 2} "
        rf"tokens, over the embedded model's context of {limit}: .*max_prompt_tokens"
    )
    with pytest.raises(ValueError, match=said):
        PolicyTrainer().update(Batch("c", 0, [long]))


def _toy_batch(iteration, completions):
    prompt = CODEC.render([Message("user", f"Reach {7 + iteration}. Total 0.")])
    rows = [_row(prompt, [ord(d), ByteCodec.EOT], [-2.2, -0.01], adv, i) for i, (d, adv) in enumerate(completions)]
    return Batch("c", iteration, rows)


def test_each_optimizer_step_is_reported_and_the_report_changes_nothing():
    batch = _toy_batch(0, [("7", 1.0), ("3", -1.0), ("8", 0.5)])
    cfg = UpdateConfig(rule="adam", target_kl=None, lr=3e-3, epochs=2, minibatch=2)
    seen: list[UpdateStep] = []
    watched, plain = PolicyTrainer(config=cfg), PolicyTrainer(config=cfg)
    stats = watched.update(batch, seen.append)
    alone = plain.update(batch)
    # 3 sequences (no shared prefix to pack) in minibatches of 2: 2 steps an epoch
    assert [(s.step, s.total, s.epoch) for s in seen] == [(1, 4, 0), (2, 4, 0), (3, 4, 1), (4, 4, 1)]
    # the update's figures are these steps' figures: the same floats summed in the same order
    assert stats.steps == 4 and stats.loss == sum(s.loss for s in seen) / 4
    assert stats.approx_kl == sum(s.approx_kl for s in seen) / 4
    assert stats.clip_fraction == sum(s.clip_fraction for s in seen) / 4
    assert all(math.isfinite(s.loss) and s.ratio > 0 for s in seen)
    # watching changes nothing: the same figures and bit for bit the same weights
    assert dataclasses.replace(stats, wall_s=0.0) == dataclasses.replace(alone, wall_s=0.0)
    for a, b in zip(watched.model.state_dict().values(), plain.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(dataclasses.FrozenInstanceError):
        seen[0].loss = 0.0  # type: ignore[misc]


@pytest.mark.parametrize("rule", ["adam", "sgd", "natural"])
@pytest.mark.parametrize(
    "completions",
    [[("7", 0.0), ("3", 0.0)], [("7", 2.3e-10), ("7", -2.3e-10)]],
    ids=["every-advantage-0", "advantages-that-cancel"],
)
def test_a_batch_with_nothing_to_learn_takes_no_step_and_leaves_the_weights(rule, completions):
    """Every advantage 0 (each tree's rollouts alike in return), or advantages that cancel
    over identical sequences sampled from the policy trained (a collected batch of four
    identical truncated leaves whose critic predictions differed in float32 rounding gave
    +-2.3e-10): the gradient is 0,
    but under ``adam`` the update still took its steps and moved the weights by the
    momentum of the update before (by 6.7e-4 on a collected toy batch), reporting them as
    a trained step; the one-step rules already took none."""
    kl = {"target_kl": None} if rule == "adam" else {"target_kl": 0.05}
    trainer = PolicyTrainer(config=UpdateConfig(rule=rule, lr=3e-3, **kl))
    trainer.update(_toy_batch(0, [("7", 1.0), ("3", -1.0)]))  # leaves Adam's moments non-zero
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    moments = [{k: v.clone() for k, v in st.items()} for st in trainer.optimizer.state_dict()["state"].values()]
    batch = _toy_batch(1, completions)
    prompt = batch.actor[0].prompt_ids
    on_policy = []  # the trained model's own log-probs: ratio 1, so no clipping undoes the cancelling
    for r in batch.actor:
        full = prompt_logprobs(trainer.model, prompt + r.completion_ids)
        lps = tuple(float(full[len(prompt) - 1 + i, t]) for i, t in enumerate(r.completion_ids))
        on_policy.append(dataclasses.replace(r, logprobs=lps))
    stats = trainer.update(Batch("c", 1, on_policy))
    assert stats.steps == 0 and not stats.stopped_early and stats.tokens == 4, stats
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    after = list(trainer.optimizer.state_dict()["state"].values())
    assert len(after) == len(moments)
    assert all(torch.equal(a[k], m[k]) for a, m in zip(after, moments, strict=True) for k in m)


@pytest.mark.slow
def test_updates_are_reproducible_and_resume_from_saved_state(tmp_path):
    b0 = _toy_batch(0, [("7", 1.0), ("3", -1.0), ("5", 0.5)])
    b1 = _toy_batch(1, [("8", 1.0), ("2", -0.5), ("9", -1.0)])
    cfg = UpdateConfig(rule="adam", target_kl=None, lr=3e-3, epochs=3, minibatch=2, seed=4)
    # one trainer through both batches
    straight = PolicyTrainer(config=cfg)
    straight.update(b0)
    straight.save(tmp_path / "a0.pt")
    straight.update(b1)
    va = straight.save(tmp_path / "a1.pt")
    # a trainer that stops after the first batch, and a new one that continues from its files
    first = PolicyTrainer(config=cfg)
    first.update(b0)
    first.save(tmp_path / "b0.pt")
    resumed = PolicyTrainer(tmp_path / "b0.pt", cfg, state=first.state_bytes())
    assert resumed.updates == 1
    resumed.update(b1)
    vb = resumed.save(tmp_path / "b1.pt")
    assert va == vb and (tmp_path / "a1.pt").read_bytes() == (tmp_path / "b1.pt").read_bytes()
    # without the optimizer state the second update differs (Adam's moments matter)
    fresh = PolicyTrainer(tmp_path / "b0.pt", cfg)
    fresh.update(b1)
    assert fresh.save(tmp_path / "c1.pt") != va
    with pytest.raises(ValueError, match="not a PolicyTrainer state"):
        PolicyTrainer(config=cfg, state=b"junk")


@pytest.mark.integration
def test_train_iteration_reloads_into_a_real_server(tmp_path):
    from focus.backends import LocalModelServer
    from focus.collector import Collector
    from focus.critic import LocalCritic
    from focus.priority import Phase, Selective
    from focus.toy import reach_target_tasks

    critic = LocalCritic(buckets=256, hidden=8, default=0.3)  # advantages even if nothing succeeds
    search = Selective(phases=(Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=8, wave_size=4)))

    async def evaluate_and_collect(url):
        agent = toy_agent(url, max_steps=6)
        try:
            before = await evaluate(agent, reach_target_tasks(8, seed=99), seed=1)
            col = Collector(agent, search=search, critic=critic, collection_id="it")
            return before, await col.collect(reach_target_tasks(6))
        finally:
            await agent.policy.aclose()

    with LocalModelServer() as server:
        initial = server.policy_version
        before, batch = asyncio.run(evaluate_and_collect(server.url))
        url = BatchStore(str(tmp_path / "store")).write(batch)
        stored = BatchStore(str(tmp_path / "store")).read(url)
        out = train_iteration(PolicyTrainer(), critic, stored, tmp_path / "policy.pt")
        served = server.reload(tmp_path / "policy.pt")
        assert served == out["policy_version"] == server.policy_version != initial
    assert before.episodes == 8 and 0.0 <= before.success_rate <= 1.0 and before.transitions >= 8
    assert out["critic"]["fitted"] and math.isfinite(out["critic"]["mse"]) and critic.fitted
    assert math.isfinite(out["train"]["loss"]) and out["train"]["steps"] >= 1
    new = load(tmp_path / "policy.pt").state_dict()
    old = load().state_dict()
    assert any(not torch.equal(new[k], old[k]) for k in old)
    assert {r.policy_version for r in stored.actor} == {initial} and actor_sequences(stored)
