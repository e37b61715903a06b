"""Renders the example READMEs' figures from their records (``examples/<name>/record.json``).

An example README is prose plus generated blocks, as benchmarks/README.md is::

    <!-- generated: math -->
    ...the run time and the result, rendered from examples/math/record.json...
    <!-- end generated: math -->

:func:`render` replaces the inside of every block with what the record gives and
leaves the prose alone, so rendering the committed records must reproduce the committed
READMEs byte for byte (``tests/test_docs_records.py``). Each block starts with the
measured run time of the command, the machine and its load, so slow can be told from
hung. ``python -m examples.records`` runs the commands and renders; ``--render-only``
renders the committed records.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.readme import BLOCK, code, duration, machine_text, num, table
from examples.records import BY_NAME, EXAMPLES, REGISTRY, read

#: The block of examples/README.md: every example's command and measured run time.
SUMMARY = "summary"


def run_text(rec: dict[str, Any]) -> str:
    """The measured run time of the command, and where and when it was measured."""
    when = rec["started_utc"].replace("T", " ")[:16] + " UTC"
    before = (rec.get("load_average_before") or [None])[0]
    return (
        f"Run time: **{duration(rec['wall_s'])}** for {code(rec['command'])} on {machine_text(rec['machine'])}, "
        f"load average {num(before)} before and {num(rec.get('load_average_max_during'))} at most during "
        f"(run of {when} at {code(str(rec.get('git_commit')))})."
    )


def result_json(result: dict[str, Any]) -> str:
    """The result the command printed, as it printed it."""
    return "```json\n" + json.dumps(result, indent=2, default=str) + "\n```"


def printed(rec: dict[str, Any]) -> str:
    return f"{run_text(rec)} It printed:\n\n{result_json(rec['result'])}"


def train_local(rec: dict[str, Any]) -> str:
    """The success table per version and seed, and the final versions."""
    f = rec["result"]
    seeds = [str(s) for s in f["seeds"]]
    success = {s: f["success"][s] for s in seeds}
    n = max(len(v) for v in success.values())
    head = "version | " + " | ".join(f"seed {s}" for s in seeds) + " | mean"
    lines = [head, "-" * len(head)]
    for i in range(n):
        got = [success[s][i] for s in seeds if i < len(success[s])]
        cells = " | ".join(f"{success[s][i]:6.3f}" if i < len(success[s]) else "   -  " for s in seeds)
        lines.append(f"{i:7d} | {cells} | {sum(got) / len(got):.3f}")
    first = [success[s][0] for s in seeds]
    last = [success[s][-1] for s in seeds]
    per_seed = "; ".join(
        f"seed {s} {success[s][0]:.3f} -> {success[s][-1]:.3f} ({duration(f['seed_wall_s'][s])}, final version "
        f"`{f['final_versions'][s]}`)"
        for s in seeds
    )
    episodes = sorted({e for e in f.get("eval_episodes", {}).values() if e})
    return (
        f"{run_text(rec)}\n\nSuccess rate on held-out targets per policy version (0 = the committed weights, "
        f"v = after v updates){f', {episodes[0]} episodes per point' if len(episodes) == 1 else ''}:\n\n"
        + "```\n"
        + "\n".join(lines)
        + "\n```\n\n"
        + f"Mean over seeds {', '.join(seeds)}: {sum(first) / len(first):.3f} before, "
        f"{sum(last) / len(last):.3f} after. Per seed: {per_seed}."
    )


RENDERERS: dict[str, Callable[[dict[str, Any]], str]] = {
    "math": printed,
    "browse": printed,
    "train_tinker": printed,
    "train_local": train_local,
}


def summary(folder: Path) -> str:
    rows = []
    for e in REGISTRY:
        rec = read(e.name, folder)
        took = (
            "not recorded yet"
            if rec is None
            else f"{duration(rec['wall_s'])} (load average {num((rec.get('load_average_before') or [None])[0])})"
        )
        rows.append([f"[{e.name}]({e.name}/README.md)", code(e.command), took])
    return table(["example", "command", "run time here"], rows)


def block(name: str, folder: Path, warnings: list[str]) -> str:
    if name == SUMMARY:
        return summary(folder)
    rec = read(name, folder)
    if rec is None:
        return f"_Not recorded yet: `.venv/bin/python -m examples.records --only {name}` runs {code(BY_NAME[name].command)}._"
    try:
        return RENDERERS[name](rec)
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
        warnings.append(f"{name}: the record does not have what the renderer reads ({type(e).__name__}: {e})")
        return f"_{name}/record.json does not have what examples/readme.py reads ({type(e).__name__}: {e})._"


def render(text: str, folder: Path = EXAMPLES) -> tuple[str, list[str]]:
    """``text`` with every generated block rendered from the records under ``folder``,
    and warnings (blocks that could not be rendered, or that name no example)."""
    warnings: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name != SUMMARY and name not in BY_NAME:
            warnings.append(f"block {name} names no example of examples.records.REGISTRY")
            return m.group(0)
        return f"<!-- generated: {name} -->\n{block(name, folder, warnings)}\n<!-- end generated: {name} -->"

    return BLOCK.sub(sub, text), warnings


def readmes(folder: Path = EXAMPLES) -> list[Path]:
    """Every README under the examples folder."""
    return sorted(folder.glob("**/README.md"))


def render_all(folder: Path = EXAMPLES) -> dict[Path, list[str]]:
    """Render every example README in place; the warnings of each."""
    out = {}
    for path in readmes(folder):
        text = path.read_text()
        rendered, warnings = render(text, folder)
        if rendered != text:
            path.write_text(rendered)
        out[path] = warnings
    return out
