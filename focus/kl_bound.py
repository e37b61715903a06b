"""The bound on an update's size (``UpdateConfig.target_kl`` of :mod:`focus.train_local`).

Pure decisions from approximate KL(behaviour || policy) figures; the trainer measures
them and does what they say (restore a snapshot, halve the learning rate). Bounding
every epoch, the first included, is what lets methods whose batches differ in size and
advantage scale be compared at a matched update size (benchmarks/learning.py).
"""

from __future__ import annotations

from typing import Literal


def kl_reached(approx_kl: float, target_kl: float | None) -> bool:
    """Whether an update should stop: its KL passed the target (pure; no target: never)."""
    return target_kl is not None and approx_kl > target_kl


#: Runs of an overshooting epoch at half the learning rate, per update. A small move's
#: KL grows with the square of its size, and Adam's step is about the learning rate
#: whatever the gradient's scale: a halving cuts the KL an epoch adds about 4x, and 4
#: halvings about 256x.
MAX_HALVINGS = 4

KlVerdict = Literal["accept", "retry", "undo"]


def kl_verdict(initial_kl: float, kl: float, target_kl: float, halvings: int) -> KlVerdict:
    """What to do with an epoch after which the whole batch's KL is ``kl`` (pure).

    ``accept`` it within the bound, ``initial_kl`` (the KL before the update: about 0
    when the batch was sampled from this policy, more when it was not) plus twice
    ``target_kl``; else undo it and ``retry`` at half the learning rate while
    ``halvings`` (so far, this update) is below :data:`MAX_HALVINGS`, and ``undo`` it
    and end the update after that. The bound is relative so that a batch from another
    policy can still be trained on: a small enough step always meets it.
    """
    if kl <= initial_kl + 2 * target_kl:
        return "accept"
    return "retry" if halvings < MAX_HALVINGS else "undo"
