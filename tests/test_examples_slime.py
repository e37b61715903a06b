"""examples/train_slime: the rollout function, called as slime calls it, on the embedded model."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from fixtures.slime_ids import slime_rollout_ids

from examples.train_slime.rollout import check_args, generate_rollout, model_url, step_metrics
from focus.exporters import slime_sample_class
from focus.format import ByteCodec


def slime_train_data(output) -> dict:
    """What slime's RolloutManager does with a training output (THUDM/slime, commit
    624b824a898ab0ec1fcb4d373004c7f3852bf515): ``_get_rollout_data`` (list[list[Sample]],
    flattened) and the checks and reads of ``_convert_samples_to_train_data``; then, as
    ``get_grpo_returns`` does, the reward broadcast over the response as the advantage."""
    samples = output.samples
    assert isinstance(samples, list) and all(isinstance(g, list) for g in samples)
    flat = [s for g in samples for s in g]
    for s in flat:
        assert len(s.loss_mask) == s.response_length, "loss mask length != response length"
        assert s.rollout_log_probs is not None and len(s.rollout_log_probs) == s.response_length
        assert 0 < s.response_length < len(s.tokens)  # get_responses: logits[-response_length - 1 : -1]
        assert isinstance(s.reward, float) and all(isinstance(w, str) for w in s.weight_versions)
    return {
        "tokens": [s.tokens for s in flat],
        "advantages": [[s.reward * m for m in s.loss_mask] for s in flat],
        "truncated": [int(s.status == s.Status.TRUNCATED) for s in flat],
        "rollout_log_probs": [s.rollout_log_probs for s in flat],
    }


def slime_eval_log(data) -> dict:
    """slime's ``log_eval_rollout_data`` and ``save_debug_rollout_data(evaluation=True)`` reads
    (same commit): mean reward, truncated ratio, and ``compute_metrics_from_samples``, whose
    np.max over response lengths and per-sample division fail on an empty ``samples`` list."""
    out = {}
    for key, info in data.items():
        out[f"eval/{key}"] = sum(info["rewards"]) / len(info["rewards"])
        out[f"eval/{key}-truncated_ratio"] = sum(info["truncated"]) / len(info["truncated"])
        lengths = np.array([s.effective_response_length for s in info["samples"]])
        out[f"eval/{key}/response_len/max"] = np.max(lengths).item()
        out[f"eval/{key}/prefix_cache"] = sum(s.prefix_cache_info.cached_tokens for s in info["samples"]) / len(
            info["samples"]
        )
        assert len(info["samples"]) == len(info["rewards"])
    return out


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
    assert out.metrics["focus/actor_rows"] >= sum(len(g) for g in groups) == out.metrics["focus/slime_samples"]
    data = slime_train_data(out)
    assert len(data["tokens"]) == out.metrics["focus/slime_samples"]
    for s, adv in zip([s for g in groups for s in g], data["advantages"], strict=True):
        assert adv == s.metadata["advantages"]  # slime's broadcast reward is FOCUS's per-token advantage


def test_train_rollout_refuses_settings_that_misread_the_advantages(local_model_server):
    url = local_model_server.url
    with pytest.raises(ValueError, match="--disable-rewards-normalization"):
        generate_rollout(args_for(url, rewards_normalization=True, advantage_estimator="grpo"), 0, None)
    with pytest.raises(ValueError, match="does not use Sample.reward"):
        generate_rollout(args_for(url, rewards_normalization=False, advantage_estimator="ppo"), 0, None)
    out = generate_rollout(args_for(url, rewards_normalization=False, global_batch_size=4), 0, None)
    flat = [s for g in out.samples for s in g]
    assert out.metrics["focus/slime_samples_past_last_step"] == len(flat) - len(slime_steps(flat, 4))


def slime_steps(samples, global_batch_size) -> list[int]:
    """The positions of the samples slime trains on: ``build_dp_schedule``
    (THUDM/slime slime/utils/dp_schedule.py, commit 624b824a898ab0ec1fcb4d373004c7f3852bf515)
    groups samples by rollout id (``_convert_samples_to_train_data`` gives a sample without one
    a fresh id) in order of first occurrence, takes ``global_batch_size`` rollouts a step and
    drops the rollouts after the last full step."""
    ids = slime_rollout_ids(samples)
    by_rollout: dict[int, list[int]] = {}
    for pos, rid in enumerate(ids):
        by_rollout.setdefault(rid, []).append(pos)
    rollouts = list(by_rollout)[: len(by_rollout) // global_batch_size * global_batch_size]
    return [pos for rid in rollouts for pos in by_rollout[rid]]


def test_step_metrics_count_what_slime_drops_when_a_segment_splits():
    """A compaction splits one segment into two samples sharing its rollout_id: slime's steps
    hold ``global_batch_size`` rollouts, so the samples past the last step are counted by
    rollout, not ``n % global_batch_size``."""
    import dataclasses

    from test_exporters import multi_turn_tree
    from test_storage import batch_from_trees

    from focus.batch import Batch
    from focus.exporters import to_slime_samples

    r = batch_from_trees([multi_turn_tree("a")], "cx", 1).actor[0]
    rows = [dataclasses.replace(r, edge_id=e) for e in range(3)]
    rows.insert(1, dataclasses.replace(r, turn_index=1, prompt_ids=(7, 7, 7)))  # splits segment 0
    samples = to_slime_samples(Batch("cx", 1, rows))
    assert len(samples) == 4
    m = step_metrics(samples, 2)
    assert m["focus/slime_samples"] == 4 and m["focus/slime_rollouts"] == 3
    assert m["focus/slime_samples_past_last_step"] == len(samples) - len(slime_steps(samples, 2)) == 1


@pytest.mark.parametrize(
    ("settings", "says"),
    [
        ({"rewards_normalization": True}, "--disable-rewards-normalization"),
        ({"normalize_advantages": True}, r"slime's --normalize-advantages would whiten the FOCUS advantages"),
        ({"advantage_estimator": "reinforce_plus_plus"}, "does not use Sample.reward"),
    ],
)
def test_settings_that_misread_the_advantages_are_refused_before_collecting(settings, says):
    # --normalize-advantages passed: slime whitened FOCUS's advantages over the batch's
    # tokens after its estimator, re-centring every segment on the others' mean
    args = SimpleNamespace(**{"rewards_normalization": False, "advantage_estimator": "grpo", **settings})
    with pytest.raises(ValueError, match=says):
        check_args(args)
    check_args(SimpleNamespace(rewards_normalization=False, normalize_advantages=False, advantage_estimator="gspo"))


def test_evaluation_and_data_source(local_model_server):
    class Source:
        def get_samples(self, n):
            return [[SimpleNamespace(prompt=str(7 + i), label=None)] for i in range(n)]

    args = args_for(local_model_server.url)
    ev = generate_rollout(args, 1, Source(), evaluation=True)
    assert len(ev.data["focus_toy"]["rewards"]) == 3
    assert 0.0 <= ev.metrics["focus_toy/success"] <= 1.0
    logged = slime_eval_log(ev.data)  # an empty samples list made slime's eval logging fail
    assert logged["eval/focus_toy/response_len/max"] > 0
    cls, codec = slime_sample_class(), ByteCodec()
    for s, r in zip(ev.data["focus_toy"]["samples"], ev.data["focus_toy"]["rewards"], strict=True):
        assert isinstance(s, cls) and s.reward == r
        assert len(s.loss_mask) == len(s.rollout_log_probs) == s.response_length < len(s.tokens)
        assert codec.decode(s.tokens).startswith("Reach ")

    class Bad:
        def get_samples(self, n):
            return [[SimpleNamespace(prompt="what?", label=None)]]

    with pytest.raises(ValueError, match="not a target number"):
        generate_rollout(args, 1, Bad())
    with pytest.raises(ValueError, match="no model server"):
        model_url(SimpleNamespace())


def _flattened(batch):
    """``batch`` with every advantage 0: each tree's rollouts alike in return."""
    import dataclasses

    from focus.batch import Batch

    rows = [dataclasses.replace(r, advantage=0.0) for r in batch.actor]
    return Batch(batch.collection_id, batch.iteration, rows, batch.critic, batch.stats)


def test_a_batch_with_nothing_to_learn_is_skipped_for_the_next_draw(local_model_server, monkeypatch):
    """slime trains on whatever the function returns, and its Adam step on a batch whose
    every advantage is 0 moves the weights by momentum alone: such a batch is collected
    again on the next tasks, as the local trainer takes no step on it."""
    from examples.train_slime import rollout

    real, drawn = rollout._collect, []

    async def first_flat(args, rollout_id, tasks, *draw):
        drawn.append([t.id for t in tasks])
        batch = await real(args, rollout_id, tasks, *draw)
        return _flattened(batch) if len(drawn) == 1 else batch

    monkeypatch.setattr(rollout, "_collect", first_flat)
    out = generate_rollout(args_for(local_model_server.url), 0, None)
    assert len(drawn) == 2 and not set(drawn[0]) & set(drawn[1])  # a second draw, of other tasks
    assert any(s.reward != 0 for g in out.samples for s in g)


def test_draws_that_never_have_anything_to_learn_stop_in_one_line(local_model_server, monkeypatch):
    from examples.train_slime import rollout
    from focus.exporters import NothingToTrain

    real, drawn = rollout._collect, []

    async def always_flat(args, rollout_id, tasks, *draw):
        drawn.append(draw[0] if draw else 0)
        return _flattened(await real(args, rollout_id, tasks, *draw))

    monkeypatch.setattr(rollout, "_collect", always_flat)
    with pytest.raises(NothingToTrain, match=r"every advantage 0 in 3 batches collected in a row"):
        generate_rollout(args_for(local_model_server.url, focus_redraws=2), 0, None)
    assert drawn == [0, 1, 2]
