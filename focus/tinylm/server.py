"""Command line of the tiny model's HTTP server (vLLM- and SGLang-compatible).

The application is :func:`focus.tinylm.app.create_app`; the engine is
:class:`focus.tinylm.engine.Engine`. Endpoints: ``POST /v1/completions``,
``POST /v1/chat/completions``, ``GET /v1/models``, ``POST /tokenize``,
``POST /detokenize`` (vLLM); ``POST /generate``, ``POST /update_weights_from_disk``,
``GET /model_info`` (and its older name ``/get_model_info``), ``GET /get_weight_version``,
``POST /flush_cache`` (SGLang); ``GET /health``,
``GET /metrics``. Every answer names the policy version (a hash of the weights file,
or the ``weight_version`` given at reload).

Run: ``python -m focus.tinylm.server --port 8000 [--weights PATH]
[--logprobs-mode processed_logprobs] [--threads 1]``. ``--threads``: BLAS threads of the
engine (default 1, see :func:`limit_threads`; the engine itself is one thread, the HTTP
loop another). With ``--args-from-stdin`` the process imports
the engine and the app first (most of its start-up) and only then reads its command line, as
one JSON list, from stdin (end of input: it exits): a command can start it before it
knows the configuration (:class:`focus.backends.local.WarmServer`). ``--debug`` wraps
the app in the test fault layer (:mod:`focus.tinylm.testing`: prompt recording and
injected faults); it is never mounted otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from focus.tinylm.sampler import LOGPROBS_MODES
from focus.tinylm.serving import ENGINE_STALL_S, MODEL_NAME


def _watch_parent(pid: int, owned: Path | None) -> None:
    """Exit when the process that started us is gone, so a crashed test leaks nothing:
    no process, and no folder (``--owned-dir``, which the parent removes otherwise)."""
    while True:
        time.sleep(1.0)
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(owned)
            os._exit(0)


def _remove(owned: Path | None) -> None:
    if owned is not None:
        shutil.rmtree(owned, ignore_errors=True)


def _positive(text: str) -> int:
    n = int(text)
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def limit_threads(n: int) -> None:
    """Let the engine's matrix products use ``n`` BLAS threads (OpenBLAS starts one per
    core). The engine's products are small (128-wide rows, one per running sequence), so
    extra threads mostly wait for each other; on a CPU that other work shares they wait
    for the cores too, and 32 requests in flight ran slower than one at a time
    (benchmarks/README.md, "Embedded model server"). One thread keeps batching ahead."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=n, user_api="blas")


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description="Serve the focus tiny model over HTTP.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (see --port-file)")
    ap.add_argument("--port-file", type=Path, help="write the bound port here once listening")
    ap.add_argument("--weights", help="weights file (default: the committed initial weights)")
    ap.add_argument("--served-model-name", default=MODEL_NAME)
    ap.add_argument(
        "--logprobs-mode",
        choices=LOGPROBS_MODES,
        default="processed_logprobs",
        help="which log-probs are reported (vLLM's names; see focus.tinylm.sampler)",
    )
    ap.add_argument("--max-num-seqs", type=int, default=64, help="sequences decoded together at most")
    ap.add_argument("--prefill-chunk", type=int, default=256, help="prompt tokens prefilled per step")
    ap.add_argument(
        "--max-model-len",
        type=_positive,
        help="context length served, at most the weights' own (vLLM's flag: prompt plus max_tokens beyond it is refused)",
    )
    ap.add_argument("--prefix-cache-tokens", type=int, default=65536, help="prefix cache budget (0: off)")
    ap.add_argument(
        "--threads",
        type=_positive,
        default=1,
        help="BLAS threads of the engine's matrix products (default 1: batching stays ahead when the CPU is shared)",
    )
    ap.add_argument("--workers", type=int, default=1, help="kept for compatibility; one engine thread serves")
    ap.add_argument("--torch-threads", type=int, default=1, help="kept for compatibility; unused (numpy serves)")
    ap.add_argument(
        "--engine-stall-s",
        type=float,
        default=ENGINE_STALL_S,
        help="/health answers 503 once one engine step has run this long (a step is one token of each sequence)",
    )
    ap.add_argument("--debug", action="store_true", help="mount the test fault layer (focus.tinylm.testing)")
    ap.add_argument("--parent-pid", type=int, help="exit when this process exits")
    ap.add_argument("--owned-dir", type=Path, help="remove this folder when exiting because the parent is gone")
    ap.add_argument(
        "--args-from-stdin",
        action="store_true",
        help="import first, then read the command line as a JSON list from stdin (end of input: exit)",
    )
    return ap


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    watched = args.parent_pid
    if watched:
        threading.Thread(target=_watch_parent, args=(watched, args.owned_dir), daemon=True).start()
    import threadpoolctl  # noqa: F401 - imported before --args-from-stdin waits, as the rest
    import uvicorn

    from focus.tinylm.app import create_app
    from focus.tinylm.engine import Engine

    if args.args_from_stdin:
        line = sys.stdin.readline()
        if not line.strip():
            _remove(args.owned_dir)  # nobody needed this server (its command ended or died)
            return
        args = build_parser().parse_args(json.loads(line))
        if args.args_from_stdin:
            raise SystemExit("--args-from-stdin: the command line read from stdin must not repeat it")
    limit_threads(args.threads)
    engine = Engine(
        args.weights,
        logprobs_mode=args.logprobs_mode,
        max_num_seqs=args.max_num_seqs,
        prefill_chunk=args.prefill_chunk,
        prefix_cache_tokens=args.prefix_cache_tokens,
        max_model_len=args.max_model_len,
    )
    app: Any = create_app(engine, model_name=args.served_model_name, engine_stall_s=args.engine_stall_s)
    if args.debug:
        from focus.tinylm.testing import FaultLayer

        app = FaultLayer(app)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    port = sock.getsockname()[1]
    if args.parent_pid and args.parent_pid != watched:
        threading.Thread(target=_watch_parent, args=(args.parent_pid, args.owned_dir), daemon=True).start()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():
            await asyncio.sleep(0.01)
        if args.port_file and server.started:
            tmp = args.port_file.with_suffix(".tmp")
            tmp.write_text(str(port))
            tmp.replace(args.port_file)
        await task

    try:
        asyncio.run(serve())
    finally:
        engine.close()


if __name__ == "__main__":
    main()
