"""Judging a math answer by equivalence, not by string equality.

``1/2``, ``0.5`` and ``\\frac{1}{2}`` are the same answer; so are ``x+1`` and ``1+x``.
math-verify parses both sides into sympy expressions and compares them symbolically
and numerically. Its own timeouts use ``signal.alarm``, which only works in the main
thread, while rollouts may run in worker threads (Dask); so its timeouts are off and
the input length is bounded instead: a model answer longer than ``MAX_ANSWER_CHARS``
is judged wrong without parsing.
"""

from __future__ import annotations

import logging
from typing import Any

MAX_ANSWER_CHARS = 200

# math-verify logs a warning on every call when its signal timeouts are disabled.
logging.getLogger("math_verify").setLevel(logging.ERROR)


def _parse(text: str) -> list[Any]:
    from math_verify import parse

    text = text.strip()
    if not text:
        return []
    # Bare answers ("11/12", "x+1") read best as LaTeX in math mode; answers that carry
    # their own markup (\boxed{...}, $...$) are left as they are.
    wrapped = text if ("$" in text or "\\boxed" in text) else f"${text}$"
    parsed = parse(wrapped, parsing_timeout=None)  # type: ignore[arg-type]
    if not parsed:
        parsed = parse(text, parsing_timeout=None)  # type: ignore[arg-type]
    return list(parsed)


def answers_equivalent(predicted: str, gold: str) -> bool:
    """Whether ``predicted`` is mathematically the same answer as ``gold``.

    ``gold`` must parse (a problem with an unparsable answer is a bug in the problem
    set, reported as a ``ValueError``); a ``predicted`` that does not parse is wrong.
    """
    from math_verify import verify

    gold_parsed = _parse(gold)
    if not gold_parsed:
        raise ValueError(f"gold answer {gold!r} does not parse as math")
    if not predicted or len(predicted) > MAX_ANSWER_CHARS:
        return False
    pred_parsed = _parse(predicted)
    if not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))  # type: ignore[arg-type]
