"""Where benchmark figures live: one JSON per benchmark under ``benchmarks/results/``.

Every figure benchmarks/README.md cites comes from one of these files, and the README's
tables are rendered from them (:mod:`benchmarks.readme`), so a figure can always be
traced to the run that made it. Each file holds the benchmark's own figures plus what
makes them comparable: the machine (cores, CPU model and vector extensions, memory,
Python), the load average before, during (the highest 1-minute value seen) and after
the run, the wall time, the command, and the git commit.

:data:`REGISTRY` names every benchmark the README cites, with the arguments of its full
run and of its smoke run (``--quick``); ``python -m benchmarks`` runs them
(:mod:`benchmarks.__main__`), each in its own process, each writing its figures with
``--json PATH``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"
#: Stands for the results folder in a benchmark's arguments (files it writes beside its JSON).
RESULTS_DIR = "{results}"


@dataclass(frozen=True)
class Benchmark:
    """One entry of ``python -m benchmarks``: ``python -m <module> <args> --json PATH``
    writes ``results/<name>.json``, which the README block ``<name>`` is rendered from.
    One module may appear under several names (other sizes of the same benchmark)."""

    name: str
    module: str
    #: the full run: what the README's figures come from
    args: tuple[str, ...] = ()
    #: the smoke run (``--quick``): seconds, figures that mean nothing
    quick: tuple[str, ...] = ()
    #: kill the full run after this long (the smoke run gets a tenth, at least 5 minutes)
    timeout_s: float = 3600.0
    #: top-level keys of the benchmark's JSON not kept in the stored record (bulk that no
    #: figure in the README reads; the benchmark's own ``--json`` still writes them)
    drop: tuple[str, ...] = ()


REGISTRY: tuple[Benchmark, ...] = (
    Benchmark("local_model", "benchmarks.local_model", (), ("--rounds", "1"), timeout_s=1200),
    Benchmark(
        "batch_write",
        "benchmarks.batch_write",
        ("--repeats", "11"),
        ("--tokens", "50000", "--repeats", "2", "--no-s3"),
        timeout_s=1800,
    ),
    Benchmark("writer_race", "benchmarks.writer_race", (), ("--attempts", "3", "--no-s3"), timeout_s=1800),
    Benchmark(
        "estimator_quality",
        "benchmarks.estimator_quality",
        # the eight project families and the original critics (the held-out-style ones
        # of issue 31 have their own record below; the default lists now include them)
        (
            "--plot",
            f"{RESULTS_DIR}/estimator_quality.png",
            "--families",
            "uniform,critical,long,slippery,forage,project,timing,subtle",
            "--critics",
            "exact,noise_0.5,noise_1,noise_3,constant",
        ),
        ("--quick", "--families", "uniform,slippery", "--budgets", "6", "--critics", "noise_1,constant", "--jobs", "1"),
        timeout_s=5400,
        drop=("raw",),
    ),  # fmt: skip
    Benchmark(
        "estimator_quality_heldout",
        "benchmarks.estimator_quality",
        (
            "--families",
            "decisive,heavy_tail,truncated",
            "--budgets",
            "2,6",
            "--critics",
            "noise_1,noise_3,constant,biased,early_late",
            "--methods",
            "grpo,uniform,selective",
            "--seeds",
            "8",
        ),
        ("--quick", "--families", "decisive", "--budgets", "2", "--critics", "biased,constant", "--jobs", "1"),
        timeout_s=5400,
        drop=("raw",),
    ),  # fmt: skip
    Benchmark(
        "estimator_quality_unseen",
        "benchmarks.estimator_quality",
        (
            "--families",
            "early_gate,risky_bridge,multi_key,wide,gauss_noise",
            "--budgets",
            "2,6",
            "--critics",
            "noise_1,noise_3,constant,stale,shrunk,biased_early",
            "--methods",
            "grpo,uniform,selective",
            "--seeds",
            "4",
        ),
        ("--quick", "--families", "wide", "--budgets", "2", "--critics", "stale,constant", "--jobs", "1"),
        timeout_s=5400,
        drop=("raw",),
    ),  # fmt: skip
    Benchmark(
        "learning",
        "benchmarks.learning",
        ("--plot", f"{RESULTS_DIR}/learning.png"),
        ("--quick", "--quiet", "--tasks", "toy", "--plot", f"{RESULTS_DIR}/learning.png"),
        timeout_s=7200,
    ),
    Benchmark(
        "load_2k",
        "benchmarks.load",
        ("--transitions", "2000", "--fault-rate", "0.1", "--repeats", "3"),
        ("--transitions", "300", "--tasks", "20", "--fault-rate", "0.1"),
        timeout_s=1800,
    ),
    Benchmark(
        "load_20k",
        "benchmarks.load",
        ("--transitions", "20000", "--fault-rate", "0.1", "--repeats", "3"),
        ("--transitions", "600", "--tasks", "20", "--fault-rate", "0.1"),
        timeout_s=3600,
    ),
    Benchmark(
        "load_tinylm",
        "benchmarks.load",
        ("--server", "tinylm", "--transitions", "2000", "--tasks", "40", "--fault-rate", "0.1", "--repeats", "3"),
        ("--server", "tinylm", "--transitions", "300", "--tasks", "20", "--fault-rate", "0.1"),
        timeout_s=3600,
    ),
    Benchmark(
        "train_local", "benchmarks.train_local", ("--tasks", "32", "--repeats", "3"), ("--tasks", "4", "--repeats", "1")
    ),
    Benchmark("engine", "benchmarks.engine", ("--repeats", "3"), ("--small",), timeout_s=3600),
    Benchmark(
        "orchestration",
        "benchmarks.orchestration",
        ("--repeats", "3"),
        ("--small", "--policy", "inprocess"),
        timeout_s=3600,
    ),
    Benchmark(
        "search_planning_scan",
        "benchmarks.search_planning",
        ("--scan", "100000", "--tasks", "40", "2000", "--wave-size", "256"),
        ("--scan", "1500", "--tasks", "10", "--wave-size", "32"),
        timeout_s=3600,
    ),
    Benchmark(
        "search_planning",
        "benchmarks.search_planning",
        ("--tasks", "40", "200", "1000"),
        ("--tasks", "10", "--waves", "2", "--warmup", "1"),
        timeout_s=1800,
    ),
    Benchmark("scale", "benchmarks.scale", (), ("--quick",), timeout_s=5400),
    Benchmark(
        "http_client",
        "benchmarks.http_client",
        (),
        ("--requests", "200", "--concurrency", "16", "--repeats", "1", "--no-tinylm"),
        timeout_s=2400,
    ),
    Benchmark(
        "cli_start", "benchmarks.cli_start", ("--repeats", "3", "--with-server"), ("--repeats", "1"), timeout_s=2400
    ),
    Benchmark("restart", "benchmarks.restart", ("--down", "30,90"), ("--down", "3", "--tasks", "3"), timeout_s=1800),
    Benchmark(
        "fleet",
        "benchmarks.fleet",
        ("--scan", "--tinylm"),
        ("--replicas", "1,2", "--transitions", "20", "--tasks", "2", "--latency-ms", "20", "--prefill-ms", "1"),
        timeout_s=5400,
    ),
    Benchmark(
        "waves",
        "benchmarks.waves",
        ("--seeds", "5", "--variants", '{"jobs": {"wave_unit": "jobs"}, "double": {"wave_size": 32}}'),
        (
            "--families",
            "critical,decisive",
            "--budgets",
            "6",
            "--seeds",
            "1",
            "--jobs",
            "1",
            "--variants",
            '{"jobs": {"wave_unit": "jobs"}}',
        ),
        timeout_s=3600,
        drop=("raw",),
    ),  # fmt: skip
)
BY_NAME = {b.name: b for b in REGISTRY}


def write_report(report: dict[str, Any], path: Path | None) -> dict[str, Any]:
    """A benchmark's figures: printed as JSON, and written to ``path`` (``--json``) when given."""
    text = json.dumps(report, indent=1)
    if path:
        path.write_text(text)
    print(text)
    return report


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


def memory_gib() -> float | None:
    """Total memory (MemTotal of /proc/meminfo), GiB."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def machine() -> dict[str, Any]:
    return {
        "cores": os.cpu_count(),
        "cpu_model": cpu_model(),
        "cpu_flags": cpu_flags(),
        "memory_gib": memory_gib(),
        "python": platform.python_version(),
        "platform": platform.platform(terse=True),
    }


def load_average() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # pragma: no cover - not on Linux
        return []


#: Files a recording run rewrites itself: changes to them do not make a run dirty.
RECORDED = (
    ":!benchmarks/results",
    ":!benchmarks/README.md",
    ":!benchmarks/QUALITY.md",
    ":!examples/*/record.json",
    ":!examples/*/README.md",
    ":!examples/*/*.png",
)


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    if out.returncode != 0:
        return None
    # the records and the READMEs the recording runners rewrite do not make a run dirty
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", "--", ".", *RECORDED], cwd=ROOT, capture_output=True
    )
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


class LoadWatch:
    """The highest 1-minute load average seen while a run lasts (sampled every few seconds)."""

    def __init__(self, every_s: float = 5.0) -> None:
        self.every_s = every_s
        self.peak = (load_average() or [0.0])[0]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._stop.wait(self.every_s):
            self.peak = max(self.peak, (load_average() or [0.0])[0])

    def __enter__(self) -> LoadWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, (load_average() or [0.0])[0])


def command_args(bench: Benchmark, results: Path, quick: bool) -> list[str]:
    """The benchmark's arguments with the results folder filled in (relative to the
    project root where it lies inside it, so the recorded command reads the same on any
    checkout)."""
    try:
        where = str(results.resolve().relative_to(ROOT))
    except ValueError:
        where = str(results.resolve())
    return [a.replace(RESULTS_DIR, where) for a in (bench.quick if quick else bench.args)]


def run_and_record(
    bench: Benchmark, *, results: Path = RESULTS, quick: bool = False, timeout_s: float | None = None
) -> dict[str, Any]:
    """Run ``python -m <module> <args> --json <tmp>`` in a fresh process (from the project
    root, this checkout first on the path) and write ``<results>/<name>.json``: the
    benchmark's figures plus the run's context. Raises if the run fails; the previous
    record, if any, is then left as it was."""
    results.mkdir(parents=True, exist_ok=True)
    args = command_args(bench, results, quick)
    limit = timeout_s if timeout_s is not None else (max(300.0, bench.timeout_s / 10) if quick else bench.timeout_s)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix=f"focus-bench-{bench.name}-") as tmp:
        out = Path(tmp) / "figures.json"
        cmd = [sys.executable, "-m", bench.module, *args, "--json", str(out)]
        load_before, started = load_average(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        t0 = time.perf_counter()
        with LoadWatch() as watch:
            try:
                proc = subprocess.run(cmd, cwd=ROOT, env=env, timeout=limit)
            except subprocess.TimeoutExpired as e:
                raise RuntimeError(f"benchmark {bench.name} ran past {limit:.0f} s: {' '.join(cmd)}") from e
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"benchmark {bench.name} failed (exit {proc.returncode}): {' '.join(cmd)}")
        figures = json.loads(out.read_text())
    dropped = [k for k in bench.drop if isinstance(figures, dict) and k in figures]
    if dropped:
        figures = {k: v for k, v in figures.items() if k not in dropped}
    record = {
        "benchmark": bench.name,
        "command": " ".join(["python -m", bench.module, *args]),
        "quick": quick,
        "started_utc": started,
        "wall_s": round(wall, 1),
        "load_average_before": load_before,
        "load_average_max_during": round(watch.peak, 2),
        "load_average_after": load_average(),
        "machine": machine(),
        "git_commit": git_commit(),
        "dropped_keys": dropped,
        "figures": figures,
    }
    path = results / f"{bench.name}.json"
    tmp_path = path.with_suffix(".json.tmp")
    tmp_path.write_text(json.dumps(record, indent=1, default=str) + "\n")
    tmp_path.replace(path)
    return record


def read(name: str, results: Path = RESULTS) -> dict[str, Any] | None:
    path = results / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None
