"""Number and table formatting shared by the README renderers (benchmarks/readme.py)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from benchmarks.results import BY_NAME, RESULTS, command_args

# -- formatting --------------------------------------------------------------------------


def num(x: Any, sig: int = 3) -> str:
    """``x`` to ``sig`` significant digits (all digits of the integer part), with
    thousands separators; ``n/a`` for nothing."""
    if x is None:
        return "n/a"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    x = float(x)
    if math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    if x == 0:
        return "0"
    if abs(x) >= 10 and x == round(x):  # a count or a rate the benchmark rounded
        return f"{x:,.0f}"
    if abs(x) < 1e-3:
        return f"{x:.{sig - 1}e}"
    digits = max(0, sig - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{digits}f}"


def unit(x: Any, name: str, sig: int = 3) -> str:
    """``x`` with its unit (``n/a`` alone for nothing)."""
    text = num(x, sig)
    return text if text == "n/a" else f"{text}{name}"


def x_(r: Any, sig: int = 3) -> str:
    """A ratio: ``1.23x``."""
    return unit(r, "x", sig)


def ms(seconds: Any, sig: int = 3) -> str:
    return unit(None if seconds is None else 1000 * seconds, " ms", sig)


def s_(seconds: Any, sig: int = 3) -> str:
    return unit(seconds, " s", sig)


def duration(seconds: float) -> str:
    if seconds < 10:
        return f"{seconds:.1f} s"
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


def span(xs: Iterable[Any], fmt: Callable[[Any], str] = num) -> str:
    """``min-max`` of ``xs`` (one value: that value)."""
    vals = [x for x in xs if x is not None]
    if not vals:
        return "n/a"
    lo, hi = fmt(min(vals)), fmt(max(vals))
    return lo if lo == hi else f"{lo}-{hi}"


def each(xs: Iterable[Any], fmt: Callable[[Any], str] = num) -> str:
    return ", ".join(fmt(x) for x in xs)


def verdict(value: Any, goal: float, op: str) -> str:
    """``met`` / ``**missed**`` for ``value op goal`` (``<=`` or ``>=``)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    ok = value <= goal if op == "<=" else value >= goal
    return "met" if ok else "**missed**"


def cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def table(head: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    lines = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + " --- |" * len(head)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def code(text: str) -> str:
    return "`" + text.replace("`", "'") + "`"


# -- the run's line --------------------------------------------------------------------------


def machine_text(m: dict[str, Any]) -> str:
    flags = "/".join(f.upper() for f in m.get("cpu_flags", []) if f in ("avx2", "avx512f"))
    mem = f", {num(m['memory_gib'])} GiB" if m.get("memory_gib") else ""
    return (
        f"{m.get('cores')} cores ({m.get('cpu_model')}{', ' + flags if flags else ''}){mem}, Python {m.get('python')}"
    )


def run_line(rec: dict[str, Any]) -> str:
    when = rec["started_utc"].replace("T", " ")[:16] + " UTC"
    before = (rec.get("load_average_before") or [None])[0]
    after = (rec.get("load_average_after") or [None])[0]
    load = f"load average {num(before)} before, {num(rec.get('load_average_max_during'))} at most during, {num(after)} after"
    line = (
        f"Run of {when} at {code(str(rec.get('git_commit')))}, {duration(rec['wall_s'])}: {code(rec['command'])}; "
        f"{machine_text(rec['machine'])}; {load}."
    )
    if rec.get("quick"):
        line += " **Smoke run (`--quick`): sizes too small for these figures to mean anything.**"
    return line


def not_run(name: str) -> str:
    b = BY_NAME[name]
    full = " ".join(["python -m", b.module, *command_args(b, RESULTS, False)])
    return f"_Not run on this machine yet: `python -m benchmarks --only {name}` (runs {code(full)})._"
