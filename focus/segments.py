"""What values, rankings and the noise fit read of one segment (an edge), computed once.

:class:`Segment` holds a segment's discounted reward, its discount and first-step
weight, its transitions and tokens; :func:`segment` makes one from an edge, in one
pass over its turns. Split from :mod:`focus.backups` so the noise fit's rows
(:mod:`focus.noise_rows`, below it) read the same segments as the backups and the
rankings; pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from focus.sums import left_sum
from focus.tree import Edge, Turn

_new = object.__new__


def first_step_weight(k: int, gamma: float) -> float:
    """``Σ_{i<k} γ^{2i}``: the variance multiplier of a segment's own k transitions."""
    g2 = gamma * gamma
    return float(k) if g2 == 1.0 else (1.0 - g2**k) / (1.0 - g2)


@dataclass(frozen=True, slots=True)
class Segment:
    """What values and rankings read of one segment, computed once per segment (slotted:
    a ranking keeps one per segment of every tree for the whole collection)."""

    child: int
    #: r(e) = Σ_i γ^i r_i, γ^{k(e)}, Σ_{i<k} γ^{2i} (first-step weight), k(e), tokens.
    reward: float
    discount: float
    weight: float
    k: int
    tokens: int


def segment(e: Edge, gamma: float) -> Segment:
    """The :class:`Segment` of ``e``: its rewards read in one pass over its turns (not one
    per property), the rest from them; the same numbers as ``e.discounted_reward(gamma)``,
    ``gamma ** e.k`` and ``e.n_tokens``."""
    turns = e.turns
    reward, k = reward_and_k(turns, gamma)
    seg = _new(Segment)
    _SEGMENT_SET[0](seg, e.child)
    _SEGMENT_SET[1](seg, reward)
    _SEGMENT_SET[2](seg, gamma**k)
    _SEGMENT_SET[3](seg, first_step_weight(k, gamma))
    _SEGMENT_SET[4](seg, k)
    _SEGMENT_SET[5](seg, sum(len(t.completion_ids) for t in turns))
    return seg


def reward_and_k(turns: tuple[Turn, ...], gamma: float) -> tuple[float, int]:
    """``(Edge.discounted_reward(gamma), Edge.k)`` of a segment with ``turns``, from one
    list of its rewards: the same sum of the same terms in the same order (with γ = 1
    each term ``r·1.0`` is ``r`` itself, so the plain sum of the rewards, as a float).
    Integer rewards sum exactly below 2**53, where their float sum is the same number."""
    rewards = [t.reward for t in turns if t.transition]
    if gamma == 1.0:
        total = left_sum(rewards)
        # integer rewards: r·1.0 made each a float, so the sum was one (of the same value)
        return (float(total) if rewards and type(total) is not float else total), len(rewards)
    return left_sum(r * gamma**i for i, r in enumerate(rewards)), len(rewards)


#: Each slot's setter, in field order (a frozen slotted class's ``__init__`` goes through
#: ``object.__setattr__`` per field; a segment is made per edge, in every backup of a batch).
_SEGMENT_SET = tuple(Segment.__dict__[name].__set__ for name in Segment.__dataclass_fields__)
