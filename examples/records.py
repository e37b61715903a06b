"""Where the figures the example READMEs quote come from: one record per example.

Each entry of :data:`REGISTRY` is the command an example's README shows. ``python -m
examples.records`` runs it (``--only math,browse`` for some), from the project root,
with ``--json`` added so the run writes its result; the record - that result plus the
command, wall time, machine, load average and commit - goes to
``examples/<name>/record.json`` (the run's ``--out`` folder is emptied first, so the
run starts from nothing rather than resuming), files the run made that the README shows (a plot) are
copied beside it, and the READMEs' generated blocks are rendered again from the
records (:mod:`examples.readme`). No figure in an example README is typed by hand, and
``tests/test_docs_records.py`` fails when a README and its record disagree.

    .venv/bin/python -m examples.records --only math
    .venv/bin/python -m examples.records --render-only
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.results import LoadWatch, git_commit, load_average, machine

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"


@dataclass(frozen=True)
class Example:
    """The command ``.venv/bin/python -m examples.<name>.run <args>`` its README shows."""

    name: str
    args: tuple[str, ...]
    #: files the run writes under its ``--out`` that are kept beside the record
    keep: tuple[str, ...] = ()
    timeout_s: float = 3600.0

    @property
    def command(self) -> str:
        return " ".join([".venv/bin/python -m", f"examples.{self.name}.run", *self.args])

    @property
    def out(self) -> Path | None:
        """The run's ``--out`` folder, if it names one."""
        args = list(self.args)
        return Path(args[args.index("--out") + 1]) if "--out" in args else None


REGISTRY: tuple[Example, ...] = (
    Example("math", ("--problems", "5", "--out", "/tmp/focus-math-x"), timeout_s=900),
    Example("browse", ("--questions", "4", "--out", "/tmp/focus-browse"), timeout_s=3600),
    Example("train_tinker", ("--collect-toy", "--out", "/tmp/focus-tinker"), timeout_s=900),
    Example(
        "train_local", ("--seeds", "0", "1", "2", "--out", "runs/train_local"), keep=("success.png",), timeout_s=14400
    ),
)
BY_NAME = {e.name: e for e in REGISTRY}


def record_path(name: str, folder: Path = EXAMPLES) -> Path:
    return folder / name / "record.json"


def read(name: str, folder: Path = EXAMPLES) -> dict[str, Any] | None:
    path = record_path(name, folder)
    return json.loads(path.read_text()) if path.exists() else None


def run_and_record(example: Example, folder: Path = EXAMPLES) -> dict[str, Any]:
    """Run the example's command from the project root with ``--json``, then write its
    record (and copy the files it keeps). Raises if the run fails; the previous record
    is then left as it was."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix=f"focus-example-{example.name}-") as tmp:
        out = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", f"examples.{example.name}.run", *example.args, "--json", str(out)]
        before, started = load_average(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        commit = git_commit()  # the code that runs (edits made while it runs do not count)
        if example.out is not None and not example.out.is_absolute():
            shutil.rmtree(ROOT / example.out, ignore_errors=True)  # a run from nothing, not a resume
        elif example.out is not None:
            shutil.rmtree(example.out, ignore_errors=True)
        t0 = time.perf_counter()
        with LoadWatch() as watch:
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=example.timeout_s)
            except subprocess.TimeoutExpired as e:
                raise RuntimeError(
                    f"example {example.name} ran past {example.timeout_s:.0f} s: {example.command}"
                ) from e
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"example {example.name} failed (exit {proc.returncode}): {example.command}")
        result = json.loads(out.read_text())
    record = {
        "example": example.name,
        "command": example.command,
        "started_utc": started,
        "wall_s": round(wall, 1),
        "load_average_before": before,
        "load_average_max_during": round(watch.peak, 2),
        "load_average_after": load_average(),
        "machine": machine(),
        "git_commit": commit,
        "result": result,
    }
    base = example.out if example.out is None or example.out.is_absolute() else ROOT / example.out
    for name in example.keep:
        assert base is not None, f"{example.name} keeps {name} but names no --out folder"
        shutil.copyfile(base / name, folder / example.name / name)
    path = record_path(example.name, folder)
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    tmp_path.replace(path)
    return record


def main(argv: list[str] | None = None) -> None:
    from examples.readme import render_all

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated example names (default: every example)")
    ap.add_argument("--render-only", action="store_true", help="render the READMEs from the records, run nothing")
    args = ap.parse_args(argv)
    names = args.only.split(",") if args.only else [e.name for e in REGISTRY]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown example(s) {unknown}; known: {', '.join(BY_NAME)}")
    if not args.render_only:
        for name in names:
            print(f"example {name}: {BY_NAME[name].command}", flush=True)
            rec = run_and_record(BY_NAME[name])
            print(f"example {name}: recorded in {record_path(name).relative_to(ROOT)} ({rec['wall_s']} s)", flush=True)
    for path, warnings in render_all().items():
        for w in warnings:
            print(f"{path}: {w}", file=sys.stderr)


if __name__ == "__main__":
    main()
