"""The tiny model's inference engine: continuous batching over a prefix cache.

One scheduler thread owns the model. Each iteration it (1) admits queued requests and
prefills their prompts in chunks (a bounded number of tokens per iteration, so running
sequences keep decoding), reusing the longest cached prefix; (2) samples the next token
of every running sequence at once (:func:`focus.tinylm.sampler.sample`); (3) runs one
forward over all sequences that continue, each attending to exactly its own keys in a
shared slot buffer. Requests that arrive while others decode join at the next
iteration; finished ones leave and their keys and values go to the prefix cache.

Numerics are cache- and batch-invariant (:mod:`focus.tinylm.numerics`): a request's ids
and log-probs do not depend on what is cached or on what else is decoded. Sampling
draws from a per-request random stream (:class:`focus.tinylm.sampler.Stream`, seeded by
the request's ``seed``; sample ``i`` of ``n`` uses ``seed + i``, as vLLM does).

Liveness: :meth:`Engine.step_s` is how long the scheduler's current iteration has run (0
while it waits for work). An iteration is one token of every running sequence (and a
bounded prefill), milliseconds on this model, so a long generation is many short
iterations; an engine stuck inside one (or whose thread died in one) reports a time that
only grows, which ``/health`` answers with (:mod:`focus.tinylm.app`).

Weights are swapped with :meth:`Engine.reload` while serving: requests already
admitted finish on the weights they started with (their own batch drains); requests
admitted afterwards use the new weights; the prefix cache is cleared.
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from focus.format import ByteCodec
from focus.tinylm.arch import DEFAULT_WEIGHTS, TinyConfig, read_weights, weights_version
from focus.tinylm.cache import Hit, LayerKV, PrefixCache
from focus.tinylm.numerics import InvariantLM, log_softmax, value_magnitudes
from focus.tinylm.sampler import LOGPROBS_MODES, Draw, RowParams, Stream, describe, sample


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: tuple[int, ...]
    #: 0 only scores the prompt (SGLang's ``max_new_tokens: 0``, vLLM's echo-only).
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False
    min_tokens: int = 0
    #: Alternatives reported per sampled token besides it (vLLM ``logprobs``).
    logprobs: int = 0
    #: None: no prompt log-probs; k: every prompt token's log-prob and k alternatives.
    prompt_logprobs: int | None = None


@dataclass(frozen=True)
class GenResult:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    #: "stop" (a stop id or string, or end of turn), "length" or "abort".
    finish_reason: str
    #: The stop id or string that ended sampling, if any.
    matched: int | str | None
    cached_tokens: int
    policy_version: str
    #: Per sampled token: its rank and the requested top alternatives (id, value).
    ranks: tuple[int, ...] = ()
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()
    #: Per prompt token (None for the first), when asked for.
    prompt_logprobs: tuple[Draw | None, ...] | None = None


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token of a streaming request (``index`` in the completion) that does
    not end it: the stop check comes first, and the token that ends a request arrives
    with its :class:`GenResult` (so a stream never sends text the answer removes).
    ``version``: the weights that sampled it (a reload does not move running requests);
    ``cached``: the request's prompt tokens found in the prefix cache."""

    index: int
    draw: Draw
    version: str
    cached: int


class EngineError(ValueError):
    """The request cannot be served (bad ids, too long); the server answers 400."""


@dataclass(eq=False)
class _Weights:
    lm: InvariantLM
    version: str
    path: str


@dataclass(eq=False)
class _Seq:
    req: GenRequest
    on_event: Callable[[Any], None]
    stream: bool
    stream_rng: Stream
    weights: _Weights | None = None
    kv: LayerKV = field(default_factory=list)
    done: int = 0
    cached: int = 0
    logits: np.ndarray | None = None
    ids: list[int] = field(default_factory=list)
    draws: list[Draw] = field(default_factory=list)
    prompt_lp: list[Draw | None] | None = None
    cancelled: bool = False

    @property
    def prompt(self) -> tuple[int, ...]:
        return self.req.prompt_ids


class Handle:
    """A submitted request; :meth:`cancel` aborts it (a client that went away)."""

    def __init__(self, seq: _Seq, engine: Engine) -> None:
        self._seq, self._engine = seq, engine

    def cancel(self) -> None:
        self._seq.cancelled = True
        self._engine._wake()


class _SeqStore:
    """Keys and values of one sequence being prefilled (grown chunk by chunk)."""

    def __init__(self, seq: _Seq) -> None:
        self.seq = seq

    def extend(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        old_k, old_v = self.seq.kv[layer]
        nk, nv = np.concatenate([old_k, k[0]], axis=1), np.concatenate([old_v, v[0]], axis=1)
        self.seq.kv[layer] = (nk, nv)
        return nk[None].astype(np.float64), nv[None].astype(np.float64), value_magnitudes(nv[None])


class _Batch:
    """The running sequences of one set of weights, in a shared slot buffer.

    Slot ``i`` holds ``seqs[i]``'s keys and values: (slots, heads, capacity, head_dim)
    per layer, in float64 so that a decode step reads them without a conversion (the
    values are float32's; the prefix cache keeps them in float32), and their magnitudes
    (:func:`focus.tinylm.numerics.value_magnitudes`). Slots stay contiguous (a leaving
    sequence's slot is refilled from the last one), so a decode step reads one view
    ``[:B, :, :L]``.
    """

    def __init__(self, weights: _Weights) -> None:
        self.weights = weights
        lm = weights.lm
        self.shape = (lm.n_heads, lm.head_dim)
        self.seqs: list[_Seq] = []
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.vabs: list[np.ndarray] = []
        self._alloc(8, 64)
        self.positions = np.zeros(0, dtype=np.int64)

    def _alloc(self, slots: int, cap: int) -> None:
        h, hd = self.shape
        layers = range(self.weights.lm.n_layers)
        old = (self.k, self.v, self.vabs)
        self.k = [np.zeros((slots, h, cap, hd)) for _ in layers]
        self.v = [np.zeros((slots, h, cap, hd)) for _ in layers]
        self.vabs = [np.zeros((slots, h, cap)) for _ in layers]
        if old[0]:
            s, c = min(slots, old[0][0].shape[0]), min(cap, old[0][0].shape[2])
            for new, prev in zip((self.k, self.v, self.vabs), old, strict=True):
                for n, p in zip(new, prev, strict=True):
                    n[:s, :, :c] = p[:s, :, :c]

    def _ensure(self, slots: int, length: int) -> None:
        cur_s, cur_c = self.k[0].shape[0], self.k[0].shape[2]
        if slots > cur_s or length > cur_c:
            s, c = cur_s, cur_c
            while s < slots:
                s *= 2
            while c < length:
                c *= 2
            self._alloc(s, c)

    def add(self, seq: _Seq) -> None:
        n = seq.kv[0][0].shape[1]
        self._ensure(len(self.seqs) + 1, n + 1)
        slot = len(self.seqs)
        for layer, (k, v) in enumerate(seq.kv):
            self.k[layer][slot, :, :n] = k
            self.v[layer][slot, :, :n] = v
            self.vabs[layer][slot, :, :n] = value_magnitudes(v)
        seq.kv = []
        self.seqs.append(seq)

    def kv_of(self, slot: int, n: int) -> LayerKV:
        f32 = np.float32
        return [(k[slot, :, :n].astype(f32), v[slot, :, :n].astype(f32)) for k, v in zip(self.k, self.v, strict=True)]

    def remove(self, slot: int) -> None:
        last = len(self.seqs) - 1
        if slot != last:
            n = len(self.seqs[last].prompt) + len(self.seqs[last].ids)
            for buf in (*self.k, *self.v, *self.vabs):
                buf[slot, :, :n] = buf[last, :, :n]
            self.seqs[slot] = self.seqs[last]
        self.seqs.pop()

    # KVStore for a decode step: token b is written at self.positions[b]
    def extend(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        b = k.shape[0]
        rows = np.arange(b)
        self.k[layer][rows, :, self.positions] = k[:, :, 0]
        self.v[layer][rows, :, self.positions] = v[:, :, 0]
        self.vabs[layer][rows, :, self.positions] = value_magnitudes(v[:, :, 0])
        n = int(np.max(self.positions)) + 1
        return self.k[layer][:b, :, :n], self.v[layer][:b, :, :n], self.vabs[layer][:b, :, :n]

    def decode(self, tokens: list[int], positions: list[int]) -> np.ndarray:
        """Logits (B, V) after feeding one token to every sequence (in slot order)."""
        self._ensure(len(tokens), max(positions) + 1)
        self.positions = np.array(positions, dtype=np.int64)
        n = max(positions) + 1
        valid = (np.arange(n)[None, :] <= self.positions[:, None])[:, None, :]
        lm = self.weights.lm
        h = lm.forward(np.array(tokens, dtype=np.int64)[:, None], self.positions[:, None], self, valid)
        return lm.logits(h[:, 0])


class Engine:
    """Loads weights, schedules and batches requests, reloads weights; thread-safe.

    ``prefix_cache_tokens``: token budget of the prefix cache (0 disables it).
    ``max_num_seqs``: sequences decoded together at most (vLLM's ``--max-num-seqs``).
    ``prefill_chunk``: prompt tokens prefilled per iteration (vLLM's chunked prefill).
    ``logprobs_mode``: which log-probs are reported (:mod:`focus.tinylm.sampler`).
    ``max_model_len``: the context served if less than the weights' (vLLM's ``--max-model-len``).
    """

    def __init__(
        self,
        weights: str | os.PathLike[str] | None = None,
        *,
        prefix_cache_tokens: int = 65536,
        max_num_seqs: int = 64,
        prefill_chunk: int = 256,
        logprobs_mode: str = "processed_logprobs",
        version: str | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_model_len: int | None = None,
    ) -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"unknown logprobs mode {logprobs_mode!r}; one of {LOGPROBS_MODES}")
        self._max_model_len = max_model_len
        self.codec = ByteCodec()
        self.logprobs_mode = logprobs_mode
        self.max_num_seqs = max_num_seqs
        self.prefill_chunk = prefill_chunk
        self.cache = PrefixCache(prefix_cache_tokens)
        self._current = self._load(weights, version)
        self._cache_weights = self._current
        self._cond = threading.Condition()
        self._queue: deque[_Seq] = deque()
        self._prefilling: deque[_Seq] = deque()
        self._batches: dict[int, _Batch] = {}
        self._thread: threading.Thread | None = None
        self._closed = False
        self._flush = False
        self._n_running = 0
        self.generation_tokens = 0
        self.prompt_tokens = 0
        self.finished: dict[str, int] = {}
        self._clock = clock
        #: When the scheduler's running iteration began (None: it waits for work).
        self._step_began: float | None = None

    # --- weights -----------------------------------------------------------------------
    @staticmethod
    def _load(weights: str | os.PathLike[str] | None, version: str | None = None) -> _Weights:
        path = str(weights) if weights is not None else str(DEFAULT_WEIGHTS)
        return _Weights(InvariantLM(read_weights(path)), version or weights_version(path), path)

    @property
    def config(self) -> TinyConfig:
        return self._current.lm.cfg

    @property
    def policy_version(self) -> str:
        return self._current.version

    @property
    def weights_path(self) -> str:
        return self._current.path

    @property
    def max_len(self) -> int:
        own = self.config.max_len
        return own if self._max_model_len is None else min(own, self._max_model_len)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    def reload(self, weights: str | os.PathLike[str], version: str | None = None) -> str:
        """Serve new weights from now on; admitted requests finish on the old ones."""
        new = self._load(Path(weights), version)
        with self._cond:
            self._current = new
            self._cond.notify()
        return new.version

    def flush_cache(self) -> None:
        """Empty the prefix cache (at the engine's next iteration)."""
        with self._cond:
            self._flush = True
            self._cond.notify()

    # --- requests -----------------------------------------------------------------------
    def check(self, req: GenRequest) -> None:
        if not req.prompt_ids:
            raise EngineError("empty prompt: send at least one token id")
        for i, t in enumerate(req.prompt_ids):
            if not 0 <= t < self.vocab_size:
                raise EngineError(
                    f"prompt token id {t} at position {i} is outside the vocabulary [0, {self.vocab_size})"
                )
        if req.max_tokens < 0:
            raise EngineError("max_tokens must be at least 0")
        if len(req.prompt_ids) + req.max_tokens > self.max_len:
            raise EngineError(
                f"This model's maximum context length is {self.max_len} tokens. However, you requested "
                f"{len(req.prompt_ids) + req.max_tokens} tokens ({len(req.prompt_ids)} in the messages, "
                f"{req.max_tokens} in the completion). Please reduce the length of the messages or completion."
            )
        if req.temperature < 0 or not 0 < req.top_p <= 1 or not 0 <= req.min_p <= 1:
            raise EngineError(f"invalid temperature {req.temperature}, top_p {req.top_p} or min_p {req.min_p}")

    def submit(self, req: GenRequest, on_event: Callable[[Any], None], *, stream: bool = False) -> Handle:
        """Queue ``req``; ``on_event`` gets :class:`TokenEvent` s (if ``stream``) and then the
        :class:`GenResult` (or an :class:`Exception`), from the engine thread."""
        self.check(req)
        seed = req.seed if req.seed is not None else random.SystemRandom().randrange(2**63)
        seq = _Seq(req, on_event, stream, Stream(seed % 2**64))
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine is closed")
            self._queue.append(seq)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="tinylm-engine", daemon=True)
                self._thread.start()
            self._cond.notify()
        return Handle(seq, self)

    def generate(self, req: GenRequest) -> GenResult:
        """Blocking convenience: submit and wait for the result."""
        done = threading.Event()
        box: list[Any] = []

        def on_event(ev: Any) -> None:
            if isinstance(ev, GenResult | Exception):
                box.append(ev)
                done.set()

        self.submit(req, on_event)
        done.wait()
        if isinstance(box[0], Exception):
            raise box[0]
        return box[0]

    @property
    def num_waiting(self) -> int:
        return len(self._queue)

    @property
    def num_running(self) -> int:
        """Requests admitted and not finished (prefilling or decoding)."""
        return self._n_running

    @property
    def cache_usage(self) -> float:
        return self.cache.tokens / self.cache.max_tokens if self.cache.max_tokens else 0.0

    def _count_running(self) -> int:
        self._n_running = len(self._prefilling) + sum(len(b.seqs) for b in self._batches.values())
        return self._n_running

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def step_s(self) -> float:
        """Seconds the scheduler's current iteration has run; 0 while it waits for work.
        Read without the lock (an engine stuck holding it must not stop the answer)."""
        began = self._step_began
        return 0.0 if began is None else max(0.0, self._clock() - began)

    def _wake(self) -> None:
        with self._cond:
            self._cond.notify()

    # --- the scheduler thread -------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not (self._queue or self._prefilling or self._batches):
                    self._cond.wait()
                if self._closed:
                    return
            # not reset if the thread dies inside: the time grows, and /health says so
            self._step_began = self._clock()
            try:
                self._iteration()
            except Exception as e:  # noqa: BLE001 - fail what was running, keep serving
                for seq in [*self._prefilling, *(s for b in self._batches.values() for s in b.seqs)]:
                    seq.on_event(RuntimeError(f"engine failure: {type(e).__name__}: {e}"))
                self._prefilling.clear()
                self._batches.clear()
            self._step_began = None

    def _iteration(self) -> None:
        if self._cache_weights is not self._current or self._flush:
            self.cache.clear()
            self._cache_weights, self._flush = self._current, False
        budget = self.prefill_chunk
        while budget > 0:
            seq = self._next_prefill()
            if seq is None:
                break
            budget -= self._prefill(seq, budget)
        for key, batch in list(self._batches.items()):
            self._step(batch)
            if not batch.seqs:
                del self._batches[key]
        self._count_running()

    def _next_prefill(self) -> _Seq | None:
        while self._prefilling and self._prefilling[0].cancelled:
            self._finish(self._prefilling.popleft(), "abort", None)
        if self._prefilling:
            return self._prefilling[0]
        if self._count_running() >= self.max_num_seqs:
            return None
        with self._cond:
            if not self._queue:
                return None
            seq = self._queue.popleft()
            seq.weights = self._current
        if seq.cancelled:
            self._finish(seq, "abort", None)
            return self._next_prefill()
        self.prompt_tokens += len(seq.prompt)
        lm = seq.weights.lm
        if seq.req.prompt_logprobs is None and self.cache.max_tokens > 0:
            hit = self.cache.lookup(seq.prompt)
        else:
            hit = Hit(0, None, None)
            seq.prompt_lp = [None]
        empty = np.zeros((lm.n_heads, 0, lm.head_dim), np.float32)
        seq.kv = list(hit.kv) if hit.kv is not None else [(empty, empty) for _ in range(lm.n_layers)]
        seq.done = seq.cached = hit.n
        seq.logits = hit.logits
        self._prefilling.append(seq)
        return seq

    def _prefill(self, seq: _Seq, budget: int) -> int:
        """Prefill up to ``budget`` prompt tokens of ``seq``; returns how many."""
        assert seq.weights is not None
        lm = seq.weights.lm
        n = min(len(seq.prompt) - seq.done, budget)
        if n > 0:
            start = seq.done
            pos = np.arange(start, start + n)
            valid = (np.arange(start + n)[None, :] <= pos[:, None])[None]
            ids = np.array([seq.prompt[start : start + n]], dtype=np.int64)
            hidden = lm.forward(ids, pos[None], _SeqStore(seq), valid)
            seq.done += n
            if seq.prompt_lp is not None:
                logits = lm.logits(hidden[0])
                lp = log_softmax(logits)
                targets = [seq.prompt[p + 1] for p in range(start, start + n) if p + 1 < len(seq.prompt)]
                k = seq.req.prompt_logprobs or 0
                seq.prompt_lp.extend(describe(lp[: len(targets)], targets, [k] * len(targets)))
                seq.logits = logits[-1]
            elif seq.done == len(seq.prompt):
                seq.logits = lm.logits(hidden[0, -1:])[0]
        if seq.done < len(seq.prompt):
            return max(n, 1)
        self._prefilling.popleft()
        assert seq.logits is not None
        if self.cache.max_tokens > 0 and seq.weights is self._current and seq.cached < len(seq.prompt):
            self.cache.store(seq.prompt, [(k.copy(), v.copy()) for k, v in seq.kv], seq.logits)
        if seq.req.max_tokens == 0 or seq.cancelled:
            self._finish(seq, "abort" if seq.cancelled else "length", None)
        else:
            key = id(seq.weights)
            if key not in self._batches:
                self._batches[key] = _Batch(seq.weights)
            self._batches[key].add(seq)
        return max(n, 1)

    def _step(self, batch: _Batch) -> None:
        seqs = batch.seqs
        for i in reversed([i for i, s in enumerate(seqs) if s.cancelled]):
            s = seqs[i]
            batch.remove(i)  # its client left: no further token for it
            self._finish(s, "abort", None)
        if not seqs:
            return
        params = [
            RowParams(
                s.req.temperature,
                s.req.top_p,
                s.req.top_k,
                s.req.min_p,
                tuple(self._stop_ids(s.req)) if len(s.ids) < s.req.min_tokens else (),
                s.req.logprobs,
            )
            for s in seqs
        ]
        logits = np.stack([s.logits for s in seqs if s.logits is not None])
        draws = sample(logits, params, [s.stream_rng for s in seqs], self.logprobs_mode)
        self.generation_tokens += len(draws)
        ending: list[tuple[int, str, int | str | None]] = []
        version = batch.weights.version
        for i, (s, d) in enumerate(zip(seqs, draws, strict=True)):
            s.ids.append(d.token)
            s.draws.append(d)
            end = self._stopped(s, d.token)
            if end is not None:
                ending.append((i, *end))
            elif s.stream:
                s.on_event(TokenEvent(len(s.ids) - 1, d, version, s.cached))
        for i, reason, matched in sorted(ending, reverse=True):
            s = seqs[i]
            n = len(s.prompt) + len(s.ids) - 1
            if self.cache.max_tokens > 0 and batch.weights is self._current and s.logits is not None:
                self.cache.store(s.prompt + tuple(s.ids[:-1]), batch.kv_of(i, n), s.logits)
            batch.remove(i)
            self._finish(s, reason, matched)
        if seqs:
            positions = [len(s.prompt) + len(s.ids) - 1 for s in seqs]
            out = batch.decode([s.ids[-1] for s in seqs], positions)
            for s, row in zip(seqs, out, strict=True):
                s.logits = row

    def _stop_ids(self, req: GenRequest) -> set[int]:
        ids = set(req.stop_token_ids)
        if not req.ignore_eos:
            ids.add(ByteCodec.EOT)
        return ids

    def _stopped(self, s: _Seq, tok: int) -> tuple[str, int | str | None] | None:
        if tok in self._stop_ids(s.req):
            return "stop", tok
        if s.req.stop:
            text = self.codec.decode(s.ids)
            for stop in s.req.stop:
                if stop and stop in text:
                    return "stop", stop
        if len(s.ids) >= s.req.max_tokens:
            return "length", None
        return None

    def _finish(self, s: _Seq, reason: str, matched: int | str | None) -> None:
        self.finished[reason] = self.finished.get(reason, 0) + 1
        assert s.weights is not None or reason == "abort"
        version = s.weights.version if s.weights is not None else self.policy_version
        s.on_event(
            GenResult(
                tuple(s.ids),
                tuple(d.logprob for d in s.draws),
                reason,
                matched,
                s.cached,
                version,
                tuple(d.rank for d in s.draws),
                tuple(d.top for d in s.draws),
                tuple(s.prompt_lp) if s.prompt_lp is not None else None,
            )
        )
