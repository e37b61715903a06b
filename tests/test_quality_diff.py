"""benchmarks.quality_diff: two estimator_quality runs side by side, on the cells both have."""

from __future__ import annotations

import json

import pytest

from benchmarks.quality_diff import compare, main, read_rows


def _row(family, budget, critic, method, adv, neutral=None, target=0.01):
    return {
        "family": family, "budget": budget, "critic": critic, "method": method, "adv_mse": adv,
        "neutral_mse": adv if neutral is None else neutral, "target_mse": target,
    }  # fmt: skip


def _run(selective: dict, grpo: bool = False) -> list[dict]:
    rows = []
    for (family, budget, critic), sel in selective.items():
        rows.append(_row(family, budget, critic, "uniform", 0.1))
        rows.append(_row(family, budget, critic, "selective", sel))
        if grpo:
            rows.append(_row(family, budget, critic, "grpo", 0.5))
    return rows


BEFORE = {("a", 2, "noise_1"): 0.2, ("a", 2, "constant"): 0.1, ("b", 6, "noise_1"): 0.08, ("b", 6, "noise_3"): 0.05}
AFTER = {("a", 2, "noise_1"): 0.1, ("a", 2, "constant"): 0.12, ("b", 6, "noise_1"): 0.08, ("b", 6, "noise_3"): 0.055}


def test_summaries_before_and_after_on_the_shared_cells():
    # the record has a GRPO arm and one more cell; the run after has neither
    before = _run({**BEFORE, ("c", 2, "noise_1"): 0.3}, grpo=True)
    result = compare(before, _run(AFTER))
    noisy_before, noisy_after = result["summary"]["selective_vs_uniform_noisy"]
    assert noisy_before == pytest.approx(0.8)  # median of 2.0, 0.8, 0.5 (c/2H not shared)
    assert noisy_after == pytest.approx(0.8)  # median of 1.0, 0.8, 0.55
    assert result["summary"]["selective_vs_uniform_constant"] == pytest.approx((1.0, 1.2))
    assert "selective_vs_grpo_noisy" not in result["summary"]  # the run after has no GRPO
    assert result["above_1_1"]["batch"] == (1, 1, 4)  # a/2H/noise_1 before, a/2H/constant after


def test_cells_that_moved_most_come_first():
    moved = compare(_run(BEFORE), _run(AFTER), top=2)["moved"]
    # |log| of the change: 0.69, 0.18, 0.095 and 0 (b/6H/noise_1 did not move)
    assert [c["cell"] for c in moved] == ["a/2H/noise_1", "a/2H/constant"]
    assert moved[0]["batch"] == pytest.approx((2.0, 1.0))


def test_reads_records_and_json_outputs_and_names_a_file_without_rows(tmp_path, capsys):
    record, output, empty = tmp_path / "record.json", tmp_path / "after.json", tmp_path / "other.json"
    record.write_text(json.dumps({"benchmark": "x", "figures": {"rows": _run(BEFORE)}}))
    output.write_text(json.dumps({"rows": _run(AFTER), "summary": {}}))
    empty.write_text(json.dumps({"figures": {"result": 1}}))
    assert len(read_rows(record)) == 8 and len(read_rows(output)) == 8
    assert main([str(record), str(output)]) == 0
    out = capsys.readouterr().out
    assert "selective_vs_uniform_noisy" in out and "a/2H/noise_1" in out
    assert main([str(record), str(empty)]) == 2
    assert "other.json: no rows of benchmarks.estimator_quality" in capsys.readouterr().err
