"""llama.cpp's ``llama-server`` native ``POST /completion``, token-in/token-out.

The prompt goes as a list of token ids (``llama-server`` adds no BOS to a prompt of ids);
``return_tokens`` returns the sampled ids (``tokens``) and ``n_probs: 1`` adds
``completion_probabilities``, one entry per token with its ``id`` and ``logprob``: the
log of the softmax of the raw logits (before temperature and truncation, as vLLM's
default ``raw_logprobs``), or with ``post_sampling_probs: true`` (``extra_body``) the
probability the token was drawn with, as ``prob`` (its log is recorded).

What ``llama-server`` does not do as vLLM does, and what this client does about it:

* No ``stop_token_ids``: it stops at the model's end-of-generation tokens only. The
  answer is cut after the first of the request's stop ids (``finish_reason`` ``stop``):
  the tokens before it were drawn the same whether the server stopped there or went on.
  Tokens past ``max_tokens`` are cut the same way (``length``).
* No log-prob for a token that leaves the text inside a UTF-8 character (it records one
  only once the character is complete), nor for the tokens of a matched stop string
  (it drops as many as the stop string re-tokenises to). The entries carry their ids;
  an answer with fewer entries than tokens is malformed as a whole, never matched up by
  guesswork (retried; the same seed gives it again, so the rollout fails as a bad
  response and the collection stops at its wave), and stop strings are refused before
  any request.
* Its sampler chain is set to ``temperature`` then ``top_p`` only (``samplers``), with
  top-k, min-p, typical-p, the penalties, DRY, XTC and mirostat off: the distribution
  the request names, not the server's defaults (top-k 40, min-p 0.05).
* With speculative decoding (a draft model), no log-prob for the tokens it accepts from
  a draft: their entries hold a placeholder probability 1 and no top log-probs, where
  ``n_probs: 1`` lists one. Such an answer is malformed as a whole, never recorded with
  log-prob 0 for those tokens.
* No weights version: each completion carries ``policy_version`` as configured.
* No ``n`` samples with vLLM's seed rule: siblings go one request each.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import partial
from typing import Any

from focus.backends.http import HttpConfig, MalformedResponse
from focus.backends.http_policy import HttpPolicy
from focus.backends.unreadable import PROBE_TOKENS, other_seed
from focus.policy import Completion, SamplingParams, UnreadableAnswers

#: The sampling FOCUS models, in the order the trainer recomputes it, and every other
#: sampler of ``llama-server`` off (its defaults: top-k 40, top-p 0.95, min-p 0.05).
SAMPLING = {
    "samplers": ["temperature", "top_p"],
    "top_k": 0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "dry_multiplier": 0.0,
    "xtc_probability": 0.0,
    "mirostat": 0,
    "dynatemp_range": 0.0,
}
_FINISH = {"eos": "stop", "word": "stop", "limit": "length"}


class LlamaCppPolicy(HttpPolicy):
    """``POST {base_url}/completion`` of llama.cpp's ``llama-server`` (see module)."""

    path = "/completion"

    def __init__(
        self,
        base_url: str,
        *,
        config: HttpConfig | None = None,
        vocab_size: int | None = None,
        policy_version: str = "llamacpp",
        extra_body: dict[str, Any] | None = None,
        transport: Any = None,
    ) -> None:
        self.connect(base_url, config, transport, probe_body, vocab_size, policy_version)
        self.extra_body = dict(extra_body or {})

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        if params.stop:
            raise UnreadableAnswers(
                f"llama-server ({self.url}) drops the log-probs of a matched stop string's tokens by re-tokenising "
                f"it, so stop strings {list(params.stop)!r} cannot be sampled token-exactly there: stop on token ids "
                "(the format codec's stop_token_ids) and leave SamplingParams.stop empty, or serve with vLLM"
            )
        body: dict[str, Any] = {
            "prompt": list(prompt_ids),
            "n_predict": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            **SAMPLING,
            "n_probs": 1,
            "return_tokens": True,
            "stream": False,
            "cache_prompt": True,
        }
        if params.seed is not None:
            body["seed"] = params.seed
        body.update(self.extra_body)
        return body

    def parse(self, data: Any) -> Completion:
        return parse_completion(data)

    def parser(self, params: SamplingParams) -> Any:
        return partial(parse_completion, stop_ids=params.stop_token_ids, max_tokens=params.max_tokens)

    version_path = "/props"

    @staticmethod
    def parse_version(data: Any) -> str | None:
        return None  # llama-server names no weights version: model.policy_version does


def parse_completion(data: Any, stop_ids: Sequence[int] = (), max_tokens: int | None = None) -> Completion:
    """A ``/completion`` answer -> Completion, cut after the first of ``stop_ids`` and at
    ``max_tokens``; MalformedResponse when a token has no log-prob or the answer cannot
    be trusted."""
    if not isinstance(data, dict):
        raise MalformedResponse("the answer is not an object")
    ids = data.get("tokens")
    entries = data.get("completion_probabilities")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids) or (entries and not ids):
        raise MalformedResponse("no 'tokens' in the answer (return_tokens): run a llama-server of 2025 or later")
    if ids and min(ids) < 0:
        raise MalformedResponse(f"'tokens' holds a negative token id: {ids[:20]!r}")
    if not isinstance(entries, list):
        if not ids:  # nothing sampled: no entries to give
            entries = []
        else:
            raise MalformedResponse("no 'completion_probabilities' in the answer (was n_probs dropped?)")
    lps = _logprobs(ids, entries)
    finish = _FINISH.get(str(data.get("stop_type")))
    if finish is None:
        raise MalformedResponse(f"unknown stop_type {data.get('stop_type')!r} (not eos, word or limit)")
    stops = set(stop_ids)
    end = next((i + 1 for i, t in enumerate(ids) if t in stops), None)
    if end is not None:
        finish = "stop"
    else:
        end = len(ids)
    if max_tokens is not None and end > max_tokens:
        end, finish = max_tokens, "length"
    timings = data.get("timings")
    cached = timings.get("cache_n") if isinstance(timings, dict) else None
    meta = {k: data[k] for k in ("model", "id_slot") if k in data}
    if data.get("truncated") is True:  # the context ran out: shifted or cut (HttpPolicy.check_echo)
        meta["context_truncated"] = True
    return Completion(tuple(ids[:end]), tuple(lps[:end]), finish, cached if isinstance(cached, int) else None, meta)


def _logprobs(ids: list[int], entries: list[Any]) -> list[float]:
    """The log-prob of each of ``ids``: entry ``i`` must be token ``i``'s (its ``id``).
    One entry fewer anywhere and every later entry is another token's, so an answer
    with fewer entries than tokens is malformed as a whole (the message names the first
    token without one), never matched up by guesswork."""
    if any(isinstance(e, dict) and "id" not in e for e in entries):  # releases before 2025: token texts only
        raise MalformedResponse(
            "log-prob entries without token ids ('probs' of token texts): run a llama-server of 2025 or later"
        )
    if len(entries) != len(ids) or any(
        not isinstance(e, dict) or e.get("id") != t for e, t in zip(entries, ids, strict=False)
    ):
        k = 0
        for i, t in enumerate(ids):
            if k < len(entries) and isinstance(entries[k], dict) and entries[k].get("id") == t:
                k += 1
                continue
            raise MalformedResponse(
                f"no log-prob for token {i} (id {t}) of the answer ({len(ids)} tokens, {len(entries)} log-probs): "
                "llama-server gives none for a token that ends inside a UTF-8 character"
            )
        raise MalformedResponse(f"{len(entries)} log-prob entries for {len(ids)} sampled tokens (ids {ids[:20]})")
    return [_value(e, i) for i, e in enumerate(entries)]


#: llama-server writes the log of a probability of 0 as the lowest float32 (its
#: ``completion_token_output::logarithm``: its JSON library would write ``-inf`` as
#: ``null``), as vLLM writes ``-9999.0``: on a sampled token it says the server gives
#: the token it drew probability 0 (a logit bias or grammar applied after the log-probs
#: were taken), and recorded as a behaviour log-prob it makes a trainer's ratio
#: ``exp(new - old)`` overflow, so such an answer is malformed, never recorded.
LOWEST_FLOAT32 = -3.4028234663852886e38


def _value(entry: dict[str, Any], i: int) -> float:
    if entry.get("top_logprobs", entry.get("top_probs")) == []:  # n_probs >= 1 lists at least one
        raise MalformedResponse(
            f"log-prob entry {i} (id {entry.get('id')}) is a placeholder (no top log-probs): llama-server gives a "
            "token it accepted from a speculative draft probability 1 without computing it, so those log-probs are "
            "not its sampler's; start it without speculative decoding (no draft model), or serve with vLLM"
        )
    if "logprob" in entry:
        x = entry["logprob"]
        if isinstance(x, int | float) and math.isfinite(x) and x <= LOWEST_FLOAT32:
            raise MalformedResponse(
                f"log-prob {x!r} of sampled token {i} is llama-server's stand-in for -inf (the lowest float): the "
                "server gives the token it sampled probability 0, so its log-probs are not those of its sampler"
            )
        if isinstance(x, int | float) and math.isfinite(x) and x <= 0:
            return float(x)
    elif "prob" in entry:  # post_sampling_probs
        p = entry["prob"]
        if isinstance(p, int | float) and 0 < p <= 1:
            return math.log(p)
    raise MalformedResponse(f"log-prob entry {i} holds no finite log-prob: {entry!r}"[:300])


def probe_body(body: dict[str, Any], k: int = 1) -> dict[str, Any]:
    """:func:`focus.backends.openai_compat.probe_body` for ``/completion``."""
    return {**body, "prompt": body["prompt"][:PROBE_TOKENS], "seed": other_seed(body.get("seed"), k)}
