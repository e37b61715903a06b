"""Gradient quality: how well one batch's policy gradient points along the true one (issue 32).

With a KL cap per update (``learning.ADAM_TRAINER``'s ``target_kl``) every update moves the
policy by about the same amount, so a better batch can help only through the direction
of its update. This measures that direction at the learning benchmark's settings: for a
task and seed it collects, at the initial policy (or after one GRPO update:
``--version 1``), FOCUS and GRPO batches exactly as ``benchmarks.learning.collect``
does, at its per-iteration budget (8 tasks) and at half of it (the first 4 of those
tasks), and a reference batch: ``--reference`` independent rollouts per task with
centred returns (``GroupNormalized(scale=False)``, Dr. GRPO: an unbiased estimate of the
gradient of the mean return over those tasks times (G − 1)/G, G the rollouts per task
of a half, as each group mean holds the rollout's own return; the same factor on every
task, so the direction is unbiased), collected as two independent halves.

Each batch's gradient is the trainer's loss gradient at the current weights: the
trainer's own sequences (``actor_sequences``, ``training_units``), scaled advantages and
loss mask, ``clipped_loss`` (its ratio is 1 on a batch of the current policy, so no
clipping), one backward pass per minibatch, no step; the parameter gradients flattened.
Reported per method, task and budget: the cosine with the reference gradient (the
sum of the halves), the batch's transitions, and the halves' cosine with each other
(the reference's own noise: the reference's cosine with the truth is about
``sqrt(2c / (1 + c))`` for halves at cosine ``c`` under isotropic noise, so every
figure understates a batch's cosine with the truth by about that factor, the same for
both methods). With ``--update`` also the cosine of the trainer's own update on the
batch (``learning.ADAM_TRAINER``: several Adam epochs under the KL bound; the parameter change,
undone after) with the reference's ascent direction, and its gain on the reference
(``surrogate_sum`` per rollout: the first-order change of the mean return the update
buys, in reward units; heavy-tailed where an update moves a few tokens' ratios far
from 1, so read medians): what the learning curve follows. ``--methods grpo-centred``:
GRPO's batches without the division by each task's spread (the reference's weighting).
``--version 1`` measures after one GRPO update on other tasks, with FOCUS's critic
fresh (in the learning benchmark it would have been fitted on the first batch).

    .venv/bin/python -m benchmarks.gradient_quality --jobs 2 --tasks corridor-early corridor-late bridge --seeds 0 1 2 3 --reference 128 --batches 2
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks import learning
from focus.agent import derive_seed
from focus.batch import Batch

#: ``grpo-centred``: GRPO's rollouts (the same seed: the same samples) with centred
#: returns, not divided by each task's spread, as the reference's are: tells GRPO's
#: noise from its weighting of tasks.
METHODS = ("focus", "grpo", "grpo-centred")
#: Update rules ``--trainers`` can measure on the same batches, each ``learning.ADAM_TRAINER``
#: with these fields changed (``focus.train_local.UpdateConfig``; the same for every method):
#: ``adam`` is the learning benchmark's; ``adam-fullbatch`` accumulates the whole batch's
#: gradient into each Adam step (up to 8 steps); ``adam-1epoch`` one pass of minibatches
#: (their learning rates raised so that they reach the KL target: at 3e-4 they ended at
#: KL 0.02 and 0.001-0.005 on a corridor-early seed);
#: ``sgd`` and ``natural`` one step along the batch's gradient / natural gradient sized
#: to the KL target by a line search (``focus.kl_step``).
TRAINERS: dict[str, dict[str, Any]] = {
    "adam": {},
    "adam-fullbatch": {"minibatch": 4096, "lr": 5e-4},
    "adam-1epoch": {"epochs": 1, "lr": 1e-3},
    "sgd": {"rule": "sgd"},
    "natural": {"rule": "natural"},
}


def batch_gradient(trainer: Any, batch: Batch, task_ids: set[str] | None = None) -> tuple[Any, int]:
    """The trainer's loss gradient on ``batch`` (its rows of ``task_ids``) at the trainer's
    weights, flattened over parameters, as a token sum (a scalar multiple of the trainer's
    token-mean loss gradient), and the trained tokens. No optimizer step."""
    import torch

    from focus.train_local import clipped_loss, pad_sequences, padded_logprobs

    cfg = trainer.config
    seqs = _sequences(trainer, batch, task_ids)
    trained = [a for s in seqs for a, m in zip(s.advantages, s.mask, strict=True) if m]
    mean = sum(trained) / len(trained)
    std = (sum((a - mean) ** 2 for a in trained) / len(trained)) ** 0.5
    scale = 1.0 / std if cfg.scale_advantages == "batch" and std > 1e-8 else 1.0
    model = trainer.model
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.torch_threads)
    try:
        model.zero_grad()
        for i in range(0, len(seqs), cfg.minibatch):
            p = pad_sequences(seqs[i : i + cfg.minibatch], trainer.pad_id)
            new = padded_logprobs(model, p, cfg.temperature or 1.0)
            loss, _ = clipped_loss(new, p, cfg.clip, p.advantages * scale)
            (loss * p.mask.sum().clamp_min(1.0)).backward()  # type: ignore[no-untyped-call]
        flat = torch.cat(
            [(q.grad if q.grad is not None else torch.zeros_like(q)).flatten() for q in model.parameters()]
        ).double()
    finally:
        model.zero_grad()
        torch.set_num_threads(threads)
    return flat, len(trained)


def _sequences(trainer: Any, batch: Batch, task_ids: set[str] | None) -> list[Any]:
    from focus.exporters import actor_sequences
    from focus.train_local import training_units, weighted
    from focus.tree_weights import task_scaled

    cfg = trainer.config
    rows = [r for r in batch.actor if task_ids is None or r.task_id in task_ids]
    part = Batch(batch.collection_id, batch.iteration, rows)
    part = task_scaled(part) if cfg.scale_advantages == "task" else part
    raw = actor_sequences(weighted(part, cfg.segment_weights) if cfg.segment_weights != "equal" else part)
    return training_units(raw, cfg)


def reference_kl(trainer: Any, batches: Sequence[Batch], task_ids: set[str]) -> float:
    """Approximate KL(behaviour || trainer's policy), token mean over ``batches``' trained
    tokens of ``task_ids``: the update's size on the policy's own samples (the reference),
    where the trainer's KL is over its batch's (a tree's states, for FOCUS)."""
    total, tokens = 0.0, 0.0
    for b in batches:
        t, n = trainer.kl_sums(_sequences(trainer, b, task_ids))
        total, tokens = total + t, tokens + n
    return total / max(tokens, 1.0)


def surrogate_sum(trainer: Any, batch: Batch, task_ids: set[str]) -> float:
    """Sum over ``batch``'s trained tokens of ``A_t (ratio_t - 1)`` at the trainer's
    weights: over a reference batch (centred returns, the behaviour policy's samples),
    divided by its rollouts, the first-order change of the mean return since the
    behaviour policy."""
    import torch

    from focus.train_local import pad_sequences, padded_logprobs

    seqs, total = _sequences(trainer, batch, task_ids), 0.0
    with torch.no_grad():
        for i in range(0, len(seqs), trainer.config.minibatch):
            p = pad_sequences(seqs[i : i + trainer.config.minibatch], trainer.pad_id)
            new = padded_logprobs(trainer.model, p, trainer.config.temperature or 1.0)
            ratio = torch.exp((new - p.old_logprobs) * p.mask)
            total += float(((ratio - 1.0) * p.advantages * p.mask).sum())
    return total


def update_delta(trainer: Any, batch: Batch, gain: Any) -> tuple[Any, float, Any]:
    """The parameter change of the trainer's own update on ``batch`` (its epochs, Adam, KL
    bound), the update's final KL and ``gain()`` after it; the trainer is put back as it
    was. Adam rescales each parameter's step, so the update need not point where the
    batch's gradient does: the gain on the reference says what the step bought."""
    import torch

    def flat() -> Any:
        return torch.cat([q.detach().flatten() for q in trainer.model.parameters()]).double()

    snap, updates, before = trainer._snapshot(), trainer.updates, flat()
    try:
        stats = trainer.update(batch)
        return flat() - before, stats.final_kl, gain()
    finally:
        trainer._restore(snap)
        trainer.updates = updates


def cosine(a: Any, b: Any) -> float:
    import torch

    d = float(a.norm() * b.norm())
    return float(torch.dot(a, b)) / d if d > 0 else 0.0


async def reference_batch(agent: Any, tasks: list[Any], rollouts: int, cid: str, seed: int) -> Batch:
    """``rollouts`` independent rollouts per task, advantages the centred returns."""
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.estimation import GroupNormalized
    from focus.execution import Execution
    from focus.priority import Phase, Selective

    return await Collector(
        agent, search=Selective(phases=(Phase("evidence", rollouts_per_task=rollouts),)),
        critic=ConstantCritic(0.0), estimator=GroupNormalized(scale=False),
        execution=Execution(max_concurrency=32), collection_id=cid, iteration=0, seed=seed,
    ).collect(tasks)  # fmt: skip


async def measure_seed(
    task: str, seed: int, args: argparse.Namespace, server: Any, workdir: Path
) -> list[dict[str, Any]]:
    """One seed's rows: per budget and method, each batch's cosine with the reference."""
    from focus.estimation import GroupNormalized
    from focus.tinylm.model import DEFAULT_WEIGHTS
    from focus.train_local import PolicyTrainer, UpdateConfig, train_iteration

    await asyncio.to_thread(server.reload, DEFAULT_WEIGHTS)
    domain = learning.DOMAINS[task]()
    trainer = PolicyTrainer(None, UpdateConfig(seed=seed, **learning.ADAM_TRAINER))
    trainers = {
        name: trainer
        if name == "adam"
        else PolicyTrainer(None, UpdateConfig(seed=seed, **{**learning.ADAM_TRAINER, **TRAINERS[name]}))
        for name in args.trainers
    }
    agent = domain.make_agent(server.url)
    tasks = domain.tasks(args.n_tasks, derive_seed("tasks", seed, 0))
    cid = f"{task}-s{seed}"
    rows: list[dict[str, Any]] = []
    try:
        if args.version == 1:  # one GRPO update first (a batch of other tasks), then measure there
            _, est, critic, _ = learning.make_method("grpo", seed)
            warm = domain.tasks(args.n_tasks, derive_seed("tasks", seed, 1))
            b = await learning.collect(agent, "grpo", critic, est, warm, cid, 0, derive_seed("warm", seed))
            path = workdir / f"{task}-s{seed}.pt"
            await asyncio.to_thread(train_iteration, trainer, None, b, path)
            await asyncio.to_thread(server.reload, path)
            for t in trainers.values():  # every rule measures from the same weights and state
                t.model.load_state_dict(trainer.model.state_dict())
                t.optimizer.load_state_dict(trainer.optimizer.state_dict())
                t.updates = trainer.updates
        halves = [
            await reference_batch(agent, tasks, args.reference // 2, cid, derive_seed("reference", seed, h))
            for h in (0, 1)
        ]
        for budget in args.budgets:
            ids = {t.id for t in tasks[:budget]}
            ga, na = batch_gradient(trainer, halves[0], ids)
            gb, nb = batch_gradient(trainer, halves[1], ids)
            ref, self_cos = ga + gb, cosine(ga, gb)
            for method in args.methods:
                for k in range(args.batches):
                    base = method.partition("-")[0]
                    _, est, critic, _ = learning.make_method(base, seed)  # a fresh critic, as at iteration 0
                    est = GroupNormalized(scale=False) if method == "grpo-centred" else est
                    cseed = derive_seed("learning", seed, 0) if k == 0 else derive_seed("gradient", seed, k)
                    batch = await learning.collect(agent, base, critic, est, tasks[:budget], cid, 0, cseed)
                    g, n = batch_gradient(trainer, batch)
                    rows.append(
                        {
                            "task": task, "seed": seed, "budget": budget, "method": method, "batch": k,
                            "cosine": round(cosine(g, ref), 5), "transitions": int(batch.stats["transitions"]),
                            "tokens": n, "reference_tokens": na + nb, "reference_self_cosine": round(self_cos, 5),
                        }
                    )  # fmt: skip
                    new = (
                        await _updates(trainers, rows.pop(), batch, halves, ids, ref, args)
                        if args.update
                        else [rows.pop()]
                    )
                    rows += new
                    if args.partial is not None:  # a run cut short keeps what it measured (every trainer's row)
                        with Path(args.partial).open("a") as f:
                            f.writelines(json.dumps(r) + "\n" for r in new)
                    if not args.quiet:
                        r = rows[-1]
                        print(task, seed, budget, method, k, f"cos={r['cosine']:+.4f}", f"transitions={r['transitions']}",
                              f"ref_self={self_cos:+.4f}", f"update_cos={r.get('update_cosine')}", f"gain={r.get('update_gain')}", flush=True)  # fmt: skip
    finally:
        await agent.policy.aclose()
    return rows


async def _updates(
    trainers: dict[str, Any],
    row: dict[str, Any],
    batch: Batch,
    halves: list[Batch],
    ids: set[str],
    ref: Any,
    args: argparse.Namespace,
) -> list[dict[str, Any]]:
    """``row`` once per trainer, with its update's cosine with the reference's ascent
    direction, KL and gain on the reference; a ``trainer`` key on all but ``adam``'s
    (so the default run's rows are what they were)."""
    rollouts = 2 * (args.reference // 2) * row["budget"]
    out = []
    for name, trainer in trainers.items():

        def gain(trainer: Any = trainer) -> tuple[float, float]:
            return sum(surrogate_sum(trainer, h, ids) for h in halves) / rollouts, reference_kl(trainer, halves, ids)

        delta, kl, (up, ref_kl) = await asyncio.to_thread(update_delta, trainer, batch, gain)
        extra = {} if name == "adam" else {"trainer": name}
        figures = {"update_cosine": round(cosine(delta, -ref), 5), "update_kl": round(kl, 5)}
        out.append({**row, **extra, **figures, "update_gain": round(up, 5), "update_kl_reference": round(ref_kl, 5)})
    return out


def trainer_table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, budget, method and trainer: the update's cosine, gain (mean and median
    over seeds of each seed's mean over its batches) and KL, and the gain minus GRPO's
    under the same trainer, paired by seed."""
    out = []
    keys = sorted({(r["task"], r["budget"]) for r in rows}, key=lambda k: (k[0], -k[1]))
    names = [t for t in TRAINERS if any(r.get("trainer", "adam") == t for r in rows)]
    for task, budget in keys:
        for name in names:
            mine = [r for r in rows if r["task"] == task and r["budget"] == budget and r.get("trainer", "adam") == name]
            seeds = sorted({r["seed"] for r in mine})

            def per_seed(
                method: str, key: str, mine: list[dict[str, Any]] = mine, seeds: list[int] = seeds
            ) -> list[float]:
                got = [[r[key] for r in mine if r["seed"] == s and r["method"] == method] for s in seeds]
                return [sum(g) / len(g) for g in got if g]

            for m in [m for m in METHODS if any(r["method"] == m for r in mine)]:
                gains = per_seed(m, "update_gain")
                line = {"task": task, "budget": budget, "trainer": name, "method": m, "seeds": len(gains)}
                for key in ("update_cosine", "update_kl", "update_kl_reference"):
                    line[key] = round(statistics.fmean(per_seed(m, key)), 4)
                # gain per unit of update size: a small move's gain grows as sqrt(KL)
                efficiency = [
                    g / k**0.5 for g, k in zip(gains, per_seed(m, "update_kl_reference"), strict=True) if k > 0
                ]
                line["gain_per_sqrt_kl"] = round(statistics.median(efficiency), 4) if efficiency else None
                line["update_gain"] = [round(x, 4) for x in _interval(gains)]
                line["update_gain_median"] = round(statistics.median(gains), 4)
                if m != "grpo" and any(r["method"] == "grpo" for r in mine):
                    diff = [a - b for a, b in zip(gains, per_seed("grpo", "update_gain"), strict=True)]
                    line["gain_minus_grpo"] = [round(x, 4) for x in _interval(diff)]
                out.append(line)
    return out


def render_trainers(lines: Sequence[dict[str, Any]]) -> str:
    out = [
        "| task | tasks per batch | trainer | method | update's cosine | update's gain: mean [interval] (median) "
        "| gain minus GRPO's | update's KL: batch / reference | gain / sqrt(reference KL), median |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in lines:
        g, d = t["update_gain"], t.get("gain_minus_grpo")
        diff = "" if d is None else f"{d[0]:+.3f} [{d[1]:+.3f}, {d[2]:+.3f}]"
        out.append(
            f"| {t['task']} | {t['budget']} | {t['trainer']} | {t['method']} | {t['update_cosine']:+.3f} | "
            f"{g[0]:+.3f} [{g[1]:+.3f}, {g[2]:+.3f}] ({t['update_gain_median']:+.3f}) | {diff} | "
            f"{t['update_kl']:.3f} / {t['update_kl_reference']:.3f} | {t['gain_per_sqrt_kl'] or 0:.3f} |"
        )
    return "\n".join(out)


def _interval(values: Sequence[float], seed: int = 0, draws: int = 2000) -> tuple[float, float, float]:
    """Mean and a 95% bootstrap interval over ``values`` (one per seed)."""
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(draws))
    return sum(values) / n, means[int(0.025 * draws)], means[int(0.975 * draws) - 1]


def table(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per task, budget and method: the cosine's mean and interval over seeds (each seed's
    mean over its batches), transitions, and the difference to GRPO paired by seed."""
    out = []
    keys = sorted({(r["task"], r["budget"]) for r in rows}, key=lambda k: (k[0], -k[1]))
    for task, budget in keys:
        mine = [r for r in rows if r["task"] == task and r["budget"] == budget]
        seeds = sorted({r["seed"] for r in mine})
        self_cos = {r["seed"]: r["reference_self_cosine"] for r in mine}

        def per_seed(method: str, key: str, mine: list[dict[str, Any]] = mine, seeds: list[int] = seeds) -> list[float]:
            got = [[r[key] for r in mine if r["seed"] == s and r["method"] == method] for s in seeds]
            return [sum(g) / len(g) for g in got]

        for m in [m for m in METHODS if any(r["method"] == m for r in mine)]:
            line: dict[str, Any] = {"task": task, "budget": budget, "method": m, "seeds": len(seeds)}
            line["cosine"] = [round(x, 4) for x in _interval(per_seed(m, "cosine"))]
            line["transitions"] = round(sum(per_seed(m, "transitions")) / len(seeds))
            if all("update_cosine" in r for r in mine):
                for key in ("update_cosine", "update_gain", "update_kl"):
                    line[key] = [round(x, 4) for x in _interval(per_seed(m, key))]
            if m != "grpo" and any(r["method"] == "grpo" for r in mine):
                diff = [a - b for a, b in zip(per_seed(m, "cosine"), per_seed("grpo", "cosine"), strict=True)]
                line["minus_grpo"] = [round(x, 4) for x in _interval(diff)]
            line["reference_self_cosine"] = round(sum(self_cos.values()) / len(seeds), 4)
            out.append(line)
    return out


def render(lines: Sequence[dict[str, Any]]) -> str:
    def c(v: list[float] | None) -> str:
        return "" if v is None else f"{v[0]:+.3f} [{v[1]:+.3f}, {v[2]:+.3f}]"

    upd = any("update_cosine" in t for t in lines)
    out = [
        "| task | tasks per batch | method | cosine with the reference | minus GRPO's | transitions | reference halves |"
        + (" update's cosine | update's gain | update's KL |" if upd else ""),
        "| --- | --- | --- | --- | --- | --- | --- |" + (" --- | --- | --- |" if upd else ""),
    ]
    for t in lines:
        out.append(
            f"| {t['task']} | {t['budget']} | {t['method']} | {c(t['cosine'])} | {c(t.get('minus_grpo'))} | "
            f"{t['transitions']} | {t['reference_self_cosine']:+.3f} |"
            + (f" {c(t.get('update_cosine'))} | {c(t.get('update_gain'))} | {c(t.get('update_kl'))} |" if upd else "")
        )
    return "\n".join(out)


def _task_worker(job: tuple[str, argparse.Namespace]) -> list[dict[str, Any]]:
    """One task's seeds, with a model server of its own (a process of its own with ``--jobs``)."""
    from focus.backends import LocalModelServer

    task, args = job

    async def go(server: Any, tmp: Path) -> list[dict[str, Any]]:
        return [r for s in args.seeds for r in await measure_seed(task, s, args, server, tmp)]

    with tempfile.TemporaryDirectory(prefix="focus-gradq-") as tmp, LocalModelServer() as server:
        return asyncio.run(go(server, Path(tmp)))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", choices=list(learning.DOMAINS), default=["corridor-early"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--n-tasks", type=int, default=learning.DEFAULT_SIZES.tasks, help="tasks per iteration")
    ap.add_argument("--budgets", type=int, nargs="+", default=None, help="tasks per batch (default: n and n/2)")
    ap.add_argument("--reference", type=int, default=128, help="reference rollouts per task (two halves)")
    ap.add_argument("--methods", nargs="+", choices=METHODS, default=["focus", "grpo"])
    ap.add_argument("--batches", type=int, default=2, help="batches per method, seed and budget")
    ap.add_argument("--update", action="store_true", help="also the cosine of the trainer's update (slower)")
    ap.add_argument(
        "--trainers", nargs="+", choices=list(TRAINERS), default=["adam"], help="update rules --update measures"
    )
    ap.add_argument("--version", type=int, choices=(0, 1), default=0, help="1: after one GRPO update")
    ap.add_argument("--jobs", type=int, default=1, help="tasks in parallel processes")
    ap.add_argument("--out", type=Path, default=Path("runs/gradient_quality.json"))
    ap.add_argument("--quiet", action="store_true")
    args = ap.parse_args(argv)
    if args.budgets is None:
        args.budgets = sorted({args.n_tasks, max(1, args.n_tasks // 2)}, reverse=True)
    if max(args.budgets) > args.n_tasks or args.reference < 2:
        ap.error("budgets must not exceed --n-tasks; --reference needs 2 rollouts or more")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.partial = str(args.out.with_suffix(".jsonl"))
    Path(args.partial).unlink(missing_ok=True)
    t0 = time.perf_counter()
    jobs = [(t, args) for t in args.tasks]
    rows: list[dict[str, Any]] = []
    if args.jobs <= 1:
        for job in jobs:
            rows += _task_worker(job)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            for got in pool.map(_task_worker, jobs):
                rows += got
    first = args.trainers[0] if args.update else "adam"  # the gradient cosines repeat per trainer
    lines = table([r for r in rows if r.get("trainer", "adam") == first])
    by_trainer = trainer_table(rows) if args.trainers != ["adam"] and args.update else None
    result = {
        "command": "python -m benchmarks.gradient_quality " + " ".join(sys.argv[1:] if argv is None else argv),
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "trainer": learning.ADAM_TRAINER,
        "table": lines,
        **({"trainers": {t: TRAINERS[t] for t in args.trainers}, "trainer_table": by_trainer} if by_trainer else {}),
        "rows": rows,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(render(lines))
    if by_trainer:
        print(render_trainers(by_trainer))
    print(f"wrote {args.out} in {result['wall_s']:.0f} s")
    return result


if __name__ == "__main__":
    main()
