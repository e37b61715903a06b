"""The critic's weight λ in a refined value, and the truncation rule's type.

Plain arithmetic, apart from the noise model (:mod:`focus.noise`, numpy), so that
:mod:`focus.priority` - which the pipeline's configuration imports to validate a search
- imports without numpy: ``focus --help`` and ``focus config show`` loaded numpy and
pyarrow only for these (tests/test_imports.py). :mod:`focus.backups` and
:mod:`focus.noise_rows` re-export both.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

#: How a truncated leaf is valued (docs/algorithm.md): ``bootstrap`` by the critic's
#: prediction (the default), ``terminal`` as 0, as if the episode had ended there.
Truncation = Literal["bootstrap", "terminal"]


def critic_weight(signal: float, var_q: float, t: float, iota: float) -> float:
    """λ minimising the summed error of the advantages V(n) enters: its m child
    segments' (``T = signal``, the variance of the mean true advantage of the sampled
    actions, against ``t + Var(Q̄)``) and, with ``iota`` = the influence per child
    segment (:func:`focus.backups.value_influence` / m), the segments above, which want
    V(n)'s own error small (the value weight ``Var(Q̄)/(t + Var(Q̄))``):
    ``λ = (T + ι·Var(Q̄)) / ((1 + ι)·(t + Var(Q̄)))``, docs/algorithm.md."""
    den = (1.0 + iota) * (t + var_q)
    return (signal + iota * var_q) / den if den > 0 else 1.0


#: Prior probability that the critic is wrong at one checkpoint beyond its depth's
#: error variance t(d) (:func:`checkpoint_critic_error`): one in a hundred. The
#: posterior passes one half where the miss is about 3.6 standard deviations, so a
#: critic that fits its model is read as before at all but about one checkpoint in
#: 2,000.
WRONG_HERE_PRIOR = 0.01


def checkpoint_critic_error(
    v_hat: float, qs: Sequence[float], q_bar: float, var_q: float, t: float, only_child: bool = False
) -> float:
    """The critic's error variance at one checkpoint with two or more children, given
    its prediction ``v̂``, its children's values ``qs`` (mean ``q_bar``, modelled
    sampling variance of the mean ``var_q``) and the depth's error variance ``t``
    (issue 31).

    The noise model fits t(d) on the checkpoints the search branched, and a critic is
    often wrong at states a search seldom looks at: a state a hidden fact decides,
    one it never saw in training. One number per depth trusts it there, and the
    refined value follows the critic's miss. Here the checkpoint's own miss
    ``v̂ − Q̄`` tests the depth's model: with prior :data:`WRONG_HERE_PRIOR` the
    critic is wrong at this checkpoint, with an error variance fitted to the miss
    (``miss² − var``, the profile likelihood), else its error has variance t. ``var``
    is the larger of the modelled ``var_q`` and the children's own spread
    ``SS/(m(m−1))``, so a checkpoint whose outcomes are noisier than its depth's
    model (a rare success, a heavy tail) does not read as a critic's miss. The result
    is t plus the posterior probability of "wrong here" times the excess
    ``miss² − var − t``: t exactly while the miss is within one standard deviation,
    continuous above it, near the miss's own estimate once it is several out.

    An only child is not tested: one outcome cannot tell a critic's miss from a rare
    outcome (a success of probability 0.05 is 4.4 standard deviations from an exact
    critic), and reading it as a miss lost an exact critic's value at decisive steps
    (3.2x the advantage error on ``decisive`` at 6H). Search reads an only child's miss
    as noisy outcomes (:func:`focus.node_view._spread_factor`) and branches there,
    and the second child makes the test. Pure: the batch's backup and search's
    ranking compute the same number (docs/algorithm.md, "A critic wrong at one
    checkpoint")."""
    m = len(qs)
    if m < 2:
        if not (only_child and m == 1):
            return t
        var = var_q
    else:
        ss = 0.0
        for q in qs:
            ss += (q - q_bar) * (q - q_bar)
        var = max(var_q, ss / (m * (m - 1)))
    total = t + var
    miss = v_hat - q_bar
    d2 = miss * miss
    if not d2 > total or not total > 0 or not math.isfinite(total):
        return t
    z2 = d2 / total
    # log of the likelihood ratio: wrong here (variance miss²) against the model (t + var)
    log_odds = 0.5 * (z2 - 1.0 - math.log(z2)) + _LOG_PRIOR_ODDS
    post = 1.0 / (1.0 + math.exp(-log_odds)) if log_odds > -700.0 else 0.0
    return t + post * (d2 - total)


_LOG_PRIOR_ODDS = math.log(WRONG_HERE_PRIOR / (1.0 - WRONG_HERE_PRIOR))
