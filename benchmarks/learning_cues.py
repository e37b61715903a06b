"""What a batch holds of the cue -> digit mapping on the cued tasks (issue 32, counting).

Runs the record's loop (``benchmarks.learning.run_one``: the same tasks, sizes, trainer
and held-out sets, so its curves are the record's runs at those seeds) and reads every
batch before its update (:func:`cue_stats`):

* ``decisive_states``: distinct decisive observations (a corridor's gate, each plank of
  a bridge; one per task and step: within a task the range named there is fixed) with
  a digit said there; ``contrast_states``: those with both a right and a wrong digit
  among the batch's turns there, the independent cue -> digit examples the batch holds;
  ``contrast_contexts``: the same counted per full context (the history differs);
* ``per_100``: contrast states per 100 transitions of the batch;
* ``cue_mass`` / ``constant_mass``: over the turns at decisive states, the sum of
  advantage x tokens x (+1 right, -1 wrong), divided by the sum of |advantage| x tokens
  over every trained token of the batch (the token-mean loss's weights, scale-free):
  ``cue_mass`` on digits the constant part allows (corridor 1-6, bridge 1-7), where
  the range named decides right from wrong; ``constant_mass`` on digits wrong whatever
  the cue (corridor 7-9, bridge 8-9). Positive: the update pushes the right way;
  ``cue_wrong_mass``: the part of ``cue_mass`` on allowed digits the range named makes
  wrong (the gate's other block; the plank's named digit), the one signal that only the
  cue explains (a right digit's push also teaches the constant part);
* ``right_share``: of the allowed digits said at decisive states, the share in the
  right range (a policy that has learned the mapping says 1.0; one that has not, about
  the share its constant part gives).

    .venv/bin/python -m benchmarks.learning_cues --seeds 0 1 2 --out runs/cues.jsonl
    .venv/bin/python -m benchmarks.learning_cues --versus benchmarks/results/learning.json runs/variant/learning.json

``--versus``: a trainer variant's learning run against the same seeds' runs without it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import learning

CUED = ["cued-corridor-early", "cued-corridor-late", "cued-bridge"]
_OBS = re.compile(r"(?:Step|Plank) (\d+): (?:not )?(\d)(?:-(\d))?\.")
_LEN = re.compile(r"(?:Corridor|Bridge) of (\d+)\.")


def first_digit(text: str) -> int | None:
    m = re.search(r"[1-9]", text)
    return int(m.group()) if m else None


def decisive(task: str, prompt: str) -> tuple[int, int, int] | None:
    """(step, low, high) of the range named at the step the turn answering ``prompt``
    (decoded) is at, if that step decides (cued corridor: its gate; cued bridge: every
    plank); None otherwise."""
    found = _OBS.findall(prompt)
    length = _LEN.search(prompt)
    if not found or length is None:
        return None
    step, lo, hi = int(found[-1][0]), int(found[-1][1]), int(found[-1][2] or found[-1][1])
    if task == "cued-corridor-early" and step != 1:
        return None
    if task == "cued-corridor-late" and step != int(length.group(1)):
        return None
    return step, lo, hi


def judged(task: str, cue: tuple[int, int, int], digit: int) -> tuple[bool, bool]:
    """(right, constant): whether ``digit`` is right at the decisive state, and whether it
    is one the constant part rules out whatever the cue."""
    _, lo, hi = cue
    if task == "cued-bridge":
        return not (digit in (8, 9) or lo <= digit <= hi), digit in (8, 9)
    return lo <= digit <= hi, digit >= 7


def cue_stats(task: str, batch: Any) -> dict[str, Any]:
    """The module doc's figures of one batch."""
    from focus.format import ByteCodec

    codec = ByteCodec()
    total = 0.0
    cue_mass = const_mass = cue_wrong = 0.0
    outcomes: dict[tuple[str, int], set[bool]] = {}
    contexts: dict[tuple[str, tuple[int, ...]], set[bool]] = {}
    allowed_right = allowed = 0
    for r in batch.actor:
        n = sum(r.loss_mask)
        total += abs(r.advantage) * n
        digit = first_digit(codec.decode(r.completion_ids))
        cue = decisive(task, codec.decode(r.prompt_ids)) if digit is not None else None
        if cue is None or digit is None:
            continue
        right, constant = judged(task, cue, digit)
        outcomes.setdefault((r.task_id, cue[0]), set()).add(right)
        contexts.setdefault((r.task_id, r.prompt_ids), set()).add(right)
        signed = r.advantage * n * (1 if right else -1)
        if constant:
            const_mass += signed
        else:
            cue_mass += signed
            cue_wrong += 0.0 if right else signed
            allowed += 1
            allowed_right += right
    transitions = int(batch.stats["transitions"])
    contrast = sum(1 for v in outcomes.values() if len(v) == 2)
    return {
        "transitions": transitions,
        "decisive_states": len(outcomes),
        "contrast_states": contrast,
        "contrast_contexts": sum(1 for v in contexts.values() if len(v) == 2),
        "per_100": round(100 * contrast / max(transitions, 1), 3),
        "cue_mass": round(cue_mass / total, 4) if total else 0.0,
        "constant_mass": round(const_mass / total, 4) if total else 0.0,
        "cue_wrong_mass": round(cue_wrong / total, 4) if total else 0.0,
        "right_share": round(allowed_right / allowed, 4) if allowed else None,
    }


def _job(job: tuple[str, int, Sequence[str], int]) -> list[dict[str, Any]]:
    task, seed, methods, iterations = job
    return asyncio.run(_runs(task, seed, methods, iterations))


async def _runs(task: str, seed: int, methods: Sequence[str], iterations: int) -> list[dict[str, Any]]:
    from dataclasses import replace

    from focus.backends import LocalModelServer

    domain = learning.DOMAINS[task]()
    sizes = replace(learning.DEFAULT_SIZES, iterations=iterations)
    options = learning.task_trainer(task, learning.TRAINER, {})
    out = []
    with tempfile.TemporaryDirectory(prefix="focus-cues-") as tmp, LocalModelServer() as server:
        for method in methods:
            run = await learning.run_one(
                domain, method, seed, sizes, server, Path(tmp), options, lambda _it, b: cue_stats(task, b)
            )
            out.append(run)
            for p in run["points"][1:]:
                b = p["batch"]
                print(f"{task} {method} s{seed} it{p['version']}: success {p['success']:.2f} "
                      + " ".join(f"{k}={v}" for k, v in b.items()), flush=True)  # fmt: skip
    return out


def table(runs: Sequence[dict[str, Any]]) -> str:
    """Per task and method: the mean over seeds and batches of each figure, and the final
    held-out success."""
    keys = ("transitions", "decisive_states", "contrast_states", "contrast_contexts", "per_100", "cue_mass",
            "constant_mass", "cue_wrong_mass", "right_share")  # fmt: skip
    lines = ["| task | method | " + " | ".join(keys) + " | final success |", "|" + " --- |" * (len(keys) + 3)]
    for task in dict.fromkeys(r["task"] for r in runs):
        for method in dict.fromkeys(r["method"] for r in runs):
            sel = [r for r in runs if r["task"] == task and r["method"] == method]
            pts = [p["batch"] for r in sel for p in r["points"][1:]]
            if not pts:
                continue
            cells = [statistics.mean(p[k] for p in pts if p[k] is not None) for k in keys]
            final = statistics.mean(r["points"][-1]["success"] for r in sel)
            lines.append(f"| {task} | {method} | " + " | ".join(f"{c:.3g}" for c in cells) + f" | {final:.3f} |")
    return "\n".join(lines)


def versus(base: Sequence[dict[str, Any]], variant: Sequence[dict[str, Any]]) -> str:
    """A trainer variant's runs against the same seeds' runs without it (the record's,
    paired: the same held-out tasks and evaluation seeds): per task and method, final
    success before / after and the mean difference with its paired-bootstrap interval;
    and FOCUS - GRPO under each."""
    from benchmarks.learning_verdicts import paired_bootstrap

    def key(r: dict[str, Any]) -> tuple[str, str, int]:
        return r["task"], r["method"], r["seed"]

    old = {key(r): r for r in base}
    new = {key(r): r for r in variant}
    lines = ["| task | method | seeds | final, without | final, with | with - without [95%] |", "|" + " --- |" * 6]
    for task in dict.fromkeys(r["task"] for r in variant):
        for method in ("focus", "grpo"):
            seeds = sorted(s for t, m, s in new if (t, m) == (task, method) and (t, m, s) in old)
            if not seeds:
                continue
            a = [old[(task, method, s)] for s in seeds]
            b = [new[(task, method, s)] for s in seeds]
            mean, lo, hi = paired_bootstrap(
                [(x["outcomes"]["last"], y["outcomes"]["last"]) for x, y in zip(a, b, strict=True)]
            )
            fa = statistics.mean(x["points"][-1]["success"] for x in a)
            fb = statistics.mean(y["points"][-1]["success"] for y in b)
            lines.append(
                f"| {task} | {method} | {len(seeds)} | {fa:.3f} | {fb:.3f} | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |"
            )
        for name, runs in (("without", old), ("with", new)):
            seeds = sorted(s for t, m, s in new if (t, m) == (task, "focus") and (t, "grpo", s) in new)
            seeds = [s for s in seeds if (task, "focus", s) in runs and (task, "grpo", s) in runs]
            if seeds:
                pairs = [(runs[(task, "grpo", s)]["outcomes"]["last"], runs[(task, "focus", s)]["outcomes"]["last"])
                         for s in seeds]  # fmt: skip
                mean, lo, hi = paired_bootstrap(pairs)
                lines.append(
                    f"| {task} | focus - grpo, {name} | {len(seeds)} | | | {mean:+.3f} [{lo:+.3f}, {hi:+.3f}] |"
                )
    return "\n".join(lines)


def _runs_of(path: Path) -> list[dict[str, Any]]:
    """The runs of a learning.json (a record's ``figures`` or a run's own) or a runs.jsonl."""
    text = path.read_text()
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    got = json.loads(text)
    return list(got.get("figures", got)["runs"])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", choices=CUED, default=CUED)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--methods", nargs="+", default=["focus", "grpo"])
    ap.add_argument("--iterations", type=int, default=learning.DEFAULT_SIZES.iterations)
    ap.add_argument("--jobs", type=int, default=2, help="(task, seed) pairs in parallel processes")
    ap.add_argument("--out", type=Path, default=Path("runs/cues.jsonl"))
    ap.add_argument("--report", action="store_true", help="print the table of --out; run nothing")
    ap.add_argument("--versus", nargs=2, type=Path, metavar=("WITHOUT", "WITH"),
                    help="compare two learning runs (learning.json or runs.jsonl) seed by seed; run nothing")  # fmt: skip
    args = ap.parse_args(argv)
    if args.versus:
        print(versus(_runs_of(args.versus[0]), _runs_of(args.versus[1])))
        return
    if not args.report:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        jobs = [(t, s, args.methods, args.iterations) for t in args.tasks for s in args.seeds]
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for got in pool.map(_job, jobs):
                with args.out.open("a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in got)
    runs = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    print(table(runs))


if __name__ == "__main__":
    main()
