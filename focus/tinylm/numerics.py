"""The serving forward of the tiny model: bit-identical whatever else is computed with it.

A batch of RL data is only reproducible if the model service returns the same ids and
log-probs for the same request whatever is in its prefix cache and whatever else is
being decoded at the same moment (issue #15's resume tests compare batches bit for
bit). Floating-point addition is not associative, and on a CPU the order of a
reduction depends on the shape of the call: a GEMM picks its kernel and blocking by
the number of rows, a prefill computes many positions where a decode computes one,
and masked attention over a padded batch adds different numbers of zeros. So the
serving path does not merely *try* to keep shapes equal; it makes every reduction
**exact**, and an exact sum has one value whatever its order:

- Every operand of a dot product is rounded to a fixed-point grid chosen from that
  operand's own values (:func:`quantize`): activations per row (23 bits below the row's
  largest power of two), weights per output row (as many bits as the remaining float64
  budget allows, twice: a high and a low part). Each product is then an integer multiple of one quantum per output
  element and the sum of the magnitudes stays below 2**53 quanta, so every partial sum
  is representable and float64 GEMMs - any kernel, any blocking, any thread count, any
  batch - return the exact value.
- Attention scores are exact the same way; the softmax weights are rounded to a grid
  of 2**-40 before their sum (exact), and the normalised weights to a grid chosen from
  the largest value they multiply (its bound is a function of the prefix), before the
  weighted sum of values (exact). Layer norms and the log-softmax use exact sums too.
- Everything else is elementwise on contiguous float64 tensors (each element computed
  by the same instruction sequence wherever it sits), and maxima, which are exact.

The result for one position is therefore a function of the token prefix alone: the
same bits in a cold prefill, in a chunked prefill, after a prefix-cache hit and in a
decode step beside 63 other sequences of other lengths. The rounding perturbs the
model by about 1e-7 relative to the float32 training forward
(:meth:`focus.tinylm.model.TinyLM.forward`), far below what an importance ratio can
see; tests compare the two at 1e-4 on log-probs.

Keys and values are stored in float32 (exactly: keys hold 24 significant bits, values
sit on a 2**-24 grid; a value large enough to lose bits in float32 is still a multiple
of that grid, which is all the exact sum needs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from focus.tinylm.model import TinyLM

#: Significant bits kept of an activation row (about float32's precision).
ACT_BITS = 23
#: Values in the KV cache are multiples of 2**-VALUE_GRID.
VALUE_GRID = 24
#: Softmax numerators (in [0, 1]) are multiples of 2**-EXP_GRID before their sum.
EXP_GRID = 40
#: Sums stay below 2**SUM_BITS quanta (float64 holds integers up to 2**53 exactly).
SUM_BITS = 52


def quantize(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round each row (last dim) of ``x`` to multiples of 2**(e - bits), where 2**e is the
    smallest power of two above the row's largest magnitude: at most ``bits + 1``
    significant bits per element. Multiplying and dividing by powers of two is exact, so
    the result depends on each element and its row's maximum only."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    _, e = torch.frexp(amax)  # amax < 2**e
    scale = torch.ldexp(torch.ones_like(amax), bits - e)
    return torch.round(x * scale) / scale


def quantize_abs(x: torch.Tensor, grid: torch.Tensor | int) -> torch.Tensor:
    """Round to multiples of 2**-grid (``grid`` broadcasts against ``x``)."""
    g = grid if isinstance(grid, torch.Tensor) else torch.tensor(float(grid), dtype=x.dtype)
    scale = torch.ldexp(torch.ones_like(g, dtype=x.dtype), g.to(torch.int32))
    return torch.round(x * scale) / scale


def elementwise(fn, x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` for a transcendental ``fn`` (exp, log, gelu), computed identically for
    every element wherever it sits: ATen evaluates the tail of a contiguous loop (past
    the last full vector) with the scalar libm function, which can differ from the
    vectorised one in the last bit. Rows are padded to a multiple of 64 elements so
    that every element goes through the vector path (with one intra-op thread)."""
    n = x.shape[-1]
    pad = (-n) % 64
    y = fn(torch.nn.functional.pad(x, (0, pad)) if pad else x.contiguous())
    return y[..., :n] if pad else y


def _weight_bits(k: int) -> int:
    """Bits of a weight row so that k products of ACT_BITS x weight bits sum exactly."""
    bits = SUM_BITS - math.ceil(math.log2(k)) - (ACT_BITS + 1) - 1
    if bits < 12:
        raise ValueError(f"a reduction over {k} terms leaves {bits} bits per weight; too few for exact sums")
    return bits


@dataclass(frozen=True)
class Linear:
    """``y = x W^T + b`` from exact GEMMs: x (per row) and W (once, per output row) are
    each split into a high and a low part on their grids, so both keep about twice the
    bits one exact GEMM allows; the three significant products (hi*hi, hi*lo, lo*hi) are
    exact and added in a fixed order."""

    hi: torch.Tensor  # (out, in) float64 on the grid
    lo: torch.Tensor
    bias: torch.Tensor | None

    @staticmethod
    def of(w: torch.Tensor, b: torch.Tensor | None) -> Linear:
        w64 = w.detach().double()
        bits = _weight_bits(w.shape[1])
        hi = quantize(w64, bits)
        lo = quantize(w64 - hi, bits)
        return Linear(hi.contiguous(), lo.contiguous(), None if b is None else b.detach().double().contiguous())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        xh = quantize(x, ACT_BITS)
        xl = quantize(x - xh, ACT_BITS)
        y = torch.matmul(xh, self.hi.T) + (torch.matmul(xh, self.lo.T) + torch.matmul(xl, self.hi.T))
        return y if self.bias is None else y + self.bias


@dataclass(frozen=True)
class LayerNorm:
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1]
        mean = quantize(x, SUM_BITS - math.ceil(math.log2(d)) - 1).sum(-1, keepdim=True) / d
        c = x - mean
        half = (SUM_BITS - math.ceil(math.log2(d))) // 2 - 1
        cq = quantize(c, half)
        var = (cq * cq).sum(-1, keepdim=True) / d
        return c / torch.sqrt(var + self.eps) * self.weight + self.bias


def exact_logsumexp(x: torch.Tensor) -> torch.Tensor:
    """log(sum(exp(x))) over the last dim, with an exact sum of the rounded exponentials."""
    m = x.amax(dim=-1, keepdim=True)
    e = quantize_abs(elementwise(torch.exp, x - m), EXP_GRID)
    return m + elementwise(torch.log, e.sum(-1, keepdim=True))


def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Batch-invariant log-softmax over the last dim (float64). ``-inf`` entries stay ``-inf``."""
    return x - exact_logsumexp(x)


@dataclass(frozen=True)
class _Block:
    ln1: LayerNorm
    qkv: Linear
    proj: Linear
    ln2: LayerNorm
    fc1: Linear
    fc2: Linear


class KVStore(Protocol):
    """Where a forward keeps keys and values (float32, (B, heads, time, head_dim))."""

    def extend(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store the new tokens' keys and values of ``layer``; return (float64) all keys and
        values the new tokens may attend to, their own included."""
        ...


class InvariantLM:
    """The serving forward of a :class:`TinyLM` (see the module docs)."""

    def __init__(self, model: TinyLM) -> None:
        cfg = model.cfg
        self.cfg = cfg
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.embed = model.embed.weight.detach().double().contiguous()
        self.head = Linear.of(model.embed.weight, None)
        self.pos = model.pos.double().contiguous()  # type: ignore[operator]

        def ln(m: torch.nn.LayerNorm) -> LayerNorm:
            assert m.weight is not None and m.bias is not None
            return LayerNorm(m.weight.detach().double(), m.bias.detach().double(), m.eps)

        self.blocks = []
        for blk in model.blocks:
            b: Any = blk
            self.blocks.append(
                _Block(
                    ln(b.ln1),
                    Linear.of(b.qkv.weight, b.qkv.bias),
                    Linear.of(b.proj.weight, b.proj.bias),
                    ln(b.ln2),
                    Linear.of(b.mlp[0].weight, b.mlp[0].bias),
                    Linear.of(b.mlp[2].weight, b.mlp[2].bias),
                )
            )
        self.ln_f = ln(model.ln_f)
        self.scale = 1.0 / math.sqrt(self.head_dim)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """Output logits (float64) of final hidden states ``h`` (..., d_model)."""
        return self.head(self.ln_f(h))

    def forward(
        self, ids: torch.Tensor, positions: torch.Tensor, store: KVStore, key_valid: torch.Tensor
    ) -> torch.Tensor:
        """Final hidden states (B, T, d) of new tokens ``ids`` at ``positions`` (B, T).

        ``store`` keeps each layer's keys and values: it receives the new tokens' keys and
        values and returns every key and value they may attend to. ``key_valid`` (B, T, L)
        says which of those L each new token sees (its own prefix, itself included).
        """
        b, t = ids.shape
        h, hd = self.n_heads, self.head_dim
        x = self.embed[ids] + self.pos[positions]
        mask = key_valid[:, None, :, :]
        for i, blk in enumerate(self.blocks):
            qkv = blk.qkv(blk.ln1(x))
            q, k, v = (z.reshape(b, t, h, hd).transpose(1, 2).contiguous() for z in qkv.split(h * hd, dim=-1))
            kk, vv = store.extend(i, quantize(k, ACT_BITS).float(), quantize_abs(v, VALUE_GRID).float())
            att = self._attend(q, kk, vv, mask)
            x = x + blk.proj(att.transpose(1, 2).reshape(b, t, h * hd))
            x = x + blk.fc2(elementwise(torch.nn.functional.gelu, blk.fc1(blk.ln2(x))))
        return x

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        # scores: exact dot products of 24-bit q and k rows (hd terms), then one scaling
        s = torch.matmul(quantize(q, ACT_BITS), k.transpose(-1, -2)) * self.scale
        s = s.masked_fill(~mask, float("-inf"))
        e = quantize_abs(elementwise(torch.exp, s - s.amax(dim=-1, keepdim=True)), EXP_GRID)
        p = e / e.sum(-1, keepdim=True)  # exact sum; sum(p) <= 1 + rounding
        # largest |value| each query sees: a function of its own prefix
        vmax = torch.where(mask, v.abs().amax(dim=-1)[:, :, None, :], 0.0).amax(dim=-1, keepdim=True)
        _, ev = torch.frexp(vmax)  # vmax < 2**ev; sum |p v| < 2 * 2**ev
        grid = (SUM_BITS - 1 - VALUE_GRID - ev).clamp(max=60)
        return torch.matmul(quantize_abs(p, grid), v)
