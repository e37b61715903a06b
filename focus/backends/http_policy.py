"""A policy behind one HTTP endpoint of a model server: what every server's client
shares above :class:`~focus.backends.http.HttpClient` (the endpoint's URL, sending a
sample with retries and hedges, following the weights version the server reports,
stats, closing). The servers' own request and answer shapes live in their modules
(:mod:`focus.backends.openai_compat`, :mod:`focus.backends.sglang`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import Any, ClassVar

from focus.backends.foreign import endpoint_in_url, url_problem
from focus.backends.http import HttpClient, HttpConfig
from focus.policy import (
    Completion,
    ContextLimit,
    Policy,
    PolicyError,
    SamplingParams,
    ServiceUnavailable,
    UnreadableAnswers,
)

__all__ = ["HttpPolicy"]

log = logging.getLogger(__name__)

#: vLLM samples greedily below this temperature (its ``_SAMPLING_EPS``; since it raises
#: any temperature in (0, 0.01) to 0.01 first, only at 0) and refuses a greedy request for
#: ``n`` > 1 with status 400 ("n must be 1 when using greedy sampling", every release):
#: siblings at such a temperature go one request each.
GREEDY_BELOW = 1e-5
#: A server that said where its weights came from and, back after failures, does not
#: answer the question is asked this many times more, this many seconds apart
#: (:meth:`HttpPolicy.weights_said`).
WEIGHTS_TRIES, WEIGHTS_RETRY_S = 10, 0.3


class HttpPolicy(Policy):
    """A policy behind one HTTP endpoint of a model server.

    Subclasses name the endpoint (``path``), build the request (:meth:`request_body`)
    and parse the answer (:meth:`parse`, raising :class:`MalformedResponse` on an answer
    that cannot be trusted, and setting the completion's ``policy_version`` to the
    version the server reports); sending with retries, following that version and
    closing the connections are the same for every server. Every completion carries its
    :class:`~focus.backends.retry.CallRecord` in ``meta["http"]``. Only seeded requests
    are hedged: both copies then sample the same tokens, so taking the faster one
    changes nothing but the wait.

    A subclass that wraps :meth:`sample` (to count, log or alter calls) wraps only the
    calls sent one at a time: where the dialect groups siblings (:attr:`groups_siblings`),
    the first calls of sibling rollouts go as one request through
    :meth:`sample_siblings`, which does not call :meth:`sample`. Wrap both, or turn
    the grouping off (``HttpConfig(group_siblings=False)``).
    """

    path: ClassVar[str]
    http: HttpClient

    def connect(
        self,
        base_url: str,
        config: HttpConfig | None,
        transport: Any,
        probe: Callable[[dict[str, Any], int], dict[str, Any]],
        vocab_size: int | None,
        policy_version: str,
    ) -> None:
        """What every dialect's constructor does: the client of the server at ``base_url``
        (refused when it names an endpoint: the dialect adds its own ``path``), with the
        dialect's ``probe`` body, and the vocabulary size and version it starts from."""
        if why := url_problem(base_url, "base_url") or endpoint_in_url(base_url):
            raise ValueError(why)
        self.http = HttpClient(base_url, config, transport=transport, probe=probe)
        self.vocab_size = vocab_size
        self.policy_version = policy_version

    @property
    def url(self) -> str:
        return f"{self.http.base_url}{self.path}"

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, data: Any) -> Completion:
        raise NotImplementedError

    def parser(self, params: SamplingParams) -> Callable[[Any], Completion]:
        """How :meth:`sample` reads an answer to a request with ``params`` (:meth:`parse`;
        a dialect that must apply the request's limits itself binds them here)."""
        return self.parse

    #: Whether the server's answer to one request with ``n`` samples and a seed holds
    #: sample ``i`` drawn with ``seed + i``, as vLLM's does: then :meth:`sample_siblings`
    #: sends one request (set by a dialect that implements :meth:`parse_siblings`).
    samples_siblings: ClassVar[bool] = False

    def parse_siblings(self, data: Any, n: int, params: SamplingParams) -> list[Completion]:
        """The answer to a request for ``n`` samples with ``params``, in sample order
        (fewer when the server gave fewer)."""
        raise NotImplementedError

    def check_params(self, params: SamplingParams) -> Awaitable[None] | None:
        """What to ask the server before a request with ``params`` goes (a dialect's rule;
        by default nothing): an awaitable that refuses ``params`` the server would not
        sample with as they say, or None, the common case, at no cost per call. A
        dialect that finds its server ignores seeds sets ``self.__dict__["_seeds_ignored"]``:
        seeded requests are then not hedged (two copies would be two samples, and the
        faster one favours short completions)."""
        return None

    def check_answer(self, params: SamplingParams, completion: Completion) -> None:
        """Refuse an answer that shows the server did not sample with ``params`` (a
        dialect's rule; by default none)."""

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.check_prompt(prompt_ids)
        if (check := self.check_params(params)) is not None:
            await check
        completion, record = await self.http.call(  # the body straight in: not kept in flight (call())
            "POST",
            self.path,
            self.request_body(prompt_ids, params),
            self.parser(params),
            hedge=params.seed is not None and not self.__dict__.get("_seeds_ignored"),
            size=params.max_tokens,
        )
        self.check_answer(params, completion)
        self.check_echo(prompt_ids, completion)
        said = self.__dict__.get("_weights")
        if said is None or said[0] != self.http._outages.comebacks:  # first contact, or back after failures
            said = await self.weights_said()
        if completion.policy_version:
            if said[1]:  # the answer names the served model only: add the weights it was loaded from
                object.__setattr__(completion, "policy_version", f"{completion.policy_version}@{said[1]}")
            self.policy_version = completion.policy_version
        completion.meta["http"] = record  # meta is the parser's own new dict
        return completion

    @property
    def groups_siblings(self) -> bool:  # type: ignore[override]
        """One request for several siblings' calls: the dialect has it, ``http.group_siblings``
        is on, and the server has not been found to break vLLM's seed rule."""
        return (
            self.samples_siblings and self.http.config.group_siblings and self.__dict__.get("_siblings_ok") is not False
        )

    async def sample_siblings(
        self, prompt_ids: Sequence[int], params: SamplingParams, routes: Sequence[tuple[Hashable, ...]]
    ) -> list[Completion]:
        """One request with ``n = len(routes)`` samples (see
        :meth:`Policy.sample_siblings`) where :attr:`groups_siblings` allows it. The first
        such request of this policy is checked once against a request for its last
        sample alone: a server whose ``n`` does not follow vLLM's seed rule (or ignores
        or refuses ``n``) gets one warning and separate requests from then on, so the answers never
        depend on how calls were grouped. Greedy calls (:data:`GREEDY_BELOW`) go
        separately: vLLM refuses ``n`` > 1 for them."""
        n = len(routes)
        if n < 2 or params.seed is None or params.temperature < GREEDY_BELOW or not self.groups_siblings:
            return await super().sample_siblings(prompt_ids, params, routes)
        if self.__dict__.get("_siblings_ok") is None:
            loop = asyncio.get_running_loop()
            check = self.__dict__.get("_siblings_check")
            if check is None or check.get_loop() is not loop:  # the first grouped request checks the rule
                check = self.__dict__["_siblings_check"] = loop.create_future()
                return await self._check_siblings_rule(check, prompt_ids, params, routes)
            await asyncio.shield(check)  # the others wait for its verdict
            return await self.sample_siblings(prompt_ids, params, routes)
        together = await self._send_siblings(prompt_ids, params, n)
        if len(together) < n:  # the server stopped honouring n: the rest one by one
            more = params.with_seed(params.seed + len(together))
            together += await super().sample_siblings(prompt_ids, more, routes[len(together) :])
        return together

    async def _check_siblings_rule(
        self,
        check: asyncio.Future[None],
        prompt_ids: Sequence[int],
        params: SamplingParams,
        routes: Sequence[tuple[Hashable, ...]],
    ) -> list[Completion]:
        n = len(routes)
        assert params.seed is not None
        try:
            together, alone = await asyncio.gather(
                self._send_siblings(prompt_ids, params, n),
                self.sample(prompt_ids, params.with_seed(params.seed + n - 1)),
                return_exceptions=True,
            )
            if isinstance(alone, BaseException):
                raise alone
            # the lone sample answered and the request for n refused (not an outage): the server refuses n
            if isinstance(together, BaseException) and (
                not isinstance(together, PolicyError) or isinstance(together, ServiceUnavailable)
            ):
                raise together
            ok = self.__dict__["_siblings_ok"] = (
                isinstance(together, list) and len(together) == n and together[-1].token_ids == alone.token_ids
            )
        finally:  # undecided when it failed: the next grouped request checks again
            self.__dict__.pop("_siblings_check", None)
            check.set_result(None)
        if ok and isinstance(together, list):
            together[-1].meta["siblings_check"] = alone  # a request sent too: for a fleet's figures
            return together
        if isinstance(together, BaseException):
            why = f"it refused n = {n}: {' '.join(str(together).split())[:300]}"
        else:
            why = "it ignored n" if len(together) < n else f"sample {n - 1} differs from a request with seed + {n - 1}"
        log.warning(
            "the model server at %s does not answer a request for n samples as vLLM does (sample i with seed + i; "
            "%s): each call goes alone from now on",
            self.url,
            why,
        )
        return await super().sample_siblings(prompt_ids, params, routes)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.pop("_siblings_check", None)  # a future of this process's event loop
        state.pop("_weights_asking", None)
        state.pop("_weights", None)  # another process asks the server itself (its client counts afresh)
        return state

    async def _send_siblings(self, prompt_ids: Sequence[int], params: SamplingParams, n: int) -> list[Completion]:
        self.check_prompt(prompt_ids)
        if (check := self.check_params(params)) is not None:
            await check
        completions, record = await self.http.call(  # the body straight in, as in sample()
            "POST",
            self.path,
            {**self.request_body(prompt_ids, params), "n": n},
            lambda data: self.parse_siblings(data, n, params),
            hedge=True,
            size=params.max_tokens,
        )
        said = self.__dict__.get("_weights")
        if said is None or said[0] != self.http._outages.comebacks:  # first contact, or back after failures
            said = await self.weights_said()
        for c in completions:
            self.check_answer(params, c)
            self.check_echo(prompt_ids, c)
            if c.policy_version:
                if said[1]:  # as in sample()
                    object.__setattr__(c, "policy_version", f"{c.policy_version}@{said[1]}")
                self.policy_version = c.policy_version
            c.meta["http"] = record  # one request: its record is every sample's
        return completions[:n]

    def check_echo(self, prompt_ids: Sequence[int], completion: Completion) -> None:
        """:class:`ContextLimit` when the server says it sampled after fewer prompt tokens
        than were sent (``meta["prompt_tokens"]``, its count of them, where it does not
        echo the prompt) or ran out of context during the answer
        (``meta["context_truncated"]``): see :func:`cut_prompt`.

        :class:`UnreadableAnswers` when the answer names the prompt it sampled from
        (``meta["prompt_token_ids"]``, vLLM's with ``return_token_ids``) and that is not
        the ids sent: something between FOCUS and the model (a proxy that passed the
        prompt on as text, a server that re-tokenised it) changed the prompt, so the
        sample continues another context than the one recorded. Every request is
        changed so; the first such answer stops the collection."""
        echoed = completion.meta.pop("prompt_token_ids", None)
        read = completion.meta.pop("prompt_tokens", None)
        cut = echoed is None and type(read) is int and 0 < read < len(prompt_ids)  # an echo is the authority
        if completion.meta.pop("context_truncated", False) or cut:
            raise ContextLimit(cut_prompt(self.url, len(prompt_ids), read if cut else None))
        if echoed is None or list(echoed) == list(prompt_ids):
            return
        first = next(
            (i for i, (a, b) in enumerate(zip(prompt_ids, echoed, strict=False)) if a != b),
            min(len(prompt_ids), len(echoed)),
        )
        raise UnreadableAnswers(
            f"the model server at {self.url} sampled from another prompt than the token ids sent ({len(prompt_ids)} ids "
            f"sent, {len(echoed)} in its prompt_token_ids, first difference at position {first}): something re-tokenised "
            "it (a proxy such as LiteLLM or OpenRouter passing the prompt on as text?); point model.url at the model "
            "server itself"
        )

    #: Whether the dialect's server says where it loaded its weights from (:meth:`read_weights`).
    says_weights: ClassVar[bool] = False

    async def read_weights(self) -> str | None:
        """Where the server says it loaded the weights it serves (vLLM's ``root``, SGLang's
        ``model_path``), when its answers name only the served model: ``""`` when it
        names its weights itself or does not say, None when it could not be asked."""
        return ""

    async def weights_said(self) -> tuple[int, str]:
        """What the server says of its weights (:meth:`read_weights`), asked at first
        contact and again when it answers after failures a restart gives (no answer,
        502/503/504: :attr:`~focus.backends.outage.OutageTotals.comebacks`), before the
        answer that followed them is recorded; never per call. Each completion's
        ``policy_version`` then carries it (``name@root``), so a server started again on
        other weights under the same served name reports another version, which the
        collection refuses (``PolicyChanged``) rather than mixing two policies' samples in
        one batch. One request at a time (the calls back at once wait for its answer); a
        server that answered before but not now is asked a few times more: taken for
        one that says nothing, its version would read as changed."""
        loop = asyncio.get_running_loop()
        while True:
            epoch = self.http._outages.comebacks  # the client's count, over its event loops
            said = self.__dict__.get("_weights")
            if said is not None and said[0] == epoch:
                return said
            asking = self.__dict__.get("_weights_asking")
            if asking is not None and asking.get_loop() is loop:
                await asyncio.shield(asking)
                continue
            mine: asyncio.Future[None] = loop.create_future()
            self.__dict__["_weights_asking"] = mine
            try:
                root = await self.read_weights() if self.says_weights else ""
                for _ in range(WEIGHTS_TRIES if said is not None and said[1] else 0):
                    if root is not None:
                        break
                    await asyncio.sleep(WEIGHTS_RETRY_S)
                    root = await self.read_weights()
                self.__dict__["_weights"] = (epoch, root or "")
            finally:
                if self.__dict__.get("_weights_asking") is mine:
                    del self.__dict__["_weights_asking"]
                mine.set_result(None)

    #: Where the server names the weights it serves (``GET``), and how to read it.
    version_path: ClassVar[str]

    @staticmethod
    def parse_version(data: Any) -> str | None:
        raise NotImplementedError

    async def served_version(self) -> str | None:
        """The weights version the server says it serves (None when it does not say), as
        its answers will carry it (:meth:`with_weights`)."""
        return await self.with_weights(
            await self.http.request("GET", self.version_path, None, self.parse_version, hedge=False)
        )

    async def with_weights(self, version: str | None) -> str | None:
        """``version`` as an answer's ``policy_version`` carries it: with where the server
        loaded its weights from, where it says (:meth:`weights_said`)."""
        root = (await self.weights_said())[1]
        return f"{version}@{root}" if version and root else version

    async def version_at(self, paths: Sequence[str], parse: Callable[[Any], str | None]) -> str | None:
        """What ``parse`` reads from the first of ``paths`` (``GET``) that the server does
        not refuse: its releases name their weights at different endpoints."""
        for path in paths[:-1]:
            try:
                return await self.http.request("GET", path, None, parse, hedge=False)
            except ServiceUnavailable:
                raise
            except PolicyError:  # refused: a release without this endpoint
                continue
        return await self.http.request("GET", paths[-1], None, parse, hedge=False)

    def stats(self) -> dict[str, Any]:
        """The HTTP client's totals in this process (:meth:`HttpClient.stats`)."""
        return self.http.stats()

    async def aclose(self) -> None:
        await self.http.aclose()


def cut_prompt(url: str, sent: int, read: int | None) -> str:
    """Why an answer sampled after a cut context is not recorded. A server that does not
    refuse a prompt over the model's context cuts it instead - SGLang started with
    ``--allow-auto-truncate`` keeps its first tokens and drops the rest, llama-server
    with ``--context-shift`` drops tokens from the middle and says ``truncated`` - and the
    answer continues a context that is not the one recorded. The episode has outgrown
    the model, as with a server that refuses such a prompt (:class:`ContextLimit`).
    llama-server without its context shift says ``truncated`` too, where an answer
    stopped at the context's end: a sound answer, but the turn after it would not fit
    (the answer cannot tell the two apart), so the episode ends one turn sooner."""
    if read is None:
        what = (
            f"ran out of context during the answer to a prompt of {sent} tokens (truncated: it stopped at the "
            "context's end, or went on after a context shift dropped tokens)"
        )
    else:
        what = (
            f"sampled after {read} of the {sent} prompt tokens sent: it cut a prompt over the model's context "
            "(SGLang's --allow-auto-truncate), or something in between re-tokenised it"
        )
    return f"the model server at {url} {what}; the answer does not continue the prompt recorded"
