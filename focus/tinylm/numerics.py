"""The serving forward of the tiny model (numpy): bit-identical whatever else is computed
with it, and from one CPU to another.

A batch of RL data is only reproducible if the model service returns the same ids and
log-probs for the same request whatever is in its prefix cache and whatever else is
being decoded at the same moment (the resume tests compare batches bit for bit). Floating-point addition is not associative, and on a CPU the order of a
reduction depends on the shape of the call: a GEMM picks its kernel and blocking by
the number of rows, a prefill computes many positions where a decode computes one,
and masked attention over a padded batch adds different numbers of zeros. So the
serving path does not merely *try* to keep shapes equal; it makes every reduction
**exact**, and an exact sum has one value whatever its order:

- Every operand of a dot product is rounded to a fixed-point grid chosen from that
  operand's own values (:func:`quantize`): activations per row (23 bits below the row's
  largest power of two), weights per output row (as many bits as the remaining float64
  budget allows, twice: a high and a low part). Each product is then an integer
  multiple of one quantum per output element and the sum of the magnitudes stays below
  2**53 quanta, so every partial sum is representable and float64 GEMMs - any kernel,
  any blocking, any thread count, any batch - return the exact value.
- Attention scores are exact the same way; the softmax weights are rounded to a grid
  of 2**-40 before their sum (exact), and the normalised weights to a grid chosen from
  the largest value they multiply (its bound is a function of the prefix), before the
  weighted sum of values (exact). Layer norms and the log-softmax use exact sums too.
- Everything else is elementwise, and maxima, which are exact. The transcendental maps
  (exp, log and GELU's normal CDF: :func:`exp`, :func:`log`, :func:`gelu`) are written
  here from IEEE basic operations (add, multiply, divide, square root, scaling by a
  power of two, rounding), which every library and CPU computes to the same bits;
  libm's and numpy's vectorised functions may differ in the last bit between a vector
  body and its scalar tail, and between CPUs.

The result for one position is therefore a function of the token prefix alone: the
same bits in a cold prefill, in a chunked prefill, after a prefix-cache hit and in a
decode step beside 63 other sequences of other lengths. Nothing in it depends on a
vector math library, so another CPU gives the same bits too (the position table is
libm's sine, computed in float64 and rounded once to float32:
:func:`focus.tinylm.arch.sinusoids`). The module needs numpy only, so the embedded
server starts without torch. The rounding
perturbs the model by about 1e-7 relative to the float32 training forward
(:meth:`focus.tinylm.model.TinyLM.forward`), far below what an importance ratio can
see; tests compare the two at 1e-4 on log-probs.

Keys and values are float32 numbers (exactly: keys hold 24 significant bits, values sit
on a 2**-24 grid; a value large enough to lose bits in float32 is still a multiple of
that grid, which is all the exact sum needs): the prefix cache stores them as float32,
the decode batch as float64 to skip a conversion every step.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from focus.tinylm.arch import TinyConfig, Weights, sinusoids

#: Significant bits kept of an activation row (about float32's precision).
ACT_BITS = 23
#: Values in the KV cache are multiples of 2**-VALUE_GRID.
VALUE_GRID = 24
#: Softmax numerators (in [0, 1]) are multiples of 2**-EXP_GRID before their sum.
EXP_GRID = 40
#: Sums stay below 2**SUM_BITS quanta (float64 holds integers up to 2**53 exactly).
SUM_BITS = 52

Array = np.ndarray


def quantize(x: Array, bits: int) -> Array:
    """Round each row (last dim) of ``x`` to multiples of 2**(e - bits), where 2**e is the
    smallest power of two above the row's largest magnitude: at most ``bits + 1``
    significant bits per element. Multiplying and dividing by powers of two is exact, so
    the result depends on each element and its row's maximum only."""
    amax = np.abs(x).max(axis=-1, keepdims=True)
    _, e = np.frexp(amax)  # amax < 2**e
    scale = np.ldexp(1.0, bits - e)
    return np.rint(x * scale) / scale


def quantize_abs(x: Array, grid: Array | int) -> Array:
    """Round to multiples of 2**-grid (``grid`` broadcasts against ``x``)."""
    scale = np.ldexp(1.0, np.asarray(grid, dtype=np.int32))
    return np.rint(x * scale) / scale


# --- exp, log and the normal CDF from basic operations --------------------------------------
_LOG2E = 1.4426950408889634
#: ln 2 in two parts (fdlibm's): the high part has 32 significant bits, so k * _LN2_HI is
#: exact for the exponents that occur.
_LN2_HI = 6.93147180369123816490e-01
_LN2_LO = 1.90821492927058770002e-10
#: Taylor coefficients of exp on |r| <= ln(2)/2 (the first omitted term is below 2e-16).
_EXP_TAYLOR = tuple(1.0 / math.factorial(k) for k in range(13))
#: 2 / (2k + 1): log(m) = 2 atanh(s) = s * sum 2 s^2k / (2k + 1), |s| <= 0.1716.
_ATANH_SERIES = tuple(2.0 / (2 * k + 1) for k in range(12))
#: erfc(z) = t exp(-z^2 + g(t)) with t = 2 / (2 + z) (z >= 0, as in Numerical Recipes'
#: erfccheb): g as a polynomial in y = 2t - 1, from its Chebyshev expansion of 24 terms
#: (computed with mpmath at 50 digits); |error| below 2e-15 on the whole half-line.
_ERFC_G = (
    -0.6717940840566906, 0.6726432239776583, 0.04734330684142489, -0.04689561023132892,
    -0.00987268934319109, 0.008824938561312326, 0.0017589331171176884, -0.002345812552995894,
    -0.00014624252395767715, 0.0006736791352568864, -9.376035760297014e-05, -0.00017430412986925938,
    7.149530982602198e-05, 3.174693542327236e-05, -3.0421097531594203e-05, 1.3989370477611051e-07,
    8.952692300720023e-06, -2.963484230959699e-06, -1.7128780471140371e-06, 1.283394915356199e-06,
    1.5975482569412025e-07, -2.895626567435524e-07, 7.992047577730608e-10, 2.980513364515168e-08,
)  # fmt: skip
_SQRT_HALF = 0.7071067811865476


def _horner(coefs: tuple[float, ...], x: Array) -> Array:
    out = x * coefs[-1]
    out += coefs[-2]
    for c in coefs[-3::-1]:
        out *= x
        out += c
    return out


#: Elements per block of the maps below: a block's temporaries stay in the CPU's L2 cache
#: (a prefill's attention scores are megabytes; every step of a polynomial would stream them).
_BLOCK = 16384


def _blockwise(fn: Callable[[Array], Array]) -> Callable[[Array], Array]:
    """``fn`` applied to blocks of a large array (elementwise, so the bits are the same)."""

    def apply(x: Array) -> Array:
        x = np.asarray(x, dtype=np.float64)
        if x.size <= _BLOCK:
            return fn(x)
        flat = x.reshape(-1)
        out = np.empty_like(flat)
        for i in range(0, flat.size, _BLOCK):
            out[i : i + _BLOCK] = fn(flat[i : i + _BLOCK])
        return out.reshape(x.shape)

    apply.__doc__ = fn.__doc__
    return apply


@_blockwise
def exp(x: Array) -> Array:
    """exp(x) within 2 units in the last place; ``-inf`` gives 0."""
    return _exp(x)


@_blockwise
def softmax_numerators(x: Array) -> Array:
    """exp(x) for x <= 0 on the grid of 2**-EXP_GRID (whose sum is exact)."""
    e = _exp(x)
    e *= 2.0**EXP_GRID
    np.rint(e, out=e)
    e *= 2.0**-EXP_GRID
    return e


def _exp(x: Array) -> Array:
    # in-place steps: every temporary of a large array would cost the allocator page faults
    x = np.clip(x, -746.0, 710.0)
    k = x * _LOG2E
    np.rint(k, out=k)
    r = k * _LN2_HI
    np.subtract(x, r, out=r)
    x *= 0.0
    x += k
    x *= _LN2_LO
    r -= x  # r = (x - k ln2_hi) - k ln2_lo, |r| <= ln(2)/2
    p = _horner(_EXP_TAYLOR, r)
    return np.ldexp(p, k.astype(np.int32), out=p)


@_blockwise
def log(x: Array) -> Array:
    """log(x) for x >= 0 within 2 units in the last place (log 0 = ``-inf``)."""
    m, e = np.frexp(x)  # x = m 2**e, m in [0.5, 1)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)  # now in [0.707, 1.414)
    e = (e - low).astype(np.float64)
    s = (m - 1.0) / (m + 1.0)  # m - 1 is exact
    out = e * _LN2_HI + (e * _LN2_LO + s * _horner(_ATANH_SERIES, s * s))
    return np.where(x > 0, out, -np.inf)


@_blockwise
def gelu(x: Array) -> Array:
    """x * Phi(x), with the normal CDF Phi from erfc (relative error below 1e-13)."""
    z = np.abs(x)
    z *= _SQRT_HALF
    t = z + 2.0
    np.divide(2.0, t, out=t)  # t = 2 / (2 + z)
    y = t * 2.0
    y -= 1.0
    g = _horner(_ERFC_G, y)
    z *= z
    g -= z
    tail = _exp(g)
    tail *= t
    tail *= 0.5  # Phi(-|x|) = erfc(z) / 2
    pos = x >= 0
    np.subtract(1.0, tail, out=tail, where=pos)
    tail *= x
    return tail


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

    hi_t: Array  # (in, out) float64 on the grid: W's high part, transposed
    lo_t: Array
    bias: Array | None

    @staticmethod
    def of(w: Array, b: Array | None) -> Linear:
        w64 = w.astype(np.float64)
        bits = _weight_bits(w.shape[1])
        hi = quantize(w64, bits)
        lo = quantize(w64 - hi, bits)
        bias = None if b is None else b.astype(np.float64)
        return Linear(np.ascontiguousarray(hi.T), np.ascontiguousarray(lo.T), bias)

    def __call__(self, x: Array) -> Array:
        lead = x.shape[:-1]
        x = x.reshape(-1, x.shape[-1])  # one 2-D GEMM (numpy loops over a stack of 1-row ones)
        xh = quantize(x, ACT_BITS)
        xl = quantize(x - xh, ACT_BITS)
        y = xh @ self.hi_t
        y += xh @ self.lo_t + xl @ self.hi_t
        if self.bias is not None:
            y += self.bias
        return y.reshape(*lead, y.shape[-1])


@dataclass(frozen=True)
class LayerNorm:
    weight: Array
    bias: Array
    eps: float = 1e-5  # torch.nn.LayerNorm's default, which the training model uses

    def __call__(self, x: Array) -> Array:
        d = x.shape[-1]
        mean = quantize(x, SUM_BITS - math.ceil(math.log2(d)) - 1).sum(-1, keepdims=True) / d
        c = x - mean
        half = (SUM_BITS - math.ceil(math.log2(d))) // 2 - 1
        cq = quantize(c, half)
        var = (cq * cq).sum(-1, keepdims=True) / d
        return c / np.sqrt(var + self.eps) * self.weight + self.bias


def exact_logsumexp(x: Array) -> Array:
    """log(sum(exp(x))) over the last dim, with an exact sum of the rounded exponentials."""
    m = x.max(axis=-1, keepdims=True)
    e = softmax_numerators(x - m)
    return m + log(e.sum(-1, keepdims=True))


def log_softmax(x: Array) -> Array:
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
    """Where a forward keeps keys and values ((B, heads, time, head_dim), values that
    float32 holds exactly)."""

    def extend(self, layer: int, k: Array, v: Array) -> tuple[Array, Array, Array]:
        """Store the new tokens' keys and values of ``layer``; return (float64) all keys and
        values the new tokens may attend to, their own included, and each one's largest
        value magnitude (B, heads, time): :func:`value_magnitudes` of those values, which
        a store can keep rather than recompute every step."""
        ...


def value_magnitudes(v: Array) -> Array:
    """max |v| over the head dimension, per key position: (..., time, head_dim) -> (..., time)."""
    return np.abs(v).max(axis=-1)


class InvariantLM:
    """The serving forward of the weights of a :class:`focus.tinylm.model.TinyLM`."""

    def __init__(self, weights: Weights) -> None:
        cfg: TinyConfig = weights.config
        st = weights.state
        self.cfg = cfg
        self.n_heads = cfg.n_heads
        self.head_dim = cfg.d_model // cfg.n_heads
        self.embed = st["embed.weight"].astype(np.float64)
        self.head = Linear.of(st["embed.weight"], None)
        self.pos = sinusoids(cfg.max_len, cfg.d_model).astype(np.float64)

        def ln(prefix: str) -> LayerNorm:
            return LayerNorm(st[f"{prefix}.weight"].astype(np.float64), st[f"{prefix}.bias"].astype(np.float64))

        def lin(prefix: str) -> Linear:
            return Linear.of(st[f"{prefix}.weight"], st[f"{prefix}.bias"])

        self.blocks = [
            _Block(
                ln(f"blocks.{i}.ln1"),
                lin(f"blocks.{i}.qkv"),
                lin(f"blocks.{i}.proj"),
                ln(f"blocks.{i}.ln2"),
                lin(f"blocks.{i}.mlp.0"),
                lin(f"blocks.{i}.mlp.2"),
            )
            for i in range(cfg.n_layers)
        ]
        self.ln_f = ln("ln_f")
        self.scale = 1.0 / math.sqrt(self.head_dim)

    @property
    def n_layers(self) -> int:
        return len(self.blocks)

    def logits(self, h: Array) -> Array:
        """Output logits (float64) of final hidden states ``h`` (..., d_model)."""
        return self.head(self.ln_f(h))

    def forward(self, ids: Array, positions: Array, store: KVStore, key_valid: Array) -> Array:
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
            q, k, v = (
                np.ascontiguousarray(z.reshape(b, t, h, hd).transpose(0, 2, 1, 3)) for z in np.split(qkv, 3, axis=-1)
            )
            kk, vv, vabs = store.extend(
                i, quantize(k, ACT_BITS).astype(np.float32), quantize_abs(v, VALUE_GRID).astype(np.float32)
            )
            att = self._attend(q, kk, vv, vabs, mask)
            x = x + blk.proj(att.transpose(0, 2, 1, 3).reshape(b, t, h * hd))
            x = x + blk.fc2(gelu(blk.fc1(blk.ln2(x))))
        return x

    def _attend(self, q: Array, k: Array, v: Array, vabs: Array, mask: Array) -> Array:
        # scores: exact dot products of 24-bit q and k rows (hd terms), then one scaling
        s = (quantize(q, ACT_BITS) @ k.transpose(0, 1, 3, 2)) * self.scale
        s = np.where(mask, s, -np.inf)
        e = softmax_numerators(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(-1, keepdims=True)  # exact sum; sum(p) <= 1 + rounding
        # largest |value| each query sees: a function of its own prefix
        vmax = np.where(mask, vabs[:, :, None, :], 0.0).max(axis=-1, keepdims=True)
        _, ev = np.frexp(vmax)  # vmax < 2**ev; sum |p v| < 2 * 2**ev
        grid = np.minimum(SUM_BITS - 1 - VALUE_GRID - ev, 60)
        return quantize_abs(p, grid) @ v
