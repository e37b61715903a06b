"""The critic's weight λ in a refined value, and the truncation rule's type.

Plain arithmetic, apart from the noise model (:mod:`focus.noise`, numpy), so that
:mod:`focus.priority` - which the pipeline's configuration imports to validate a search
- imports without numpy: ``focus --help`` and ``focus config show`` loaded numpy and
pyarrow only for these (tests/test_imports.py). :mod:`focus.backups` and
:mod:`focus.noise_rows` re-export both.
"""

from __future__ import annotations

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
