"""The task side: what the agent can do, how state changes, rewards and the end.

An :class:`Env` is stateless; the state of one branch is plain, picklable data that the
env returns and receives back. That is what lets FOCUS checkpoint a decision point,
ship it to another worker and continue it there as often as the search wants. Mutable
task data that does not fit in plain data (files, a browser) lives in a
:class:`~focus.workspace.Workspace`, which each branch forks.
"""

from __future__ import annotations

import abc
import inspect
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from focus.reprs import short_repr, short_value
from focus.workspace import Workspace

#: The largest magnitude of a reward or a critic value FOCUS takes. The noise model
#: (:mod:`focus.noise`) weighs its moment equations by squared variances, fourth powers
#: of values, which overflow a double near 1e77 (an ``OverflowError`` deep in the fit);
#: 1e60 leaves room for returns summed over long episodes. Beyond it an env's reward
#: fails its rollout (:func:`check_step_result`) and a critic's value is a
#: :class:`focus.critic.CriticError` naming the state it scored.
VALUE_LIMIT = 1e60


@dataclass(frozen=True)
class Task:
    """One problem to collect on. ``data`` holds whatever the env needs (prompt, answer)."""

    __repr__ = short_repr

    id: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # a dataset's integer id (Task(row["id"])) ran the whole collection and failed
        # when the batch was built, its task_id column refusing the int
        if not isinstance(self.id, str):
            raise TypeError(f"Task.id must be a str, got {type(self.id).__name__} {self.id!r}: write Task(str(...))")


@dataclass(frozen=True)
class Message:
    """A chat message. Assistant messages carry the exact sampled ids in ``token_ids``."""

    __repr__ = short_repr

    role: str
    content: str
    token_ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Reset:
    """The start of an episode: its state and the messages that open the conversation."""

    state: Any
    messages: tuple[Message, ...]


@dataclass(frozen=True)
class StepResult:
    """Outcome of one task transition."""

    state: Any
    observation: str
    reward: float = 0.0
    done: bool = False
    info: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Action:
    """What a parser extracted from a model response.

    ``kind`` is ``"tool"`` (``name`` and ``arguments`` set), ``"answer"`` (``text`` set)
    or ``"text"`` (free text for envs without tools).
    """

    kind: str
    text: str = ""
    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


class EnvError(RuntimeError):
    """Env or tool code broke its contract (raised, hung, returned the wrong type)."""


class Env(abc.ABC):
    """A task environment. Implement :meth:`reset` and :meth:`step`.

    Both are coroutines so that tools may call services without blocking the rollouts
    that share an event loop. ``state`` must be picklable; do not mutate it in place -
    return a new one (sibling branches may hold the old one).

    **Randomness.** An env whose transitions are random declares a keyword-only
    ``seed`` parameter on :meth:`step` (``async def step(self, state, action,
    workspace, *, seed=None)``) and draws from it alone, e.g. ``random.Random(seed)``.
    The agent then passes a seed derived, like the policy's sampling seeds, from
    (collection seed, tree, checkpoint, branch, step): sibling branches from one
    checkpoint draw independently, and a resumed or replayed collection draws the same
    outcomes. A ``step`` without that parameter is called as before (see
    :func:`accepts_seed`). An env that keeps its own random generator in its state
    instead gets the generator's state saved with every checkpoint: every continuation
    from a checkpoint replays the same draws, so branches differ only by the policy's
    choices and the search sees none of the env's randomness at that point (its
    values are those of one fixed outcome). An env that draws from a global generator
    is not reproducible at all.
    """

    @abc.abstractmethod
    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        """Create the initial state and opening messages for ``task``."""

    @abc.abstractmethod
    async def step(self, state: Any, action: Action, workspace: Workspace | None) -> StepResult:
        """Apply ``action``; return the next state, an observation, a reward and done."""

    def make_workspace(self, task: Task) -> Workspace | None:
        """The workspace a fresh episode starts with; ``None`` when the env needs none."""
        return None


def accepts_seed(env: Env) -> bool:
    """Whether ``env.step`` takes the keyword ``seed`` (declared, or ``**kwargs``)."""
    try:
        params = inspect.signature(env.step).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        (p.name == "seed" and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)) or p.kind is p.VAR_KEYWORD
        for p in params
    )


def check_step_result(result: object, where: str) -> StepResult:
    """Validate what an env returned, so a bad env fails with its name, not deep inside."""
    if not isinstance(result, StepResult):
        raise EnvError(f"{where} returned {type(result).__name__}, expected StepResult")
    if not isinstance(result.observation, str):
        raise EnvError(f"{where} returned an observation of type {type(result.observation).__name__}, expected str")
    _check_text(result.observation, where)
    _check_info(result.info, where)
    try:
        if isinstance(result.reward, str | bytes):  # float() reads "1": a judge's text passed on unparsed
            raise TypeError(result.reward)
        reward = float(result.reward)
    except (TypeError, ValueError):
        raise EnvError(f"{where} returned a non-numeric reward {short_value(result.reward)}") from None
    except OverflowError:  # an int past a float's range (10**400)
        reward = math.inf
    if not abs(reward) <= VALUE_LIMIT:  # NaN too: it went into every value of its tree
        shown = short_value(result.reward) if math.isinf(reward) else repr(reward)
        raise EnvError(f"{where} returned the reward {shown}, not a finite number within ±{VALUE_LIMIT:g}")
    if not isinstance(result.done, bool):
        if type(result.done).__module__ != "numpy" or type(result.done).__name__ not in ("bool", "bool_"):
            raise EnvError(f"{where} returned done={result.done!r}, expected a bool")
        return replace(result, done=bool(result.done))  # numpy's bool, as gym-style envs return it
    return result


def _check_text(observation: str, where: str, what: str = "an observation") -> None:
    """Refuse an observation (or ``what``) no codec can encode: a lone surrogate (bytes decoded with
    ``errors="surrogateescape"``, as ``os.fsdecode`` does with a file name that is not
    UTF-8, or a subprocess's output read so) is no Unicode text. Found later, when the
    codec encoded it, it failed the rollout's job: its finished segments were lost and
    the cause named a ``UnicodeEncodeError`` but not the env."""
    if observation.isascii():
        return
    try:
        observation.encode("utf-8")
    except UnicodeEncodeError as e:
        raise EnvError(
            f"{where} returned {what} that is not valid text: {observation[e.start]!r} at character "
            f"{e.start} is a lone surrogate (bytes decoded with errors='surrogateescape'?); decode such bytes with "
            "errors='replace'"
        ) from None


def _check_info(info: object, where: str) -> None:
    """``info`` is a mapping whose ``tool_error``, where given, counts the step's tool
    failures (:class:`focus.tools.ToolEnv`; the agent sums it into the rollout's
    counters). ``info=None`` or a text there failed the rollout's job with a bare
    ``AttributeError`` or ``ValueError`` that named neither the env nor ``info``."""
    if not isinstance(info, Mapping):
        raise EnvError(f"{where} returned info={short_value(info)}, expected a mapping (a dict; {{}} for none)")
    count = info.get("tool_error", 0)
    try:
        if isinstance(count, str | bytes):  # int("1") would read it; a count is a number
            raise TypeError(count)
        int(count)
    except (TypeError, ValueError, OverflowError):
        raise EnvError(
            f"{where} returned info['tool_error']={short_value(count)}, expected a number of tool failures"
        ) from None


def check_reset(result: object, where: str) -> Reset:
    """Validate what an env's reset returned, each opening message's text and ids too: a
    ``Message("user", task.data.get("question"))`` whose key is missing (``None``), or a
    number, stopped the collection with a bare ``AttributeError`` naming neither the
    env, the task nor the message."""
    if not isinstance(result, Reset):
        raise EnvError(f"{where} returned {type(result).__name__}, expected Reset")
    if not result.messages or not all(isinstance(m, Message) for m in result.messages):
        raise EnvError(f"{where} returned no opening messages (a tuple of Message)")
    for i, m in enumerate(result.messages):
        if not isinstance(m.content, str):
            raise EnvError(
                f"{where} returned opening message {i} ({m.role!r}) with content {short_value(m.content)}, expected str"
            )
        _check_text(m.content, where, f"opening message {i}")
        ids = m.token_ids
        if ids is not None and not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in ids):
            raise EnvError(f"{where} returned opening message {i} with token_ids {short_value(ids)}, expected ints")
    return result
