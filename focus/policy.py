"""The model side: what a policy is asked and what it must answer.

A policy is token-in/token-out. It receives the exact prompt token ids and returns the
exact sampled token ids with the log-probability of each sampled token under the
distribution it actually sampled from. Generated text is never re-tokenised anywhere in
FOCUS: everything downstream (contexts, checkpoints, batches) is built from these ids.
"""

from __future__ import annotations

import abc
import asyncio
import math
import operator
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt

from focus.reprs import short_repr


class SamplingParams(BaseModel):
    """Limits and randomness of one model response.

    ``max_tokens`` bounds one response; it is not a rollout budget (that is
    ``Agent(max_steps=...)``) nor a search budget (that is ``Phase``).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_tokens: int = Field(256, gt=0)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    stop: tuple[str, ...] = ()
    #: Token ids are >= 0: a server refuses a negative one (vLLM: 400 "stop_token_ids must
    #: be non-negative"), so every request of a collection failed.
    stop_token_ids: tuple[NonNegativeInt, ...] = ()
    seed: int | None = None

    def with_seed(self, seed: int | None) -> SamplingParams:
        """``self.model_copy(update={"seed": seed})``, which the agent calls on every model
        call: built directly for this class (no extra fields, no private attributes), about
        a microsecond instead of two, the same copy (equal, same fields set, no validation
        either way); a subclass goes through ``model_copy``."""
        if type(self) is not SamplingParams:
            return self.model_copy(update={"seed": seed})
        new = object.__new__(SamplingParams)
        values = dict(self.__dict__)
        values["seed"] = seed
        _set(new, "__dict__", values)
        _set(new, "__pydantic_fields_set__", self.__pydantic_fields_set__ | _SEED)
        _set(new, "__pydantic_extra__", None)
        _set(new, "__pydantic_private__", None)
        return new


_set = object.__setattr__
_SEED = frozenset({"seed"})


def _nth(seed: int | None, i: int) -> int | None:
    """The seed of sample ``i`` of a request with ``n`` samples and seed ``seed`` (vLLM's rule)."""
    return None if seed is None else seed + i


FINISH_REASONS = ("stop", "length", "abort", "error")
_INT = {int}


#: How far above 0 a log-prob may be: a token of probability 1 that a server's float
#: rounding put just above it (what :class:`Completion` and
#: :class:`focus.testing.PolicyConformance` accept).
LOGPROB_SLACK = 1e-6


@dataclass(frozen=True)
class Completion:
    """One sampled response: ids, their behaviour log-probs and why sampling ended."""

    __repr__ = short_repr

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    finish_reason: str = "stop"
    #: Prompt tokens the server reports as served from its prefix cache, if it says.
    cached_prompt_tokens: int | None = None
    meta: dict = field(default_factory=dict, compare=False)
    #: The version of the weights that sampled it, as the server reports it (None: unknown).
    policy_version: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise BadResponse(f"completion has {len(self.token_ids)} tokens but {len(self.logprobs)} log-probs")
        if not set(map(type, self.token_ids)) <= _INT:  # plain ints: the HTTP backends' (one pass in C)
            _check_ids(self.token_ids)
        try:
            for lp in self.logprobs:
                if not math.isfinite(lp) or lp > LOGPROB_SLACK:
                    raise BadResponse(f"completion has an invalid log-prob {lp!r}")
        except TypeError:  # None, a text: it said "must be real number, not NoneType" and named no log-prob
            raise BadResponse(f"completion has an invalid log-prob {lp!r}, not a number") from None
        if self.finish_reason not in FINISH_REASONS:
            raise BadResponse(f"unknown finish reason {self.finish_reason!r}")


def _check_ids(ids: Sequence[Any]) -> None:
    """Token ids are integers (numpy's and torch's too, as ``operator.index`` reads them);
    a float (a custom policy's ``tensor.float()``), a bool or a text failed each rollout's
    job later, in the codec's decode (``TypeError: 'float' object cannot be interpreted
    as an integer``), naming neither the policy nor the id."""
    for i, t in enumerate(ids):
        try:
            if isinstance(t, bool | str | bytes):
                raise TypeError
            operator.index(t)
        except TypeError:
            raise BadResponse(f"completion has token id {t!r} at position {i}, not an integer") from None


class PolicyError(RuntimeError):
    """A model call failed for good (after retries) or returned something unusable."""


class BadResponse(PolicyError):
    """The model service answered, but the answer breaks the policy contract: more
    tokens than the request's ``max_tokens``, log-probs that do not line up with the
    tokens or are not finite log-probabilities, token ids outside the vocabulary, a body
    that is not what the API promises. Such an answer is never stored: the rollout ends
    in a failed leaf with cause ``bad response: ...`` (failure kind ``bad response``),
    is run again with its seed, and if every run of it gets such an answer, the
    collection stops at its wave (:class:`focus.execution.BadResponses`) and a rerun
    runs it again, so no batch keeps the failure. Those failures also count with the
    model service's against a wave's outage share (:class:`focus.execution.Execution`),
    so a service that answers garbage fails the wave at once. The HTTP clients retry an
    answer they cannot parse before giving up with this error."""


class UnreadableAnswers(PolicyError):
    """The model service answers every request in a form the client cannot read (the
    same malformed answer, again and again: another server's answer shape, no token ids
    or log-probs): a setting to fix (``model.kind``, the server's flags), not a fault
    that passes, so it is neither retried further nor run again, and it is no outage.
    It stops the collection at once (the agent and the execution layer let it through);
    ``str()`` leads with the cause (:mod:`focus.backends.unreadable`)."""


class ReplicasDiffer(UnreadableAnswers):
    """The replicas of one model (:class:`focus.backends.FleetPolicy`) serve different
    weights: asked before the first call, or an answer naming other weights than the
    fleet's (a replica restarted on another checkpoint). A setting to fix, as
    :class:`UnreadableAnswers` is, and stopped at once the same way: as a bad response
    it failed each rollout sent there and then the wave as a "model service outage",
    which said a rerun would compute it again, where the rerun met the same replicas."""


class ContextLimit(PolicyError):
    """The model service refused a request because its prompt (with ``max_tokens``) does
    not fit the model's context length (vLLM's and the embedded server's 400 "maximum
    context length", SGLang's "longer than the model's context length"). Nothing is wrong
    with the service or the setting: the episode has outgrown the model, as when it
    reaches the agent's ``max_prompt_tokens``, so the agent ends the rollout in a
    ``truncated`` leaf (cause ``context limit``) that bootstraps on the critic, instead
    of a failed one, whose segment gets no advantage."""


class ServiceUnavailable(PolicyError):
    """The model service gave no usable answer within the client's retries (down,
    unreachable, overloaded, timing out): an outage, not a wrong request. Policy clients
    raise it so the collector can tell an outage from a bad request or answer."""


class Policy(abc.ABC):
    """A model service that samples one response from exact prompt token ids.

    Implementations in ``focus.backends``: ``OpenAICompatPolicy`` (OpenAI-compatible
    completions, as vLLM and the embedded ``LocalModelServer`` serve them),
    ``SGLangPolicy`` (SGLang native), ``LlamaCppPolicy`` (llama.cpp's ``llama-server``),
    ``TinkerPolicy`` and ``FleetPolicy`` (several replicas, calls routed by the search
    tree). Subclass and implement :meth:`sample` to connect another service;
    ``focus.testing.PolicyConformance`` checks the contract.

    What :meth:`sample` raises decides what the collection does (docs/model-services.md,
    failure causes): :class:`ServiceUnavailable` once the service gave no usable answer
    within your retries (an outage: too many in a wave fail it, nothing of it is kept),
    :class:`BadResponse` for an answer that breaks this contract (the rollout is run
    again), :class:`ContextLimit` for a prompt too long for the model (a truncated leaf),
    :class:`PolicyError` for a request refused. Any other exception (a client library's
    ``ConnectionError``) fails only its rollout, cause ``error: ...``, however many do.
    """

    #: Size of the token vocabulary when known; prompts are checked against it.
    vocab_size: int | None = None
    #: An identifier of the weights producing samples, recorded in every batch row.
    policy_version: str = "0"
    #: Whether :meth:`sample_siblings` answers several calls in fewer requests than
    #: calls (then the agent gathers the first calls of sibling rollouts for it,
    #: :mod:`focus.siblings`); the default samples them one by one.
    groups_siblings: bool = False

    @abc.abstractmethod
    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """Sample one response continuing exactly ``prompt_ids``."""

    async def sample_on_route(
        self, prompt_ids: Sequence[int], params: SamplingParams, route: tuple[Hashable, ...]
    ) -> Completion:
        """:meth:`sample`, told the call's route: the path of rollouts it continues (the
        task id, then rollout seeds; :mod:`focus.backends.routing`). A policy over several
        replicas of a model (:class:`focus.backends.FleetPolicy`) sends the call where
        that prefix is cached; any other policy samples as it would without it."""
        return await self.sample(prompt_ids, params)

    async def sample_siblings(
        self, prompt_ids: Sequence[int], params: SamplingParams, routes: Sequence[tuple[Hashable, ...]]
    ) -> list[Completion]:
        """One completion per route, all continuing ``prompt_ids``: completion ``i`` is
        what :meth:`sample_on_route` gives with seed ``params.seed + i`` on ``routes[i]``
        (unseeded when ``params.seed`` is None).

        This is how vLLM serves a request with ``n`` samples and a seed (sample ``i``
        with ``seed + i``), so a server that does so can answer every sibling of a
        checkpoint in one request: one prompt sent, one prefill. The agent calls it for
        the first calls of rollouts that start together from one state with consecutive
        seeds (:meth:`focus.agent.Agent.rollout`); the answers do not depend on whether
        the calls went together. The default samples each one as :meth:`sample_on_route`
        would; :class:`~focus.backends.http_policy.HttpPolicy` sends one request."""
        return list(
            await asyncio.gather(
                *(
                    self.sample_on_route(prompt_ids, params.with_seed(_nth(params.seed, i)), route)
                    for i, route in enumerate(routes)
                )
            )
        )

    async def aclose(self) -> None:  # noqa: B027 - optional hook
        """Release connections. The default has nothing to release."""

    def check_prompt(self, prompt_ids: Sequence[int]) -> None:
        """Reject prompts a server would reject, naming the offending id."""
        if not prompt_ids:
            raise PolicyError("empty prompt: a model call needs at least one token id")
        vocab = self.vocab_size
        # min and max in C first: a prompt of thousands of ids is checked on every call
        if vocab is not None and not (0 <= min(prompt_ids) and max(prompt_ids) < vocab):
            for i, t in enumerate(prompt_ids):
                if not 0 <= t < vocab:
                    raise PolicyError(f"prompt token id {t} at position {i} is outside the vocabulary [0, {vocab})")

    def check_completion(self, completion: Completion, params: SamplingParams | None = None) -> None:
        """Reject an answer longer than ``params.max_tokens`` and sampled ids outside
        the vocabulary, naming the first (:class:`BadResponse`).

        A server that ignores the length limit, or runs another tokenizer (or a
        corrupted answer), would otherwise put rows into the batch that no request
        asked for, or ids that the next prompt - and every trainer - rejects; since
        generated ids are never re-tokenised, this is the one place to catch them.
        The agent calls it on every answer (log-prob alignment is checked when the
        :class:`Completion` is made). An answer that is no :class:`Completion` at all (a
        custom policy's dict, say) is :class:`UnreadableAnswers` naming the policy: every
        call would return one, so it stops the collection.
        """
        if not isinstance(completion, Completion):
            raise UnreadableAnswers(
                f"{type(self).__name__}.sample returned {type(completion).__name__}, expected a Completion "
                "(focus.policy.Completion: token ids, their log-probs, the finish reason)"
            )
        if params is not None and len(completion.token_ids) > params.max_tokens:
            raise BadResponse(
                f"{len(completion.token_ids)} tokens sampled where max_tokens = {params.max_tokens} were asked "
                "(does the server honour max_tokens?)"
            )
        if self.vocab_size is not None:
            check_vocabulary(completion, self.vocab_size)


def check_vocabulary(completion: Completion, vocab: int) -> None:
    """:class:`BadResponse` naming the first sampled id outside ``[0, vocab)``."""
    ids = completion.token_ids
    if not ids or (0 <= min(ids) and max(ids) < vocab):
        return
    for i, t in enumerate(ids):
        if not 0 <= t < vocab:
            raise BadResponse(
                f"sampled token id {t} at position {i} is outside the vocabulary [0, {vocab}) "
                "(does the model match the codec?)"
            )
