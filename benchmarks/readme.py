"""Renders the benchmark pages' figures from the records in ``benchmarks/results/``.

The pages (:data:`PAGES`: benchmarks/README.md, and benchmarks/QUALITY.md for the
estimation and learning records) are prose (what each benchmark measures, its goal,
how to read it, its command) plus generated blocks, each benchmark's block on one page::

    <!-- generated: engine -->
    ...tables rendered from results/engine.json...
    <!-- end generated: engine -->

:func:`render` replaces the inside of every block with what the record gives and leaves
the prose alone, so no measured figure is typed by hand: rendering the committed records
must reproduce the committed pages byte for byte (a test checks it). A benchmark with
no record yet renders as not run. Each block starts with the run's line (date, commit,
wall time, command, machine, load average before, at most during and after).

The renderers, one function per benchmark named in :data:`RENDERERS`, live by kind in
``render_quality`` (estimation, learning), ``render_speed`` (throughput and overhead) and
``render_systems`` (serving and storage), over ``render_format``'s number formatting. A
renderer reads keys of its benchmark's JSON; if one is missing (the benchmark's
figures changed) the block says so instead of failing the whole README, and
:func:`render` returns a warning naming it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.render_format import (
    code,
    duration,
    machine_text,
    not_run,
    num,
    run_line,
    table,
)
from benchmarks.render_quality import estimator_quality, estimator_quality_heldout, learning, waves
from benchmarks.render_speed import (
    engine,
    fleet,
    http_client,
    orchestration,
    scale,
    search_planning,
    search_planning_scan,
)
from benchmarks.render_systems import batch_write, cli_start, load, local_model, restart, train_local, writer_race
from benchmarks.results import BY_NAME, REGISTRY, RESULTS, read

#: The pages, in benchmarks/: every block of the registry is on exactly one of them.
PAGES = ("README.md", "QUALITY.md")
BLOCK = re.compile(r"<!-- generated: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- end generated: (?P=name) -->", re.S)
SUMMARY = "summary"


RENDERERS: dict[str, Callable[[Any], str]] = {
    "local_model": local_model,
    "batch_write": batch_write,
    "writer_race": writer_race,
    "estimator_quality": estimator_quality,
    "estimator_quality_heldout": estimator_quality_heldout,
    "estimator_quality_unseen": estimator_quality_heldout,
    "learning": learning,
    "load_2k": load,
    "load_20k": load,
    "load_tinylm": load,
    "train_local": train_local,
    "engine": engine,
    "orchestration": orchestration,
    "search_planning_scan": search_planning_scan,
    "search_planning": search_planning,
    "scale": scale,
    "http_client": http_client,
    "cli_start": cli_start,
    "restart": restart,
    "fleet": fleet,
    "waves": waves,
}


# -- the README ----------------------------------------------------------------------------------


def block(name: str, results: Path, warnings: list[str]) -> str:
    """The inside of block ``name`` (without its markers)."""
    if name == SUMMARY:
        return summary(results)
    rec = read(name, results)
    if rec is None:
        return not_run(name)
    try:
        body = RENDERERS[name](rec["figures"])
    except (KeyError, IndexError, TypeError, ValueError, ZeroDivisionError) as e:
        warnings.append(f"{name}: the record does not have what the renderer reads ({type(e).__name__}: {e})")
        body = (
            f"_results/{name}.json does not have what its renderer (RENDERERS in benchmarks/readme.py) reads "
            f"({type(e).__name__}: {e}); the benchmark's figures changed: fix its renderer._"
        )
    return f"{run_line(rec)}\n\n{body}"


def summary(results: Path) -> str:
    rows, total, machines = [], 0.0, []
    for b in REGISTRY:
        rec = read(b.name, results)
        if rec is None:
            rows.append([b.name, "not run on this machine yet", "", "", ""])
            continue
        total += rec["wall_s"]
        m = machine_text(rec["machine"])
        if m not in machines:
            machines.append(m)
        load = [(rec.get("load_average_before") or [None])[0], rec.get("load_average_max_during"),
                (rec.get("load_average_after") or [None])[0]]  # fmt: skip
        rows.append(
            [
                b.name + (" (smoke run)" if rec.get("quick") else ""),
                rec["started_utc"].replace("T", " ")[:16],
                code(str(rec.get("git_commit"))),
                duration(rec["wall_s"]),
                " / ".join(num(x) for x in load),
            ]
        )
    done = sum(1 for b in REGISTRY if read(b.name, results) is not None)
    took = f"; their runs took {duration(total)} together" if done else ""
    rest = " (the others are not counted)" if 0 < done < len(REGISTRY) else ""
    lines = [
        table(["benchmark", "run (UTC)", "commit", "wall", "load average before / max during / after"], rows),
        f"{done} of {len(REGISTRY)} benchmarks recorded{took}{rest}.",
    ]
    if machines:
        lines.append("Machine" + ("s" if len(machines) > 1 else "") + ": " + "; ".join(machines) + ".")
    return "\n\n".join(lines)


def blocks(text: str) -> list[str]:
    """Names of the generated blocks in ``text``, in order."""
    return [m.group("name") for m in BLOCK.finditer(text)]


def problems(text: str) -> list[str]:
    """What is wrong with the README's blocks: a benchmark of the registry without its
    block, a block twice, a block of no benchmark, a marker without its pair."""
    names = blocks(text)
    out = [f"no generated block for {b.name}" for b in REGISTRY if b.name not in names]
    out += [f"block {n} appears {names.count(n)} times" for n in sorted(set(names)) if names.count(n) > 1]
    out += [f"block {n} names no benchmark" for n in names if n != SUMMARY and n not in BY_NAME]
    opened = len(re.findall(r"^<!-- generated: [\w-]+ -->$", text, re.M))
    closed = len(re.findall(r"^<!-- end generated: [\w-]+ -->$", text, re.M))
    if opened != len(names) or closed != len(names):
        out.append(f"{opened} opening and {closed} closing markers, {len(names)} paired blocks")
    return out


def render(text: str, results: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` (one page) with every generated block rendered from the records in
    ``results``, and warnings (blocks that could not be rendered)."""
    warnings: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        if name != SUMMARY and name not in BY_NAME:
            return m.group(0)
        return f"<!-- generated: {name} -->\n{block(name, results, warnings)}\n<!-- end generated: {name} -->"

    return BLOCK.sub(sub, text), warnings


def render_pages(texts: dict[str, str], results: Path = RESULTS) -> tuple[dict[str, str], list[str]]:
    """Every page of ``texts`` (name -> text) rendered, and the warnings: blocks that
    could not be rendered, and blocks missing, repeated or unknown across the pages."""
    warnings = problems("\n".join(texts.values()))
    out = {}
    for name, text in texts.items():
        out[name], more = render(text, results)
        warnings += more
    return out, warnings
