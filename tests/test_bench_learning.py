"""benchmarks/learning.py: the smoke run writes every figure; the curve reading is right."""

from __future__ import annotations

import json

import pytest

from benchmarks.learning import METHODS, goal, reach

pytestmark = pytest.mark.timeout(240)


def test_reach_interpolates_along_the_curve():
    curve = [(0.0, 0.1), (100.0, 0.2), (200.0, 0.4)]
    assert reach(curve, 0.1) == 0.0
    assert reach(curve, 0.3) == pytest.approx(150.0)
    assert reach(curve, 0.4) == 200.0
    assert reach(curve, 0.5) is None


def _run(method, seed, curve):
    return {
        "task": "t",
        "method": method,
        "seed": seed,
        "points": [{"transitions": x, "wall_s": x / 10, "success": y} for x, y in curve],
    }


def test_goal_reads_medians_over_seeds():
    runs = []
    for seed, bump in enumerate((0.0, 0.01, -0.01)):
        runs.append(_run("grpo", seed, [(0, 0.1), (100, 0.2 + bump), (200, 0.3 + bump)]))
        runs.append(_run("focus", seed, [(0, 0.1), (100, 0.3 + bump), (200, 0.5 + bump)]))
        runs.append(_run("uniform", seed, [(0, 0.1), (100, 0.1), (200, 0.2 + bump)]))
    g = goal(runs, "t")
    assert g["grpo_final_success"] == pytest.approx(0.3) and g["grpo_transitions"] == 200
    assert g["focus_ratio"] == pytest.approx(0.5) and g["goal_met"]
    assert g["uniform_ratio"] is None
    flat = [r if r["method"] != "grpo" else _run("grpo", r["seed"], [(0, 0.1), (200, 0.1)]) for r in runs]
    assert not goal(flat, "t")["goal_met"]  # GRPO did not improve: nothing to reach


@pytest.mark.integration
def test_quick_run_writes_json_and_png(tmp_path):
    from benchmarks import learning

    result = learning.main(["--quick", "--tasks", "toy", "--out", str(tmp_path), "--quiet"])
    saved = json.loads((tmp_path / "learning.json").read_text())
    assert saved["goals"] == json.loads(json.dumps(result["goals"]))
    assert (tmp_path / "learning.png").stat().st_size > 10_000
    assert sorted(r["method"] for r in saved["runs"]) == sorted(METHODS)
    for run in saved["runs"]:
        first, last = run["points"][0], run["points"][-1]
        assert first["transitions"] == 0 and last["transitions"] == last["batch_transitions"] > 0
        assert 0.0 <= last["success"] <= 1.0 and last["wall_s"] > 0
    by = {r["method"]: r["points"][-1] for r in saved["runs"]}
    # the same transitions per iteration: FOCUS and uniform spend what GRPO's extra rollouts would
    assert 0.5 < by["focus"]["batch_transitions"] / by["grpo"]["batch_transitions"] < 2.0
    # GRPO's advantages are group-normalised returns: zero for a group whose returns are equal
    assert by["grpo"]["nonzero_advantage_rows"] <= by["grpo"]["actor_rows"]
