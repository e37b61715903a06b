"""Batched sampling with per-request parameters, and which log-probs are reported.

One call samples the next token of every running sequence from its own logits row,
with its own temperature, top-k, top-p, min-p and random stream (:class:`Stream`). Every
operation is per row and batch-invariant (:mod:`focus.tinylm.numerics`): sorting, exact
sums on a grid, elementwise maps, so a sequence samples the same token whatever rows
sit beside it.

**Which log-prob is reported** is the server's ``--logprobs-mode``, with vLLM's names
(vLLM's ``--logprobs-mode``):

- ``processed_logprobs`` (the default here): the log-probs of the distribution the token
  was drawn from - ``log_softmax(logits / T)`` restricted to the top-k / top-p / min-p
  set and renormalised. This is the behaviour log-prob an importance ratio needs, and
  what :mod:`focus.train_local` assumes (it recomputes ``log_softmax(logits / T)``).
- ``raw_logprobs`` (vLLM's default): ``log_softmax(logits)`` of the model, before
  temperature and truncation. Equals ``processed_logprobs`` at T = 1 without
  truncation.
- ``processed_logits`` / ``raw_logits``: the logits instead of log-probs.

Greedy requests (T = 0) draw the argmax and, as in vLLM, skip temperature and
truncation: both log-prob modes report the raw ``log_softmax(logits)`` there (not the
0.0 of a point mass). Tokens outside the truncation set have processed log-prob
``-inf`` (the HTTP layer writes -9999.0, as vLLM does).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from focus.tinylm.numerics import exp, log_softmax, quantize_abs

LogprobsMode = Literal["raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits"]
LOGPROBS_MODES: tuple[str, ...] = ("raw_logprobs", "raw_logits", "processed_logprobs", "processed_logits")

#: Probabilities are rounded to multiples of 2**-PROB_GRID before cumulative sums (exact).
PROB_GRID = 50


@dataclass(frozen=True)
class RowParams:
    """Sampling parameters of one row (one sequence)."""

    temperature: float = 1.0
    top_p: float = 1.0
    #: 0 or -1: no top-k truncation.
    top_k: int = 0
    min_p: float = 0.0
    #: Ids that may not be drawn at this step (stop ids before ``min_tokens``).
    banned: tuple[int, ...] = ()
    #: How many top alternatives to report besides the sampled token (0: none).
    n_top: int = 0


class Stream:
    """A request's random numbers: PCG64 seeded with the request's seed (numpy's
    ``SeedSequence``, whose output numpy keeps stable across versions). Uniforms are the
    top 53 bits of each 64-bit output, so they do not depend on how numpy converts them."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.PCG64(seed)

    def uniform(self) -> float:
        return (int(self._bits.random_raw()) >> 11) * 2.0**-53


@dataclass(frozen=True)
class Draw:
    """The sampled token of one row, its reported log-prob, rank and top alternatives."""

    token: int
    logprob: float
    #: 1 + the number of tokens with a strictly larger reported value (vLLM's rank).
    rank: int
    #: The ``n_top`` best (id, reported value) pairs, best first.
    top: tuple[tuple[int, float], ...]


def sample(
    logits: np.ndarray,
    params: Sequence[RowParams],
    streams: Sequence[Stream],
    mode: str = "processed_logprobs",
) -> list[Draw]:
    """Sample one token per row of ``logits`` (B, V) float64."""
    b, v = logits.shape
    if b == 0:
        return []
    if any(p.banned for p in params):
        logits_eff = logits.copy()
        for i, p in enumerate(params):
            if p.banned:
                logits_eff[i, list(p.banned)] = -np.inf
    else:
        logits_eff = logits
    temps = np.array([p.temperature for p in params], dtype=np.float64)
    greedy = temps == 0
    z = logits_eff / np.where(greedy, 1.0, temps)[:, None]
    processed = _truncate(z, params)
    # greedy rows: argmax, no temperature or truncation (vLLM); keep the stop-id ban
    processed = np.where(greedy[:, None], logits_eff, processed)
    proc_lp = log_softmax(processed)
    probs = quantize_abs(exp(proc_lp), PROB_GRID)
    cum = probs.cumsum(-1)
    tokens: list[int] = []
    for i, p in enumerate(params):
        if p.temperature == 0:
            tokens.append(int(np.argmax(logits_eff[i])))
        else:
            u = streams[i].uniform() * cum[i, -1]
            tokens.append(min(int(np.searchsorted(cum[i], u, side="right")), v - 1))
    if mode == "processed_logprobs":
        reported = np.where(greedy[:, None], log_softmax(logits), proc_lp)
    elif mode == "processed_logits":
        reported = np.where(greedy[:, None], logits, processed)
    elif mode == "raw_logprobs":
        reported = log_softmax(logits)
    elif mode == "raw_logits":
        reported = logits
    else:
        raise ValueError(f"unknown logprobs mode {mode!r}; one of {LOGPROBS_MODES}")
    return describe(reported, tokens, [p.n_top for p in params])


def describe(values: np.ndarray, tokens: Sequence[int], n_top: Sequence[int]) -> list[Draw]:
    """For each row: the value of ``tokens[i]``, its rank and the ``n_top[i]`` best entries
    (ties: the lower id first)."""
    k = max(n_top, default=0)
    order = np.argsort(-values, axis=-1, kind="stable")[:, :k] if k else None
    out = []
    for i, tok in enumerate(tokens):
        row = values[i]
        val = float(row[tok])
        rank = int((row > row[tok]).sum()) + 1
        top: tuple[tuple[int, float], ...] = ()
        if n_top[i] and order is not None:
            ids = order[i, : n_top[i]]
            top = tuple(zip(ids.tolist(), row[ids].tolist(), strict=True))
        out.append(Draw(tok, val, rank, top))
    return out


def _truncate(z: np.ndarray, params: Sequence[RowParams]) -> np.ndarray:
    """``z`` with tokens outside each row's top-k, top-p and min-p sets set to -inf."""
    b, v = z.shape
    ks = [p.top_k if p.top_k > 0 else v for p in params]
    if all(k >= v for k in ks) and all(p.top_p >= 1.0 for p in params) and all(p.min_p <= 0 for p in params):
        return z
    order = np.argsort(-z, axis=-1, kind="stable")  # descending, ties in id order
    vals = np.take_along_axis(z, order, axis=-1)
    keep = np.arange(v)[None, :] < np.array(ks)[:, None]
    p_sorted = quantize_abs(exp(log_softmax(np.where(keep, vals, -np.inf))), PROB_GRID)
    top_p = np.array([p.top_p for p in params], dtype=np.float64)[:, None]
    # the smallest prefix whose mass reaches top_p (always at least one token)
    keep &= (p_sorted.cumsum(-1) - p_sorted) < top_p
    min_p = np.array([p.min_p for p in params], dtype=np.float64)[:, None]
    keep &= p_sorted >= min_p * p_sorted[:, :1]
    out = np.full_like(z, -np.inf)
    np.put_along_axis(out, order, np.where(keep, vals, -np.inf), axis=-1)
    return out
