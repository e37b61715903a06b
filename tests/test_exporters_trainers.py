"""The exports against what each trainer's own code reads from them: verl's metric helpers
(a mirror of their logic, tests/fixtures/_verl_metrics.py), Tinker's loss functions (the
installed SDK's ``LossFnType``), and the Parquet readers of a batch of no rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fixtures._verl_metrics import DataProto, compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
from test_exporters import _positions, batch  # noqa: F401 - the multi-turn two-tree batch fixture

from focus.batch import Batch
from focus.exporters import actor_sequences, to_verl_batch


def test_verl_s_metric_helpers_read_a_focus_batch_with_verl_s_meanings(batch):  # noqa: F811
    """verl's trainer calls ``compute_data_metrics`` (``token_level_scores``,
    ``token_level_rewards``, ``returns``) and ``compute_throughout_metrics``
    (``meta_info["global_token_num"]``, also read by its actor worker after every
    ``update_policy``) on the batch it trains on: the export had none of them, so each
    raised ``KeyError`` on FOCUS's ``DataProto``. Scores and rewards are the env rewards
    (each turn's at its last completion token: per sequence they sum to the segment's
    reward), returns are the advantages (verl's critic-free estimators' convention)."""
    out = to_verl_batch(batch, pad_token_id=262, temperature=1.0)
    data = DataProto.from_dict(out["tensors"], out["non_tensors"], out["meta_info"])
    metrics = compute_data_metrics(data, use_critic=False)
    seqs = actor_sequences(batch)
    rewards = np.array([s.reward for s in seqs], dtype=np.float32)
    trained = [(row.advantage, m) for s in seqs for row, i, _ in _positions(s) for m in [row.loss_mask[i]] if m]
    advs = np.array([a for a, _ in trained], dtype=np.float32)
    assert metrics["critic/score/mean"] == pytest.approx(rewards.mean())
    assert metrics["critic/score/max"] == pytest.approx(rewards.max()) and rewards.max() > rewards.min()
    assert metrics["critic/rewards/mean"] == metrics["critic/score/mean"]  # no KL in the reward
    assert metrics["critic/advantages/mean"] == pytest.approx(advs.mean())
    assert metrics["critic/returns/mean"] == metrics["critic/advantages/mean"]
    lengths = [len(s.tokens) - s.prompt_length for s in seqs]
    assert metrics["response_length/mean"] == pytest.approx(np.mean(lengths))
    perf = compute_throughout_metrics(data, {"step": 2.0}, n_gpus=1)
    assert perf["perf/total_num_tokens"] == sum(len(s.tokens) for s in seqs)
    timing = compute_timing_metrics(data, {"gen": 1.0, "update_actor": 1.0})
    assert timing["timing_per_token_ms/update_actor"] == pytest.approx(1000 / sum(len(s.tokens) for s in seqs))
    t = out["tensors"]
    for i, s in enumerate(seqs):  # each turn's reward sits on its last completion token
        for row in s.rows:
            j = len(row.prompt_ids) + len(row.completion_ids) - 1 - s.prompt_length
            assert t["token_level_scores"][i, j] == np.float32(row.reward)
        assert np.count_nonzero(t["token_level_scores"][i]) <= len(s.rows)
    assert t["token_level_scores"].dtype == t["returns"].dtype == np.float32
    with pytest.raises(KeyError, match="values"):  # FOCUS's critic is not verl's: no per-token values
        compute_data_metrics(data, use_critic=True)


def test_a_reward_beyond_float32_is_refused_by_the_verl_export_naming_its_sequence(batch):  # noqa: F811
    """verl's score arrays are float32: a reward of 1e39 (rewards are collected up to
    1e60) would be ``inf`` in every score metric."""
    r = batch.actor[0]
    big = Batch("cx", 1, [dataclasses.replace(r, reward=1e39)])
    with pytest.raises(ValueError, match=rf"sequence 0 \(task {r.task_id!r}, edge {r.edge_id}\) has the reward 1e\+39"):
        to_verl_batch(big, pad_token_id=0)


#: What each loss of the installed SDK's ``tinker.types.LossFnType`` reads from a datum, as
#: documented at tinker-docs.thinkingmachines.ai (losses/, losses/gspo/, losses/stable-reinforce/,
#: datum/): GSPO takes the mean log-ratio over the positions ``sequence_ratio_mask`` marks.
TINKER_LOSS_INPUTS = {
    "importance_sampling": {"target_tokens", "logprobs", "advantages"},
    "ppo": {"target_tokens", "logprobs", "advantages"},
    "cispo": {"target_tokens", "logprobs", "advantages"},
    "gspo": {"target_tokens", "logprobs", "advantages", "sequence_ratio_mask"},
}
#: Losses a FOCUS batch cannot feed, and the words of the refusal.
TINKER_REFUSED = {
    "stable_reinforce": "sequence_id",
    "cross_entropy": "supervised",
    "dro": "not been checked",
    "custom": "forward_backward_custom",
}


@pytest.mark.needs("tinker")
def test_every_tinker_loss_gets_its_inputs_or_a_refusal_naming_why(batch):  # noqa: F811
    """Tinker's SDK gained ``gspo``, ``stable_reinforce`` and ``dro``; the export gave every
    loss the same three inputs. GSPO's sequence ratio is the mean log-ratio over the tokens
    ``sequence_ratio_mask`` marks: a FOCUS sequence's prompt and observation tokens carry
    log-prob 0 (they were not sampled), so without the mask they would enter the ratio as
    if sampled with probability 1. StableReinforce needs each token's sampling
    ``sequence_id`` (recorded by a sampling client with ``record_stability_info``), which a
    batch does not hold."""
    import typing

    import tinker

    from focus.exporters import NothingToTrain, to_tinker_datums

    losses = set(typing.get_args(tinker.types.LossFnType))
    assert losses == set(TINKER_LOSS_INPUTS) | set(TINKER_REFUSED)  # a new loss must be looked at
    seqs = actor_sequences(batch)
    for loss_fn, keys in TINKER_LOSS_INPUTS.items():
        datums = to_tinker_datums(batch, loss_fn=loss_fn)
        tinker.types.ForwardBackwardInput(data=datums, loss_fn=loss_fn)  # type: ignore[arg-type]
        for seq, d in zip(seqs, datums, strict=True):
            assert set(d.loss_fn_inputs) == keys, loss_fn
            n = d.model_input.length
            assert all(v.shape == [n] for v in d.loss_fn_inputs.values())
            if loss_fn == "gspo":
                ratio = d.loss_fn_inputs["sequence_ratio_mask"].to_numpy()
                assert ratio.dtype == np.float32 and ratio.tolist() == [float(m) for m in seq.mask[1:]]
                assert not d.loss_fn_inputs["logprobs"].to_numpy()[ratio == 0].any()  # unsampled: out of the ratio
    for loss_fn, why in TINKER_REFUSED.items():
        with pytest.raises(ValueError, match=why) as e:
            to_tinker_datums(batch, loss_fn=loss_fn)
        assert not isinstance(e.value, NothingToTrain) and loss_fn in str(e.value)
    with pytest.raises(ValueError, match="unknown Tinker loss 'grpo'"):
        to_tinker_datums(batch, loss_fn="grpo")
