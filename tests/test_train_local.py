"""focus.train_local: the clipped policy-gradient update, prefix packing, and the loop
against a real embedded model server (weights change, the served version advances)."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from focus.batch import ActorRow, Batch
from focus.env import Message
from focus.exporters import TokenSequence, actor_sequences
from focus.format import ByteCodec
from focus.tinylm.model import load, prompt_logprobs
from focus.train_local import (
    LoopConfig,
    PolicyTrainer,
    TrainConfig,
    clipped_loss,
    pack_prefixes,
    pad_sequences,
    run_loop,
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
    trainer = PolicyTrainer(config=TrainConfig(lr=3e-3, epochs=4, scale_advantages=False))
    stats = trainer.update(batch)
    assert stats.sequences == 2 and stats.tokens == 4 and math.isfinite(stats.loss)
    assert lp(trainer.model, good)[0] > before_good[0] + 0.05
    assert lp(trainer.model, bad)[0] < before_bad[0] - 0.05
    with pytest.raises(ValueError, match="no trainable actor sequences"):
        trainer.update(Batch("c", 1, []))


def test_loop_trains_saves_and_reloads_into_the_server(tmp_path):
    from focus.backends import LocalModelServer

    config = LoopConfig(
        iterations=1,
        tasks_per_iteration=6,
        eval_tasks=8,
        rollouts_per_task=2,
        transitions=8,
        wave_size=4,
        store=str(tmp_path / "store"),
        critic="local",
    )
    with LocalModelServer() as server:
        initial = server.policy_version
        records = asyncio.run(run_loop(config, server, tmp_path / "w", BatchStore(config.store)))
        served = server.policy_version
    assert [r.iteration for r in records] == [0, 1]
    assert records[0].policy_version == initial != records[1].policy_version == served
    assert records[0].critic["fitted"] and math.isfinite(records[0].critic["mse"])
    assert math.isfinite(records[0].train["loss"]) and records[0].train["steps"] >= 1
    new = load(tmp_path / "w" / "policy-0001.pt").state_dict()
    old = load().state_dict()
    assert any(not torch.equal(new[k], old[k]) for k in old)
    # the batch trained on is the exported one, readable with its exact tokens
    batch = BatchStore(str(tmp_path / "store")).read(records[0].batch_url)
    assert len(batch.actor) == records[0].actor_rows > 0
    assert {r.policy_version for r in batch.actor} == {initial}
    assert actor_sequences(batch)
