"""``focus collect`` on S3 killed (SIGKILL) at half its budget, then run again: what the
resume costs until its first new wave, and that its batch is the uninterrupted one's.

Moto's S3 server on 127.0.0.1 (:mod:`benchmarks.s3`) behind
:class:`focus.testing.s3faults.S3FaultProxy`, which records every request and, for the
resumed run only, holds each one ``--delay-ms`` (a store farther away than loopback: a
real bucket answers a small GET in 10-30 ms). The model service is the simulated one
(``focus.testing.simserver``, as :mod:`benchmarks.pipeline_scale`). First the
collection uninterrupted (root ``s3://<bucket>/clean``); then, per delay, the same
collection id under another root, killed once it has saved half as many continuation
waves as the clean run, and the same command again. Figures of each rerun: requests
(by method) and wall time from its start to the first new wave (the first checkpoint
data file it writes), its CPU (``os.wait4``), and whether its batch equals the clean
one (polars ``DataFrame.equals`` on the actor and critic tables, and the batch
manifests' fingerprints).

Run: ``python -m benchmarks.resume_s3 --size 20000:200 --delays-ms 0,20 [--json PATH]``
(benchmarks/README.md, "Resume on S3", has the figures).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _command(url: str, root: str, transitions: int, tasks: int, log: Path) -> list[str]:
    cmd = [sys.executable, "-m", "cli", "collect", "--model-url", url, "--set", "model.model=sim", "--store", root]
    cmd += ["--collection-id", "resume", "--tasks", str(tasks), "--transitions", str(transitions)]
    return cmd + ["--json", "--log-file", str(log)]


def _env(proxy_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FOCUS_", "PREFECT_API_URL"))}
    return {**env, "AWS_ENDPOINT_URL": proxy_url}


def _wait(proc: subprocess.Popen[bytes]) -> tuple[int, float]:
    """Exit status and CPU seconds (user + system) of ``proc``."""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def _run(cmd: list[str], env: dict[str, str], out: Path) -> tuple[int, float, float]:
    """Run ``cmd`` to its end, stdout into ``out``: (exit status, wall s, CPU s)."""
    t0 = time.perf_counter()
    with out.open("wb") as f:
        code, cpu = _wait(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.DEVNULL))
    return code, time.perf_counter() - t0, cpu


def _waves_saved(proxy: Any, root_path: str) -> int:
    """Continuation-wave manifests written under ``root_path`` (as the proxy saw them)."""
    return sum(
        1 for _, _, m, p in list(proxy.served) if m == "PUT" and p.startswith(root_path) and "n-1.continue-w" in p
        and p.endswith(".manifest.json")
    )  # fmt: skip


def _kill_at(cmd: list[str], env: dict[str, str], proxy: Any, root_path: str, waves: int) -> int:
    """Start ``cmd`` and kill its process group (SIGKILL) once ``waves`` waves are saved."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    while _waves_saved(proxy, root_path) < waves:
        if proc.poll() is not None:
            raise RuntimeError(f"{' '.join(cmd)} ended ({proc.returncode}) before {waves} waves were saved")
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return _waves_saved(proxy, root_path)


def what(method: str, path: str) -> str:
    """A request as the rerun's figures count it: a listing, a checkpoint manifest or
    data file read or written, a lease's request, anything else (batches, HEADs)."""
    if method == "GET" and path.count("/") <= 1:
        return "LIST"  # GET on the bucket: list-objects (the query is not recorded)
    if "/leases/" in path or path.endswith(".lease"):
        return f"{method} lease"
    if "/checkpoints/" in path and path.endswith(".manifest.json"):
        return f"{method} manifest"
    if "/checkpoints/" in path and path.endswith(".pkl"):
        return f"{method} data"
    return f"{method} other"


def _tables(root: str, url: str) -> tuple[Any, Any, str]:
    import polars as pl

    from storage import BatchStore

    store = BatchStore(root)
    t = store.read_tables(url)
    return pl.from_arrow(t.actor), pl.from_arrow(t.critic), store.manifest(url).fingerprint


def resume(url: str, bucket: str, proxy: Any, size: tuple[int, int], delay_s: float, clean: dict[str, Any],
           tmp: Path) -> dict[str, Any]:  # fmt: skip
    """One delay: kill at half the budget, rerun with requests held ``delay_s``."""
    root = f"s3://{bucket}/resumed-{int(delay_s * 1000)}ms"
    root_path = f"/{bucket}/resumed-{int(delay_s * 1000)}ms/"
    cmd = _command(url, root, *size, tmp / f"{int(delay_s * 1000)}.log")
    env = _env(proxy.url)
    killed_at = _kill_at(cmd, env, proxy, root_path, clean["waves"] // 2)
    proxy.delay_s = delay_s
    start = time.monotonic()
    code, wall, cpu = _run(cmd, env, tmp / "rerun.json")
    proxy.delay_s = 0.0
    if code != 0:
        raise RuntimeError(f"the rerun exited {code}")
    # its requests: those under its root, and the listings (a GET on the bucket, whose
    # prefix is in the query the proxy does not record; nothing else runs meanwhile)
    mine = [r for r in list(proxy.served) if r[0] >= start and (r[3].startswith(root_path) or r[3] == f"/{bucket}")]
    first = min(r[0] for r in mine if r[2] == "PUT" and "/checkpoints/" in r[3] and r[3].endswith(".pkl"))
    before = [r for r in mine if r[0] < first]
    out = json.loads((tmp / "rerun.json").read_text())
    actor, critic, fingerprint = _tables(root, out["batch_url"])
    return {
        "delay_ms": delay_s * 1000,
        "waves_saved_at_kill": killed_at,
        "steps_reused": out["stats"].get("steps_reused"),
        "to_first_new_wave_s": first - start,
        "requests_to_first_new_wave": len(before),
        "by_method": dict(Counter(r[2] for r in before)),
        "by_what": dict(Counter(what(r[2], r[3]) for r in before)),
        "most_gets_of_one_checkpoint_file": max(
            Counter(r[3] for r in before if what(r[2], r[3]) in ("GET manifest", "GET data")).values()
        ),
        "rerun_requests": len(mine),
        "rerun_by_what": dict(Counter(what(r[2], r[3]) for r in mine)),
        "rerun_wall_s": wall,
        "rerun_cpu_s": cpu,
        "actor_equal": actor.equals(clean["actor"]),
        "critic_equal": critic.equals(clean["critic"]),
        "fingerprint_equal": fingerprint == clean["fingerprint"],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--size", default="20000:200", help="transitions:tasks")
    ap.add_argument("--delays-ms", default="0,20", help="what the proxy holds each request of a rerun, comma-separated")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here")
    args = ap.parse_args(argv)
    transitions, tasks = (int(x) for x in args.size.split(":"))
    from benchmarks.s3 import loopback_bucket
    from focus.testing.s3faults import S3FaultProxy
    from focus.testing.simserver import SimConfig, SimServerProcess

    sim = SimConfig(slots=256, latency_s=0.005, completion_tokens=3, cache_capacity_tokens=0)
    rows = []
    with (
        SimServerProcess(sim) as server,
        loopback_bucket("focus-resume") as bucket,
        S3FaultProxy(os.environ["AWS_ENDPOINT_URL"]) as proxy,
        tempfile.TemporaryDirectory(prefix="focus-resume-s3-") as tmp,
    ):
        root = f"s3://{bucket}/clean"
        cmd = _command(server.url, root, transitions, tasks, Path(tmp) / "clean.log")
        start = time.monotonic()
        code, wall, cpu = _run(cmd, _env(proxy.url), Path(tmp) / "clean.json")
        ours = [
            r
            for r in list(proxy.served)
            if r[0] >= start and (r[3].startswith(f"/{bucket}/clean/") or r[3] == f"/{bucket}")
        ]
        if code != 0:
            raise RuntimeError(f"{' '.join(cmd)} exited {code}")
        out = json.loads((Path(tmp) / "clean.json").read_text())
        actor, critic, fingerprint = _tables(root, out["batch_url"])
        clean = {"waves": _waves_saved(proxy, f"/{bucket}/clean/"), "actor": actor, "critic": critic}
        clean["fingerprint"] = fingerprint
        head = {"transitions": int(out["stats"]["transitions"]), "tasks": tasks, "clean_waves": clean["waves"]}
        head |= {"clean_wall_s": wall, "clean_cpu_s": cpu, "clean_requests": len(ours)}
        head["clean_by_what"] = dict(Counter(what(r[2], r[3]) for r in ours))
        print(json.dumps(head), file=sys.stderr)
        for delay in (float(d) / 1000 for d in args.delays_ms.split(",")):
            rows.append(resume(server.url, bucket, proxy, (transitions, tasks), delay, clean, Path(tmp)))
            print(json.dumps(rows[-1]), file=sys.stderr)
    if args.json is not None:
        args.json.write_text(json.dumps({**head, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
