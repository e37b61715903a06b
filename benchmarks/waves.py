"""Wave barriers of a collection: how many continuation waves Selective and uniform
branching run, how full they are, and what a model server's batches would hold, beside
the estimator quality of the same runs (issue 37 item 3).

Each collection is one of :mod:`benchmarks.estimator_quality`'s (library defaults, the
same families, budgets, critics, seeds and task counts), so the error ratios printed
here are that benchmark's on a reduced run. Per collection it reads the rollout log:

* ``waves``: continuation waves (each one a barrier: the next is planned once it is
  grafted);
* ``jobs_per_wave`` and ``transitions_per_wave``: the mean fill of a wave;
* ``occupancy``: the model server's batch occupancy in a lock-step model of it: the
  server has ``--slots`` sequences (the collections' ``max_concurrency``), every
  model call takes one step, a wave's rollouts take free slots in order and the next
  wave starts when the last one ends. Occupancy is the model calls over
  ``slots × steps`` of the continuation phase; ``batch`` is the mean number of
  sequences in a step (model calls / steps). ``steps`` counts the whole collection
  (the evidence wave too): the time a server bound by steps, not by its batch, takes.

``--variants`` runs the continuation phase again with other ``Phase`` fields (as
JSON), e.g. ``'{"jobs": {"wave_unit": "jobs"}}'`` for waves of ``wave_size`` jobs.
Ratios are selective / uniform within a variant: waves, and the advantage MSE and the
composition-neutral MSE per cell (family x budget x critic, seed means), with their
median over cells.

    .venv/bin/python -m benchmarks.waves [--families critical,forage,decisive,truncated]
        [--budgets 2,6,16] [--critics noise_1] [--seeds 2] [--variants JSON] [--json PATH]
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Any

from benchmarks.estimator_quality import ALL_FAMILIES, CRITICS, add_neutral, collect, score
from benchmarks.quality_summary import cell_ratio

FAMILIES = ("critical", "forage", "decisive", "truncated")
METHODS = ("uniform", "selective")
#: ``Execution(max_concurrency=64)`` of the estimator-quality collections.
SLOTS = 64


def lockstep(waves: list[list[int]], slots: int) -> int:
    """Steps a server of ``slots`` sequences takes for ``waves`` (each a list of the
    model calls of its rollouts, in launch order) when every call is one step, a
    rollout takes the first free slot and a wave starts when the previous one ended."""
    total = 0
    for calls in waves:
        free = [0] * min(slots, max(len(calls), 1))
        for c in calls:
            heapq.heappush(free, heapq.heappop(free) + c)
        total += max(free)
    return total


def wave_stats(trees: list[Any], slots: int) -> dict[str, float]:
    """Wave count, fill and lock-step occupancy of the continuation phase (phase 1)."""
    by_wave: dict[tuple[int, int], list[Any]] = {}
    for t in trees:
        for r in t.log:
            by_wave.setdefault((r.phase, r.wave), []).append(r)
    order = sorted(by_wave)
    cont = [by_wave[k] for k in order if k[0] >= 1]
    calls = [[r.usage.rollout_steps for r in w] for w in cont]
    steps = lockstep(calls, slots)
    n = max(len(cont), 1)
    made = sum(sum(c) for c in calls)
    return {
        "waves": len(cont),
        "jobs_per_wave": sum(len(w) for w in cont) / n,
        "transitions_per_wave": sum(r.usage.transitions for w in cont for r in w) / n,
        "batch": made / steps if steps else 0.0,
        "occupancy": made / (slots * steps) if steps else 0.0,
        "steps": lockstep([[r.usage.rollout_steps for r in by_wave[k]] for k in order], slots),
    }


def run_one(job: tuple[str, int, int, str, str, int, str, str, int]) -> dict[str, Any]:
    family, n_tasks, budget, critic, method, seed, variant, phase, slots = job
    batch, mdps, values, gamma, trees = collect((family, n_tasks, budget, critic, method, seed), json.loads(phase))
    row = {"family": family, "budget": budget, "critic": critic, "method": method, "seed": seed, "variant": variant}
    return row | score(batch, mdps, values, gamma) | wave_stats(trees, slots)


KEYS = (
    "waves",
    "jobs_per_wave",
    "transitions_per_wave",
    "batch",
    "occupancy",
    "steps",
    "adv_mse",
    "neutral_mse",
    "target_mse",
)
ERRORS = ("adv_mse", "neutral_mse", "target_mse")


def cell_means(rows: list[dict[str, Any]], key: str) -> dict[tuple[str, str], float]:
    """Per (family, critic): the mean of ``key`` over the seeds of ``rows``."""
    cells: dict[tuple[str, str], list[float]] = {}
    for r in rows:
        if not math.isnan(r[key]):
            cells.setdefault((r["family"], r["critic"]), []).append(r[key])
    return {k: statistics.fmean(v) for k, v in cells.items()}


def median_ratio(num: dict[tuple[str, str], float], den: dict[tuple[str, str], float]) -> dict[str, Any] | None:
    xs = [cell_ratio(num[k], den[k]) for k in sorted(num.keys() & den.keys())]
    return {"median": statistics.median(xs), "cells": len(xs), "each": xs} if xs else None


def against(raw: list[dict[str, Any]], base: str) -> dict[str, Any]:
    """Per other variant, method and budget: its errors over ``base``'s (median over
    cells of the seed means' ratio), on the same pairs for the neutral MSE."""
    out: dict[str, Any] = {}
    for v in dict.fromkeys(r["variant"] for r in raw):
        if v == base:
            continue
        for m in METHODS:
            for b in sorted({r["budget"] for r in raw}):
                mine = [r for r in raw if (r["variant"], r["method"], r["budget"]) == (v, m, b)]
                theirs = [r for r in raw if (r["variant"], r["method"], r["budget"]) == (base, m, b)]
                out.setdefault(v, {}).setdefault(m, {})[str(b)] = {
                    k: median_ratio(cell_means(mine, k), cell_means(theirs, k)) for k in ERRORS
                }
    return out


def summarise(raw: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant, method and budget: the means over families, critics and seeds; per
    variant and budget: selective / uniform of waves, steps and (median over cells) of
    the advantage, neutral and critic-target MSE of the cells' seed means."""
    out: dict[str, Any] = {}
    for v in dict.fromkeys(r["variant"] for r in raw):
        rows = [r for r in raw if r["variant"] == v]
        per: dict[str, Any] = {}
        for b in sorted({r["budget"] for r in rows}):
            at = [r for r in rows if r["budget"] == b]
            means = {
                m: {k: statistics.fmean(r[k] for r in at if r["method"] == m) for k in KEYS}
                for m in METHODS
                if any(r["method"] == m for r in at)
            }
            ratios: dict[str, list[float]] = {k: [] for k in ("waves", "steps", *ERRORS)}
            for f, c in sorted({(r["family"], r["critic"]) for r in at}):
                sel = [r for r in at if (r["family"], r["critic"], r["method"]) == (f, c, "selective")]
                uni = [r for r in at if (r["family"], r["critic"], r["method"]) == (f, c, "uniform")]
                if not sel or not uni:
                    continue
                for k in ratios:
                    a = statistics.fmean(r[k] for r in sel)
                    o = statistics.fmean(r[k] for r in uni)
                    if not (math.isnan(a) or math.isnan(o)):
                        ratios[k].append(cell_ratio(a, o))
            by_family = {
                f: {m: statistics.fmean(r["waves"] for r in at if (r["family"], r["method"]) == (f, m)) for m in means}
                for f in dict.fromkeys(r["family"] for r in at)
            }
            per[str(b)] = {
                "means": means,
                "waves_by_family": by_family,
                "selective_vs_uniform": {
                    k: {"median": statistics.median(xs), "cells": len(xs), "each": xs} if xs else None
                    for k, xs in ratios.items()
                },
            }
        out[v] = per
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--budgets", default="2,6,16", help="transitions per task, in multiples of H")
    ap.add_argument("--critics", default="noise_1")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--tasks", type=int, default=6, help="tasks (MDP instances) per collection")
    ap.add_argument("--slots", type=int, default=SLOTS, help="sequences of the lock-step server")
    ap.add_argument("--variants", default="{}", help='JSON {"name": {Phase field: value}}; "default" always runs')
    ap.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args(argv)
    families, critics = args.families.split(","), args.critics.split(",")
    budgets = [int(b) for b in args.budgets.split(",")]
    for flag, given, known in (("--families", families, ALL_FAMILIES), ("--critics", critics, CRITICS)):
        unknown = [x for x in given if x not in known]
        if unknown:
            ap.error(f"{flag}: unknown {', '.join(unknown)}")
    variants = {"default": {}} | json.loads(args.variants)
    jobs = [
        (f, args.tasks, b, c, m, s, v, json.dumps(p), args.slots)
        for v, p in variants.items()
        for f in families
        for b in budgets
        for c in critics
        for m in METHODS
        for s in range(args.seeds)
    ]
    t0 = time.perf_counter()
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            raw = list(pool.map(run_one, jobs, chunksize=1))
    else:
        raw = [run_one(j) for j in jobs]
    # the neutral MSE is read on the (state, action) pairs every method and variant has
    add_neutral(raw)
    summary = summarise(raw)
    for v, per in summary.items():
        for b, d in per.items():
            s, u = d["means"].get("selective"), d["means"].get("uniform")
            r = d["selective_vs_uniform"]
            if not s or not u:
                continue
            print(
                f"{v:>10s} {b:>3s}H  waves sel {s['waves']:6.1f} uni {u['waves']:6.1f} (x{r['waves']['median']:.2f})  "
                f"jobs/wave {s['jobs_per_wave']:5.1f} {u['jobs_per_wave']:5.1f}  "
                f"trans/wave {s['transitions_per_wave']:6.1f} {u['transitions_per_wave']:6.1f}  "
                f"occupancy {s['occupancy']:.3f} {u['occupancy']:.3f}  steps x{r['steps']['median']:.2f}  "
                f"adv x{r['adv_mse']['median']:.3f} neutral x{r['neutral_mse']['median']:.3f} "
                f"target x{r['target_mse']['median']:.3f}"
            )
    base = next((v for v in variants if variants[v].get("wave_unit") == "jobs"), None)
    versus = against(raw, base) if base else {}
    for v, per in versus.items():
        for m, by in per.items():
            cells = "  ".join(
                f"{b}H adv x{d['adv_mse']['median']:.3f} neutral x{d['neutral_mse']['median']:.3f} "
                f"target x{d['target_mse']['median']:.3f}"
                for b, d in by.items()
                if d["adv_mse"] and d["neutral_mse"] and d["target_mse"]
            )
            print(f"{v:>10s} / {base} {m:>9s}  {cells}")
    info = {
        "families": families,
        "budgets": budgets,
        "critics": critics,
        "seeds": args.seeds,
        "tasks": args.tasks,
        "slots": args.slots,
        "variants": variants,
        "collections": len(jobs),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    report = {"summary": summary, "versus": {"base": base, "ratios": versus}, "info": info, "raw": raw}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(report, fh, indent=1)
    return report


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
