"""examples/train_tinker without a key: conversion of a real batch and the dry-run report."""

from __future__ import annotations

import pytest

from examples.train_tinker.run import describe, main
from focus.exporters import actor_sequences
from storage import BatchStore


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
    assert '"sent": false' in capsys.readouterr().out
    # the same batch, addressed by URL, and the PPO loss
    again = main(["--store", str(tmp_path), "--batch-url", result["batch"], "--loss-fn", "ppo", "--dry-run"])
    assert again["datums"] == result["datums"] and again["loss_fn"] == "ppo" and "--dry-run" in again["reason"]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match="nothing to send"):
        describe([], "ppo")
    with pytest.raises(SystemExit):
        main([])
