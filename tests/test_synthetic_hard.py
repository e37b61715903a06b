"""The held-out-style families and critics of issue 31 (focus/synthetic_hard.py) and the
composition-neutral error of benchmarks/estimator_quality.py: each does what its
docstring says, checked against the MDP's exact values."""

from __future__ import annotations

import math
import statistics

import pytest

from benchmarks.estimator_quality import add_neutral, neutral_mse, run_one
from focus.agent import Agent
from focus.collector import Collector
from focus.env import Task
from focus.estimation import DirectBranchTd
from focus.priority import Phase, Uniform
from focus.synthetic import SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.synthetic_hard import (
    HARD_FAMILIES,
    TRUNCATED_AT,
    decisive,
    depth_critic,
    depths,
    event_depth,
    heavy_tail,
    truncated_walk,
)
from focus.testing import run


@pytest.mark.parametrize("seed", range(4))
def test_decisive_has_one_step_that_decides_the_return(seed: int) -> None:
    mdp = decisive(seed)
    v, dep = mdp.values(), depths(mdp)
    assert 2 <= mdp.decisive <= 29 and max(dep) == 32
    biggest: dict[int, float] = {}
    for s in range(len(mdp.outcomes)):
        for a in range(len(mdp.probs[s])):
            biggest[dep[s]] = max(biggest.get(dep[s], 0.0), abs(mdp.advantage(s, a, v)))
    # the decisive step's advantages are worth a large share of the unit payoff ...
    assert biggest[mdp.decisive] > 0.2
    # ... and every other step's are a few hundredths at most
    assert max(x for d, x in biggest.items() if d != mdp.decisive) < 0.05


def test_decisive_depth_varies_between_instances() -> None:
    assert len({decisive(s).decisive for s in range(12)}) >= 5


def test_heavy_tail_returns_have_rare_large_payoffs() -> None:
    mdp = heavy_tail(3)
    rewards = [(r, p) for row in mdp.outcomes for outs in row for _, r, p in outs]
    assert max(r for r, _ in rewards) == 10.0
    assert all(p < 0.01 for r, p in rewards if r == 10.0)
    # the actions move the chance of a payoff: advantages are not all zero
    v = mdp.values()
    assert max(abs(mdp.advantage(0, a, v)) for a in range(3)) > 1e-3


def test_truncated_walk_is_cut_by_the_agents_step_limit() -> None:
    mdps = [truncated_walk(i) for i in range(2)]
    assert max(depths(mdps[0])) == 24 and HARD_FAMILIES["truncated"].max_steps == TRUNCATED_AT
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=TRUNCATED_AT)
    col = Collector(
        agent,
        Uniform(phases=(Phase("evidence", rollouts_per_task=2),)),
        depth_critic("biased", mdps, 1.0, 0, TRUNCATED_AT),
        DirectBranchTd(),
        collection_id="t",
        seed=0,
    )
    batch = run(col.collect([Task(f"t{i}", {"mdp": i}) for i in range(2)]))
    # every rollout (2 per task) ends in a truncated leaf after 8 transitions
    assert sum(r.truncated for r in batch.actor) == 4
    assert batch.stats["transitions"] == 4 * TRUNCATED_AT


@pytest.mark.parametrize("seed", range(3))
def test_the_biased_critic_is_exact_until_the_hidden_event_then_wrong(seed: int) -> None:
    mdps = [decisive(10 * seed + i) for i in range(2)]
    critic = depth_critic("biased", mdps, 1.0, seed)
    for i, mdp in enumerate(mdps):
        exact, dep = mdp.values(), depths(mdp)
        cut = event_depth(mdp, 1000 * seed + i)
        assert cut == mdp.decisive + 1
        before = [abs(critic.value(i, s) - exact[s]) for s in range(len(exact)) if dep[s] <= cut]
        after = [abs(critic.value(i, s) - exact[s]) for s in range(len(exact)) if cut < dep[s] < 32]
        assert max(before) == 0.0
        # after the decision the critic ignores it: off by a large part of the payoff
        assert statistics.fmean(after) > 0.2


def test_the_biased_critic_s_event_lies_within_the_agents_reach() -> None:
    mdps = [truncated_walk(i) for i in range(8)]
    cuts = [event_depth(m, i, TRUNCATED_AT) for i, m in enumerate(mdps)]
    assert all(1 <= c <= TRUNCATED_AT for c in cuts)
    assert any(c > TRUNCATED_AT for c in (event_depth(m, i) for i, m in enumerate(mdps)))


def test_the_early_late_critic_s_error_grows_with_depth() -> None:
    mdps = [heavy_tail(i) for i in range(6)]
    critic = depth_critic("early_late", mdps, 1.0, 0)
    early, late = [], []
    for i, mdp in enumerate(mdps):
        exact, dep = mdp.values(), depths(mdp)
        for s in range(len(exact)):
            err = (critic.value(i, s) - exact[s]) ** 2
            (early if dep[s] <= 2 else late if dep[s] >= 8 else []).append(err)
    assert critic.value(0, 0) == pytest.approx(mdps[0].values()[0], abs=1e-12)
    assert statistics.fmean(late) > 10 * statistics.fmean(early)


def test_unknown_depth_critic_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown depth critic"):
        depth_critic("wrong", [heavy_tail(0)], 1.0, 0)


def test_neutral_mse_weights_pairs_by_their_on_policy_probability_not_their_tokens() -> None:
    # pair A: error 1 per token on 100 tokens, probability 0.5; pair B: error 3 on 1 token, probability 0.5
    pairs = {(0, 1, 0): (100.0, 100.0, 0.5), (0, 2, 1): (3.0, 1.0, 0.5), (0, 3, 0): (50.0, 1.0, 0.1)}
    assert neutral_mse(pairs, {(0, 1, 0), (0, 2, 1)}) == pytest.approx(2.0)
    # a pair outside the shared set does not count, however large its error
    assert neutral_mse(pairs, {(0, 1, 0)}) == pytest.approx(1.0)
    assert math.isnan(neutral_mse(pairs, set()))


def test_add_neutral_reads_every_method_on_the_pairs_all_compared_methods_have() -> None:
    base = {"family": "f", "budget": 2, "critic": "exact", "seed": 0}
    raw = [
        base | {"method": "grpo", "_pairs": {(0, 1, 0): (4.0, 1.0, 1.0), (0, 2, 0): (9.0, 1.0, 1.0)}},
        base | {"method": "uniform", "_pairs": {(0, 1, 0): (1.0, 1.0, 1.0), (0, 3, 0): (100.0, 1.0, 1.0)}},
        base | {"method": "selective", "_pairs": {(0, 1, 0): (2.0, 2.0, 1.0), (0, 2, 0): (0.0, 1.0, 1.0)}},
    ]
    add_neutral(raw)
    assert [r["neutral_mse"] for r in raw] == [4.0, 1.0, 1.0]
    assert all("_pairs" not in r for r in raw)


def test_the_benchmark_reports_the_decisive_step_s_share_of_the_batch() -> None:
    row = run_one(("decisive", 2, 2, "biased", "uniform", 0))
    assert 0.0 < row["decisive_share"] < 0.5
    assert row["adv_mse"] >= 0.0 and "_pairs" in row
    other = run_one(("heavy_tail", 2, 2, "early_late", "uniform", 0))
    assert other["decisive_share"] is None
