"""t(d) takes the only children's excess only where it is significant (issue 31;
``noise_model(excess=True)``, :mod:`focus.noise_excess`).

An only child's squared critic miss beyond the model's variance is the critic's error
there plus the model's misfit; a branched checkpoint's is the same. A misfit (or a
critic error) present in both groups cancels and t(d) takes none of it; a critic wrong
where search did not branch shows in the only children alone, and t(d) takes it."""

from __future__ import annotations

import random
import statistics

import numpy as np

from focus.noise import noise_model
from focus.noise_excess import significant_excess, t_quantile
from tests.test_noise_joint import _BRANCH, _LATE, STEPS, _trees


def _exp(rng: np.random.Generator, mean: float, n: int) -> np.ndarray:
    """Squared misses less a model variance: chi-square-like excesses of this mean."""
    return mean * rng.chisquare(1, n) - 0.002


def test_the_same_excess_in_both_groups_is_not_taken() -> None:
    """Both groups draw their excess from one distribution (a misfit of the model, 0.01
    beyond it): over 400 depths t(d) takes something at about the test's level (5%), and
    on average a small part of the excess (a share of the positive differences)."""
    rng = np.random.default_rng(0)
    nd = 400
    one_depth, res_depth = np.repeat(np.arange(nd), 30), np.repeat(np.arange(nd), 12)
    got = significant_excess(nd, one_depth, _exp(rng, 0.01, 30 * nd), res_depth, _exp(rng, 0.01, 12 * nd))
    assert np.count_nonzero(got) / nd < 0.09, np.count_nonzero(got)
    assert float(np.mean(got)) < 0.001, float(np.mean(got))


def test_a_far_larger_excess_of_the_only_children_is_taken() -> None:
    """The only children show 0.01 more than the branched checkpoints: the difference is
    taken at nearly every depth, and about its size."""
    rng = np.random.default_rng(1)
    nd = 50
    one_depth, res_depth = np.repeat(np.arange(nd), 40), np.repeat(np.arange(nd), 12)
    got = significant_excess(nd, one_depth, _exp(rng, 0.011, 40 * nd), res_depth, _exp(rng, 0.001, 12 * nd))
    assert np.count_nonzero(got) / nd > 0.9, got
    assert 0.007 < float(np.mean(got[got > 0])) < 0.013, got


def test_too_few_rows_or_a_smaller_excess_take_nothing() -> None:
    one = np.array([0.0, 0.0, 0.0, 1.0, 2.0, 3.0])
    res = np.array([0.0, 0.0, 0.0, 0.0, 2.0, 2.0, 5.0, 5.0, 5.0])
    d_one, d_res = np.array([0, 0, 0, 1, 1, 1]), np.array([0, 0, 1, 1, 1, 1, 2, 2, 2])
    got = significant_excess(3, d_one, one, d_res, res)
    # depth 0: two branched rows (too few); depth 1: 2.0 against 1.0, t = 1.22 (not
    # taken); depth 2: no only children
    assert got.tolist() == [0.0, 0.0, 0.0]
    # 2.0 against 0.0 with the same spread as the branched rows have none: t = 3.5 on 2
    # degrees of freedom (quantile 2.9), taken
    assert significant_excess(1, np.zeros(3, int), one[3:], np.zeros(3, int), res[:3]).tolist() == [2.0]


def test_the_t_quantile_is_students() -> None:
    # one-sided 95% quantiles of Student's t (tables)
    for df, q in ((2, 2.920), (5, 2.015), (10, 1.812), (30, 1.697), (1e9, 1.645)):
        assert abs(t_quantile(df) - q) < 0.04 * q, (df, t_quantile(df))


def test_trees_where_search_branched_only_where_the_critic_was_right() -> None:
    """The trees of ``test_noise_joint``: critic error variance 0.01 at depths 4-7,
    second children there only where its miss was small. The branched residuals put
    t(4-7) near 0.001; with the only children's significant excess about 0.01. Fails
    without ``excess`` (main's t(d))."""
    for seed in range(3):
        trees = _trees(random.Random(seed), 200, 0.05, _LATE, _BRANCH, selective=True)
        before = noise_model(trees)
        after = noise_model(trees, excess=True)
        assert statistics.fmean(before.critic_vars[4:]) < 0.003, (seed, before.critic_vars)
        assert 0.007 < statistics.fmean(after.critic_vars[4:]) < 0.014, (seed, after.critic_vars)
        assert after.step_vars == before.step_vars or 0.0015 < statistics.fmean(after.step_vars) < 0.0035


def test_trees_whose_critic_is_as_wrong_where_search_branched() -> None:
    """The same critic with a second child at every checkpoint of the first rollout
    (nothing selected): the only children's excess is the branched checkpoints', and
    t(d) at the wrong depths is the branched residuals' own (to 0.1%: an excess taken at
    an earlier depth moves s, and the residuals' weights with it)."""
    for seed in range(2):
        trees = _trees(random.Random(100 + seed), 150, 0.05, _LATE, [1.0] * STEPS)
        before, after = noise_model(trees).critic_vars[4:], noise_model(trees, excess=True).critic_vars[4:]
        assert all(abs(a - b) <= 1e-3 * b for a, b in zip(after, before, strict=True)), (seed, before, after)
