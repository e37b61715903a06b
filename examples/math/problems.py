"""A small problem set the example generates itself (nothing is downloaded).

Five families of short problems with exact answers, drawn from a seeded generator:
fraction sums, linear equations, expansions of products, percentages and least
common multiples; and an easy sixth (single-digit sums) for the ``digit_sum``
difficulty (:data:`DIFFICULTIES`). Gold answers are written in one canonical form (LaTeX fractions,
expanded polynomials); the verifier accepts any equivalent form, which is the point
of the example. ``python -m examples.math.problems --n 20`` prints a set as JSON lines.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass
from fractions import Fraction

KINDS = ("fraction_sum", "linear_equation", "expand", "percent", "lcm", "digit_sum")
#: Problem kinds per difficulty. ``standard``: the five MATH-style families (the
#: embedded tiny model solves almost none). ``digit_sum``: "Compute a + b." with
#: digits a, b and a single-digit sum, the one kind the tiny model (trained to say
#: digits) solves now and then, which leaves RL room to improve it.
DIFFICULTIES = {"standard": KINDS[:5], "digit_sum": ("digit_sum",)}


@dataclass(frozen=True)
class Problem:
    id: str
    kind: str
    question: str
    answer: str


def _latex(q: Fraction) -> str:
    if q.denominator == 1:
        return str(q.numerator)
    sign = "-" if q < 0 else ""
    return f"{sign}\\frac{{{abs(q.numerator)}}}{{{q.denominator}}}"


def _poly(a: int, b: int, c: int) -> str:
    """``a x^2 + b x + c`` written canonically (coefficients 1 and 0 elided)."""
    out = "x^2" if a == 1 else f"{a}x^2"
    for coef, var in ((b, "x"), (c, "")):
        if coef == 0:
            continue
        mag = abs(coef)
        term = var if mag == 1 and var else f"{mag}{var}"
        out += f" {'-' if coef < 0 else '+'} {term}"
    return out


def _one(kind: str, rng: random.Random) -> tuple[str, str]:
    if kind == "fraction_sum":
        a, b = Fraction(rng.randint(1, 9), rng.randint(2, 9)), Fraction(rng.randint(1, 9), rng.randint(2, 9))
        return f"Compute {a} + {b}.", _latex(a + b)
    if kind == "linear_equation":
        x, a, b = rng.randint(-9, 9), rng.randint(2, 9), rng.randint(-20, 20)
        c = a * x + b
        return f"Solve for x: {a}x {'+' if b >= 0 else '-'} {abs(b)} = {c}.", str(x)
    if kind == "expand":
        p, q = rng.choice([i for i in range(-6, 7) if i]), rng.choice([i for i in range(-6, 7) if i])
        left = f"(x {'+' if p > 0 else '-'} {abs(p)})(x {'+' if q > 0 else '-'} {abs(q)})"
        return f"Expand {left}.", _poly(1, p + q, p * q)
    if kind == "percent":
        pct, n = rng.choice([5, 10, 12, 15, 20, 25, 40, 50, 75]), rng.randint(2, 40) * 4
        return f"What is {pct}% of {n}?", _latex(Fraction(pct * n, 100))
    if kind == "digit_sum":
        a = rng.randint(1, 8)
        b = rng.randint(1, 9 - a)
        return f"Compute {a} + {b}.", str(a + b)
    if kind == "lcm":
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        return f"What is the least common multiple of {a} and {b}?", str(a * b // math.gcd(a, b))
    raise ValueError(f"unknown problem kind {kind!r}; known: {KINDS}")


def generate_problems(n: int, seed: int = 0, kinds: tuple[str, ...] = DIFFICULTIES["standard"]) -> list[Problem]:
    """``n`` problems cycling through ``kinds``; the same seed gives the same set."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    unknown = [k for k in kinds if k not in KINDS]
    if unknown or not kinds:
        raise ValueError(f"unknown problem kinds {unknown}; known: {KINDS}")
    rng = random.Random(seed)
    out = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        question, answer = _one(kind, rng)
        out.append(Problem(f"math-{seed}-{i}", kind, question, answer))
    return out


def main(argv: list[str] | None = None) -> None:
    from examples.common import ArgumentParser, count

    ap = ArgumentParser(
        prog="python -m examples.math.problems", description="Print a generated problem set as JSON lines."
    )
    ap.add_argument("--n", type=count(0), default=20)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    for p in generate_problems(args.n, args.seed):
        print(json.dumps(asdict(p)))


if __name__ == "__main__":
    main()
