"""What a collection's checkpoints hold, byte by byte, and what saving and loading them costs.

Runs ``focus collect`` once (a process of its own, a fresh local store; the command's
defaults but ``--tasks`` and ``--transitions``) against the simulated model service
(``focus.testing.simserver``, as :mod:`benchmarks.pipeline_scale`: 3 tokens per call) or,
with ``--model tiny``, the embedded tiny model. Then, in this process, it reads every
checkpoint of the collection back and reports:

- the stored bytes by kind (the evidence state, the waves' rollouts, the critic's
  scores, the tree picture, the records, the manifests), per transition and against the
  Parquet batch; ``pickled`` is the same objects' bare pickle (:func:`storage.checkpoints.dumps`);
- the CPU (this process's user + system) of :meth:`CheckpointStore.save` of every
  checkpoint into a fresh store, of :meth:`CheckpointStore.load` of every one back, and
  of the encoding alone (:func:`storage.checkpoints.encode` and the SHA-256 a save takes):
  as stored, and bare (``encode`` set to the bare pickle, as the store saved before
  compression), the two arms interleaved ``--repeats`` times.

Run: ``python -m benchmarks.checkpoint_size [--transitions 5000 --tasks 50] [--model tiny] [--json PATH]``
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]

KINDS = ("evidence state", "wave rollouts", "scores", "tree picture", "records", "manifests")


def kind_of(phase: str) -> str:
    """The kind of checkpoint a phase key names (tasks.journal's keys)."""
    if phase == "evidence":
        return "evidence state"
    if phase == "trees.svg":
        return "tree picture"
    if phase.endswith(".score"):
        return "scores"
    if phase[:1].isdigit() and "." in phase and not phase.endswith((".end", ".unfinished")):
        return "wave rollouts"
    return "records"


def collect(store: Path, cid: str, transitions: int, tasks: int, model_url: str | None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "cli", "collect", "--store", str(store), "--collection-id", cid]
    cmd += ["--tasks", str(tasks), "--transitions", str(transitions), "--json", "--log-file", str(store / "c.log")]
    if model_url is not None:
        cmd += ["--model-url", model_url, "--set", "model.model=sim"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FOCUS_", "PREFECT_API_URL"))}
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}: {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout)["stats"])


def _cpu() -> float:
    return time.process_time()


def _arm(ck: Any, objs: list[tuple[Any, int, Any]], cid: str, bare: bool) -> tuple[float, float, float]:
    """CPU seconds of saving ``objs`` into a fresh store, of loading them back, and of
    encoding them alone (with the SHA-256 a save takes); ``bare``: as the store saved
    before compression, the pickle as it is."""
    compressed = getattr(ck, "encode", ck.dumps)
    ck.encode = ck.dumps if bare else compressed
    try:
        with tempfile.TemporaryDirectory(prefix="focus-ckpt-save-") as tmp:
            dst = ck.CheckpointStore(tmp)
            t = _cpu()
            for phase, wave, obj in objs:
                dst.save(cid, phase, wave, obj)
            save = _cpu() - t
            t = _cpu()
            for phase, wave, _ in objs:
                dst.load(cid, phase, wave)
            load = _cpu() - t
        t = _cpu()
        for _, _, obj in objs:
            ck.sha256(ck.encode(obj))
        return save, load, _cpu() - t
    finally:
        ck.encode = compressed


def measure(store: Path, cid: str, repeats: int) -> dict[str, Any]:
    from storage import checkpoints as ck

    src = ck.CheckpointStore(store)
    keys = src.list(cid)
    folder = store / "checkpoints" / cid
    stored: Counter[str] = Counter()
    pickled: Counter[str] = Counter()
    for p in folder.iterdir():
        if p.name.endswith(".manifest.json"):
            stored["manifests"] += p.stat().st_size
    objs = []
    for phase, wave in keys:
        manifest = json.loads((folder / (Path(src.url_for(cid, phase, wave)).name + ".manifest.json")).read_text())
        kind = kind_of(str(phase))
        stored[kind] += int(manifest["files"][0]["bytes"])
        obj = src.load(cid, phase, wave)
        pickled[kind] += len(ck.dumps(obj))
        objs.append((phase, wave, obj))
    # the two arms interleaved, so both see the same load from other processes
    arms: dict[str, list[tuple[float, float, float]]] = {"bare": [], "stored": []}
    for _ in range(repeats):
        for arm, runs in arms.items():
            runs.append(_arm(ck, objs, cid, bare=arm == "bare"))
    cpu = {
        f"{arm}_{what}_cpu_s": sorted(r[i] for r in runs)
        for arm, runs in arms.items()
        for i, what in enumerate(("save", "load", "encode"))
    }
    return {
        "checkpoints": len(keys),
        "waves": sum(1 for phase, _ in keys if kind_of(str(phase)) == "wave rollouts"),
        "stored_bytes": {k: stored[k] for k in KINDS},
        "pickled_bytes": {k: pickled[k] for k in KINDS if k != "manifests"},
        **cpu,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--transitions", type=int, default=5000)
    ap.add_argument("--tasks", type=int, default=50)
    ap.add_argument("--model", choices=("sim", "tiny"), default="sim", help="simulated service or the embedded model")
    ap.add_argument("--repeats", type=int, default=5, help="save and load CPU: the median of this many")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    cid = f"ckpt-{args.transitions}-{args.tasks}"
    with tempfile.TemporaryDirectory(prefix="focus-ckpt-size-") as tmp:
        store = Path(tmp)
        if args.model == "sim":
            from focus.testing.simserver import SimConfig, SimServerProcess

            sim = SimConfig(slots=256, latency_s=0.005, completion_tokens=3, cache_capacity_tokens=0)
            with SimServerProcess(sim) as server:
                stats = collect(store, cid, args.transitions, args.tasks, server.url)
        else:
            stats = collect(store, cid, args.transitions, args.tasks, None)
        figures = measure(store, cid, args.repeats)
        batch = sum(p.stat().st_size for p in (store / "batches" / cid).rglob("*") if p.is_file())
    n = int(stats["transitions"])
    total = sum(figures["stored_bytes"].values())
    row = {
        "model": args.model,
        "transitions": n,
        "tasks": args.tasks,
        **figures,
        "checkpoint_bytes": total,
        "batch_bytes": batch,
        "checkpoint_bytes_per_transition": total / n,
        "batch_bytes_per_transition": batch / n,
        "checkpoint_to_batch": total / batch,
    }
    per_t = {k: round(v / n, 1) for k, v in figures["stored_bytes"].items()}
    print(json.dumps(row, indent=1), file=sys.stderr)
    print(
        f"{n} transitions, {figures['checkpoints']} checkpoints: {total / n:.1f} B/transition stored "
        f"({total / batch:.2f}x the batch's {batch / n:.1f}); by kind {per_t}"
        + "; CPU ms, median of "
        + str(args.repeats)
        + ", bare pickle / as stored: "
        + ", ".join(
            f"{what} {1000 * median(figures[f'bare_{what}_cpu_s']):.0f} / {1000 * median(figures[f'stored_{what}_cpu_s']):.0f}"
            for what in ("save", "load", "encode")
        ),
        file=sys.stderr,
    )
    if args.json is not None:
        args.json.write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
