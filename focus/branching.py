"""Which decision points may become checkpoints that search can continue from.

A rule sees the full branch state before the model is called at a decision point - the
env state, the context and the workspace - and answers yes or no. Which of the
eligible checkpoints the search continues is a different question (``focus.priority``).
"""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from focus.agent import BranchState


class BranchPoints(abc.ABC):
    """Eligibility of a decision point. Implement :meth:`eligible`.

    It is asked at every decision point after a rollout's first model call: the state a
    rollout starts from is a checkpoint already (the task's root, which is one whatever
    the rule says, or the checkpoint it continues)."""

    @abc.abstractmethod
    def eligible(self, state: BranchState) -> bool: ...


class BrokenBranchPoints(TypeError):
    """A rule's :meth:`BranchPoints.eligible` returned ``None`` (a ``def`` that forgot its
    ``return``). No decision point became a checkpoint, silently: the search continued
    from the roots alone. Code to fix, the same in every rollout, so it stops the
    collection at the first call that shows it, as
    :class:`~focus.context.BrokenContextManager` does."""


def eligible(rule: BranchPoints, state: BranchState) -> bool:
    """``rule.eligible(state)``, or :class:`BrokenBranchPoints` naming the rule when it is ``None``."""
    ok = rule.eligible(state)
    if ok is None:
        raise BrokenBranchPoints(
            f"{type(rule).__name__}.eligible returned None, expected a truth value (a `return` missing?)"
        )
    return ok


class EveryDecision(BranchPoints):
    """Every decision point is a checkpoint."""

    def eligible(self, state: BranchState) -> bool:
        return True


class SparseCheckpoints(BranchPoints):
    """Checkpoints every ``every`` rollout steps, optionally only up to ``max_step``.

    ``min_prompt_tokens`` skips decision points whose context is still short (little
    to share), which keeps the tree small on long-horizon tasks.
    """

    def __init__(
        self, every: int = 2, *, offset: int = 0, max_step: int | None = None, min_prompt_tokens: int = 0
    ) -> None:
        if every < 1:
            raise ValueError("SparseCheckpoints.every must be at least 1")
        self.every, self.offset, self.max_step, self.min_prompt_tokens = every, offset, max_step, min_prompt_tokens

    def eligible(self, state: BranchState) -> bool:
        if self.max_step is not None and state.steps > self.max_step:
            return False
        if len(state.context.prompt_ids) < self.min_prompt_tokens:
            return False
        return state.steps >= self.offset and (state.steps - self.offset) % self.every == 0
