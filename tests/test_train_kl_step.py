"""focus.kl_step (``UpdateConfig.rule`` ``sgd`` / ``natural``): one step sized to the KL
target by a line search; it reaches the target, keeps the bound, puts the weights back
when no probe meets it, is deterministic, and its Fisher product is the KL's curvature."""

from __future__ import annotations

import math

import pytest

try:
    import torch
except ModuleNotFoundError:  # pip install focus-rl without [train]
    pytest.skip("torch is not installed (the [train] extra)", allow_module_level=True)
from pydantic import ValidationError
from test_train_kl import _batch, _on_policy

from focus.exporters import actor_sequences
from focus.format import ByteCodec
from focus.kl_step import PROBES, TOLERANCE, conjugate_gradient, curvature_along, fisher_product, kl_step
from focus.tinylm.model import load
from focus.train_local import (
    PolicyTrainer,
    UpdateConfig,
    clipped_loss,
    pack_prefixes,
    pad_sequences,
    token_logprobs,
)


def _weights(trainer):
    return [t.clone() for t in trainer.model.state_dict().values()]


@pytest.mark.parametrize("rule", ["sgd", "natural"])
def test_one_step_reaches_the_kl_target_whatever_the_learning_rate(rule):
    batch = _on_policy(_batch())
    got = []
    for lr in (1e-5, 1e-2):  # the step's length comes from the line search, not from lr
        trainer = PolicyTrainer(config=UpdateConfig(rule=rule, target_kl=0.05, lr=lr, epochs=8))
        stats = trainer.update(batch)
        assert abs(stats.initial_kl) < 1e-6  # on-policy (float error only)
        # the search stops within TOLERANCE of the target, or keeps the closest probe within the bound
        assert stats.final_kl == pytest.approx(0.05, rel=TOLERANCE + 1e-3)
        assert stats.steps == 1 and not stats.stopped_early and 0 <= stats.kl_halvings <= PROBES
        assert not trainer.optimizer.state  # Adam's moments are neither used nor made
        got.append(_weights(trainer))
    assert all(torch.equal(a, b) for a, b in zip(*got, strict=True))


def test_the_step_is_deterministic_and_differs_between_rules():
    batch = _on_policy(_batch())
    runs = {
        (rule, k): _weights(_trained(rule, batch)) for rule in ("sgd", "natural") for k in range(2)
    }  # fmt: skip
    for rule in ("sgd", "natural"):
        assert all(torch.equal(a, b) for a, b in zip(runs[(rule, 0)], runs[(rule, 1)], strict=True))
    assert not all(torch.equal(a, b) for a, b in zip(runs[("sgd", 0)], runs[("natural", 0)], strict=True))


def _trained(rule, batch, target_kl=0.05):
    trainer = PolicyTrainer(config=UpdateConfig(rule=rule, target_kl=target_kl))
    trainer.update(batch)
    return trainer


def _chunks(batch):
    return [pad_sequences(pack_prefixes(actor_sequences(batch)), ByteCodec.PAD)]


def _loss(model):
    return lambda p: clipped_loss(token_logprobs(model, p.inputs, p.targets, 1.0), p, 0.5)


@pytest.mark.parametrize("measured", [1.0, math.nan])
def test_no_probe_within_the_bound_puts_the_weights_back(measured):
    batch = _on_policy(_batch())
    model = load()
    before = [t.clone() for t in model.state_dict().values()]
    cfg = UpdateConfig(rule="sgd", target_kl=0.05)
    calls = []

    def kl():  # every probe reads past the bound (or not a number)
        calls.append(1)
        return measured

    taken, overshoots = kl_step(model, _chunks(batch), cfg, _loss(model), 0.0, kl)
    assert taken == [] and overshoots == len(calls) == 1 + PROBES
    assert all(torch.equal(a, b) for a, b in zip(before, model.state_dict().values(), strict=True))


def test_a_probe_past_the_bound_is_not_kept():
    batch = _on_policy(_batch())
    model = load()
    before = [t.clone() for t in model.state_dict().values()]
    cfg = UpdateConfig(rule="sgd", target_kl=0.05)
    readings = iter([0.5, 0.052])  # the first guess overshoots twice the target; the second ends the search

    taken, overshoots = kl_step(model, _chunks(batch), cfg, _loss(model), 0.0, lambda: next(readings))
    assert len(taken) == 1 and overshoots == 1
    moved = [a - b for a, b in zip(model.state_dict().values(), before, strict=True)]
    assert any(float(m.abs().max()) > 0 for m in moved)


def test_a_rule_without_a_target_is_refused():
    with pytest.raises(ValidationError, match="target_kl"):
        UpdateConfig(rule="natural", target_kl=None)
    with pytest.raises(ValidationError, match="target_kl"):
        UpdateConfig(target_kl=None)  # the default rule, sgd
    assert UpdateConfig(rule="adam", target_kl=None).target_kl is None  # adam needs none


def test_fisher_product_is_the_curvature_of_the_whole_vocabulary_kl():
    torch.manual_seed(0)
    batch = _on_policy(_batch())
    model = load()
    chunks = _chunks(batch)
    params = list(model.parameters())
    u = [torch.randn_like(q) * 1e-2 for q in params]
    v = [torch.randn_like(q) * 1e-2 for q in params]

    def dot(a, b):
        return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b, strict=True)))

    fu, fv = fisher_product(model, chunks, 1.0, u), fisher_product(model, chunks, 1.0, v)
    assert dot(u, fv) == pytest.approx(dot(v, fu), rel=1e-3)  # symmetric (float32 sums)
    quad = dot(v, fv)
    assert quad > 0
    # the KL over the vocabulary after a small move eps * v is eps^2/2 v'Fv to second order
    p = chunks[0]
    with torch.no_grad():
        old = torch.log_softmax(model(p.inputs)[0].float(), -1)
        eps = 0.5
        for q, d in zip(params, v, strict=True):
            q.add_(eps * d)
        new = torch.log_softmax(model(p.inputs)[0].float(), -1)
        kl = float(((old.exp() * (old - new)).sum(-1) * p.mask).sum() / p.mask.sum())
    # third-order terms: a 10% band at this step (kl about 1e-3)
    assert kl == pytest.approx(0.5 * eps**2 * quad, rel=0.1)


def test_conjugate_gradient_solves_a_small_system():
    a = torch.tensor([[4.0, 1.0, 0.0], [1.0, 3.0, 0.5], [0.0, 0.5, 2.0]], dtype=torch.float64)
    b = [torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64)]
    x = conjugate_gradient(lambda v: [a @ v[0]], b, iterations=3)  # exact in n steps for n unknowns
    assert torch.allclose(a @ x[0], b[0], atol=1e-10)


@pytest.mark.parametrize("layout", ["prefixes", "tree"])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_forward_mode_curvature_is_v_fisher_v(layout, temperature):
    """The line search's first guess reads ``v'Fv`` from one Jacobian-vector product per
    chunk; it must be what the Fisher product (two backward passes) gives, on either
    sequence layout (float32 sums in different orders: 1e-4 relative)."""
    from focus.train_local import pack_sequences

    torch.manual_seed(1)
    batch = _on_policy(_batch())
    model = load()
    seqs = pack_sequences(actor_sequences(batch), layout)
    chunks = [pad_sequences(seqs[i : i + 8], ByteCodec.PAD) for i in range(0, len(seqs), 8)]
    v = [torch.randn_like(q) * 1e-2 for q in model.parameters()]
    want = float(
        sum(
            (a.double() * b.double()).sum()
            for a, b in zip(v, fisher_product(model, chunks, temperature, v), strict=True)
        )
    )
    assert want > 0
    assert curvature_along(model, chunks, temperature, v) == pytest.approx(want, rel=1e-4)


def test_several_steps_follow_the_gradient_and_land_near_the_target_unlike_one_step():
    """``steps`` 3: steps of target / 3 each from the weights before it, the gradient
    taken again after each, until the KL from the behaviour reaches the target; the
    weights differ from one step's; ``steps`` 1 is the one step (the default)."""
    batch = _on_policy(_batch())
    seen = []
    trainer = PolicyTrainer(config=UpdateConfig(rule="sgd", target_kl=0.06, steps=3))
    stats = trainer.update(batch, on_step=seen.append)
    assert 2 <= stats.steps <= 3 and [s.step for s in seen] == list(range(1, stats.steps + 1))
    assert stats.final_kl >= 0.06 * (1 - TOLERANCE) or stats.steps == 3
    assert stats.final_kl <= 3 * 0.06
    one = _weights(_trained("sgd", batch, target_kl=0.06))
    assert not all(torch.equal(a, b) for a, b in zip(_weights(trainer), one, strict=True))
    default = PolicyTrainer(config=UpdateConfig(rule="sgd", target_kl=0.06, steps=1))
    default.update(batch)
    assert all(torch.equal(a, b) for a, b in zip(_weights(default), one, strict=True))
    with pytest.raises(ValidationError):
        UpdateConfig(steps=0)
