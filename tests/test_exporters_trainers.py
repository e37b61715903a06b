"""The exports against what each trainer's own code reads from them: verl's metric helpers
(a mirror of their logic, tests/fixtures/verl_metrics.py), Tinker's loss functions (the
installed SDK's ``LossFnType``), and the Parquet readers of a batch of no rows."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fixtures.verl_metrics import DataProto, compute_data_metrics, compute_throughout_metrics, compute_timing_metrics
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
