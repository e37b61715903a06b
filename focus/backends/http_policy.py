"""A policy behind one HTTP endpoint of a model server: what every server's client
shares above :class:`~focus.backends.http.HttpClient` (the endpoint's URL, sending a
sample with retries and hedges, following the weights version the server reports,
stats, closing). The servers' own request and answer shapes live in their modules
(:mod:`focus.backends.openai_compat`, :mod:`focus.backends.sglang`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from focus.backends.http import HttpClient
from focus.policy import Completion, Policy, SamplingParams

__all__ = ["HttpPolicy"]


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
    """

    path: ClassVar[str]
    http: HttpClient

    @property
    def url(self) -> str:
        return f"{self.http.base_url}{self.path}"

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        raise NotImplementedError

    def parse(self, data: Any) -> Completion:
        raise NotImplementedError

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.check_prompt(prompt_ids)
        completion, record = await self.http.call(  # the body straight in: not kept in flight (call())
            "POST",
            self.path,
            self.request_body(prompt_ids, params),
            self.parse,
            hedge=params.seed is not None,
            size=params.max_tokens,
        )
        if completion.policy_version:
            self.policy_version = completion.policy_version
        completion.meta["http"] = record  # meta is the parser's own new dict
        return completion

    #: Where the server names the weights it serves (``GET``), and how to read it.
    version_path: ClassVar[str]

    @staticmethod
    def parse_version(data: Any) -> str | None:
        raise NotImplementedError

    async def served_version(self) -> str | None:
        """The weights version the server says it serves (None when it does not say)."""
        return await self.http.request("GET", self.version_path, None, self.parse_version, hedge=False)

    def stats(self) -> dict[str, Any]:
        """The HTTP client's totals in this process (:meth:`HttpClient.stats`)."""
        return self.http.stats()

    async def aclose(self) -> None:
        await self.http.aclose()
