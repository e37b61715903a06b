"""Sums of floats that are the same on every Python version.

Python 3.12 made the built-in ``sum()`` of floats compensated (Neumaier summation,
CPython gh-100425): the same floats in the same order can sum to a different last bit
on 3.11 and on 3.12 or later. FOCUS's batches are functions of such sums (refined
values, advantages, critic targets, the noise model, the search's expected
transitions), so a collection with the same configuration and seed wrote other
advantages and critic targets on 3.12 and 3.13 than on 3.11 (1 to 4 units in the last
place, seen in every pinned batch of tests/test_search_planning.py), and a search
decision on a near tie could go the other way.

:func:`left_sum` adds left to right in double precision, as ``sum()`` did up to 3.11,
on every version: the batches a seed gives, and the digests pinned on 3.11, are the
same on 3.11, 3.12 and 3.13. Use it for every sum of floats whose result reaches a
batch, a decision or a trained weight; ``sum()`` stays right for integers (exact on
every version).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable


def left_sum(values: Iterable[float], start: float = 0) -> float:
    """``start + v0 + v1 + ...`` in that order, each addition rounded (``sum()`` before
    Python 3.12; integers stay exact and the result of integers is an integer)."""
    return functools.reduce(operator.add, values, start)
