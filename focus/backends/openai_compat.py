"""OpenAI-compatible completions, the way vLLM serves them, token-in/token-out.

The prompt goes as a list of token ids (vLLM accepts ``prompt: list[int]``), so the
server never re-tokenises text. ``return_token_ids`` makes vLLM return the sampled
ids (``choices[0].token_ids``); ``return_tokens_as_token_ids`` makes the log-prob
entries name ids as ``"token_id:<id>"``, a second source of the ids that works on
older vLLM releases without ``return_token_ids``. ``logprobs: 0`` asks for the
log-prob of the sampled token only; the sampling fields FOCUS does not model go as
"off" (:data:`NEUTRAL`), never left to the server's defaults. Answers whose ids and log-probs do not line up,
or carry non-finite log-probs, are treated as malformed and retried.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from typing import Any

from focus.backends.foreign import url_problem
from focus.backends.http import Aborted, HttpConfig, MalformedResponse, Unservable
from focus.backends.http_policy import HttpPolicy
from focus.backends.unreadable import PROBE_TOKENS, other_seed
from focus.policy import Completion, PolicyError, SamplingParams, ServiceUnavailable, UnreadableAnswers

log = logging.getLogger(__name__)

#: vLLM's finish reasons (``vllm/v1/engine``); ``repetition``: a request with
#: ``repetition_detection`` cut where its tokens repeat, a server's limit as ``length`` is.
_FINISH = {
    "stop": "stop",
    "length": "length",
    "abort": "abort",
    "error": "error",
    "eos": "stop",
    "repetition": "length",
}
#: Sampling fields FOCUS does not model, sent as "off": a field a request leaves out
#: takes the server's default, which vLLM (``--generation-config auto``, its default)
#: and SGLang (``--preferred-sampling-params``) take from the model's
#: ``generation_config.json`` - Qwen3's ``top_k`` 20, another's ``repetition_penalty``
#: 1.05 - and the tokens would be drawn from another distribution than the one the
#: request names and the trainer recomputes. ``extra_body`` may still set them.
NEUTRAL = {"top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0}
#: Request fields ``extra_body`` may not set, and why: each makes the answer one FOCUS
#: would misread, or the sample another than the one recorded.
NOT_EXTRA = {
    "echo": "the answer's log-probs would start with the prompt's",
    "stream": "the answer would come as server-sent events, and FOCUS reads one JSON body",
    "n": "FOCUS asks for several samples itself, each recorded with its own seed",
    "best_of": "the server would keep the likeliest of several samples: not a sample of the policy",
    "use_beam_search": "beam search does not sample the policy",
    "seed": "FOCUS sends each call's own seed; one for all would make every rollout the same",
    "temperature": "the samples would be of another temperature than the one recorded (agent.sampling.temperature)",
}
#: The served model name a request names when none is given (the embedded server's).
DEFAULT_MODEL = "focus-tinylm"
#: vLLM raises a temperature in (0, this) to this value (``_MAX_TEMP`` in
#: ``vllm/sampling_params.py``, ``SamplingParams.__post_init__``), saying so only in its own
#: log: the tokens are drawn from another distribution than the one the request names and
#: the trainer recomputes (``agent.sampling.temperature``), and so are the log-probs of a
#: processed ``--logprobs-mode``.
VLLM_MIN_TEMPERATURE = 0.01


class OpenAICompatPolicy(HttpPolicy):
    """``POST {base_url}/v1/completions`` with token-id prompts (vLLM and compatibles).

    ``base_url`` is the server root (``http://host:8000``); a trailing ``/v1`` is
    accepted too. ``policy_version`` starts as ``model`` and follows what the server
    reports: its ``policy_version`` field (the embedded server's weights version), else
    the answer's ``model`` (vLLM's served model name); each completion carries it.
    ``extra_body`` is merged into every request (e.g. ``{"top_k": 20}``).
    """

    path = "/v1/completions"

    def __init__(
        self,
        base_url: str,
        model: str = DEFAULT_MODEL,
        *,
        config: HttpConfig | None = None,
        vocab_size: int | None = None,
        extra_body: dict[str, Any] | None = None,
        transport: Any = None,
    ) -> None:
        if why := url_problem(base_url, "base_url"):
            raise ValueError(why)
        root = base_url.rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        self.connect(root, config, transport, probe_body, vocab_size, model)
        self.model = model
        if taken := sorted(set(extra_body or ()) & set(NOT_EXTRA)):
            raise ValueError(
                "model.options.extra_body sets " + "; ".join(f"{k} ({NOT_EXTRA[k]})" for k in taken) + ": leave it out"
            )
        self.extra_body = dict(extra_body or {})

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": list(prompt_ids),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **NEUTRAL,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "skip_special_tokens": False,
            "n": 1,
        }
        if params.stop:
            body["stop"] = list(params.stop)
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(self.extra_body)
        return body

    def parse(self, data: Any) -> Completion:
        return parse_completion(data)

    def parser(self, params: SamplingParams) -> Callable[[Any], Completion]:
        return partial(parse_completion, stop_ids=params.stop_token_ids)

    samples_siblings = True  # vLLM: sample i of a request with n and a seed uses seed + i

    def check_params(self, params: SamplingParams) -> Awaitable[None] | None:
        """:class:`UnreadableAnswers` for a temperature in (0, :data:`VLLM_MIN_TEMPERATURE`)
        when the server is vLLM (a ``/v1/models`` card ``owned_by`` it, asked once; no
        answer counts as not), which would sample at 0.01 instead; other servers (the
        embedded one, SGLang) sample at the temperature asked."""
        if 0 < params.temperature < VLLM_MIN_TEMPERATURE:
            return self._refuse_on_vllm(params)
        if params.seed is not None and self.__dict__.get("_sglang") and "_seeds_ignored" not in self.__dict__:
            return ask_deterministic(self)  # SGLang's completions: the same seeds as its /generate
        return None

    async def _refuse_on_vllm(self, params: SamplingParams) -> None:
        if await self._is_vllm():
            raise UnreadableAnswers(raised_temperature(self.url, params.temperature))

    def check_answer(self, params: SamplingParams, completion: Completion) -> None:
        """The same rule for an answer that names vLLM (``system_fingerprint``
        ``vllm-<version>-...``) where ``/v1/models`` did not (a proxy in front of it). An
        answer of SGLang's (``metadata.weight_version``) has the next seeded call ask it
        whether it honours seeds, as :class:`~focus.backends.sglang.SGLangPolicy` does."""
        if completion.meta.pop("sglang", False):
            self.__dict__.setdefault("_sglang", True)
        fingerprint = completion.meta.pop("system_fingerprint", None)
        if 0 < params.temperature < VLLM_MIN_TEMPERATURE and str(fingerprint).startswith("vllm-"):
            raise UnreadableAnswers(raised_temperature(self.url, params.temperature))

    async def _is_vllm(self) -> bool:
        if (known := self.__dict__.get("_vllm")) is None:  # one GET, not retried or counted (HttpClient.peek)
            known = self.__dict__["_vllm"] = "vllm" in (await self.http.peek("/v1/models", model_owners) or ())
        return bool(known)

    def parse_siblings(self, data: Any, n: int, params: SamplingParams) -> list[Completion]:
        return parse_completions(data, n, params.stop_token_ids)

    version_path = "/v1/models"

    async def served_version(self) -> str | None:
        """The version of :attr:`model`'s card on ``/v1/models`` (:meth:`parse_version`);
        SGLang's (a card ``owned_by`` it) names its weights elsewhere, as its answers do
        (``metadata.weight_version``): its ``weight_version``, where it says one."""
        card = await self.http.request(
            "GET", self.version_path, None, partial(model_card, model=self.model), hedge=False
        )
        if card.get("owned_by") == "sglang" and not card.get("policy_version"):
            try:
                if version := await self.version_at(SGLANG_VERSION_PATHS, weight_version):
                    return await self.with_weights(version)
            except ServiceUnavailable:
                raise
            except PolicyError:  # a release that names no weights: its answers name the model
                pass
        return await self.with_weights(card_version(card))

    says_weights = True

    async def read_weights(self) -> str | None:
        """vLLM's card's ``root``, the path or repository its weights were loaded from
        (``ModelCard`` in ``vllm/entrypoints/openai/protocol.py``), where it is not the
        served name itself; SGLang's ``model_path`` (:func:`sglang_weights`: its card's
        ``root`` is the served name); nothing for a server whose card names its weights
        version (the embedded server's ``policy_version``). One ``GET``, not retried or
        counted (:meth:`HttpClient.peek`)."""
        card = await self.http.peek("/v1/models", partial(model_card, model=self.model))
        if card is None or card.get("policy_version"):
            return None if card is None else ""
        if card.get("owned_by") == "sglang":
            return await sglang_weights(self)
        root = card.get("root")
        return root if isinstance(root, str) and root != card.get("id") else ""

    @staticmethod
    def parse_version(data: Any, model: str | None = None) -> str | None:
        """The version ``model``'s answers will name, which a fleet compares with them:
        the card's ``policy_version`` (the embedded server's weights hash), else its
        ``id``: the served name that vLLM's answers give as ``model`` - a LoRA
        adapter's own card (one with a ``parent``), else the first card, since vLLM
        answers a request for any of its ``--served-model-name`` names with the first
        (some older releases with the name asked for: ``model.model`` should be the first).
        Not vLLM's ``root`` (the weights' path): no answer names it, so a server started
        with ``--served-model-name``, or a LoRA adapter as the model, failed every call
        of a fleet."""
        return card_version(model_card(data, model))


#: Where SGLang says how it was started (``dataclasses.asdict(server_args)`` and more):
#: ``/server_info``, or ``/get_server_info`` on releases before it (later ones keep it as a
#: deprecated alias).
SERVER_INFO_PATHS = ("/server_info", "/get_server_info")


def deterministic_inference(data: Any) -> bool | None:
    """``enable_deterministic_inference`` of a :data:`SERVER_INFO_PATHS` answer (None: not said)."""
    flag = data.get("enable_deterministic_inference") if isinstance(data, dict) else None
    return flag if isinstance(flag, bool) else None


def seeds_ignored(url: str) -> str:
    """The line for an SGLang server that ignores ``sampling_seed``."""
    return (
        f"the SGLang server at {url} was started without --enable-deterministic-inference, so it ignores each "
        "request's sampling_seed and samples anew every time: a retried request, a resumed collection and two "
        "runs of one collection get other samples; FOCUS no longer hedges its requests (two copies would be two "
        "samples, and the faster one favours short completions); start it with --enable-deterministic-inference "
        "for seeded sampling"
    )


def ask_deterministic(policy: HttpPolicy) -> Awaitable[None]:
    """Ask ``policy``'s SGLang server once whether it honours ``sampling_seed``
    (:data:`SERVER_INFO_PATHS`); one warning line and no more hedged requests when it
    does not (:func:`seeds_ignored`). The calls beside the one that asks go on meanwhile."""
    policy.__dict__["_seeds_ignored"] = False

    async def ask() -> None:
        for path in SERVER_INFO_PATHS:  # one GET each, not retried or counted (HttpClient.peek)
            if (flag := await policy.http.peek(path, deterministic_inference)) is not None:
                break
        if flag is False:
            policy.__dict__["_seeds_ignored"] = True
            log.warning("%s", seeds_ignored(policy.url))

    return ask()


def model_owners(data: Any) -> set[str]:
    """The ``owned_by`` of each card in a ``/v1/models`` answer (vLLM's say ``vllm``)."""
    cards = data.get("data") if isinstance(data, dict) else None
    return {c["owned_by"] for c in cards or () if isinstance(c, dict) and isinstance(c.get("owned_by"), str)}


def raised_temperature(url: str, temperature: float) -> str:
    """The line for a temperature vLLM would raise (:data:`VLLM_MIN_TEMPERATURE`)."""
    return (
        f"the model server at {url} is vLLM, which raises a temperature in (0, {VLLM_MIN_TEMPERATURE:g}) to "
        f"{VLLM_MIN_TEMPERATURE:g} (vllm/sampling_params.py, _MAX_TEMP) and says so only in its own log: asked for "
        f"{temperature:g}, it would draw the tokens at {VLLM_MIN_TEMPERATURE:g} (and a processed --logprobs-mode "
        f"would report their log-probs at {VLLM_MIN_TEMPERATURE:g}), not at the temperature recorded and trained "
        f"with; set agent.sampling.temperature to 0 (greedy) or at least "
        f"{VLLM_MIN_TEMPERATURE:g}"
    )


def model_card(data: Any, model: str | None = None) -> dict[str, Any]:
    """``model``'s card in a ``/v1/models`` answer (see :meth:`OpenAICompatPolicy.parse_version`)."""
    cards = data.get("data") if isinstance(data, dict) else None
    cards = [c for c in cards if isinstance(c, dict)] if isinstance(cards, list) else []
    card = next((c for c in cards if c.get("id") == model), None)
    if card is None or not card.get("parent"):  # a base model: vLLM's answers give its first served name
        card = cards[0] if cards else {}
    return card


def card_version(card: dict[str, Any]) -> str | None:
    version = card.get("policy_version") or card.get("id")
    return str(version) if version else None


#: Where SGLang names the weights it serves: ``/model_info``, or ``/get_weight_version``
#: on releases before it (releases since late 2025 refuse that one with 404,
#: "deprecated. Please use '/model_info' instead").
SGLANG_VERSION_PATHS = ("/model_info", "/get_weight_version")


#: Where SGLang says how its weights were loaded (``model_path``): ``/model_info``, or
#: ``/get_model_info`` on releases before it.
SGLANG_INFO_PATHS = ("/model_info", "/get_model_info")


async def sglang_weights(policy: HttpPolicy) -> str | None:
    """SGLang's ``model_path`` (:data:`SGLANG_INFO_PATHS`), the weights it was started on,
    while its ``weight_version`` is the default one (``"default"``, which every
    checkpoint reports until a weights update names another); ``""`` when it names a
    version of its own (the embedded server's hash, a ``--weight-version``) or says
    nothing; None when it did not answer."""
    for path in SGLANG_INFO_PATHS:
        if (info := await policy.http.peek(path, lambda data: data if isinstance(data, dict) else {})) is not None:
            root = info.get("model_path")
            if info.get("weight_version") not in (None, "default") or not isinstance(root, str):
                return ""
            return root
    return None


def weight_version(data: Any) -> str | None:
    """SGLang's ``weight_version`` in an answer of one of :data:`SGLANG_VERSION_PATHS`
    (or its completions answer's ``metadata``)."""
    version = data.get("weight_version") if isinstance(data, dict) else None
    return str(version) if version else None


def unserved_model(base_url: str, model: str, *, headers: dict[str, str] | None = None) -> str | None:
    """One line saying that the server at ``base_url`` does not serve ``model``, or None
    when it does, or does not say (not up yet, no ``/v1/models``, a refusal).

    vLLM (and the embedded server) reject a request naming a model they do not serve
    with 404, which fails each rollout as a refused request: a collection against a
    vLLM server serving another name than ``model.model`` (``focus-tinylm`` when unset)
    would end with every rollout failed and an empty batch. A command asks first."""
    import httpx

    root = base_url.rstrip("/")
    root = root[: -len("/v1")] if root.endswith("/v1") else root
    try:
        answer = httpx.get(f"{root}/v1/models", headers=headers or {}, timeout=3.0, trust_env=False)  # as the client
        data = answer.json() if answer.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None
    cards = data.get("data") if isinstance(data, dict) else None
    ids = [c["id"] for c in cards or () if isinstance(c, dict) and isinstance(c.get("id"), str)]
    if not ids or model in ids:
        return None
    served = ", ".join(repr(i) for i in ids)
    return (
        f"model.model {model!r} is not served at {root} (it serves {served}); set it, e.g. --set model.model={ids[0]}"
    )


def probe_body(body: dict[str, Any], k: int = 1) -> dict[str, Any]:
    """The ``k``-th request beside ``body`` with its settings, to another prompt (its
    first :data:`~focus.backends.unreadable.PROBE_TOKENS` tokens) and another seed: the
    probe that tells a server of another answer format from one request's bad answers."""
    return {**body, "prompt": body["prompt"][:PROBE_TOKENS], "seed": other_seed(body.get("seed"), k)}


def aborted(finish: str, n: int, detail: Any) -> str:
    """Why an answer that ended in ``abort`` or ``error`` is retried, not recorded: the
    server stopped the request itself (a weights update with ``abort_all_requests``, an
    admin abort, an engine error), so its tokens are a cut-off sample that the same seed
    would not give again; recorded, it would end a turn at a random place and make a
    resumed collection differ from an uninterrupted one."""
    why = f": {detail}" if detail else ""
    return f"the server ended the request with finish_reason {finish!r} after {n} token(s){why} (a cut-off sample)"


#: vLLM writes a log-prob below it (``-inf`` included) as this value
#: (``max(logprob, -9999.0)`` in its completions serving): a sampled token's behaviour
#: log-prob there makes a trainer's importance ratio ``exp(new - old)`` overflow, so such
#: an answer is malformed, never recorded (docs/model-services.md).
NEG_INF_STAND_IN = -9999.0

#: Why an answer without ids cannot be used, and what to set on the server.
NO_IDS = (
    "no token ids in the answer, only token texts (never re-tokenised): run vLLM >= 0.8 or start it "
    "with --return-tokens-as-token-ids; for SGLang set model.kind = sglang; behind a proxy (LiteLLM, OpenRouter) "
    "that drops those fields, point model.url at vLLM itself"
)
#: llama-server's ``/v1/completions``: log-probs (only with ``logprobs`` > 0) as
#: ``{"content": [{"id", "token", "logprob", ...}]}``, no ``token_ids``; its native
#: ``/completion`` gives the ids and their log-probs (:mod:`focus.backends.llamacpp`).
LLAMACPP = (
    "this is llama.cpp's llama-server, whose /v1/completions gives no token ids (and no log-probs at logprobs: 0): "
    "set model.kind = llamacpp (its /completion endpoint)"
)


def _llamacpp(data: dict[str, Any]) -> bool:
    """Whether a completions answer is llama-server's: its ``system_fingerprint`` is its
    build, ``b<number>-<commit>`` - ``b0-unknown`` for one built where git could not name
    the commit (a source tarball, a package build: its ``build-info.cmake`` falls back to
    0 and ``unknown``) - or it carries llama-server's ``timings`` (``predicted_per_second``,
    which no OpenAI-compatible answer has). A ``b0-unknown`` build's answer to
    ``logprobs: 0`` (``logprobs: null``) got the line for a dropped field, naming neither
    the server nor the setting to use."""
    fingerprint = data.get("system_fingerprint")
    if isinstance(fingerprint, str) and re.fullmatch(r"b\d+-(?:[0-9a-f]+|unknown)", fingerprint) is not None:
        return True
    timings = data.get("timings")
    return isinstance(timings, dict) and "predicted_per_second" in timings


def chat_logprobs(data: dict[str, Any]) -> str:
    """The line for log-probs in the chat format (``{"content": [...]}``, no token ids)
    from a server that is not known to be llama-server: it names what the answer says of
    the server (``system_fingerprint``, ``model``), nothing more. Other servers give this
    format too (an OpenAI-compatible proxy or gateway that rewrites answers); the line
    named llama-server whatever the server was."""
    said = [f"{k} {data[k]!r}" for k in ("system_fingerprint", "model") if isinstance(data.get(k), str) and data[k]]
    who = f" (the answer names {', '.join(said)})" if said else ""
    return (
        f"the answer's log-probs are in the chat format ('logprobs.content') with no token ids{who}: "
        "FOCUS reads /v1/completions' 'token_logprobs' and 'token_ids' (vLLM); for llama.cpp's llama-server set "
        "model.kind = llamacpp, for SGLang model.kind = sglang"
    )


def _canonical_tokens(tokens: Any, ids: Any) -> bool:
    """Whether ``tokens`` are exactly ``token_id:<id>`` of each of ``ids`` (a list of
    plain ints), as vLLM writes them: what the check that the two agree finds of such an
    answer, without reading each token back (:func:`_token_id`; two microseconds a call
    at three tokens). Anything else (another spelling of an id, a mismatch) is read
    token by token."""
    return type(ids) is list and all(type(i) is int for i in ids) and tokens == [f"token_id:{i}" for i in ids]


def _token_id(tok: Any) -> int:
    if isinstance(tok, str) and tok.startswith("token_id:"):
        digits = tok[len("token_id:") :]
        # int() took ' 7', '+7', '1_0' too, and raised a bare ValueError; a negative id is
        # read, and refused below as one
        if digits.isascii() and digits.removeprefix("-").isdigit():
            return int(digits)
        raise MalformedResponse(f"log-prob token {tok!r} is not of the form 'token_id:<id>'")
    if isinstance(tok, str):  # a token's text: the server ignored both id fields of the request
        raise Unservable(NO_IDS)
    raise MalformedResponse(f"log-prob token {tok!r} is not of the form 'token_id:<id>'")


def server_said(data: Any) -> str:
    """What an answer without the fields asked for says of itself: an error a proxy or
    server sent with status 200 (``{"error": {"message": ...}}``, vLLM's and SGLang's
    ``{"object": "error", "message": ...}``), for the line that names the missing field."""
    if not isinstance(data, dict):
        return ""
    error = data.get("error")
    said = error.get("message") if isinstance(error, dict) else error
    if not said and data.get("object") == "error":
        said = data.get("message")
    return f" but an error: {' '.join(str(said).split())[:200]}" if said else ""


def parse_completion(data: Any, stop_ids: Sequence[int] = ()) -> Completion:
    """A vLLM completions answer -> Completion; MalformedResponse when it cannot be trusted
    (its one choice not sample 0, or more than one: which was sampled as asked?)."""
    return parse_completions(data, 1, stop_ids)[0]


def parse_completions(data: Any, n: int, stop_ids: Sequence[int] = ()) -> list[Completion]:
    """The samples of an answer to a request with ``n`` samples, by their ``index`` (fewer
    than ``n`` when the server gave fewer: one that ignores ``n`` answers one).

    A sample whose last token is one of the request's ``stop_ids`` is ``stop`` even where
    the server says ``length``: vLLM releases whose ``check_stop`` tested the length cap
    first (older releases of its V1 engine) answer ``length`` when the stop id is the last token
    ``max_tokens`` allows, and the complete turn was recorded (and exported) as truncated."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not choices or not isinstance(choices, list) or not all(isinstance(ch, dict) for ch in choices):
        raise MalformedResponse(f"no 'choices' in the answer{server_said(data)}")
    index = [ch.get("index") for ch in choices]
    if len(choices) == 1:  # one that ignores n answers sample 0; another one alone is not sample 0
        numbered = index[0] in (0, None)
    else:
        numbered = len(choices) <= n and all(type(i) is int for i in index) and sorted(index) == list(range(len(index)))
    if not numbered:
        raise MalformedResponse(f"asked for {n} sample(s), the answer's choices are numbered {index}")
    if len(choices) > 1:
        choices = sorted(choices, key=lambda ch: ch["index"])
    return [_parse_choice(data, ch, stop_ids) for ch in choices]


def _parse_choice(data: dict[str, Any], ch: Any, stop_ids: Sequence[int] = ()) -> Completion:
    if not isinstance(ch, dict):
        raise MalformedResponse("a choice of the answer is not an object")
    lp = ch.get("logprobs")
    if not isinstance(lp, dict) or not isinstance(lp.get("token_logprobs"), list):
        if _llamacpp(data):
            raise Unservable(LLAMACPP)
        if isinstance(lp, dict) and isinstance(lp.get("content"), list):
            raise Unservable(chat_logprobs(data))
        raise MalformedResponse("the choice has no 'logprobs.token_logprobs' (was 'logprobs' dropped?)")
    logprobs = lp["token_logprobs"]
    ids = ch.get("token_ids")
    if ids is None:
        ids = [_token_id(t) for t in lp.get("tokens") or []]
    elif (tokens := lp.get("tokens")) and not _canonical_tokens(tokens, ids):
        if all(isinstance(t, str) and t.startswith("token_id:") for t in tokens) and [
            _token_id(t) for t in tokens
        ] != list(ids):
            raise MalformedResponse("'token_ids' and the ids in 'logprobs.tokens' disagree")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids) or (ids and min(ids) < 0):
        raise MalformedResponse(f"'token_ids' is not a list of token ids (ints >= 0): {ids!r}"[:300])
    if len(logprobs) != len(ids):
        raise MalformedResponse(f"{len(ids)} tokens but {len(logprobs)} log-probs")
    values = []
    for i, x in enumerate(logprobs):
        if not isinstance(x, int | float) or not math.isfinite(x):
            raise MalformedResponse(f"log-prob {x!r} of token {i} is not a finite number")
        if x <= NEG_INF_STAND_IN:
            who = "vLLM's" if x == NEG_INF_STAND_IN else "a"  # SGLang's completions write the lowest float32
            raise MalformedResponse(
                f"log-prob {x!r} of sampled token {i} is {who} stand-in for -inf: the server gives the token it "
                "sampled probability 0, so its log-probs are not those of its sampler (see --logprobs-mode)"
            )
        values.append(float(x))
    finish = _FINISH.get(str(ch.get("finish_reason")))
    if finish is None:
        raise MalformedResponse(f"unknown finish_reason {ch.get('finish_reason')!r}")
    if finish in ("abort", "error"):
        raise Aborted(aborted(finish, len(ids), ch.get("stop_reason")))
    if finish == "length" and ids and ids[-1] in stop_ids:
        finish = "stop"
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    meta: dict[str, Any] = {k: data[k] for k in ("policy_version", "model", "id", "system_fingerprint") if k in data}
    if isinstance(data.get("metadata"), dict) and "weight_version" in data["metadata"]:
        meta["sglang"] = True  # SGLang's completions (OpenAICompatPolicy.check_answer)
    echoed = ch.get("prompt_token_ids")
    if isinstance(echoed, list):  # the prompt the server sampled from (HttpPolicy.check_echo)
        meta["prompt_token_ids"] = echoed
    if type(read := usage.get("prompt_tokens")) is int:  # how many of the prompt's tokens it read (check_echo)
        meta["prompt_tokens"] = read
    # the embedded server names its weights, SGLang too (metadata.weight_version; its 'model'
    # is the name asked for); vLLM names the served model (or LoRA adapter)
    version = data.get("policy_version") or weight_version(data.get("metadata")) or data.get("model")
    version = version if isinstance(version, str) and version else None
    return Completion(tuple(ids), tuple(values), finish, cached, meta, version)
