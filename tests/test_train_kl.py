"""focus.train_local: the KL early stop ends an update, and segment weights follow the tree."""

from __future__ import annotations

import pytest

from focus.batch import ActorRow, Batch
from focus.env import Message
from focus.format import ByteCodec
from focus.train_local import PolicyTrainer, UpdateConfig, kl_reached
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


def test_kl_reached_is_a_plain_threshold():
    assert not kl_reached(0.5, None)
    assert not kl_reached(0.02, 0.03) and kl_reached(0.031, 0.03)


@pytest.mark.slow
def test_an_update_stops_once_its_kl_passes_the_target():
    batch = _batch()
    # a large step size: the first optimizer step already moves the policy far
    free = PolicyTrainer(config=UpdateConfig(lr=3e-2, epochs=6, minibatch=1, scale_advantages=False)).update(batch)
    assert free.steps == 6 * 4 and not free.stopped_early
    capped = PolicyTrainer(
        config=UpdateConfig(lr=3e-2, epochs=6, minibatch=1, scale_advantages=False, target_kl=1e-3)
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
