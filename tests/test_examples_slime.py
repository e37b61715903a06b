"""examples/train_slime: the rollout function, called as slime calls it, on the embedded model."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from examples.train_slime.rollout import generate_rollout, model_url
from focus.exporters import slime_sample_class
from focus.format import ByteCodec


def args_for(url, **kw):
    host, port = url.removeprefix("http://").split(":")
    return SimpleNamespace(
        sglang_router_ip=host,
        sglang_router_port=int(port),
        rollout_batch_size=3,
        n_samples_per_prompt=2,
        focus_transitions=6,
        seed=0,
        **kw,
    )


def test_train_rollout_returns_grouped_token_exact_samples(local_model_server):
    out = generate_rollout(args_for(local_model_server.url), 0, None)
    assert type(out).__name__ in ("RolloutFnTrainOutput", "_TrainOutput")
    groups = out.samples
    assert len(groups) == 3 and all(groups)
    cls = slime_sample_class()
    codec = ByteCodec()
    for gi, group in enumerate(groups):
        for s in group:
            assert isinstance(s, cls) and s.group_index == gi
            assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length
            assert 0 < s.response_length < len(s.tokens)
            assert all(lp <= 0 for lp, m in zip(s.rollout_log_probs, s.loss_mask, strict=True) if m)
            assert codec.decode(s.tokens).startswith("Reach ")  # the env's opening, rendered by the codec
            assert s.reward == s.metadata["advantage"]
    assert out.metrics["focus/actor_rows"] >= sum(len(g) for g in groups)


def test_evaluation_and_data_source(local_model_server):
    class Source:
        def get_samples(self, n):
            return [[SimpleNamespace(prompt=str(7 + i), label=None)] for i in range(n)]

    args = args_for(local_model_server.url)
    ev = generate_rollout(args, 1, Source(), evaluation=True)
    assert len(ev.data["focus_toy"]["rewards"]) == 3
    assert 0.0 <= ev.metrics["focus_toy/success"] <= 1.0

    class Bad:
        def get_samples(self, n):
            return [[SimpleNamespace(prompt="what?", label=None)]]

    with pytest.raises(ValueError, match="not a target number"):
        generate_rollout(args, 1, Bad())
    with pytest.raises(ValueError, match="no model server"):
        model_url(SimpleNamespace())
