"""benchmarks/orchestration.py at smoke size: both paths, both policies, same batches."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.timeout(240)


def test_orchestration_benchmark_runs_small_and_reports_every_figure(prefect_api, tmp_path):
    from benchmarks import orchestration

    out = tmp_path / "orch.json"
    figures = orchestration.main(
        ["--small", "--service-latency-s", "0.01", "--latency-ms", "0", "--repeats", "1", "--json", str(out)]
    )
    assert json.loads(out.read_text(encoding="utf-8")) == figures
    for suffix in ("", "_inprocess"):
        for size in ("2k", "10k"):
            key = f"{size}{suffix}"
            # the benchmark itself asserts the flow's batch equals the direct one, row for row
            assert figures[f"transitions_{key}"] > 0 and figures[f"flow_steps_{key}"] >= 5
            assert figures[f"flow_s_{key}"] > 0 and figures[f"direct_collect_s_{key}"] > 0
            ratio = figures[f"flow_s_{key}"] / figures[f"direct_s_{key}"]
            assert figures[f"overhead_ratio_{key}"] == pytest.approx(ratio, rel=0.01)
            assert len(figures[f"overhead_ratios_all_repeats_{key}"]) == 1
    assert figures["transitions_10k"] > figures["transitions_2k"]
    assert "overhead_ratio_10k" in figures
