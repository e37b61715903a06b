"""The embedded default model: a tiny byte-level causal transformer with a KV cache.

It exists so that the whole pipeline (collect -> export -> train -> collect) runs on a
laptop CPU with no model service. Its vocabulary is :class:`focus.format.ByteCodec`'s
(256 bytes plus role markers), so prompts rendered by that codec are its input ids.

This module is the training side (torch). The serving forward that the embedded server
runs is :mod:`focus.tinylm.numerics` (numpy only); both read the weights file and the
position table of :mod:`focus.tinylm.arch`.

:func:`sampling_distribution` is the distribution a token is drawn from (after
temperature and top-p): the reference the tests hold the server's reported log-probs to.
"""

from __future__ import annotations

import io
import os
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from focus.tinylm.arch import DEFAULT_WEIGHTS, TinyConfig, read_weights, sinusoids, weights_version

#: One KV cache entry per layer: keys and values, each (batch, heads, time, head_dim).
KVCache = list[tuple[torch.Tensor, torch.Tensor]]

# the framework-free names are defined in focus.tinylm.arch and re-exported here
__all__ = [
    "DEFAULT_WEIGHTS",
    "KVCache",
    "TinyConfig",
    "TinyLM",
    "load",
    "prompt_logprobs",
    "sampling_distribution",
    "save",
    "weights_version",
]


class Block(nn.Module):
    def __init__(self, cfg: TinyConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(
            nn.Linear(cfg.d_model, 4 * cfg.d_model), nn.GELU(), nn.Linear(4 * cfg.d_model, cfg.d_model)
        )

    def forward(
        self,
        x: torch.Tensor,
        past: tuple[torch.Tensor, torch.Tensor] | None,
        attn_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        if past is not None:
            k = torch.cat([past[0], k], dim=2)
            v = torch.cat([past[1], v], dim=2)
        # With a cache, the t new queries sit at the end of the key sequence.
        total = k.shape[2]
        if attn_mask is None:
            mask = torch.ones(t, total, dtype=torch.bool).tril(diagonal=total - t)
        else:  # (batch, t, t): each query's own keys (a token trie, focus.packing)
            mask = attn_mask.unsqueeze(1)
        att = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, d))
        x = x + self.mlp(self.ln2(x))
        return x, (k, v)


class TinyLM(nn.Module):
    """Causal transformer over ByteCodec ids; output head tied to the embedding."""

    def __init__(self, cfg: TinyConfig | None = None) -> None:
        super().__init__()
        self.cfg = cfg or TinyConfig()
        self.embed = nn.Embedding(self.cfg.vocab_size, self.cfg.d_model)
        self.blocks = nn.ModuleList(Block(self.cfg) for _ in range(self.cfg.n_layers))
        self.ln_f = nn.LayerNorm(self.cfg.d_model)
        pos = torch.from_numpy(sinusoids(self.cfg.max_len, self.cfg.d_model))
        self.register_buffer("pos", pos, persistent=False)
        nn.init.normal_(self.embed.weight, std=0.02)

    def forward(
        self,
        ids: torch.Tensor,
        past: KVCache | None = None,
        *,
        positions: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, KVCache]:
        """Logits (batch, time, vocab) of ``ids`` continuing ``past``; and the new cache.

        ``positions`` and ``attn_mask`` (batch, time, time; True where a query may look)
        replace the causal layout, for tokens laid out as a trie (no ``past``)."""
        pos: torch.Tensor = self.pos  # type: ignore[assignment]
        if (positions is None) != (attn_mask is None) or (positions is not None and past):
            raise ValueError("positions and attn_mask go together, and without a cache")
        if positions is not None:
            if int(positions.max()) >= self.cfg.max_len:
                raise ValueError(f"position {int(positions.max())} exceeds the model's max_len {self.cfg.max_len}")
            x = self.embed(ids) + pos[positions]
        else:
            start = past[0][0].shape[2] if past else 0
            end = start + ids.shape[1]
            if end > self.cfg.max_len:
                raise ValueError(f"sequence of {end} tokens exceeds the model's max_len {self.cfg.max_len}")
            x = self.embed(ids) + pos[start:end]
        cache: KVCache = []
        for i, block in enumerate(self.blocks):
            x, kv = block(x, past[i] if past else None, attn_mask)
            cache.append(kv)
        return self.ln_f(x) @ self.embed.weight.T, cache

    def n_params(self) -> int:
        return sum(p.numel() for p in self.parameters())


def sampling_distribution(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Probabilities actually sampled from: softmax(logits / T), cut to the top-p nucleus
    and renormalised. ``temperature == 0`` is greedy: a point mass on the argmax."""
    logits = logits.double()
    if temperature == 0.0:
        out = torch.zeros_like(logits)
        out[logits.argmax()] = 1.0
        return out
    probs = torch.softmax(logits / temperature, dim=-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        keep = (sorted_p.cumsum(0) - sorted_p) < top_p
        kept = torch.zeros_like(probs)
        kept[order[keep]] = probs[order[keep]]
        probs = kept / kept.sum()
    return probs


def save(model: TinyLM, path: str | os.PathLike[str]) -> str:
    """Write config + fp16 weights (half the bytes; loads back to fp32). Returns the version."""
    state = {k: v.detach().to(torch.float16).clone() for k, v in model.state_dict().items()}
    # Through a buffer: torch.save names the archive after the file, so writing to the
    # path directly would make the bytes (and the version) depend on the file name.
    buf = io.BytesIO()
    torch.save({"config": asdict(model.cfg), "state_dict": state}, buf)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_bytes(buf.getvalue())
    return weights_version(path)


def load(path: str | os.PathLike[str] | None = None) -> TinyLM:
    """Load a weights file written by :func:`save` (the committed default when ``None``)."""
    weights = read_weights(path)
    model = TinyLM(weights.config)
    try:
        model.load_state_dict({k: torch.from_numpy(v) for k, v in weights.state.items()})
    except RuntimeError as e:
        raise ValueError(f"{path or DEFAULT_WEIGHTS} is not a tinylm weights file: {e}") from e
    model.eval()
    return model


@torch.no_grad()
def prompt_logprobs(model: TinyLM, ids: Sequence[int]) -> torch.Tensor:
    """Log-softmax of the model's logits at every position (a direct full forward)."""
    logits, _ = model(torch.tensor([list(ids)]))
    return torch.log_softmax(logits[0].double(), dim=-1)
