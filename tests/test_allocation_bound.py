"""The benchmark-only allocation rules of benchmarks/allocation_bound.py place
continuations where they say: a depth profile at its depth, the rules that read the MDP
on the states they rank (the state of a checkpoint taken from the search's trees, not a
stale or another tree's), and the composition-neutral rows read on the pairs uniform and
selective share."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from benchmarks.allocation_bound import BOUND_METHODS, Reach, World, attach, bound_search, neutral_rows
from benchmarks.estimator_quality import parse_args, search_state
from focus.priority import Phase
from focus.synthetic import read_state


def starts(job: tuple[str, int, int, str, str, int]) -> tuple[list[tuple[int, int, int]], World]:
    """(tree, depth, MDP state) of every continuation-phase rollout's start, and the MDPs."""
    _, state, _, mdps, _, fam, _, _ = search_state(job)
    out = []
    for ti, tree in enumerate(state.trees):
        for rec in tree.log:
            if rec.phase == 1:
                node = tree.nodes[rec.node]
                out.append((ti, node.depth, read_state(node.context_ids)[1]))
    return out, World(mdps, fam.gamma)


def test_a_depth_profile_continues_only_checkpoints_at_its_depth_while_they_have_room() -> None:
    # 2H: one evidence rollout per task and about one more rollout's transitions, fewer
    # than the depth-2 checkpoints' free branches (3 per task) can take
    got, _ = starts(("heavy_tail", 3, 2, "noise_1", "depth_d2", 0))
    assert got, "the continuation phase started nothing"
    assert {d for _, d, _ in got} == {2}
    other, _ = starts(("heavy_tail", 3, 2, "noise_1", "depth_d0", 0))
    assert {d for _, d, _ in other} == {0}


def test_the_decisive_depth_rule_continues_each_task_at_its_own_decisive_step() -> None:
    job = ("decisive", 4, 2, "noise_1", "decisive_depth", 0)
    got, world = starts(job)
    at = [m.decisive for m in world.mdps]
    assert len(set(at)) > 1  # the tasks decide at different depths
    assert got and all(d == at[t] for t, d, _ in got)


@pytest.mark.parametrize("family", ["heavy_tail", "truncated"])
def test_the_reach_rule_continues_states_the_policy_reaches_often(family: str) -> None:
    # the exact MDP's mean reach of the starts: 0.72-0.84 for the rule, 0.19-0.26 for
    # uniform and 0.18-0.30 for a depth-4 profile (seeds 1, 2); a rule reading another
    # checkpoint's state, or another tree's, would land near uniform
    reach, world = starts((family, 4, 6, "noise_1", "reach", 1))
    uniform, _ = starts((family, 4, 6, "noise_1", "uniform", 1))
    mean = [sum(world.reach[t][s] for t, _, s in got) / len(got) for got in (reach, uniform)]
    assert mean[0] > 2 * mean[1]


def test_the_rules_read_each_checkpoint_s_own_state_from_the_trees_shown() -> None:
    _, state, search, mdps, _, _, _, _ = search_state(("truncated", 3, 6, "noise_1", "reach", 0))
    world = search.world
    assert world.trees is not None and len(world.trees) == 3
    seen = 0
    for ti, tree in enumerate(state.trees):
        for nid in tree.states:
            ev = SimpleNamespace(tree_index=ti, node_id=nid)
            assert world.state(ev) == read_state(tree.nodes[nid].context_ids)  # type: ignore[arg-type]
            seen += 1
    assert seen > 3 * 8


def test_the_rules_that_read_the_mdp_refuse_to_rank_without_it() -> None:
    rule = Reach(phases=(Phase("evidence", rollouts_per_task=1), Phase("continue", transitions=10)))
    with pytest.raises(RuntimeError, match="needs the MDPs"):
        _ = rule.world
    with pytest.raises(ValueError, match="unknown allocation rule"):
        bound_search("depth", rule.phases)


def test_every_rule_is_a_method_of_the_estimator_benchmark() -> None:
    args = parse_args(["--methods", ",".join(("uniform", *BOUND_METHODS)), "--quick"])
    assert args.methods[1:] == list(BOUND_METHODS)
    rule = bound_search("sqrt_reach", (Phase("evidence", rollouts_per_task=1),))
    world = World([], 1.0)
    attach(rule, world)
    assert rule.model_copy().world is world  # the collector's copies share the trees shown


def test_neutral_rows_read_every_rule_on_the_pairs_uniform_and_selective_share() -> None:
    key = {"family": "f", "budget": 2, "critic": "c", "seed": 0}
    raw = [
        key | {"method": "uniform", "_pairs": {(0, 1, 0): (1.0, 1.0, 0.5), (0, 2, 0): (4.0, 1.0, 0.5)}},
        key | {"method": "selective", "_pairs": {(0, 1, 0): (0.0, 1.0, 0.5), (0, 2, 0): (0.0, 1.0, 0.5)}},
        # the rule has pair (0, 1, 0) only, and one neither compared method has
        key | {"method": "depth_d0", "_pairs": {(0, 1, 0): (2.0, 2.0, 0.5), (0, 9, 0): (9.0, 1.0, 0.9)}},
    ]
    neutral_rows(raw)
    uni, _, rule = raw
    assert uni["neutral_mse"] == pytest.approx(2.5)  # (0.5·1 + 0.5·4) / 1
    assert rule["neutral_mse"] == pytest.approx(1.0)  # its own pair only: 2/2
    assert rule["cover"] == pytest.approx(0.5)
    assert uni["neutral_all"] == pytest.approx(1.0)  # the pair every row has
    assert "_pairs" not in rule
