"""What an operator waits for and reads: ``focus collect`` on the embedded default.

Measures, each as the wall time of the whole command (process start to exit):

- the first collection of a new id (no Prefect server configured: the direct path; the embedded model,
  rollouts in-process), on a pseudo-terminal like a person's shell: seconds, the
  lines it printed, and the flow's own wall time (``flow_wall_s``) it reports;
- a rerun of that finished collection;
- each error decided before anything starts (resume with another seed, an invalid
  value, a missing factory, an option mapping of the wrong shape, a config file that is
  not UTF-8, a storage root that is a file, an S3 bucket that does not exist, an S3
  endpoint that is down).

With ``--baseline PATH`` (a checkout, e.g. the main branch before these changes) the
first collection and a rerun are also measured with that checkout's CLI in the same run.

    python -m benchmarks.cli_start --json /tmp/bench_cli.json [--baseline /work/main] [--repeats 3] [--with-server]
"""

from __future__ import annotations

import argparse
import json
import os
import pty
import re
import select
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]")


_CSI = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[()][0-9A-Za-z]")


def screen_lines(text: str) -> list[str]:
    """The lines a terminal shows after ``text`` was written to it (what a person reads
    in the scrollback): a small emulation of line feeds, carriage returns, cursor-up and
    erase-line, the only moves rich's live display makes. Counting raw line feeds would
    also count the ones a live bar spends redrawing itself."""
    lines: list[str] = [""]
    row = col = 0
    pos = 0
    for m in list(_CSI.finditer(text)) + [None]:
        chunk = text[pos : m.start() if m else len(text)]
        for ch in chunk:
            if ch == "\n":
                row += 1
                col = 0
                while len(lines) <= row:
                    lines.append("")
            elif ch == "\r":
                col = 0
            else:
                line = lines[row].ljust(col)
                lines[row] = line[:col] + ch + line[col + 1 :]
                col += 1
        if m is None:
            break
        pos = m.end()
        arg, cmd = m.group(1), m.group(2)
        if cmd == "A":  # cursor up
            row = max(0, row - int(arg or 1))
        elif cmd == "K":  # erase in line
            lines[row] = "" if arg in ("2",) else lines[row][:col]
        elif cmd == "G":
            col = max(0, int(arg or 1) - 1)
    return [ln.rstrip() for ln in lines if ln.strip()]


def _env(home: Path, checkout: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "FOCUS_"))}
    env.update(
        PREFECT_HOME=str(home),
        DO_NOT_TRACK="1",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONPATH=str(checkout),
        XDG_STATE_HOME=str(home / "state"),
        COLUMNS="120",
        LINES="40",
        TERM="xterm-256color",
    )
    return env


def run_pty(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 300) -> tuple[int, float, str]:
    """Exit status, wall seconds and everything written, with stdout and stderr on a terminal."""
    master, slave = pty.openpty()
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    out = bytearray()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        elif proc.poll() is not None:
            break
    code = proc.wait(timeout=30)
    wall = time.perf_counter() - t0
    os.close(master)
    return code, wall, out.decode("utf-8", errors="replace")


def _timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[int, float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    return done.returncode, time.perf_counter() - t0, done.stdout + done.stderr


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collection(checkout: Path, work: Path, home: Path, cid: str, api: str | None = None) -> dict[str, Any]:
    """The first collection of ``cid`` with ``checkout``'s CLI, then its rerun (with
    ``api``: against that running Prefect server)."""
    # the console script's entry (``python -m cli``); older checkouts had it in flows
    if (checkout / "cli" / "__main__.py").exists():
        entry = "cli"
    else:
        entry = "flows" if (checkout / "flows" / "__main__.py").exists() else "flows.cli"
    cmd = [sys.executable, "-m", entry, "collect", "--collection-id", cid]
    env = _env(home, checkout)
    if api:
        env["PREFECT_API_URL"] = api
    code, wall, text = run_pty(cmd, env, work)
    plain = ANSI.sub("", text)
    flow = re.search(r"flow_wall_s\s*[│|]\s*([\d.]+)", plain)
    out: dict[str, Any] = {
        "exit": code,
        "wall_s": round(wall, 2),
        "lines": len(screen_lines(text)),
        "line_feeds": text.count("\n"),
        "flow_wall_s": float(flow.group(1)) if flow else None,
    }
    out["ratio_to_flow"] = round(wall / out["flow_wall_s"], 2) if out["flow_wall_s"] else None
    code, wall, _ = run_pty(cmd, env, work)
    out["rerun_exit"], out["rerun_wall_s"] = code, round(wall, 2)
    return out


def errors(work: Path, home: Path, cid: str) -> dict[str, Any]:
    """Seconds and exit status of each error decided before anything starts."""
    env = {**_env(home, ROOT), "PREFECT_API_URL": f"http://127.0.0.1:{_free_port()}/api"}
    base = [sys.executable, "-m", "cli", "collect"]
    latin = work / "latin.toml"
    latin.write_bytes("seed = 1\n# café\n".encode("latin-1"))
    shape = work / "shape.toml"
    shape.write_text("[model.options.config]\ntimeout_s = 5\n")
    blocker = work / "a-file"
    blocker.write_text("x")
    cases = {
        "resume_mismatch": ["--collection-id", cid, "--seed", "5"],
        "invalid_value": ["--set", "search.phases.1.wave_size=0"],
        "missing_factory": ["--set", "model.kind=factory", "--set", "model.factory=no_such_module:make"],
        "option_shape": ["--config", str(shape)],
        "config_not_utf8": ["--config", str(latin)],
        "storage_root_is_a_file": ["--store", str(blocker / "runs")],
    }
    moto = None
    try:
        from moto.server import ThreadedMotoServer

        moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        moto.start()
        host, port = moto.get_host_and_port()
        env.update(
            AWS_ACCESS_KEY_ID="x",
            AWS_SECRET_ACCESS_KEY="x",
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=f"http://{host}:{port}",
        )
        cases["s3_bucket_missing"] = ["--store", "s3://no-such-bucket/runs"]
    except ImportError:
        pass
    out: dict[str, Any] = {}
    try:
        for name, args in cases.items():
            code, wall, text = _timed([*base, *args], env, work)
            lines = [ln for ln in text.splitlines() if ln.strip()]
            out[name] = {
                "exit": code,
                "wall_s": round(wall, 2),
                "lines": len(lines),
                "line": lines[-1] if lines else "",
            }
        down = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{_free_port()}"}
        code, wall, text = _timed([*base, "--store", "s3://bucket/runs"], down, work)
        lines = [ln for ln in text.splitlines() if ln.strip()]
        out["s3_endpoint_down"] = {"exit": code, "wall_s": round(wall, 2), "lines": len(lines), "line": lines[-1]}
    finally:
        if moto is not None:
            moto.stop()
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--json", type=Path, default=None, help="write every figure here")
    ap.add_argument("--baseline", type=Path, default=None, help="another checkout to measure in the same run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--with-server", action="store_true", help="also measure against a running `prefect server`")
    args = ap.parse_args(argv)
    figures: dict[str, Any] = {"command": " ".join(["python -m benchmarks.cli_start", *(argv or sys.argv[1:])])}
    figures["load_before"] = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="focus-bench-cli-") as tmp:
        work = Path(tmp)
        home = work / "prefect"
        # the first command ever also migrates Prefect's database: measured once, apart
        cold = collection(ROOT, work, home, "cold")
        figures["cold_first_collection"] = cold
        runs = [collection(ROOT, work, home, f"warm{i}") for i in range(args.repeats)]
        figures["first_collection"] = runs
        figures["median"] = {
            k: statistics.median(r[k] for r in runs)
            for k in ("wall_s", "lines", "flow_wall_s", "ratio_to_flow", "rerun_wall_s")
        }
        figures["errors"] = errors(work, home, "warm0")
        if args.with_server:
            port = _free_port()
            shome = work / "prefect-server"
            server = subprocess.Popen(
                [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                env={**_env(shome, ROOT), "PREFECT_SERVER_API_HOST": "127.0.0.1"},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                import httpx

                api = f"http://127.0.0.1:{port}/api"
                deadline = time.monotonic() + 120
                while time.monotonic() < deadline:
                    try:
                        if httpx.get(f"{api}/health", timeout=1).status_code == 200:
                            break
                    except httpx.HTTPError:
                        time.sleep(0.3)
                runs = [collection(ROOT, work, home, f"srv{i}", api) for i in range(args.repeats)]
                figures["with_running_server"] = runs
                figures["with_running_server_median"] = {
                    k: statistics.median(r[k] for r in runs)
                    for k in ("wall_s", "lines", "flow_wall_s", "ratio_to_flow")
                }
            finally:
                server.terminate()
                server.wait(timeout=30)
        if args.baseline is not None:
            bhome = work / "prefect-baseline"
            collection(args.baseline, work, bhome, "bcold")  # migrations
            base = [collection(args.baseline, work, bhome, f"b{i}") for i in range(args.repeats)]
            figures["baseline"] = {"checkout": str(args.baseline), "runs": base}
            figures["baseline_median"] = {
                k: statistics.median(r[k] for r in base if r[k] is not None)
                for k in ("wall_s", "lines", "flow_wall_s", "ratio_to_flow", "rerun_wall_s")
            }
    figures["load_after"] = os.getloadavg()
    text = json.dumps(figures, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text)


if __name__ == "__main__":
    main()
