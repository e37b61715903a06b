"""Racing writers: do two (or more) writers of one collection ever corrupt the store?

``--attempts`` times, ``--writers`` threads start together (a barrier) on a fresh
collection, once on a local folder and once on S3 (moto's server on loopback). Each
writer takes the collection's lease (:func:`storage.collection_lease`) and, if it gets
it, saves ``--waves`` checkpoints with content of its own; every writer then also saves
the same keys of a second collection *without* any lease, the case the lease cannot
help with. Afterwards every manifest is checked against its data (``load`` verifies size
and SHA-256) and the folders are searched for temporary leftovers.

Reported: lease holders at the same moment (must be 1), writers that got the lease and
that were refused, manifests checked, mismatched manifests (must be 0), leftovers (0).

    .venv/bin/python -m benchmarks.writer_race [--attempts 100] [--writers 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks.s3 import loopback_bucket
from storage import CheckpointStore, LeaseHeld, collection_lease
from storage.urls import TEMP_MARK


def race(root: str, attempts: int, writers: int = 3, waves: int = 2) -> dict[str, Any]:
    """Run the race ``attempts`` times under ``root``; counts as described in the module docs."""
    out: dict[str, Any] = dict.fromkeys(("holders_max", "won", "refused", "manifests", "mismatched", "leftovers"), 0)
    out["refusals"] = []
    t0 = time.perf_counter()
    for n in range(attempts):
        _attempt(root, f"race-{n}", f"free-{n}", writers, waves, out)
    out["wall_s"] = time.perf_counter() - t0
    return out


def _attempt(root: str, cid: str, free: str, writers: int, waves: int, out: dict[str, Any]) -> None:
    """One start of ``writers`` threads together on collections ``cid`` (with the lease)
    and ``free`` (without); adds to the counts in ``out``."""
    barrier = threading.Barrier(writers)
    lock = threading.Lock()
    active = [0]
    errors: list[BaseException] = []

    def save_all(store: CheckpointStore, c: str, i: int) -> None:
        for w in range(waves):
            store.save(c, 1, w, {"writer": i, "wave": w, "pad": os.urandom(64 + 50 * i)})

    def writer(i: int) -> None:
        store = CheckpointStore(root)
        barrier.wait()
        try:
            try:
                with collection_lease(root, cid, ttl_s=60):
                    with lock:
                        active[0] += 1
                        out["holders_max"] = max(out["holders_max"], active[0])
                        out["won"] += 1
                    save_all(store, cid, i)
                    with lock:
                        active[0] -= 1
            except LeaseHeld as e:
                with lock:
                    out["refused"] += 1
                    if len(out["refusals"]) < 3:
                        out["refusals"].append(str(e))
            save_all(store, free, i)  # no lease: content naming keeps data and manifest together
        except BaseException as e:  # noqa: BLE001 - re-raised by the caller's thread
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    if errors:
        raise errors[0]
    check = CheckpointStore(root)
    for c in (cid, free):
        saved = check.list(c)
        if len(saved) != waves:
            raise AssertionError(f"{c}: {len(saved)} checkpoints, expected {waves}")
        for phase, wave in saved:
            out["manifests"] += 1
            try:
                if check.load(c, phase, wave)["wave"] != wave:
                    out["mismatched"] += 1
            except Exception:  # noqa: BLE001 - counted
                out["mismatched"] += 1
        folder = check.loc.url("checkpoints", c)
        out["leftovers"] += sum(TEMP_MARK in u for u in check.loc.list_files(folder, check.retry))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attempts", type=int, default=100)
    ap.add_argument("--writers", type=int, default=3)
    ap.add_argument("--waves", type=int, default=2)
    ap.add_argument("--no-s3", action="store_true", help="skip the loopback S3 run")
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    args = ap.parse_args()
    results: dict[str, Any] = {"attempts": args.attempts, "writers": args.writers, "waves": args.waves}
    with tempfile.TemporaryDirectory(prefix="focus-race-") as tmp:
        results["local"] = race(tmp, args.attempts, args.writers, args.waves)
    if not args.no_s3:
        with loopback_bucket("race") as bucket:
            results["s3"] = race(f"s3://{bucket}", args.attempts, args.writers, args.waves)
    for key in ("local", "s3"):
        if key in results:
            r = results[key]
            print(
                f"{key:>5}: {args.attempts} attempts x {args.writers} writers in {r['wall_s']:.1f} s: "
                f"max holders at once {r['holders_max']}, lease taken {r['won']}, refused {r['refused']}, "
                f"manifests checked {r['manifests']}, mismatched {r['mismatched']}, leftovers {r['leftovers']}"
            )
    if results.get("local", {}).get("refusals"):
        print("a refusal:", results["local"]["refusals"][0])
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
