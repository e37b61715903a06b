"""Generation for the tiny model: KV-cached decoding, exact log-probs, a prefix cache.

The engine is synchronous and thread-safe; the HTTP server runs it in worker threads
so its event loop never blocks. The prefix cache is what a real server's radix/prefix
cache does for FOCUS: continuations from a checkpoint resend the identical prompt
prefix, and the engine reports how many prompt tokens it did not recompute
(``cached_tokens``), which tests use to observe prefix reuse from the server side.
"""

from __future__ import annotations

import os
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from focus.format import ByteCodec
from focus.tinylm.model import KVCache, TinyLM, load, sampling_distribution, weights_version


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False


@dataclass(frozen=True)
class GenResult:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    #: "stop" (a stop id or string, or end of turn) or "length".
    finish_reason: str
    #: The stop id or string that ended sampling, if any.
    matched: int | str | None
    cached_tokens: int
    policy_version: str


class EngineError(ValueError):
    """The request cannot be served (bad ids, too long); the server answers 400."""


class Engine:
    """Loads weights, samples, reloads weights; keeps a small LRU prefix cache."""

    def __init__(self, weights: str | os.PathLike[str] | None = None, *, prefix_cache_size: int = 64) -> None:
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[int, ...], tuple[KVCache, torch.Tensor]] = OrderedDict()
        self.prefix_cache_size = prefix_cache_size
        self.codec = ByteCodec()
        self.model, self.policy_version, self.weights_path = self._load(weights)

    @staticmethod
    def _load(weights: str | os.PathLike[str] | None) -> tuple[TinyLM, str, str]:
        from focus.tinylm.model import DEFAULT_WEIGHTS

        path = str(weights) if weights is not None else str(DEFAULT_WEIGHTS)
        return load(path), weights_version(path), path

    @property
    def max_len(self) -> int:
        return self.model.cfg.max_len

    @property
    def vocab_size(self) -> int:
        return self.model.cfg.vocab_size

    def reload(self, weights: str | os.PathLike[str]) -> str:
        """Swap in new weights atomically; running requests finish on the old ones."""
        model, version, path = self._load(weights)
        with self._lock:
            self.model, self.policy_version, self.weights_path = model, version, path
            self._cache.clear()
        return version

    def check(self, req: GenRequest) -> None:
        if not req.prompt_ids:
            raise EngineError("empty prompt: send at least one token id")
        for i, t in enumerate(req.prompt_ids):
            if not 0 <= t < self.vocab_size:
                raise EngineError(
                    f"prompt token id {t} at position {i} is outside the vocabulary [0, {self.vocab_size})"
                )
        if len(req.prompt_ids) + req.max_tokens > self.max_len:
            raise EngineError(
                f"prompt of {len(req.prompt_ids)} tokens plus max_tokens {req.max_tokens} exceeds "
                f"the model's context of {self.max_len} tokens"
            )
        if req.max_tokens < 1:
            raise EngineError("max_tokens must be at least 1")
        if req.temperature < 0 or not 0 < req.top_p <= 1:
            raise EngineError(f"invalid temperature {req.temperature} or top_p {req.top_p}")

    def _lookup(self, prompt: tuple[int, ...]) -> tuple[int, KVCache | None, torch.Tensor | None]:
        """Longest cached prefix of ``prompt``: (length, cache, logits after it)."""
        best: tuple[int, KVCache | None, torch.Tensor | None] = (0, None, None)
        with self._lock:
            for key, (kv, logits) in self._cache.items():
                n = len(key)
                if n <= len(prompt) and n > best[0] and prompt[:n] == key:
                    best = (n, kv, logits)
            if best[0]:
                self._cache.move_to_end(prompt[: best[0]])
        return best

    def _store(self, prompt: tuple[int, ...], kv: KVCache, logits: torch.Tensor, model: TinyLM) -> None:
        with self._lock:
            if model is not self.model:  # weights changed while we ran: the cache is stale
                return
            self._cache[prompt] = (kv, logits)
            self._cache.move_to_end(prompt)
            while len(self._cache) > self.prefix_cache_size:
                self._cache.popitem(last=False)

    @torch.no_grad()
    def generate(self, req: GenRequest) -> GenResult:
        self.check(req)
        with self._lock:
            model, version = self.model, self.policy_version
        prompt = req.prompt_ids
        n_cached, kv, logits = self._lookup(prompt)
        if n_cached < len(prompt):
            out, kv = model(torch.tensor([prompt[n_cached:]]), kv)
            logits = out[0, -1]
            self._store(prompt, kv, logits, model)
        assert kv is not None and logits is not None
        seed = req.seed if req.seed is not None else random.SystemRandom().randrange(2**63)
        gen = torch.Generator().manual_seed(seed)
        stops = set(req.stop_token_ids)
        if not req.ignore_eos:
            stops.add(ByteCodec.EOT)
        ids: list[int] = []
        lps: list[float] = []
        finish: str = "length"
        matched: int | str | None = None
        for _ in range(req.max_tokens):
            probs = sampling_distribution(logits, req.temperature, req.top_p)
            tok = int(torch.multinomial(probs, 1, generator=gen)) if req.temperature > 0 else int(probs.argmax())
            ids.append(tok)
            lps.append(float(torch.log(probs[tok])))
            if tok in stops:
                finish, matched = "stop", tok
                break
            hit = _stop_string(self.codec.decode(ids), req.stop)
            if hit is not None:
                finish, matched = "stop", hit
                break
            if len(ids) == req.max_tokens:
                break
            out, kv = model(torch.tensor([[tok]]), kv)
            logits = out[0, -1]
        return GenResult(tuple(ids), tuple(lps), finish, matched, n_cached, version)


def _stop_string(text: str, stops: Sequence[str]) -> str | None:
    for s in stops:
        if s and s in text:
            return s
    return None
