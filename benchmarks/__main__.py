"""``python -m benchmarks``: run every benchmark the pages cite, then render the pages.

Each benchmark of :data:`benchmarks.results.REGISTRY` runs in its own process (``python
-m <module> <args> --json PATH``) and its figures are stored with the run's context in
``benchmarks/results/<name>.json``; then the generated blocks of the pages
(benchmarks/README.md and benchmarks/QUALITY.md) are rendered from those files
(:mod:`benchmarks.readme`). A benchmark that fails keeps its previous record; the
others still run, and the command exits 1.

    python -m benchmarks                         # everything (what `make bench` runs)
    python -m benchmarks --only engine,scale     # some; the pages are rendered from all records
    python -m benchmarks --quick                 # smoke sizes, into runs/bench-quick/ (not the committed results)
    python -m benchmarks --render-only [--check] # render (or check) the pages from the stored records
    python -m benchmarks --list                  # names, commands, last wall times
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from benchmarks import readme
from benchmarks.results import REGISTRY, RESULTS, ROOT, Benchmark, command_args, read, run_and_record

BENCH = Path(__file__).resolve().parent  # where the pages (readme.PAGES) live
QUICK_RESULTS = ROOT / "runs" / "bench-quick"


def select(only: str | None) -> list[Benchmark]:
    if not only:
        return list(REGISTRY)
    names = [n.strip() for n in only.split(",") if n.strip()]
    known = {b.name for b in REGISTRY}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"unknown benchmark(s): {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    return [b for b in REGISTRY if b.name in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--only", help="comma-separated names (default: every benchmark)")
    ap.add_argument("--quick", action="store_true", help="smoke sizes (seconds to a minute each); figures mean nothing")
    ap.add_argument("--render-only", action="store_true", help="run nothing; render the pages from the records")
    ap.add_argument("--check", action="store_true", help="with --render-only: exit 1 if a page is not up to date")
    ap.add_argument("--list", action="store_true", help="list the benchmarks, their commands and last wall times")
    ap.add_argument(
        "--results", type=Path, help="records folder (default benchmarks/results; --quick: runs/bench-quick)"
    )
    ap.add_argument(
        "--pages", type=Path, help="folder the pages are rendered in (default benchmarks/; --quick: the records folder)"
    )
    args = ap.parse_args(argv)
    results = args.results or (QUICK_RESULTS if args.quick else RESULTS)
    # Smoke figures never go into the committed pages: --quick renders copies beside its
    # records; a page not yet in the chosen folder starts from the committed one.
    folder = args.pages or (results if args.quick else BENCH)
    chosen = select(args.only)

    if args.list:
        total = 0.0
        for b in chosen:
            rec = read(b.name, results)
            total += rec["wall_s"] if rec else 0.0
            last = f"{rec['wall_s'] / 60:.1f} min" if rec else "not run"
            print(f"{b.name:22s} {last:>10s}  python -m {b.module} {' '.join(command_args(b, results, args.quick))}")
        print(f"{'recorded, together':22s} {total / 60:6.1f} min")
        return 0

    failed: list[str] = []
    if not args.render_only:
        t0 = time.perf_counter()
        for i, b in enumerate(chosen, 1):
            cmd = " ".join(["python -m", b.module, *command_args(b, results, args.quick)])
            print(f"[{i}/{len(chosen)}] {b.name}: {cmd}", file=sys.stderr, flush=True)
            try:
                rec = run_and_record(b, results=results, quick=args.quick)
            except RuntimeError as e:
                failed.append(b.name)
                print(f"[{i}/{len(chosen)}] {b.name}: FAILED: {e}", file=sys.stderr, flush=True)
                continue
            print(f"[{i}/{len(chosen)}] {b.name}: {rec['wall_s']:.0f} s", file=sys.stderr, flush=True)
        print(f"ran {len(chosen)} benchmark(s) in {(time.perf_counter() - t0) / 60:.1f} min", file=sys.stderr)

    targets = {name: folder / name for name in readme.PAGES}
    texts = {name: (t if t.exists() else BENCH / name).read_text(encoding="utf-8") for name, t in targets.items()}
    rendered, warnings = readme.render_pages(texts, results)
    for w in warnings:
        print(f"readme: {w}", file=sys.stderr)
    if args.check:
        stale = [
            str(t) for name, t in targets.items() if not t.exists() or rendered[name] != t.read_text(encoding="utf-8")
        ]
        if stale:
            print(
                f"{', '.join(stale)}: not what the records render: run `python -m benchmarks --render-only`",
                file=sys.stderr,
            )
            return 1
    else:
        folder.mkdir(parents=True, exist_ok=True)
        for name, t in targets.items():
            t.write_text(rendered[name], encoding="utf-8")
        print(f"rendered {', '.join(map(str, targets.values()))} from {results}", file=sys.stderr)
    if failed:
        print(f"failed: {', '.join(failed)} (their previous records, if any, were kept)", file=sys.stderr)
    return 1 if failed or warnings else 0


if __name__ == "__main__":
    raise SystemExit(main())
