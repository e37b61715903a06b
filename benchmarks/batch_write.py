"""Storage throughput: write and read a ~1M-token batch to a local folder and to loopback S3.

The yardstick, measured in the same run on the same data, is pyarrow writing the same
Arrow tables straight to Parquet (``pq.write_table``) and reading them back
(``pq.read_table``). Its settings are fixed here (:data:`YARDSTICK_OPTIONS`: zstd level 3,
dictionary for the id strings; the store's settings when the goal was set, and faster
than pyarrow's own defaults on this data), so tuning the store cannot move it.

The batch is columnar from the start, as ``Collector.prepare`` makes it: the synthetic
turns go through :class:`focus.batch.BatchBuilder` (timed apart as ``build_s``: packing
the Python ints, once per distinct token tuple, which is what the collector pays while
preparing). The store's write is then the encoding plus what a store must do besides:
check for an existing batch, checksum every file, write the manifest last. The goal is
to stay within 1.2x of the raw write: what a store adds must stay small beside the encoding.
Yardstick and store alternate in every repeat; the reported ratio is the median of the
per-repeat ratios, so load from other processes hits both alike. ``same_settings_ratio``
compares with pyarrow writing with the store's own settings (strictest, for reference).

    .venv/bin/python -m benchmarks.batch_write [--tokens 1000000] [--repeats 3] [--json out.json]

Tokens counted are every token id stored: prompt, completion and critic context ids.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.s3 import loopback_bucket
from focus.batch import ActorRow, Batch, BatchBuilder, CriticRow
from storage import PARQUET_OPTIONS, BatchStore

#: The yardstick's Parquet settings; do not tune (see the module docstring).
YARDSTICK_OPTIONS: dict[str, Any] = {
    "compression": "zstd",
    "compression_level": 3,
    "use_dictionary": ["collection_id", "task_id", "tree_id", "policy_version", "kind", "finish_reason"],
}


def synthetic_rows(target_tokens: int, seed: int = 0) -> Batch:
    """Trees of multi-turn rollouts as typed rows: each turn's prompt extends the previous
    turn, like Segments; a critic row's context is the very tuple its turn was sent."""
    rng = np.random.default_rng(seed)
    actor: list[ActorRow] = []
    critic: list[CriticRow] = []
    tokens = 0
    tree = 0
    while tokens < target_tokens:
        prompt = tuple(rng.integers(0, 50_000, 120).tolist())
        tree_id = f"tree-{tree}"
        for turn in range(6):
            n = int(rng.integers(40, 200))
            completion = tuple(rng.integers(0, 50_000, n).tolist())
            logprobs = tuple((-rng.exponential(0.7, n)).tolist())
            actor.append(
                ActorRow(
                    "bench",
                    0,
                    f"task-{tree // 4}",
                    tree_id,
                    turn,
                    turn,
                    0,
                    "v0",
                    prompt,
                    completion,
                    logprobs,
                    (1,) * n,
                    float(rng.normal()),
                    float(turn == 5),
                    "stop",
                )  # fmt: skip
            )
            critic.append(
                CriticRow("bench", 0, f"task-{tree // 4}", tree_id, turn, prompt, float(rng.random()), 1.0, None)
            )
            tokens += 2 * len(prompt) + n
            observation = tuple(rng.integers(0, 50_000, 30).tolist())
            prompt = prompt + completion + observation
        tree += 1
    return Batch("bench", 0, actor, critic, {"transitions": len(actor)})


def build_columnar(rows: Batch) -> Batch:
    """The columnar batch of ``rows``, built turn by turn as the collector does."""
    b = BatchBuilder(rows.collection_id, rows.iteration)
    for r in rows.actor:
        b.add_turn(
            r.task_id, r.tree_id, r.node_id, r.edge_id, r.turn_index, r.policy_version, r.kind, r.prompt_ids,
            r.completion_ids, r.logprobs, r.loss_mask[0] if r.loss_mask else 1, r.advantage, r.reward,
            r.finish_reason,
        )  # fmt: skip
    for c in rows.critic:
        b.add_checkpoint(c.task_id, c.tree_id, c.node_id, c.context_ids, c.target, c.weight, c.prediction)
    return b.build(rows.stats)


def n_tokens(batch: Batch) -> int:
    return sum(len(r.prompt_ids) + len(r.completion_ids) for r in batch.actor) + sum(
        len(r.context_ids) for r in batch.critic
    )


def timed(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    """Fastest wall time of ``repeats`` calls, and the last result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return min(times), result


def measure(name: str, root_factory: Callable[[], str], batch: Batch, repeats: int, fs: Any = None) -> dict[str, Any]:
    tokens = n_tokens(batch)
    tables = {"actor": batch.actor_table, "critic": batch.critic_table}

    def raw_write(options: dict[str, Any] = YARDSTICK_OPTIONS) -> str:
        root = root_factory()
        for kind, table in tables.items():
            path = f"{root}/raw/{kind}.parquet"
            if fs is None:
                os.makedirs(os.path.dirname(path.removeprefix("file://")), exist_ok=True)
                pq.write_table(table, path.removeprefix("file://"), **options)
            else:
                with fs.open(path, "wb") as f:
                    pq.write_table(table, f, **options)
        return root

    def raw_read(root: str) -> int:
        rows = 0
        for kind in tables:
            path = f"{root}/raw/{kind}.parquet"
            if fs is None:
                rows += pq.read_table(path.removeprefix("file://")).num_rows
            else:
                with fs.open(path, "rb") as f:
                    rows += pq.read_table(pa.BufferReader(f.read())).num_rows
        return rows

    def store_write(overlap: bool = False) -> tuple[BatchStore, str]:
        store = BatchStore(root_factory(), overlap=overlap)
        return store, store.write(batch)

    # alternate the yardstick and the store in every repeat, so load from other processes hits both alike
    raw_ws, store_ws, same_ws, one_ws, raw_cpu, store_cpu = [], [], [], [], [], []
    for _ in range(repeats):
        c0 = time.process_time()
        t, raw_root = timed(raw_write, 1)
        raw_cpu.append(time.process_time() - c0)
        raw_ws.append(t)
        c0 = time.process_time()
        t, (store, url) = timed(store_write, 1)
        store_cpu.append(time.process_time() - c0)
        store_ws.append(t)
        same_ws.append(timed(lambda: raw_write(PARQUET_OPTIONS), 1)[0])
        one_ws.append(timed(lambda: store_write(overlap=True), 1)[0])
    raw_w, w = min(raw_ws), min(store_ws)  # the fastest run is the least disturbed (as timeit reports)
    ratios = [s / r for s, r in zip(store_ws, raw_ws, strict=True)]
    same_ratios = [s / r for s, r in zip(store_ws, same_ws, strict=True)]
    cpu_ratios = [s / r for s, r in zip(store_cpu, raw_cpu, strict=True)]
    one_ratios = [s / r for s, r in zip(one_ws, raw_ws, strict=True)]

    raw_r, _ = timed(lambda: raw_read(raw_root), repeats)
    r_tables, _ = timed(lambda: store.read_tables(url), repeats)

    def read_rows() -> Batch:
        b = store.read(url)
        b.actor, b.critic  # noqa: B018 - the typed row view is built on first use
        return b

    r_rows, back = timed(read_rows, repeats)
    assert back.actor == batch.actor and back.critic == batch.critic, "round trip changed the batch"
    assert back.actor_table.equals(batch.actor_table) and back.critic_table.equals(batch.critic_table)
    nbytes = sum(f.bytes for f in store.manifest(url).files)
    raw_bytes = sum(fs_size(f"{raw_root}/raw/{kind}.parquet", fs) for kind in tables)
    mb = nbytes / 1e6
    rows = len(batch.actor) + len(batch.critic)
    return {
        "target": name,
        "tokens": tokens,
        "actor_rows": len(batch.actor),
        "critic_rows": len(batch.critic),
        "bytes": nbytes,
        "bytes_per_token": nbytes / tokens,
        "pyarrow_bytes_per_token": raw_bytes / tokens,
        "write_s": w,
        "write_mb_s": mb / w,
        "write_rows_s": rows / w,
        "read_tables_s": r_tables,
        "read_tables_mb_s": mb / r_tables,
        "read_rows_s": r_rows,
        "read_rows_per_s": rows / r_rows,
        "pyarrow_write_s": raw_w,
        "pyarrow_read_s": raw_r,
        "write_ratio_vs_pyarrow": statistics.median(ratios),
        "write_ratios": ratios,
        "write_ratio_of_fastest": w / raw_w,
        "same_settings_ratio": statistics.median(same_ratios),
        "overlap_write_ratio_vs_pyarrow": statistics.median(one_ratios),
        "write_s_median": statistics.median(store_ws),
        "pyarrow_write_s_median": statistics.median(raw_ws),
        "write_cpu_s": min(store_cpu),
        "pyarrow_write_cpu_s": min(raw_cpu),
        "write_cpu_ratio_vs_pyarrow": statistics.median(cpu_ratios),
        "read_tables_ratio_vs_pyarrow": r_tables / raw_r,
    }


def fs_size(url: str, fs: Any) -> int:
    return os.path.getsize(url.removeprefix("file://")) if fs is None else int(fs.size(url))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    ap.add_argument("--no-s3", action="store_true", help="skip the loopback S3 measurement")
    args = ap.parse_args()

    rows = synthetic_rows(args.tokens)
    build_s, batch = timed(lambda: build_columnar(rows), args.repeats)
    print(
        f"batch: {n_tokens(batch):,} tokens, {len(batch.actor):,} actor rows; built as columns "
        f"(BatchBuilder, what Collector.prepare pays) in {build_s * 1e3:.1f} ms"
    )
    results: dict[str, Any] = {"tokens": n_tokens(batch), "repeats": args.repeats, "build_s": build_s}
    results["load_average"] = os.getloadavg()

    with tempfile.TemporaryDirectory(prefix="focus-bench-") as tmp:
        counter = iter(range(10**6))
        local = measure("local", lambda: f"file://{tmp}/run-{next(counter)}", batch, args.repeats)
    results["local"] = local
    results["write_ratio_vs_pyarrow"] = local["write_ratio_vs_pyarrow"]

    if not args.no_s3:
        import s3fs

        with loopback_bucket("bench") as bucket:
            fs = s3fs.S3FileSystem(skip_instance_cache=True)
            counter = iter(range(10**6))
            results["s3"] = measure(
                "s3 (moto, loopback)", lambda: f"s3://{bucket}/run-{next(counter)}", batch, args.repeats, fs
            )

    for key in ("local", "s3"):
        if key not in results:
            continue
        m = results[key]
        print(
            f"{m['target']:>20}: write {m['write_s'] * 1e3:7.1f} ms ({m['write_mb_s']:6.1f} MB/s, {m['write_rows_s']:8,.0f} rows/s, "
            f"median ratio {m['write_ratio_vs_pyarrow']:.2f}x pyarrow {m['pyarrow_write_s'] * 1e3:.1f} ms; CPU "
            f"{m['write_cpu_ratio_vs_pyarrow']:.2f}x; same settings {m['same_settings_ratio']:.2f}x; "
            f"overlap=True {m['overlap_write_ratio_vs_pyarrow']:.2f}x) | "
            f"read tables {m['read_tables_s'] * 1e3:7.1f} ms ({m['read_tables_mb_s']:6.1f} MB/s, "
            f"{m['read_tables_ratio_vs_pyarrow']:.2f}x pyarrow) | read rows {m['read_rows_s'] * 1e3:7.1f} ms "
            f"({m['read_rows_per_s']:8,.0f} rows/s) | {m['bytes'] / 1e6:.2f} MB, {m['bytes_per_token']:.2f} B/token "
            f"(pyarrow {m['pyarrow_bytes_per_token']:.2f})"
        )
    print(f"load average (1, 5, 15 min): {', '.join(f'{x:.2f}' for x in results['load_average'])}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"figures written to {args.json}")


if __name__ == "__main__":
    main()
