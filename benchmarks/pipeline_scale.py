"""``focus collect`` on a large collection, as an operator runs it: what the command costs
per transition (CPU, peak RSS), what it leaves in the store (files, bytes), and what a
rerun of the finished collection costs.

The model service is the simulated one (``focus.testing.simserver``: 256 slots at 5 ms
per call, 3 tokens per call, no prefix cache; its own process), so the figures are the
pipeline's. Each size is ``transitions:tasks``; each runs ``python -m cli collect`` in a
process of its own with a fresh local store, the command's own defaults but
``--transitions``, ``--tasks`` and, with ``--wave-size``, the continuation phase's wave
size and the concurrency. CPU and peak RSS are the collecting process's
(``os.wait4``); the rerun is the same command again, which finds the collection finished
(its peak RSS, the command's imports, is the baseline of the RSS growth).

Run: ``python -m benchmarks.pipeline_scale --sizes 20000:200 [--wave-size 512] [--json PATH]``
(20k transitions over 200 tasks: about a minute on an idle 2-core machine; docs/operations.md,
"A large collection", has the figures at 20k, 50k and 100k).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env: dict[str, str]) -> tuple[int, float, float, float, str]:
    """Run ``cmd``; (exit status, wall s, CPU s, peak RSS MiB, standard output)."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        wall = time.perf_counter() - t0
        out.seek(0)
        text = out.read().decode()
    return proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, text


def _tree(folder: Path) -> tuple[int, int]:
    """Files and bytes under ``folder``."""
    files = [p for p in folder.rglob("*") if p.is_file()]
    return len(files), sum(p.stat().st_size for p in files)


def measure(url: str, transitions: int, tasks: int, wave_size: int | None, store: Path) -> dict[str, Any]:
    """One size: the collection, then its rerun."""
    cid = f"scale-{transitions}-{tasks}"
    cmd = [sys.executable, "-m", "cli", "collect", "--model-url", url, "--set", "model.model=sim"]
    cmd += ["--store", str(store), "--collection-id", cid, "--tasks", str(tasks), "--transitions", str(transitions)]
    cmd += ["--json", "--log-file", str(store / "collect.log")]
    if wave_size is not None:
        cmd += ["--set", f"search.phases.1.wave_size={wave_size}", "--set", f"execution.max_concurrency={wave_size}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FOCUS_", "PREFECT_API_URL"))}
    code, wall, cpu, rss, out = _run(cmd, env)
    if code != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {code}")
    stats = json.loads(out)["stats"]
    n = int(stats["transitions"])
    ckpt_files, ckpt_bytes = _tree(store / "checkpoints" / cid)
    batch_files, batch_bytes = _tree(store / "batches" / cid)
    code, rerun_wall, rerun_cpu, rerun_rss, out = _run(cmd, env)
    if code != 0 or not json.loads(out).get("already_finished"):
        raise RuntimeError(f"the rerun of {cid} did not find it finished")
    return {
        "transitions": n,
        "tasks": tasks,
        "steps": int(stats["steps"]),
        "wall_s": wall,
        "cpu_s": cpu,
        "cpu_ms_per_transition": 1000 * cpu / n,
        "peak_rss_mib": rss,
        # over the rerun's peak: the same command, its imports, nothing collected
        "rss_growth_kib_per_transition": 1024 * (rss - rerun_rss) / n,
        "checkpoint_files": ckpt_files,
        "checkpoint_bytes_per_transition": ckpt_bytes / n,
        "batch_files": batch_files,
        "batch_bytes_per_transition": batch_bytes / n,
        "rerun_wall_s": rerun_wall,
        "rerun_cpu_s": rerun_cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", nargs="+", default=["20000:200"], help="transitions:tasks, one per size")
    ap.add_argument("--wave-size", type=int, default=None, help="continuation wave size and concurrency")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    sizes = [tuple(int(x) for x in s.split(":")) for s in args.sizes]
    from focus.testing.simserver import SimConfig, SimServerProcess

    sim = SimConfig(slots=256, latency_s=0.005, completion_tokens=3, cache_capacity_tokens=0)
    rows = []
    with SimServerProcess(sim) as server, tempfile.TemporaryDirectory(prefix="focus-pipeline-scale-") as tmp:
        for transitions, tasks in sizes:
            row = measure(server.url, transitions, tasks, args.wave_size, Path(tmp) / f"s{transitions}")
            rows.append(row)
            print(json.dumps(row), file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({"wave_size": args.wave_size, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
