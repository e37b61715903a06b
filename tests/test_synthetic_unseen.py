"""The families and critics made after issue 31 (focus/synthetic_unseen.py): each has the
structure its docstring names, checked against the MDP's exact values, and runs through
benchmarks/estimator_quality.py like every other family."""

from __future__ import annotations

import statistics
import subprocess
import sys

import pytest

from benchmarks.estimator_quality import ALL_FAMILIES, CRITICS, run_one
from focus.synthetic import TreeMDP
from focus.synthetic_hard import depths
from focus.synthetic_unseen import (
    UNSEEN_CRITICS,
    UNSEEN_FAMILIES,
    WRONG_STATE_OFFSET,
    early_gate,
    gauss_noise,
    multi_key,
    risky_bridge,
    unseen_critic,
    wide,
)


def advantages_by_depth(mdp: TreeMDP, gamma: float = 1.0) -> dict[int, float]:
    """The largest |A(s, a)| at each depth."""
    v, dep = mdp.values(gamma), depths(mdp)
    out: dict[int, float] = {}
    for s in range(len(mdp.outcomes)):
        for a in range(len(mdp.probs[s])):
            out[dep[s]] = max(out.get(dep[s], 0.0), abs(mdp.advantage(s, a, v, gamma)))
    return out


def step_noise(mdp: TreeMDP, gamma: float = 1.0) -> dict[int, float]:
    """On-policy variance of ``r + γV(s')`` around ``Q(s, a)`` at each depth (the env's part)."""
    v, d, dep = mdp.values(gamma), mdp.visits(), depths(mdp)
    num: dict[int, float] = {}
    den: dict[int, float] = {}
    for s, ds in enumerate(d):
        if not ds or mdp.terminal(s):
            continue
        for a, pa in enumerate(mdp.probs[s]):
            q = mdp.q(s, a, v, gamma)
            var = sum(p * (r + gamma * v[n] - q) ** 2 for n, r, p in mdp.outcomes[s][a])
            num[dep[s]] = num.get(dep[s], 0.0) + ds * pa * var
        den[dep[s]] = den.get(dep[s], 0.0) + ds
    return {k: num.get(k, 0.0) / den[k] for k in den}


def test_every_family_and_critic_is_one_of_the_benchmark_s() -> None:
    assert set(UNSEEN_FAMILIES) <= set(ALL_FAMILIES) and set(UNSEEN_CRITICS) <= set(CRITICS)


def test_instances_are_the_same_in_another_process() -> None:
    # the instances are seeded from hashes of integers only: a string's hash would
    # change with the process and so would the MDP
    code = (
        "from focus.synthetic_unseen import UNSEEN_FAMILIES as F;"
        "print([round(f.make(7).values(f.gamma)[0], 12) for f in F.values()])"
    )
    here = [round(f.make(7).values(f.gamma)[0], 12) for f in UNSEEN_FAMILIES.values()]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == str(here)


@pytest.mark.parametrize("seed", range(3))
def test_early_gate_decides_at_the_first_step(seed: int) -> None:
    mdp = early_gate(seed)
    big = advantages_by_depth(mdp)
    assert big[0] > 0.1 and max(x for d, x in big.items() if d > 0) <= 0.011
    # the later steps' coin flips of ±0.1 (variance 0.01; the position the coin moves
    # changes the next state's value by under a hundredth)
    assert all(0.0095 < x < 0.0105 for d, x in step_noise(mdp).items() if d > 0)


def test_risky_bridge_ends_some_episodes_at_every_length() -> None:
    mdp = risky_bridge(1)
    dep = depths(mdp)
    ended = {dep[s] for s in range(len(mdp.outcomes)) if mdp.terminal(s)}
    assert ended == set(range(1, 13))
    assert 1.0 < mdp.expected_length() < 12.0


def test_multi_key_pays_only_when_every_key_was_turned() -> None:
    mdp = multi_key(2)
    payoffs = [r for row in mdp.outcomes for outs in row for _, r, _ in outs]
    assert max(payoffs) >= 1.0 and all(r < 0.1 for r in payoffs if r < 1.0)
    # a sparse success: the chance of turning all three keys
    assert 0.0 < mdp.values()[0] < 0.5
    big = advantages_by_depth(mdp)
    assert sum(x > 0.05 for x in big.values()) == 3


def test_wide_has_most_of_a_step_s_noise_at_the_last_step() -> None:
    mdp = wide(4)
    assert all(len(row) == 6 for s, row in enumerate(mdp.probs) if not mdp.terminal(s))
    noise = step_noise(mdp)
    assert noise[4] > 0.1 and max(noise[d] for d in range(4)) == 0.0
    # the policy favours a few of the six actions
    assert statistics.fmean(max(row) for row in mdp.probs if row) > 0.4


def test_gauss_noise_rewards_have_a_deviation_of_about_0_3() -> None:
    mdp = gauss_noise(5)
    noise = step_noise(mdp, 0.95)
    assert all(0.08 < x < 0.12 for x in noise.values())
    assert max(advantages_by_depth(mdp, 0.95).values()) < 0.15


def test_the_stale_critic_gives_the_uniform_policy_s_values() -> None:
    mdps = [early_gate(i) for i in range(2)]
    critic = unseen_critic("stale", mdps, 1.0, 0)
    for i, mdp in enumerate(mdps):
        uniform = TreeMDP(mdp.outcomes, tuple(tuple(1 / len(r) for _ in r) for r in mdp.probs), mdp.tokens)
        assert critic.values[i] == pytest.approx(uniform.values())
        # wrong wherever the policy is not uniform: at the root's gate
        assert abs(critic.value(i, 0) - mdp.values()[0]) > 0.01


def test_the_shrunk_critic_is_halfway_to_the_depth_s_mean() -> None:
    mdp = multi_key(3)
    critic = unseen_critic("shrunk", [mdp], 1.0, 0)
    exact, dep, visits = mdp.values(), depths(mdp), mdp.visits()
    at = [s for s in range(len(exact)) if dep[s] == 10 and visits[s] > 0]
    mean = sum(visits[s] * exact[s] for s in at) / sum(visits[s] for s in at)
    for s in at:
        assert critic.value(0, s) == pytest.approx((exact[s] + mean) / 2, abs=1e-12)


def test_the_biased_early_critic_is_wrong_early_and_exact_late() -> None:
    mdps = [early_gate(i) for i in range(4)]
    critic = unseen_critic("biased_early", mdps, 1.0, 3)
    for i, mdp in enumerate(mdps):
        exact, dep = mdp.values(), depths(mdp)
        errs = {d: 0.0 for d in range(17)}
        for s in range(len(exact)):
            errs[dep[s]] = max(errs[dep[s]], abs(critic.value(i, s) - exact[s]))
        assert errs[1] > 0.1  # the gate's two sides get one value
        assert errs[15] == 0.0 and errs[16] == 0.0


def test_the_wrong_state_critic_is_exact_but_at_the_most_visited_state() -> None:
    mdps = [risky_bridge(i) for i in range(3)]
    critic = unseen_critic("wrong_state", mdps, 1.0, 0, reach=5)
    for i, mdp in enumerate(mdps):
        exact, dep, visits = mdp.values(), depths(mdp), mdp.visits()
        wrong = [s for s in range(len(exact)) if critic.value(i, s) != exact[s]]
        assert len(wrong) == 1
        (s,) = wrong
        assert 1 <= dep[s] < 5
        assert visits[s] == max(visits[x] for x in range(len(exact)) if 1 <= dep[x] < 5)
        assert critic.value(i, s) - exact[s] == pytest.approx(WRONG_STATE_OFFSET * mdp.advantage_scale(1.0))


def test_unknown_critic_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown critic"):
        unseen_critic("wrong", [wide(0)], 1.0, 0)


def test_a_collection_runs_on_every_family_with_each_new_critic() -> None:
    for family, critic in (
        ("wide", "stale"),
        ("risky_bridge", "shrunk"),
        ("gauss_noise", "biased_early"),
        ("early_gate", "wrong_state"),
    ):
        row = run_one((family, 2, 2, critic, "selective", 0))
        assert row["transitions"] > 0 and 0 <= row["adv_mse"] < 10
