"""A sweep of the learning benchmark's trainer settings, each method read at its best.

Issue 32 asks that every method get the same small learning-rate (or KL-target) sweep
and be compared at its best setting. ``--sweep FIELD=V1,V2,...`` (repeatable; the lists
are zipped, so ``--sweep target_kl=0.05,0.1 --sweep lr=3e-4,6e-4`` is two settings)
runs every method at every setting with the same seeds, the same collected tasks and
the same held-out tasks as a plain run (``benchmarks.learning``), one process per
(setting, task) in a pool of ``--jobs``.

``--sweep-sizes 8x3,4x6,2x12`` crosses the settings with batch sizes (tasks per
iteration x iterations; the same total tasks collected at each), sizes outer: the
question whether many small updates beat few large ones needs every method swept over
batch size and step alike.

Selection rule: per task and method, the setting with the highest final held-out
success (mean over seeds); a tie goes to the earlier setting in the sweep (the smaller
update, as the sweep is written; with sizes, the first size). Beside it, the same
rule on the area under the learning curve (``auc``: mean success over the transitions
axis, from v0 to the last version), which rewards reaching a level sooner - the
tie-break of the final's rule at the ceiling says nothing about speed. The selection and the verdict read the same seeds and
held-out tasks, so the best of ``k`` is biased upwards by selection on evaluation noise
- for every method alike, as each picks from the same grid - and the verdicts at the
best settings are reported beside the verdicts at each matched setting.

The comparison at the best settings pairs FOCUS's runs at its best setting with GRPO's
at its best: the pairing holds because the held-out tasks and the evaluation's
sampling seeds depend only on the seed, and v0 is the same committed model at every
setting (``check_pairing`` asserts it). This module's arithmetic is pure; running is
``benchmarks.learning._task_worker``'s.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.learning_verdicts import METHODS, verdicts


def parse_sweep(specs: Sequence[str]) -> list[dict[str, Any]]:
    """``["target_kl=0.05,0.1", "lr=3e-4,6e-4"]`` -> ``[{target_kl: 0.05, lr: 3e-4},
    {target_kl: 0.1, lr: 6e-4}]`` (zipped; every list as long as the first)."""
    columns: dict[str, list[Any]] = {}
    for spec in specs:
        key, sep, values = spec.partition("=")
        if not sep or not key or not values:
            raise ValueError(f"--sweep takes FIELD=V1,V2,...; got {spec!r}")
        if key in columns:
            raise ValueError(f"--sweep names {key!r} twice")
        columns[key] = [_value(v) for v in values.split(",")]
    lengths = {len(v) for v in columns.values()}
    if len(lengths) != 1:
        raise ValueError(f"--sweep lists differ in length: {sorted(lengths)} (they are zipped, not crossed)")
    n = lengths.pop()
    settings = [{k: v[i] for k, v in columns.items()} for i in range(n)]
    if len({label(s) for s in settings}) != n:
        raise ValueError("--sweep repeats a setting")
    return settings


#: Fields of a setting that size the run rather than the trainer (``--sweep-sizes``).
SIZE_FIELDS = ("tasks_per_iteration", "iterations")


def parse_sizes(spec: str) -> list[dict[str, int]]:
    """``"8x3,4x6"`` -> ``[{tasks_per_iteration: 8, iterations: 3}, {... 4, ... 6}]``."""
    out = []
    for item in spec.split(","):
        tasks, sep, iterations = item.strip().partition("x")
        if not sep or not tasks.isdigit() or not iterations.isdigit() or int(tasks) < 1 or int(iterations) < 1:
            raise ValueError(f"--sweep-sizes takes TASKSxITERATIONS,...; got {item!r}")
        out.append({"tasks_per_iteration": int(tasks), "iterations": int(iterations)})
    if len({(d["tasks_per_iteration"], d["iterations"]) for d in out}) != len(out):
        raise ValueError("--sweep-sizes repeats a size")
    return out


def settings_of(sweep: Sequence[str], sizes: str | None) -> list[dict[str, Any]]:
    """The sweep's settings: every size (outer) with every ``--sweep`` setting (inner)."""
    trainer = parse_sweep(sweep) if sweep else [{}]
    if not sizes:
        return trainer
    return [{**z, **t} for z in parse_sizes(sizes) for t in trainer]


def split(setting: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(size fields, trainer options) of a setting."""
    return {k: v for k, v in setting.items() if k in SIZE_FIELDS}, {
        k: v for k, v in setting.items() if k not in SIZE_FIELDS
    }


def sized(sizes: Any, setting: dict[str, Any]) -> Any:
    """``sizes`` (a ``benchmarks.learning.Sizes``) with the setting's size fields."""
    from dataclasses import replace

    own, _ = split(setting)
    return replace(
        sizes, tasks=own.get("tasks_per_iteration", sizes.tasks), iterations=own.get("iterations", sizes.iterations)
    )


def _value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def label(setting: dict[str, Any]) -> str:
    """``target_kl=0.1,lr=0.0006`` (``4x6,target_kl=0.1`` with sizes): a setting's name
    in the report and its folder."""
    own, rest = split(setting)
    head = [f"{own['tasks_per_iteration']}x{own['iterations']}"] if len(own) == 2 else []
    return ",".join(head + [f"{k}={v}" for k, v in setting.items() if k in rest or not head])


def check_pairing(by_setting: Sequence[Sequence[dict[str, Any]]]) -> None:
    """Raise unless every setting's v0 evaluation is the same per (task, seed): the
    cross-setting comparison pairs runs of different settings task by task."""
    first: dict[tuple[str, int], str] = {}
    for runs in by_setting:
        for r in runs:
            key = (r["task"], r["seed"])
            if first.setdefault(key, r["outcomes"]["first"]) != r["outcomes"]["first"]:
                raise ValueError(f"v0 evaluations differ across settings at {key}: runs are not paired")


def auc(points: Sequence[dict[str, Any]]) -> float:
    """Mean success over the transitions axis from v0 to the last version (trapezoids)."""
    xs, ys = [p["transitions"] for p in points], [p["success"] for p in points]
    if len(points) < 2 or xs[-1] <= xs[0]:
        return ys[-1]
    area = sum((x1 - x0) * (y0 + y1) / 2 for x0, x1, y0, y1 in zip(xs, xs[1:], ys, ys[1:], strict=False))
    return area / (xs[-1] - xs[0])


def grid(by_setting: Sequence[Sequence[dict[str, Any]]], tasks: Sequence[str]) -> dict[str, Any]:
    """Per task, method and setting (index): final success (mean over seeds), gain over
    v0 (mean over seeds), ``auc`` (mean over seeds), median and max approximate KL per
    update, update count."""
    out: dict[str, Any] = {}
    for task in tasks:
        out[task] = {}
        for m in METHODS:
            cells = []
            for runs in by_setting:
                mine = [r for r in runs if r["task"] == task and r["method"] == m]
                if not mine:
                    cells = []
                    break
                kls = [p["approx_kl"] for r in mine for p in r["points"][1:]]
                cells.append(
                    {
                        "final": round(statistics.fmean(r["points"][-1]["success"] for r in mine), 6),
                        "gain": round(
                            statistics.fmean(r["points"][-1]["success"] - r["points"][0]["success"] for r in mine), 6
                        ),
                        "auc": round(statistics.fmean(auc(r["points"]) for r in mine), 6),
                        "kl_median": round(statistics.median(kls), 6) if kls else 0.0,
                        "kl_max": round(max(kls, default=0.0), 6),
                        "updates": len(kls),
                        "seeds": len(mine),
                    }
                )
            if cells:
                out[task][m] = cells
    return out


def best(cells: Sequence[dict[str, Any]], key: str = "final") -> int:
    """The selection rule: the highest mean ``key`` (final success, or ``auc``); ties to
    the earlier setting."""
    return max(range(len(cells)), key=lambda i: (cells[i][key], -i))


def at_best(
    by_setting: Sequence[Sequence[dict[str, Any]]], tasks: Sequence[str], table: dict[str, Any], key: str = "final"
) -> dict[str, Any]:
    """Per task: each method's best setting (index) by ``key``, and the verdicts (gains,
    FOCUS and uniform against GRPO) on the runs of each method at its own best setting."""
    out: dict[str, Any] = {}
    for task in tasks:
        chosen = {m: best(cells, key) for m, cells in table[task].items()}
        runs = [r for m, i in chosen.items() for r in by_setting[i] if r["task"] == task and r["method"] == m]
        out[task] = {"best": chosen, "verdicts": verdicts(runs, [task])["tasks"][task]}
    return out


def assemble(settings: Sequence[dict[str, Any]], by_setting: Sequence[Sequence[dict[str, Any]]],
             tasks: Sequence[str]) -> dict[str, Any]:  # fmt: skip
    """The sweep's figures from its runs (one run list per setting)."""
    check_pairing(by_setting)
    table = grid(by_setting, tasks)
    return {
        "settings": [dict(s) for s in settings],
        "labels": [label(s) for s in settings],
        "grid": table,
        "at_setting": [verdicts(runs, tasks) for runs in by_setting],
        "at_best": at_best(by_setting, tasks, table),
        "at_best_auc": at_best(by_setting, tasks, table, "auc"),
        "selection": "per task and method, the highest mean final success over the sweep (at_best_auc: the highest "
        "mean area under the learning curve); ties to the earlier setting",
    }


def summary(result: dict[str, Any]) -> str:
    """The grid, each method's best, and FOCUS against GRPO at the best and at each setting."""
    labels = result["labels"]
    lines = []
    for task, methods in result["grid"].items():
        lines.append(f"{task}:")
        for m, cells in methods.items():
            row = "; ".join(
                f"{lab}: final {c['final']:.3f} gain {c['gain']:+.3f} auc {c.get('auc', 0.0):.3f} "
                f"KL {c['kl_median']:.3f} (max {c['kl_max']:.3f})"
                for lab, c in zip(labels, cells, strict=True)
            )
            lines.append(f"  {m:7s} {row}; best {labels[best(cells)]}")
        for name, key in (("at best", "at_best"), ("at best auc", "at_best_auc")):
            b = result.get(key, {}).get(task)
            for m, c in (b["verdicts"]["vs_grpo"] if b else {}).items():
                lines.append(f"  {name}: " + _versus(m, c, labels[b["best"][m]], labels[b["best"]["grpo"]]))
        for lab, v in zip(labels, result["at_setting"], strict=True):
            for m, c in v["tasks"][task]["vs_grpo"].items():
                lines.append(f"  at {lab}: " + _versus(m, c, lab, lab))
    return "\n".join(lines)


def _versus(method: str, c: dict[str, Any], mine: str, base: str) -> str:
    d = c["difference"]
    share = "never" if c["share_median"] is None else f"{c['share_median']:.2f}"
    ratio = c.get("reach_ratio_median")
    return (
        f"{method} ({mine}) - grpo ({base}) {d['mean']:+.3f} [{d['interval'][0]:+.3f}, {d['interval'][1]:+.3f}], "
        f"{c['verdict']}; share of GRPO's transitions {share}; reach ratio {'-' if ratio is None else f'{ratio:.2f}'}"
    )


def run(args: Any, options: dict[str, Any], sizes: Any, seeds: Sequence[int]) -> dict[str, Any]:
    """Every (setting, task) as one job of ``benchmarks.learning._task_worker`` in a pool
    of ``args.jobs``; each setting's finished runs go to ``<out>/<label>/runs.jsonl``
    as they finish and everything to ``<out>/sweep.json``."""
    from benchmarks.learning import _task_worker, given_options, size_options, task_trainer

    settings = settings_of(args.sweep, args.sweep_sizes)
    out = Path(args.out)
    t0 = time.perf_counter()
    jobs, where = [], []
    for i, s in enumerate(settings):
        folder = out / label(s)
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / "runs.jsonl"
        partial.unlink(missing_ok=True)
        for name in args.tasks:
            own = task_trainer(name, options, {**given_options(args), **split(s)[1]})
            jobs.append((name, sized(sizes, s), seeds, args.methods, not args.quiet, own, partial))
            where.append(i)
    by_setting: list[list[dict[str, Any]]] = [[] for _ in settings]
    if args.jobs <= 1:
        results = [_task_worker(job) for job in jobs]
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(max_workers=args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_task_worker, jobs))
    for i, got in zip(where, results, strict=True):
        by_setting[i] += got
    result = {
        "command": "python -m benchmarks.learning "
        + " ".join([*(f"--set {o}" for o in args.set), *(f"--sweep {s}" for s in args.sweep)])
        + (f" --sweep-sizes {args.sweep_sizes}" if args.sweep_sizes else "")
        + size_options(args),
        "methods": args.methods,
        "jobs": args.jobs,
        "seeds": list(seeds),
        "sizes": sizes.__dict__,
        "trainer": options,
        **assemble(settings, by_setting, args.tasks),
        "runs": by_setting,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    (out / "sweep.json").write_text(json.dumps(result, indent=1))
    print(summary(result))
    print(f"wrote {out / 'sweep.json'} in {result['wall_s']:.0f} s")
    return result


def assemble_cut(args: Any, options: dict[str, Any]) -> dict[str, Any]:
    """The figures of a sweep stopped early, from ``<folder>/<label>/runs.jsonl``: per
    task, the seeds that every method finished at every setting (a comparison across
    settings needs them all)."""
    settings = settings_of(args.sweep, args.sweep_sizes)
    folder = Path(args.assemble)
    done = []
    for s in settings:
        path = folder / label(s) / "runs.jsonl"
        done.append(
            [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
        )
    tasks = [t for t in args.tasks if any(r["task"] == t for runs in done for r in runs)]
    keep = {
        (t, seed)
        for t in tasks
        for seed in {r["seed"] for runs in done for r in runs}
        if all(
            any((r["task"], r["seed"], r["method"]) == (t, seed, m) for r in runs)
            for runs in done
            for m in args.methods
        )
    }
    by_setting = [[r for r in runs if (r["task"], r["seed"]) in keep and r["method"] in args.methods] for runs in done]
    tasks = [t for t in tasks if any(k[0] == t for k in keep)]
    result = {
        "command": f"python -m benchmarks.learning --assemble {folder} (a sweep stopped early)",
        "methods": args.methods,
        "seeds_per_task": {t: sorted(seed for task, seed in keep if task == t) for t in tasks},
        "trainer": options,
        **assemble(settings, by_setting, tasks),
        "runs": by_setting,
    }
    (args.json or folder / "sweep-assembled.json").write_text(json.dumps(result, indent=1))
    print(summary(result))
    return result


def report(saved: dict[str, Any]) -> dict[str, Any]:
    """A saved sweep's figures recomputed from its runs (``--report sweep.json``)."""
    tasks = list(saved["grid"])
    result = {**saved, **assemble(saved["settings"], saved["runs"], tasks)}
    print(summary(result))
    return result
