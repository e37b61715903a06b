"""focus.train_local: the KL bound of an update (an early stop, and an epoch, the first
included, that overshoots is undone and run again at half the learning rate), the same
update as before where no target is set, and segment weights that follow the tree."""

from __future__ import annotations

import dataclasses
import random

import pytest

try:
    import torch
except ModuleNotFoundError:  # pip install focus-rl without [train]
    pytest.skip("torch is not installed (the [train] extra)", allow_module_level=True)

from focus.batch import ActorRow, Batch
from focus.env import Message
from focus.exporters import actor_sequences
from focus.format import ByteCodec
from focus.kl_bound import MAX_HALVINGS, kl_verdict
from focus.tinylm.model import load, prompt_logprobs
from focus.train_local import (
    PolicyTrainer,
    UpdateConfig,
    clipped_loss,
    kl_reached,
    pack_prefixes,
    pad_sequences,
    token_logprobs,
)
from focus.tree_weights import segment_weights, weighted

CODEC = ByteCodec()


def _row(prompt, completion, adv, edge, node=0, tree="t#0", logprobs=None):
    return ActorRow(
        "c", 0, "t", tree, node, edge, 0, "v0", tuple(prompt), tuple(completion),
        tuple(logprobs or [-2.2] * len(completion)), (1,) * len(completion), adv, 0.0, "stop",
    )  # fmt: skip


def _batch():
    prompt = CODEC.render([Message("user", "Reach 9. Total 0.")])
    rows = [
        _row(prompt, [ord(d), ByteCodec.EOT], adv, i)
        for i, (d, adv) in enumerate(zip("9318", (1.0, -1.0, -1.0, 0.5), strict=True))
    ]
    return Batch("c", 0, rows)


def _on_policy(batch):
    """``batch`` with the committed model's own log-probs: sampled from it, as the
    learning loop's batches are (their KL before an update is about 0)."""
    model = load()

    def own(r):
        full = prompt_logprobs(model, list(r.prompt_ids) + list(r.completion_ids))
        lp = tuple(float(full[len(r.prompt_ids) - 1 + i, t]) for i, t in enumerate(r.completion_ids))
        return dataclasses.replace(r, logprobs=lp)

    return Batch(batch.collection_id, batch.iteration, [own(r) for r in batch.actor])


def test_kl_reached_is_a_plain_threshold():
    assert not kl_reached(0.5, None)
    assert not kl_reached(0.02, 0.03) and kl_reached(0.031, 0.03)


def test_kl_verdict_bounds_the_kl_an_epoch_adds():
    assert kl_verdict(0.0, 0.1, 0.05, 0) == "accept"  # at the bound, twice the target
    assert kl_verdict(0.0, 0.1001, 0.05, 0) == "retry"
    assert kl_verdict(0.0, 0.1001, 0.05, MAX_HALVINGS - 1) == "retry"
    assert kl_verdict(0.0, 0.1001, 0.05, MAX_HALVINGS) == "undo"
    # a batch from another policy: the bound counts from where the update started
    assert kl_verdict(2.9, 2.95, 0.05, 0) == "accept" and kl_verdict(2.9, 3.01, 0.05, 0) == "retry"


def test_an_overshooting_first_epoch_is_undone_and_run_again_at_half_the_learning_rate():
    batch = _on_policy(_batch())
    base = {"rule": "adam", "lr": 3e-3, "epochs": 1, "minibatch": 2, "scale_advantages": False}
    # without a target this one epoch overshoots: the case the bound is for
    free = PolicyTrainer(config=UpdateConfig(**base, target_kl=None)).update(batch)
    assert free.final_kl > 2 * 0.05 and free.kl_halvings == 0 and free.initial_kl == 0.0
    trainer = PolicyTrainer(config=UpdateConfig(**base, target_kl=0.05))
    capped = trainer.update(batch)
    assert abs(capped.initial_kl) < 1e-6  # on-policy (float error only)
    assert 1 <= capped.kl_halvings <= MAX_HALVINGS and capped.steps >= 1
    assert capped.final_kl <= capped.initial_kl + 2 * 0.05
    assert all(g["lr"] == 3e-3 for g in trainer.optimizer.param_groups)  # the next update starts at lr
    # undone means undone, optimizer state too: the same weights and moments as a first
    # try at the halved learning rate
    lr = 3e-3 / 2**capped.kl_halvings
    direct = PolicyTrainer(config=UpdateConfig(**{**base, "lr": lr}, target_kl=0.05))
    again = direct.update(batch)
    assert again.kl_halvings == 0 and again.final_kl == capped.final_kl and again.steps == capped.steps
    for a, b in zip(trainer.model.state_dict().values(), direct.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    moments = [trainer.optimizer.state_dict()["state"], direct.optimizer.state_dict()["state"]]
    assert moments[0].keys() == moments[1].keys()
    for k, st in moments[0].items():
        assert all(torch.equal(v, moments[1][k][n]) for n, v in st.items())


def test_an_update_from_another_policy_may_add_up_to_twice_the_target():
    batch = _batch()  # behaviour log-probs -2.2 and -2.2: not the model's
    stats = PolicyTrainer(
        config=UpdateConfig(rule="adam", lr=3e-3, epochs=2, minibatch=2, scale_advantages=False, target_kl=0.05)
    ).update(batch)
    assert stats.initial_kl > 1.0 and stats.steps >= 1
    assert stats.final_kl <= stats.initial_kl + 2 * 0.05


def _plain_update(trainer: PolicyTrainer, batch: Batch) -> None:
    """The update without a KL target as it was before the bound (the loop of 7c207a7):
    epochs x minibatches of similar length in a seeded order, one step each."""
    cfg = trainer.config
    seqs = pack_prefixes(actor_sequences(batch))
    rng = random.Random(f"{cfg.seed}/{trainer.updates}")
    by_len = sorted(range(len(seqs)), key=lambda i: (len(seqs[i].tokens), seqs[i].tokens))
    chunks = [by_len[i : i + cfg.minibatch] for i in range(0, len(by_len), cfg.minibatch)]
    threads = torch.get_num_threads()
    torch.set_flush_denormal(True)
    torch.set_num_threads(1)
    try:
        trainer.model.train()
        for _ in range(cfg.epochs):
            rng.shuffle(chunks)
            for idx in chunks:
                p = pad_sequences([seqs[i] for i in idx], ByteCodec.PAD)
                new = token_logprobs(trainer.model, p.inputs, p.targets, 1.0)
                loss, _ = clipped_loss(new, p, cfg.clip, p.advantages)
                trainer.optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), cfg.max_grad_norm)
                trainer.optimizer.step()
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)


def test_without_a_target_the_update_is_the_one_before_the_bound():
    batch = _on_policy(_batch())
    cfg = UpdateConfig(
        rule="adam", target_kl=None, lr=3e-3, epochs=3, minibatch=2, scale_advantages=False, seed=3, pack="prefixes"
    )  # the plain layout, bit for bit
    new, old = PolicyTrainer(config=cfg), PolicyTrainer(config=cfg)
    stats = new.update(batch)
    _plain_update(old, batch)
    assert stats.steps == 3 * 2 and stats.kl_halvings == 0 and stats.initial_kl == 0.0
    assert stats.final_kl > 2 * 0.05  # far past any bound: nothing held it back
    for a, b in zip(new.model.state_dict().values(), old.model.state_dict().values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_an_update_stops_once_its_kl_passes_the_target():
    batch = _batch()
    # a large step size: the first optimizer step already moves the policy far
    free = PolicyTrainer(
        config=UpdateConfig(rule="adam", target_kl=None, lr=3e-2, epochs=6, minibatch=1, scale_advantages=False)
    ).update(batch)
    assert free.steps == 6 * 4 and not free.stopped_early
    capped = PolicyTrainer(
        config=UpdateConfig(rule="adam", lr=3e-2, epochs=6, minibatch=1, scale_advantages=False, target_kl=1e-3)
    ).update(batch)
    assert capped.stopped_early and 1 <= capped.steps < free.steps
    # the KL after the update is measured over every trained token: the capped update moved less
    assert 0.0 < capped.final_kl < free.final_kl


def test_sibling_and_reach_weights_follow_the_tree():
    # root (node 0) -> edges 0, 1 (two rollouts); edge 0 ends at checkpoint 5, which has
    # 3 continuations (edges 2, 3, 4), whose first prompts extend edge 0's last turn
    root = (1, 2, 3)
    e0 = _row(root, (10, 11), 1.0, 0, node=0)
    e1 = _row(root, (12, 13), 1.0, 1, node=0)
    cont = (*root, 10, 11, 20)
    kids = [_row(cont, (30 + i,), 1.0, 2 + i, node=5) for i in range(3)]
    rows = [e0, e1, *kids]
    sib = segment_weights(rows, "siblings")
    # raw: 1/2, 1/2, 1/3 x 3; mean 2/5
    assert sib[("t", "t#0", 0)] == pytest.approx(0.5 / (2.0 / 5))
    assert sib[("t", "t#0", 2)] == pytest.approx((1 / 3) / (2.0 / 5))
    reach = segment_weights(rows, "reach")
    # raw: 1/2, 1/2, 1/6 x 3; mean 1.5/5 = 0.3
    assert reach[("t", "t#0", 3)] == pytest.approx((1 / 6) / 0.3)
    assert sum(reach.values()) / len(reach) == pytest.approx(1.0)
    out = weighted(Batch("c", 0, rows), "reach")
    assert [r.advantage for r in out.actor] == pytest.approx([reach[("t", "t#0", r.edge_id)] for r in rows])
    with pytest.raises(ValueError, match="unknown"):
        segment_weights(rows, "depth")


def test_task_scaling_gives_every_task_unit_spread_and_keeps_a_flat_task():
    from focus.train_local import UpdateConfig
    from focus.tree_weights import task_scaled

    def row(task, adv, tokens, edge):
        r = _row((1, 2), tuple(range(5, 5 + tokens)), adv, edge)
        return dataclasses.replace(r, task_id=task)

    # task a: advantages +2 (2 tokens) and -1 (1 token); task b: 0.1 / -0.1 / 0.3; task c: flat
    rows = [row("a", 2.0, 2, 0), row("a", -1.0, 1, 1), row("b", 0.1, 1, 2), row("b", -0.1, 1, 3), row("b", 0.3, 2, 4)]
    rows += [row("c", 0.5, 1, 5), row("c", 0.5, 3, 6)]
    out = task_scaled(Batch("c", 0, rows)).actor
    for task in ("a", "b"):
        got = [(r.advantage, sum(r.loss_mask)) for r in out if r.task_id == task]
        n = sum(k for _, k in got)
        mean = sum(a * k for a, k in got) / n
        assert sum(k * (a - mean) ** 2 for a, k in got) / n == pytest.approx(1.0)  # unit spread per task
    a_before = [r.advantage for r in rows if r.task_id == "a"]
    a_after = [r.advantage for r in out if r.task_id == "a"]
    assert a_after[0] / a_after[1] == pytest.approx(a_before[0] / a_before[1])  # one factor per task, signs kept
    assert [r.advantage for r in out if r.task_id == "c"] == [0.5, 0.5]
    # a task whose advantages sit far from 0 (rewards in the millions, a critic at 0):
    # E[a^2] - E[a]^2 lost their spread to rounding, 0 (kept unscaled) or 8 for 9
    for centre, half in ((1e8, 3.0), (3e8, 1.0), (1e6, 1e-3)):
        hi, lo = centre + half, centre - half
        got = [r.advantage for r in task_scaled(Batch("c", 0, [row("d", hi, 1, 7), row("d", lo, 1, 8)])).actor]
        assert got == pytest.approx([hi / ((hi - lo) / 2), lo / ((hi - lo) / 2)], rel=1e-9)
    assert UpdateConfig(scale_advantages=True).scale_advantages == "batch"
    assert UpdateConfig(scale_advantages=False).scale_advantages == "none"
    with pytest.raises(ValueError):
        UpdateConfig(scale_advantages="tree")
