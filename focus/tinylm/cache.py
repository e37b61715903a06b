"""The prefix cache: keys and values of token prefixes the engine computed before.

FOCUS continues rollouts from checkpoints, and every continuation resends the
checkpoint's exact prompt ids; a multi-turn rollout resends the previous turn's prompt
and completion. The engine stores the keys and values of every prompt it prefilled and
of every sequence it finished (prompt + completion, less the last sampled token, which
was never fed), with the logits after the last stored token. A new prompt reuses the
longest stored prefix of it; a prompt that is itself a prefix of a stored sequence
reuses all but its last token (recomputed to get its logits).

Because the serving forward is exact per position (:mod:`focus.tinylm.numerics`),
reused keys and values are bit-identical to recomputed ones: the cache changes speed,
never results. Entries are evicted least-recently-used beyond a token budget. Only the
engine thread touches the cache; the counters are read by ``/metrics``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

#: Per layer: keys and values, float32 (heads, tokens, head_dim).
LayerKV = list[tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class Hit:
    """``n`` leading tokens are cached; ``logits`` follow token ``n - 1`` when known."""

    n: int
    kv: LayerKV | None
    logits: np.ndarray | None


class PrefixCache:
    def __init__(self, max_tokens: int = 65536) -> None:
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, ...], tuple[LayerKV, np.ndarray]] = OrderedDict()
        self._tokens = 0
        #: Prompt tokens looked up, and how many of them were found (vLLM's counters).
        self.queries = 0
        self.hits = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        return self._tokens

    def lookup(self, prompt: tuple[int, ...], *, count: bool = True) -> Hit:
        best = Hit(0, None, None)
        best_key: tuple[int, ...] | None = None
        n_prompt = len(prompt)
        for key, (kv, logits) in self._entries.items():
            n = len(key)
            if n <= n_prompt:
                if n > best.n and prompt[:n] == key:
                    best, best_key = Hit(n, kv, logits if n == n_prompt else None), key
            elif n_prompt - 1 > best.n and key[:n_prompt] == prompt:
                # the prompt is a proper prefix of a stored sequence: reuse all but its last token
                m = n_prompt - 1
                best, best_key = Hit(m, [(k[:, :m], v[:, :m]) for k, v in kv], None), key
        if best_key is not None:
            self._entries.move_to_end(best_key)
        if count:
            self.queries += n_prompt
            self.hits += best.n
        return best

    def store(self, tokens: tuple[int, ...], kv: LayerKV, logits: np.ndarray) -> None:
        """Keep ``kv`` (for exactly ``tokens``) and the logits after the last token."""
        if not tokens or len(tokens) > self.max_tokens:
            return
        if tokens in self._entries:
            self._entries.move_to_end(tokens)
            return
        self._entries[tokens] = (kv, logits)
        self._tokens += len(tokens)
        while self._tokens > self.max_tokens:
            old, _ = self._entries.popitem(last=False)
            self._tokens -= len(old)

    def clear(self) -> None:
        self._entries.clear()
        self._tokens = 0
