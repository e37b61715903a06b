"""SGLang's native ``POST /generate``, token-in/token-out.

The request sends ``input_ids`` and ``sampling_params`` (``max_new_tokens``,
``temperature``, ``top_p``, ``stop``, ``stop_token_ids``, ``sampling_seed``, and
the fields FOCUS does not model as "off": :data:`~focus.backends.openai_compat.NEUTRAL`) with
``return_logprob: true``. SGLang answers ``output_ids`` and, in ``meta_info``,
``output_token_logprobs`` as ``[logprob, token_id, text_or_null]`` triples, a
``finish_reason`` object (``{"type": "stop" | "length" | "abort", ...}``) and
``cached_tokens``, and ``weight_version``, the version of the weights that sampled it,
which each completion (and so each recorded turn) carries as its ``policy_version``.
The ids in the log-prob triples are the authority; ``output_ids``, when present, must
agree with them.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Sequence
from typing import Any

from focus.backends.http import Aborted, HttpConfig, MalformedResponse
from focus.backends.http_policy import HttpPolicy
from focus.backends.openai_compat import (
    NEG_INF_STAND_IN,
    NEUTRAL,
    SGLANG_VERSION_PATHS,
    aborted,
    ask_deterministic,
    server_said,
    sglang_weights,
    weight_version,
)
from focus.backends.unreadable import PROBE_TOKENS, other_seed
from focus.policy import Completion, PolicyError, SamplingParams, ServiceUnavailable, UnreadableAnswers


class SGLangPolicy(HttpPolicy):
    """``POST {base_url}/generate`` of an SGLang server (or the embedded one)."""

    path = "/generate"

    def __init__(
        self,
        base_url: str,
        *,
        config: HttpConfig | None = None,
        vocab_size: int | None = None,
        policy_version: str = "sglang",
        extra_sampling_params: dict[str, Any] | None = None,
        transport: Any = None,
    ) -> None:
        self.connect(base_url, config, transport, probe_body, vocab_size, policy_version)
        self.extra_sampling_params = dict(extra_sampling_params or {})

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        sp: dict[str, Any] = {
            "max_new_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **NEUTRAL,  # not the server's defaults (the model's generation_config.json)
            "skip_special_tokens": False,
        }
        if params.stop:
            sp["stop"] = list(params.stop)
        if params.stop_token_ids:
            sp["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            sp["sampling_seed"] = params.seed
        sp.update(self.extra_sampling_params)
        return {"input_ids": list(prompt_ids), "sampling_params": sp, "return_logprob": True, "stream": False}

    def parse(self, data: Any) -> Completion:
        return parse_generate(data)

    def check_params(self, params: SamplingParams) -> Awaitable[None] | None:
        """Once, at the first seeded call (:func:`ask_deterministic`): whether the server
        was started with ``--enable-deterministic-inference`` (its ``/server_info``, or ``/get_server_info``
        on releases before it). Without it SGLang ignores ``sampling_seed``
        (``SamplingBatchInfo.from_schedule_batch`` builds the seed tensor only then, and
        the sampler draws unseeded), so a seeded request samples anew each time: one
        warning line, and its seeded requests are no longer hedged (:func:`seeds_ignored`).
        A server that does not say (an older release, a proxy, no answer) is left as it is."""
        if params.seed is None or "_seeds_ignored" in self.__dict__:
            return None
        return ask_deterministic(self)

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        """:meth:`HttpPolicy.sample`; a seeded call that gave up on status 500 before any
        seeded answer is told apart from an outage (:func:`seeds_refused`)."""
        try:
            completion = await super().sample(prompt_ids, params)
        except ServiceUnavailable as e:
            if params.seed is not None and not self.__dict__.get("_seeds_ok") and "status 500" in str(e):
                if await self._answers_unseeded(prompt_ids, params):
                    raise UnreadableAnswers(seeds_refused(self.url)) from e
            raise
        if params.seed is not None:
            self.__dict__["_seeds_ok"] = True
        return completion

    async def _answers_unseeded(self, prompt_ids: Sequence[int], params: SamplingParams) -> bool:
        """Whether the request that failed answers without ``sampling_seed`` (one token)."""
        one = params.model_copy(update={"seed": None, "max_tokens": 1})
        try:
            await self.http.request("POST", self.path, self.request_body(prompt_ids, one), parse_generate, hedge=False)
        except PolicyError:
            return False
        return True

    version_path = SGLANG_VERSION_PATHS[0]

    async def served_version(self) -> str | None:
        """The ``weight_version`` at the first of :data:`~focus.backends.openai_compat.SGLANG_VERSION_PATHS`
        that the server has."""
        return await self.with_weights(await self.version_at(SGLANG_VERSION_PATHS, self.parse_version))

    says_weights = True

    async def read_weights(self) -> str | None:
        """:func:`~focus.backends.openai_compat.sglang_weights`: its ``model_path``."""
        return await sglang_weights(self)

    parse_version = staticmethod(weight_version)


def parse_generate(data: Any) -> Completion:
    """An SGLang ``/generate`` answer -> Completion; MalformedResponse when untrustworthy."""
    if isinstance(data, list):  # a batch answer; we send one prompt
        if len(data) != 1:
            raise MalformedResponse(f"expected one result, got {len(data)}")
        data = data[0]
    meta = data.get("meta_info") if isinstance(data, dict) else None
    if not isinstance(meta, dict):
        raise MalformedResponse(f"no 'meta_info' in the answer{server_said(data)}")
    triples = meta.get("output_token_logprobs")
    if not isinstance(triples, list):
        raise MalformedResponse("no 'meta_info.output_token_logprobs' (was return_logprob dropped?)")
    ids: list[int] = []
    lps: list[float] = []
    for i, tr in enumerate(triples):
        if not isinstance(tr, list | tuple) or len(tr) < 2 or not isinstance(tr[1], int) or tr[1] < 0:
            raise MalformedResponse(f"log-prob entry {i} is not [logprob, token_id, text]: {tr!r}")
        lp = tr[0]
        if not isinstance(lp, int | float) or not math.isfinite(lp):
            raise MalformedResponse(f"log-prob {lp!r} of token {i} is not a finite number")
        if lp <= NEG_INF_STAND_IN:
            raise MalformedResponse(clamped(lp, i))
        ids.append(tr[1])
        lps.append(float(lp))
    out_ids = data.get("output_ids")
    if out_ids is not None and list(out_ids) != ids:
        raise MalformedResponse(f"'output_ids' ({len(out_ids)} ids) disagree with the log-prob ids ({len(ids)})")
    fr = meta.get("finish_reason")
    kind = fr.get("type") if isinstance(fr, dict) else fr
    finish = {"stop": "stop", "length": "length", "abort": "abort"}.get(str(kind))
    if finish is None:
        raise MalformedResponse(f"unknown finish_reason {fr!r}")
    if finish == "abort":  # e.g. a weights update with abort_all_requests: retried (aborted())
        raise Aborted(aborted(finish, len(ids), fr.get("message") if isinstance(fr, dict) else None))
    cached = meta.get("cached_tokens")
    extra = {k: meta[k] for k in ("policy_version", "weight_version", "id") if k in meta}
    if type(read := meta.get("prompt_tokens")) is int:  # the input ids it sampled after (HttpPolicy.check_echo)
        extra["prompt_tokens"] = read
    # SGLang names the weights that sampled the answer (set by weight updates)
    version = meta.get("weight_version") or meta.get("policy_version")
    version = version if isinstance(version, str) and version else None
    return Completion(tuple(ids), tuple(lps), finish, cached if isinstance(cached, int) else None, extra, version)


def clamped(lp: float, i: int) -> str:
    """Why a sampled token's log-prob at or below -9999 is refused. SGLang's sampler
    writes the log of a probability of 0 as the lowest float32, -3.4e38
    (``torch.log(probs).clamp(min=torch.finfo(probs.dtype).min)``, "to avoid -inf"), as
    vLLM writes ``-9999.0`` and llama-server the lowest float: on a sampled token it says
    the server gives the token it drew probability 0, and recorded as a behaviour
    log-prob it makes a trainer's ratio ``exp(new - old)`` overflow (it was recorded)."""
    return (
        f"log-prob {lp!r} of sampled token {i} is a stand-in for -inf (SGLang clamps the log of a probability "
        "of 0 to the lowest float, -3.4e38): the server gives the token it sampled probability 0, so its "
        "log-probs are not those of its sampler"
    )


def seeds_refused(url: str) -> str:
    """The line for an SGLang that cannot take ``sampling_seed``: releases before its
    deterministic-inference work (September 2025) build ``SamplingParams(**params)``
    from a class without that field, and the ``TypeError`` is a bare 500 on every
    seeded request, which read as an outage. FOCUS seeds every request (resumes, hedges
    and siblings rely on it), so it cannot go on without."""
    return (
        f"the SGLang server at {url} answered a request carrying sampling_seed with status 500 on every try "
        "and the same request without it: it predates per-request seeds (September 2025), which FOCUS sends "
        "with every request; run a later SGLang release"
    )


def probe_body(body: dict[str, Any], k: int = 1) -> dict[str, Any]:
    """:func:`focus.backends.openai_compat.probe_body` for ``/generate``: the first
    tokens of ``body``'s prompt, the ``k``-th other seed, the same settings."""
    sp = {**body["sampling_params"], "sampling_seed": other_seed(body["sampling_params"].get("sampling_seed"), k)}
    return {**body, "input_ids": body["input_ids"][:PROBE_TOKENS], "sampling_params": sp}
