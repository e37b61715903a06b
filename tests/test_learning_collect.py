"""benchmarks/learning_collect.py: FOCUS's evidence and continuation split, and the flat-tree counts."""

from __future__ import annotations

import json

import pytest

from benchmarks.learning_collect import EVIDENCE, continuation_budget, flat
from focus.tree import Tree, Turn

pytestmark = pytest.mark.timeout(300)


def _turn(reward: float) -> Turn:
    return Turn((1,), (5, 5), (-0.5, -0.5), 1, "stop", reward=reward, transition=True)


def _tree(*returns: float, failed: int = 0) -> Tree:
    """A root with one checkpoint below it and one terminal leaf per return (plus failed leaves)."""
    t = Tree.new("t", None, (1,))
    a = t.add_node(0, (_turn(0.0),), "checkpoint", steps=1, context_ids=(1, 2))
    for r in returns:
        t.add_node(a.id, (_turn(r),), "terminal", steps=2)
    for _ in range(failed):
        t.add_node(a.id, (), "failed", steps=1, cause="model: down")
    return t


def test_the_default_split_costs_what_grpos_group_costs():
    assert EVIDENCE == 4
    # 4 evidence rollouts took 100 transitions: 4 more rollouts' worth of continuations
    assert continuation_budget(100, EVIDENCE, None) == 100
    # 6 of the 8 rollouts' worth as evidence: 2 rollouts' worth left, a third of what 6 took
    assert continuation_budget(150, 6, None) == 50
    # GRPO's group as evidence leaves nothing; more than it, still nothing (not negative)
    assert continuation_budget(200, 8, None) == 0 and continuation_budget(250, 10, None) == 0
    # an explicit continuation: GRPO's group again on top of 8 evidence rollouts (twice its cost)
    assert continuation_budget(200, 8, 8) == 200 and continuation_budget(200, 8, 0) == 0


def test_a_tree_is_flat_when_every_valid_leaf_returned_alike():
    assert flat([_tree(0.0, 0.0, 0.0)]) == (1, 0)
    assert flat([_tree(1.0, 1.0, failed=2)]) == (1, 1)  # failed leaves carry no return
    assert flat([_tree(1.0, 0.0, 1.0)]) == (0, 0)
    assert flat([_tree(0.0, 0.0), _tree(1.0, 1.0), _tree(0.0, 1.0)]) == (2, 1)
    assert flat([_tree(failed=2)]) == (0, 0)  # no valid leaf: nothing to compare, not counted


def test_the_evidence_options_size_the_run_and_are_recorded():
    from benchmarks.learning import DEFAULT_SIZES, _parser, size_options, sizes_of

    args = _parser().parse_args(["--evidence", "6"])
    assert sizes_of(args).evidence == 6 and sizes_of(args).continuation is None
    assert size_options(args) == " --evidence 6"
    args = _parser().parse_args(["--evidence", "8", "--continuation-rollouts", "8"])
    assert (sizes_of(args).evidence, sizes_of(args).continuation) == (8, 8)
    assert size_options(args) == " --evidence 8 --continuation-rollouts 8"
    assert sizes_of(_parser().parse_args([])) == DEFAULT_SIZES
    assert (DEFAULT_SIZES.evidence, DEFAULT_SIZES.continuation) == (EVIDENCE, None)
    for bad in (["--evidence", "0"], ["--continuation-rollouts", "-1"]):
        with pytest.raises(ValueError, match="--evidence"):
            sizes_of(_parser().parse_args(bad))


@pytest.mark.integration
def test_a_run_with_evidence_only_counts_the_same_flat_trees_before_and_after(tmp_path):
    """With no continuation budget FOCUS's batch is its evidence: every tree flat in the
    evidence is flat in the batch, and the batch is 6 rollouts per task against GRPO's 8."""
    from benchmarks import learning

    learning.main(["--quick", "--tasks", "toy", "--evidence", "6", "--continuation-rollouts", "0",
                   "--out", str(tmp_path), "--quiet"])  # fmt: skip
    saved = json.loads((tmp_path / "learning.json").read_text(encoding="utf-8"))
    assert saved["sizes"]["evidence"] == 6 and saved["sizes"]["continuation"] == 0
    assert "--evidence 6 --continuation-rollouts 0" in saved["command"]
    by = {r["method"]: r["points"][1] for r in saved["runs"]}
    tasks = learning.QUICK_SIZES.tasks
    assert 0 <= by["focus"]["flat_trees"] == by["focus"]["flat_evidence_trees"] <= tasks
    assert 0 <= by["grpo"]["flat_trees_won"] <= by["grpo"]["flat_trees"] <= tasks
    assert "flat_evidence_trees" not in by["grpo"]
    assert by["focus"]["evidence_rollouts"] == 6 * tasks and by["grpo"]["evidence_rollouts"] == 8 * tasks
