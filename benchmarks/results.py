"""Where benchmark figures live: one JSON per benchmark under ``benchmarks/results/``.

Every figure benchmarks/README.md cites comes from one of these files, and the README's
tables are rendered from them (:mod:`benchmarks.readme`), so a figure can always be
traced to the run that made it. Each file holds the benchmark's own figures plus what
makes them comparable: the machine (cores, CPU model, Python, torch threads), the load
average before and after the run, the wall time, the command, and the git commit.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"


def cpu_model() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (``platform.processor()`` elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The vector extensions that change float results between machines (AVX2, AVX-512)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return sorted(f for f in flags if f in ("avx", "avx2", "avx512f", "avx512_bf16", "amx_tile"))
    except OSError:
        pass
    return []


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return []


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def run_and_record(name: str, module: str, args: list[str], *, timeout_s: float) -> dict[str, Any]:
    """Run ``python -m <module> <args> --json <tmp>`` in a fresh process and write
    ``results/<name>.json``: the benchmark's figures plus the run's context."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"{name}.figures.tmp.json"
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", module, *args, "--json", str(out)]
    load_before, t0, started = load_average(), time.perf_counter(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    proc = subprocess.run(cmd, cwd=ROOT, timeout=timeout_s)
    wall = time.perf_counter() - t0
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"benchmark {name} failed (exit {proc.returncode}): {' '.join(cmd)}")
    figures = json.loads(out.read_text())
    out.unlink()
    record = {
        "benchmark": name,
        "command": f"python -m {module} {' '.join(args)}".strip(),
        "started_utc": started,
        "wall_s": round(wall, 1),
        "load_average_before": load_before,
        "load_average_after": load_average(),
        "machine": machine(),
        "git_commit": git_commit(),
        "figures": figures,
    }
    (RESULTS / f"{name}.json").write_text(json.dumps(record, indent=1, sort_keys=True, default=str) + "\n")
    return record


def read(name: str) -> dict[str, Any] | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None
