"""One-step update rules sized to the KL target (``UpdateConfig.rule``; issue 32).

The ``adam`` rule (several Adam epochs over minibatches, stopped at the KL target;
the default until 2026-12-06) turns a batch's gradient into a parameter change nearly
orthogonal to it: on the learning benchmark's corridors the batch gradient's cosine
with a 128-rollouts-per-task reference is 0.8-0.9, the Adam update's 0.04
(docs/findings/learning.md, "Gradient quality"). These rules (``sgd`` the default) keep
the direction and choose only the length: the whole batch's loss gradient ``g`` (the same clipped loss, scaled
advantages and token mean as the Adam rule), then one step ``alpha * d`` with

- ``sgd``: ``d = -g`` (plain, or normalised, gradient ascent of the objective);
- ``natural``: ``d = -(F + damping I)^-1 g`` by conjugate gradient, ``F`` the Hessian of
  the batch's token-mean KL(current || new) over the whole vocabulary at each trained
  position (the KL's second-order term: the Fisher of the model's next-token
  distributions at the batch's contexts), as TRPO does.

``alpha`` is found by a line search on the whole batch's approximate KL (the trainer's
own k3 figure, the one the Adam rule's bound reads): a first guess from the quadratic
model ``KL = alpha^2 d'Fd / 2``, then up to :data:`PROBES` corrections
``alpha *= sqrt(target / KL)``, stopping within :data:`TOLERANCE` of the target. The
probe kept is the one closest to the target among those within the Adam rule's bound
(``initial_kl + 2 * target_kl``, :func:`focus.kl_bound.kl_verdict`); if none is, the
weights are put back as they were. No optimizer state is used or changed; the step is
deterministic (no sampling; one torch thread as the trainer sets).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from focus.kl_bound import kl_verdict
from focus.packing import padded_logits

if TYPE_CHECKING:
    import torch

#: Line-search probes after the first guess.
PROBES = 4
#: A probe whose KL (above the KL before the update) is within this share of the target ends the search.
TOLERANCE = 0.1

Vector = list["torch.Tensor"]


def _dot(a: Vector, b: Vector) -> float:
    return float(sum((x.double() * y.double()).sum() for x, y in zip(a, b, strict=True)))


#: The trainer's loss on one chunk (a ``focus.train_local.Padded``): its token mean and figures.
LossFn = Callable[[Any], tuple[Any, dict[str, float]]]


def loss_gradient(model: Any, chunks: Sequence[Any], loss_of: LossFn) -> tuple[Vector, dict[str, float]]:
    """The gradient of the loss's token mean over every chunk (a ``Padded``),
    accumulated chunk by chunk, and the loss's figures over the whole batch."""
    params = list(model.parameters())
    total = sum(float(p.mask.sum()) for p in chunks)
    grad = [0.0 * q.detach() for q in params]
    figures = {"loss": 0.0, "ratio": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
    for p in chunks:
        share = float(p.mask.sum()) / max(total, 1.0)
        loss, stats = loss_of(p)
        got = _grad(loss * share, params)
        grad = [g + x for g, x in zip(grad, got, strict=True)]
        figures["loss"] += float(loss.detach()) * share
        for k in ("ratio", "clip_fraction", "approx_kl"):
            figures[k] += stats[k] * share
    return grad, figures


def _grad(value: Any, params: Vector, create_graph: bool = False) -> Vector:
    import torch

    got = torch.autograd.grad(value, params, allow_unused=True, create_graph=create_graph)
    return [0.0 * q if g is None else g for q, g in zip(params, got, strict=True)]


def fisher_product(model: Any, chunks: Sequence[Any], temperature: float, v: Vector) -> Vector:
    """``F v``: the Hessian of the token-mean KL(current || new) over the vocabulary at
    every trained position, at the current weights, times ``v`` (two backward passes
    per chunk)."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    params = list(model.parameters())
    total = sum(float(p.mask.sum()) for p in chunks)
    out = [0.0 * q.detach() for q in params]
    for p in chunks:
        with sdpa_kernel(SDPBackend.MATH):  # the fused CPU kernel has no second derivative
            logits = padded_logits(model, p)
        logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        fixed = logp.detach()
        kl = ((fixed.exp() * (fixed - logp)).sum(-1) * p.mask).sum() / max(total, 1.0)
        g = _grad(kl, params, create_graph=True)
        hv = _grad(sum((a * b).sum() for a, b in zip(g, v, strict=True)), params)
        out = [o + h.detach() for o, h in zip(out, hv, strict=True)]
    return out


def curvature_along(model: Any, chunks: Sequence[Any], temperature: float, v: Vector) -> float:
    """``v'Fv``, what ``fisher_product`` dotted with ``v`` gives, from one forward-mode
    pass per chunk: with ``delta`` the change of the tempered logits along ``v`` (a
    Jacobian-vector product) and ``p`` the model's next-token distribution, ``v'Fv`` is
    the token mean of ``p``'s variance of ``delta``. The line search needs only this
    number; two backward passes through the attention cost 2-3x more."""
    import torch
    from torch.func import functional_call, jvp
    from torch.nn.attention import SDPBackend, sdpa_kernel

    names = [n for n, _ in model.named_parameters()]
    params = tuple(q.detach() for _, q in model.named_parameters())
    total = sum(float(p.mask.sum()) for p in chunks)
    out = 0.0
    for p in chunks:

        def logits_of(*ps: torch.Tensor, p: Any = p) -> torch.Tensor:
            state = dict(zip(names, ps, strict=True))
            return padded_logits(lambda *a, **k: functional_call(model, state, a, k), p).float() / temperature

        with sdpa_kernel(SDPBackend.MATH), torch.no_grad():  # the fused CPU kernel has no forward-mode rule
            pair = jvp(logits_of, params, tuple(t.detach() for t in v))
        logits, delta = pair[0], pair[1]
        prob = torch.softmax(logits, dim=-1)
        mean = (prob * delta).sum(-1, keepdim=True)
        out += float(((prob * (delta - mean) ** 2).sum(-1) * p.mask).sum())
    return out / max(total, 1.0)


def conjugate_gradient(product: Callable[[Vector], Vector], b: Vector, iterations: int) -> Vector:
    """An approximate solution of ``product(x) = b`` (``product`` symmetric positive definite)."""
    x = [0.0 * t for t in b]
    r = [t.clone() for t in b]
    d = [t.clone() for t in b]
    rr = _dot(r, r)
    for _ in range(iterations):
        if rr <= 1e-20:
            break
        ad = product(d)
        step = rr / max(_dot(d, ad), 1e-30)
        x = [a + step * c for a, c in zip(x, d, strict=True)]
        r = [a - step * c for a, c in zip(r, ad, strict=True)]
        new = _dot(r, r)
        d = [a + (new / rr) * c for a, c in zip(r, d, strict=True)]
        rr = new
    return x


def kl_step(
    model: Any,
    chunks: Sequence[Any],
    cfg: Any,
    loss_of: LossFn,
    initial_kl: float,
    kl: Callable[[], float],
) -> tuple[list[dict[str, float]], int]:
    """Take one step of ``cfg.rule`` (an ``UpdateConfig``) along the gradient of
    ``loss_of``'s token mean, sized to ``cfg.target_kl`` by ``kl()``, the whole batch's KL
    at the current weights (module docstring): the step's figures (empty when no probe
    met the bound and the weights were put back) and the probes that overshot the bound."""
    import torch

    temperature, target = cfg.temperature or 1.0, float(cfg.target_kl)
    params = list(model.parameters())
    grad, figures = loss_gradient(model, chunks, loss_of)
    direction = [-g for g in grad]
    if cfg.rule == "natural":

        def damped(v: Vector) -> Vector:
            fv = fisher_product(model, chunks, temperature, v)
            return [a + cfg.damping * b for a, b in zip(fv, v, strict=True)]

        direction = conjugate_gradient(damped, direction, cfg.cg_iterations)
    curvature = curvature_along(model, chunks, temperature, direction)
    if not curvature > 0 or not math.isfinite(curvature):
        return [], 0
    base = [q.detach().clone() for q in params]
    alpha, kept, overshoots = math.sqrt(2 * target / curvature), None, 0
    try:
        for _ in range(1 + PROBES):
            with torch.no_grad():
                for q, b, d in zip(params, base, direction, strict=True):
                    q.copy_(b + alpha * d)
            got = kl() - initial_kl
            if not math.isfinite(got) or kl_verdict(initial_kl, initial_kl + got, target, 0) != "accept":
                overshoots += 1
            elif kept is None or abs(got - target) < abs(kept[1] - target):
                kept = (alpha, got)
            if math.isfinite(got) and abs(got - target) <= TOLERANCE * target:
                break
            alpha *= (math.sqrt(target / got) if got > 0 else 4.0) if math.isfinite(got) else 0.25
    finally:
        with torch.no_grad():
            for q, b, d in zip(params, base, direction, strict=True):
                q.copy_(b if kept is None else b + kept[0] * d)
    return ([] if kept is None else [figures]), overshoots
