"""What the model sees at each step.

A :class:`Context` is plain data: the conversation as messages and the exact prompt ids
of the next model call. Managers differ in how a turn extends it:

* :class:`AppendOnly` keeps every message and re-renders the prompt with the codec at
  each call (sampled turns are emitted from their ids, so nothing is re-tokenised).
  Use it with chat templates that render earlier turns differently.
* :class:`Segments` never re-renders: the next prompt is the previous prompt plus the
  completion ids plus the codec's observation ids. A continuation from a checkpoint
  sends exactly the prefix recorded there, so a server's prefix cache serves it.
* :class:`Summarize` appends like Segments until the prompt passes a token threshold,
  then compacts: a model call summarises the progress and the context restarts from
  the opening messages plus the summary ids (and the model acts before any further
  compaction, even if those alone pass the threshold). Compaction is a rollout step, not a task
  transition; its turn is recorded with loss mask 0 unless ``train_on_summary``.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from focus.env import Message
from focus.format import ChatCodec
from focus.policy import Completion, Policy, SamplingParams
from focus.reprs import short_repr


@dataclass(frozen=True)
class Context:
    """The live context of one branch."""

    __repr__ = short_repr

    #: Opening messages of the episode (system, task); kept through compactions.
    opening: tuple[Message, ...]
    #: Messages after the opening, assistant ones with their exact ids.
    history: tuple[Message, ...]
    #: Exact ids of the next prompt.
    prompt_ids: tuple[int, ...]
    compactions: int = 0

    @property
    def messages(self) -> tuple[Message, ...]:
        return self.opening + self.history


@dataclass(frozen=True)
class Compaction:
    """Result of a compaction: the new context and the model turn that produced it."""

    __repr__ = short_repr

    context: Context
    prompt_ids: tuple[int, ...]
    completion: Completion
    loss_mask: int


class ContextManager(abc.ABC):
    """Builds and extends contexts. Implement :meth:`extend`; compaction is optional.

    The agent checks what each method returns (:func:`returned`): a ``Context`` from
    :meth:`start` and :meth:`extend`, a ``Compaction`` from :meth:`compact`, not ``None``
    from :meth:`needs_compaction`."""

    def start(self, codec: ChatCodec, opening: Sequence[Message]) -> Context:
        return Context(tuple(opening), (), tuple(codec.render(opening)))

    @abc.abstractmethod
    def extend(
        self, ctx: Context, codec: ChatCodec, completion: Completion, text: str, observations: Sequence[Message]
    ) -> Context:
        """The context after the model answered ``completion`` and the env replied."""

    def needs_compaction(self, ctx: Context) -> bool:
        return False

    async def compact(self, ctx: Context, codec: ChatCodec, policy: Policy, params: SamplingParams) -> Compaction:
        raise NotImplementedError(f"{type(self).__name__} does not compact")


class BrokenContextManager(TypeError):
    """A context manager's method returned what its interface does not allow (a ``def``
    that forgot its ``return`` gives ``None``). Code to fix, the same in every rollout,
    so it stops the collection at the first call that shows it (the agent and the
    execution layer let it through, as :class:`~focus.policy.UnreadableAnswers`). It
    failed each rollout with "'NoneType' object has no attribute 'prompt_ids'", naming
    neither the manager nor the method, and a ``needs_compaction`` without ``return``
    never compacted, silently."""


def returned(manager: ContextManager, method: str, value: Any, expected: type | None) -> Any:
    """``value``, what ``manager.method`` returned, if it is an ``expected`` (``None``:
    anything but ``None``, a truth value); else :class:`BrokenContextManager` names both."""
    if value is not None and (expected is None or isinstance(value, expected)):
        return value
    got = "None" if value is None else f"a {type(value).__name__}"
    want = "a truth value" if expected is None else f"a {expected.__name__}"
    raise BrokenContextManager(
        f"{type(manager).__name__}.{method} returned {got}, expected {want} (a `return` missing?)"
    )


def _evolve(ctx: Context, **changes: Any) -> Context:
    """``dataclasses.replace(ctx, **changes)`` without re-running the frozen class's
    ``__init__`` field by field (no ``__post_init__``): a rollout extends its context
    at every step (0.6 against 1.5 us)."""
    new = object.__new__(type(ctx))
    new.__dict__.update(ctx.__dict__, **changes)
    return new


def _assistant(completion: Completion, text: str) -> Message:
    return Message("assistant", text, tuple(completion.token_ids))


class AppendOnly(ContextManager):
    """The full conversation, re-rendered by the codec at each call."""

    def extend(
        self, ctx: Context, codec: ChatCodec, completion: Completion, text: str, observations: Sequence[Message]
    ) -> Context:
        history = ctx.history + (_assistant(completion, text), *observations)
        return _evolve(ctx, history=history, prompt_ids=tuple(codec.render(ctx.opening + history)))


class Segments(ContextManager):
    """Append-only token prefix: prompt(t+1) = prompt(t) + completion + observation ids."""

    def extend(
        self, ctx: Context, codec: ChatCodec, completion: Completion, text: str, observations: Sequence[Message]
    ) -> Context:
        history = ctx.history + (_assistant(completion, text), *observations)
        ids = (
            ctx.prompt_ids
            + tuple(completion.token_ids)
            + tuple(codec.observation_ids(completion.token_ids, observations))
        )
        return _evolve(ctx, history=history, prompt_ids=ids)


#: Messages :meth:`Summarize.compact` leaves in the history: the note and the summary.
_SUMMARY_MESSAGES = 2


class Summarize(Segments):
    """Segments plus compaction by a model call when the prompt exceeds ``max_prompt_tokens``."""

    def __init__(
        self,
        max_prompt_tokens: int,
        instruction: str = "Summarize the progress so far: facts found, steps taken, what remains.",
        train_on_summary: bool = False,
    ) -> None:
        if max_prompt_tokens <= 0:
            raise ValueError("Summarize.max_prompt_tokens must be positive")
        self.max_prompt_tokens = max_prompt_tokens
        self.instruction = instruction
        self.train_on_summary = train_on_summary

    def needs_compaction(self, ctx: Context) -> bool:
        """Past the threshold with something to summarise: not a history that holds only
        the last compaction's summary (its two messages, :meth:`compact`). Compacting that
        again cannot shrink the context (the opening and the summary are what passes the
        threshold), so the model acts on the long prompt first; back to back, every step
        of the episode was a compaction."""
        if len(ctx.prompt_ids) <= self.max_prompt_tokens or not ctx.history:
            return False
        return not (ctx.compactions and len(ctx.history) <= _SUMMARY_MESSAGES)

    async def compact(self, ctx: Context, codec: ChatCodec, policy: Policy, params: SamplingParams) -> Compaction:
        prompt = tuple(codec.render(ctx.messages + (Message("user", self.instruction),)))
        completion = await policy.sample(prompt, params)
        summary = Message("user", "Summary of progress so far:", None)
        history = (summary, Message("assistant", codec.decode(completion.token_ids), tuple(completion.token_ids)))
        new = Context(ctx.opening, history, tuple(codec.render(ctx.opening + history)), ctx.compactions + 1)
        return Compaction(new, prompt, completion, int(self.train_on_summary))
