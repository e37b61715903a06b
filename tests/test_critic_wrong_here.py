"""A critic wrong at one checkpoint (issue 31): the checkpoint's own miss against its
children tests the depth's error variance t(d), :func:`focus.weighting.checkpoint_critic_error`."""

from __future__ import annotations

import math

import pytest

from focus.estimation import NoiseModel, refine
from focus.weighting import WRONG_HERE_PRIOR, checkpoint_critic_error


def _posterior(z2: float) -> float:
    """The posterior of "wrong here" for a miss of z² variances, written from the
    likelihoods: N(miss; 0, miss²) against N(miss; 0, t + var), prior π."""
    pi = WRONG_HERE_PRIOR
    total = 1.0
    miss = math.sqrt(z2 * total)
    wrong = math.exp(-0.5) / math.sqrt(2 * math.pi * miss * miss)
    model = math.exp(-0.5 * z2) / math.sqrt(2 * math.pi * total)
    return pi * wrong / (pi * wrong + (1 - pi) * model)


def test_a_miss_within_one_standard_deviation_leaves_the_depths_t():
    # t + var = 0.01 + 0.04: a miss of 0.2 is 0.89 standard deviations
    assert checkpoint_critic_error(0.7, [0.4, 0.6], 0.5, 0.04, 0.01) == 0.01
    # an only child is not tested unless asked (search's reading, not the estimator's)
    assert checkpoint_critic_error(9.0, [0.5], 0.5, 0.04, 0.01) == 0.01
    assert checkpoint_critic_error(9.0, [], 0.0, 0.04, 0.01) == 0.01


@pytest.mark.parametrize("z2", [1.5, 4.0, 9.0, 16.0, 36.0])
def test_a_far_miss_raises_t_by_the_posterior_share_of_its_excess(z2: float):
    t, var = 0.2, 0.8  # t + var = 1: the miss is sqrt(z2) standard deviations
    q_bar = 0.0
    qs = [q_bar - 0.1, q_bar + 0.1]  # spread 0.01 < var: the model's var is used
    v_hat = q_bar + math.sqrt(z2)
    got = checkpoint_critic_error(v_hat, qs, q_bar, var, t)
    assert got == pytest.approx(t + _posterior(z2) * (z2 - 1.0), rel=1e-12)


def test_the_posterior_passes_one_half_near_three_point_six_standard_deviations():
    t, var = 0.0, 1.0
    below = checkpoint_critic_error(3.5, [0.0, 0.0], 0.0, var, t)
    above = checkpoint_critic_error(3.7, [0.0, 0.0], 0.0, var, t)
    assert below < 0.5 * (3.5**2 - 1.0) and above > 0.5 * (3.7**2 - 1.0)
    # far out, the critic's error is the miss's own estimate, miss² − var
    assert checkpoint_critic_error(30.0, [0.0, 0.0], 0.0, var, t) == pytest.approx(899.0, rel=1e-9)


def test_children_that_spread_more_than_the_model_are_not_read_as_a_miss():
    # two children 0 and 2: their own variance of the mean SS/(m(m−1)) = 1 beside a
    # modelled 0.01, so a miss of 1.5 is 1.5 standard deviations, not 15
    near = checkpoint_critic_error(2.5, [0.0, 2.0], 1.0, 0.01, 0.0)
    assert near < 0.2
    # the same miss with children that agree is a critic wrong here
    far = checkpoint_critic_error(2.5, [1.0, 1.0], 1.0, 0.01, 0.0)
    assert far == pytest.approx(2.25 - 0.01, rel=1e-6)


def test_the_refined_value_leaves_a_critic_its_children_contradict():
    """Three children agree on 1.0 and the depth's model calls the critic nearly exact
    (t = 0.001): a prediction of 5.0 was followed before; now the value is the
    children's mean, and its error says the critic's miss."""
    noise = NoiseModel((0.04,), 0.001, (0.01,))
    kids = [(1.0 + d, 1.0, 0.0, 0.0, 1.0) for d in (-0.05, 0.0, 0.05)]
    r = refine(5.0, kids, noise, 0, None)
    assert r.q_bar == pytest.approx(1.0)
    assert abs(r.value - 1.0) < 0.05
    # the same children under a prediction the model allows keep the critic's weight
    ok = refine(1.02, kids, noise, 0, None)
    m = 3
    signal, var_q = (0.04 - 0.01) * m / m**2, 0.04 * m / m**2
    assert ok.weight == pytest.approx(signal / (0.001 + var_q))
