"""Small deterministic linear algebra for the noise fit (:mod:`focus.noise`).

BLAS-free products (einsum's own loops give the same bits on every CPU and start no
threads on a shared machine) and a Lawson-Hanson non-negative least-squares solve.
"""

from __future__ import annotations

import numpy as np


def nnls(mat: np.ndarray, rhs: np.ndarray) -> np.ndarray:
    """``argmin ½xᵀ·mat·x − rhsᵀx`` over ``x ≥ 0`` (``mat`` symmetric positive
    definite): the Lawson-Hanson active-set method on the normal equations, exact
    after finitely many steps and deterministic."""
    n = len(rhs)
    x = np.zeros(n)
    active: list[int] = []
    tol = 1e-12 * (float(np.max(np.abs(rhs))) + 1e-300)
    for _ in range(3 * n + 10):
        grad = rhs - mv(mat, x)
        free = [i for i in range(n) if i not in active]
        if not free or max(grad[i] for i in free) <= tol:
            break
        active.append(max(free, key=lambda i: grad[i]))
        while True:
            z = np.zeros(n)
            z[active] = np.linalg.solve(mat[np.ix_(active, active)], rhs[active])
            if all(z[i] > 0 for i in active):
                x = z
                break
            steps = [x[i] / (x[i] - z[i]) for i in active if z[i] <= 0 and x[i] - z[i] > 0]
            alpha = min(steps) if steps else 0.0
            x = x + alpha * (z - x)
            active = [i for i in active if x[i] > tol]
            x[[i for i in range(n) if i not in active]] = 0.0
    return x


def mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Matrix product without BLAS (einsum's own loops): the same bits on every CPU,
    and no BLAS threads spinning on a shared machine."""
    return np.einsum("ij,jk->ik", a, b)


def depth_walk(nd: int) -> np.ndarray:
    """The quadratic form ``Σ_d (x(d) − x(d+1))²`` over ``nd`` depths: the prior that
    neighbouring depths have similar variances (a random walk over depth)."""
    diff = np.zeros((max(nd - 1, 0), nd))
    for d in range(nd - 1):
        diff[d, d], diff[d, d + 1] = 1.0, -1.0
    return mm(diff.T, diff)


def mv(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.einsum("ij,j->i", a, v)


def sig6(x: float) -> float:
    return float(f"{float(x):.6g}")
