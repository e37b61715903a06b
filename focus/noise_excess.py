"""The only children's excess that the critic's error t(d) takes where it is significant
(issue 31; ``noise_model(excess=True)``, :func:`only_excess`).

An excess is a squared critic miss beyond the fitted model's variance of what the critic
is compared with: ``(v̂ − q)² − Var(q)`` for an only child, ``mean_j (v̂ − q_j)² −
mean_j Var(q_j)`` for a branched checkpoint. Both have expectation ``t(d)`` (the critic's
error there) plus the model's misfit at that depth. The model's misfit shows in both
groups alike (an exact critic whose per-depth model is short at a decisive step); a
critic wrong where search did not branch shows in the only children alone. So t(d)
takes the difference of the two groups' mean excess at a depth, and only where a
one-sided Welch test at :data:`LEVEL` says the only children's is larger. Pure.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from focus.lsq import mv
from focus.noise_rows import Checkpoint

if TYPE_CHECKING:
    from focus.noise import _Moments

#: The test's one-sided level, chosen before any measurement: 5%.
LEVEL = 0.05
#: Its standard normal quantile, z(1 − LEVEL).
_Z = 1.6448536269514722
#: Rows a group needs at a depth for its variance to mean anything.
MIN_ROWS = 3


def t_quantile(df: float) -> float:
    """Student's t quantile at 1 − :data:`LEVEL` for ``df`` degrees of freedom, by the
    Cornish–Fisher expansion about the normal's (three terms: 2.885 at df = 2 against
    2.920, within 0.2% from df = 5 on)."""
    z = _Z
    z3, z5, z7 = z**3, z**5, z**7
    return (
        z
        + (z3 + z) / (4 * df)
        + (5 * z5 + 16 * z3 + 3 * z) / (96 * df**2)
        + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * df**3)
    )


def significant_excess(
    nd: int, one_depth: np.ndarray, one_excess: np.ndarray, res_depth: np.ndarray, res_excess: np.ndarray
) -> np.ndarray:
    """Per depth, the only children's mean excess less the branched checkpoints', where
    it is positive and a one-sided Welch t-test (each group's own variance, the
    Welch–Satterthwaite degrees of freedom) rejects "no larger" at :data:`LEVEL`; else
    0. A depth with fewer than :data:`MIN_ROWS` rows in either group takes nothing:
    without branched checkpoints to compare, an excess cannot be told from the model's
    misfit. One rare outcome among the only children raises their mean and their
    variance together, so it does not pass the test on its own."""
    out = np.zeros(nd)
    for d in range(nd):
        a, b = one_excess[one_depth == d], res_excess[res_depth == d]
        if len(a) < MIN_ROWS or len(b) < MIN_ROWS:
            continue
        diff = float(np.mean(a) - np.mean(b))
        va, vb = float(np.var(a, ddof=1)) / len(a), float(np.var(b, ddof=1)) / len(b)
        se2 = va + vb
        if diff <= 0:
            continue
        if se2 <= 0:  # two groups without spread: the difference is exact
            out[d] = diff
            continue
        df = se2 * se2 / (va * va / (len(a) - 1) + vb * vb / (len(b) - 1))  # Welch–Satterthwaite
        if diff > t_quantile(df) * math.sqrt(se2):
            out[d] = diff
    return out


def only_excess(recs: list[Checkpoint], mo: _Moments, s: np.ndarray, t: float) -> np.ndarray:
    """What t(d) adds to the branched residuals' (:func:`significant_excess`):
    each only child's ``(v̂ − q)² − Var(q)`` against each branched checkpoint's mean over
    its children, ``(v̂ − Q̄)² + SS/m − m·Var(Q̄)``, Var from the model (s, the pooled t)."""
    res = mo.res_ix
    m = np.array([recs[i].m for i in res], dtype=np.float64)
    res_y = np.array([recs[i].d2 + recs[i].ss / recs[i].m for i in res], dtype=np.float64)  # type: ignore[operator]
    res_excess = res_y - m * (mv(mo.alpha[res], s) + mo.beta[res] * t)
    one_excess = mo.one_y - mv(mo.one_rows[:, : mo.nd], s) - t * (mo.one_t - 1.0)
    res_depth = np.array([recs[i].depth for i in res], dtype=np.int64)
    return significant_excess(mo.nd, mo.one_depth, one_excess, res_depth, res_excess)
