"""benchmarks/gradient_quality.py: a smoke run of its main path on the loopback model server."""

from __future__ import annotations

import json
import math

import pytest

pytestmark = pytest.mark.timeout(300)


@pytest.mark.integration
def test_smoke_run_gives_cosines_updates_and_a_reference_that_agrees_with_itself(tmp_path):
    from benchmarks import gradient_quality

    out = tmp_path / "gq.json"
    args = ["--tasks", "corridor-early", "--seeds", "0", "--n-tasks", "2", "--reference", "16"]
    result = gradient_quality.main([*args, "--batches", "1", "--update", "--out", str(out), "--quiet"])
    rows = result["rows"]
    # both methods at both budgets (2 tasks and 1), one batch each
    assert sorted((r["method"], r["budget"]) for r in rows) == [("focus", 1), ("focus", 2), ("grpo", 1), ("grpo", 2)]
    for r in rows:
        assert math.isfinite(r["cosine"]) and -1.0 <= r["cosine"] <= 1.0
        assert r["transitions"] > 0 and r["tokens"] > 0 and r["reference_tokens"] > r["tokens"]
        assert -1.0 <= r["reference_self_cosine"] <= 1.0
        if r["budget"] == 2:
            # two independent halves of 8 rollouts on each of 2 tasks estimate one gradient:
            # they agree (0.48 at the seeds the test uses; on one task alone, 0.12, too near 0 to test)
            assert r["reference_self_cosine"] > 0.0
        # the trainer's update on the batch: a step of bounded size whose gain is a finite number
        assert -1.0 <= r["update_cosine"] <= 1.0 and math.isfinite(r["update_gain"]) and r["update_kl"] >= 0.0
    # GRPO's batch at the full budget is 2 * EVIDENCE rollouts per task; FOCUS spends the same
    by = {(r["method"], r["budget"]): r["transitions"] for r in rows}
    assert 0.5 < by[("focus", 2)] / by[("grpo", 2)] < 2.0
    saved = json.loads(out.read_text(encoding="utf-8"))
    assert saved["table"] == json.loads(json.dumps(result["table"]))
    assert len(saved["table"]) == 4  # 2 budgets x 2 methods
    assert out.with_suffix(".jsonl").read_text(encoding="utf-8").count("\n") == 4


@pytest.mark.needs("torch")
def test_cosine_and_interval_arithmetic():
    import torch

    from benchmarks.gradient_quality import _interval, cosine

    a = torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)
    assert cosine(a, torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64)) == pytest.approx(2**-0.5, abs=1e-12)
    assert cosine(a, -a) == pytest.approx(-1.0, abs=1e-12) and cosine(a, 0 * a) == 0.0
    mean, lo, hi = _interval([0.2, 0.4, 0.6])
    assert mean == pytest.approx(0.4) and 0.2 <= lo < 0.4 < hi <= 0.6
    assert _interval([0.5, 0.5]) == (0.5, 0.5, 0.5)


def test_trainer_table_pairs_gains_by_seed_within_a_trainer():
    from benchmarks.gradient_quality import render_trainers, trainer_table

    def row(seed, method, gain, kl_ref, trainer=None):
        r = {"task": "t", "budget": 8, "seed": seed, "method": method, "update_cosine": 0.1, "update_kl": 0.05}
        r.update(update_gain=gain, update_kl_reference=kl_ref)
        return r if trainer is None else {**r, "trainer": trainer}

    rows = [
        row(s, m, g, 0.04) for s, m, g in [(0, "focus", 0.3), (0, "grpo", 0.2), (1, "focus", 0.1), (1, "grpo", 0.2)]
    ]
    rows += [row(s, m, 0.5, 0.25, "sgd") for s in (0, 1) for m in ("focus", "grpo")]
    lines = {(t["trainer"], t["method"]): t for t in trainer_table(rows)}
    assert set(lines) == {("adam", "focus"), ("adam", "grpo"), ("sgd", "focus"), ("sgd", "grpo")}
    adam = lines[("adam", "focus")]
    assert adam["update_gain"][0] == pytest.approx(0.2) and adam["update_gain_median"] == pytest.approx(0.2)
    assert adam["gain_minus_grpo"][0] == pytest.approx(0.0)  # +0.1 and -0.1, paired by seed
    assert adam["gain_per_sqrt_kl"] == pytest.approx(0.2 / 0.2)  # median of 0.3/0.2 and 0.1/0.2
    assert lines[("sgd", "focus")]["gain_per_sqrt_kl"] == pytest.approx(1.0)  # 0.5 / sqrt(0.25)
    assert "gain_minus_grpo" not in lines[("sgd", "grpo")]
    assert render_trainers(list(lines.values())).count("\n") == 5  # header, rule, 4 lines
