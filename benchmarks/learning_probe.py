"""What a batch teaches at a task's decisive step: a diagnostic beside benchmarks/learning.py.

For one task, method variant and seed it runs ``iterations`` x (collect, train, reload,
evaluate) as ``benchmarks.learning.run_one`` does (the same tasks, trainer and budget),
and per batch it measures where the loss puts its weight:

* ``decisive_token_share``: the share of trained tokens on turns at the decisive step
  (corridor: the gate's step; bridge: every plank), and their count;
* ``signal``: sum over decisive tokens of the trainer's scaled advantage times +1 for a
  good action (corridor: a digit 1-3; bridge: not 8 or 9) and -1 for a bad one, divided
  by every trained token: the weight the token-mean loss gives to the right direction
  at the decisive step;
* ``decisive_good_mean`` / ``decisive_bad_mean``: scaled advantage means there;
* ``other_mean`` / ``other_rms``: scaled advantages on every other token (what the
  update spends its KL budget on that no decision asked for);
* the update's approximate KL, and held-out success after it. On corridor-early also
  ``p_gate``: the policy's probability that the first reply token is a gate digit
  (1-3), averaged over the held-out openings (no sampling noise).

Variants (``METHOD[:CHANGE]``, one change each): ``focus``, ``grpo``,
``focus:center=batch`` / ``focus:center=tree`` (advantages centred over the batch's
tokens / each tree's), ``focus:weights=siblings`` / ``reach`` (the trainer's
``segment_weights``), ``focus:cold`` (``Collector(warm_start_critic=False)``: the first
collection scores with the critic unfitted, as before the warm start was the default;
it was measured as ``focus:warm`` the other way round, the warm start a variant),
``focus:carry`` (TD advantages carried down one-child chains, :class:`CarriedTd`),
``focus:evidence=6`` (6 of the 8 rollouts' worth as evidence).

    .venv/bin/python -m benchmarks.learning_probe --task corridor-early --variants focus grpo --seeds 0 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import re
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import learning
from focus.agent import derive_seed
from focus.batch import Batch
from focus.estimation import DirectBranchTd

_STEP = re.compile(r"(?:Step|Plank) (\d+)\.")
_LEN = re.compile(r"(?:Corridor|Bridge) of (\d+)\.")


def _digit(text: str) -> int | None:
    m = re.search(r"[1-9]", text)
    return int(m.group()) if m else None


def decisive_turn(task: str, prompt: str) -> bool:
    """Whether the turn answering ``prompt`` (decoded) is at the decisive step."""
    steps = _STEP.findall(prompt)
    if not steps:
        return False
    step = int(steps[-1])
    if task == "corridor-early":
        return step == 1
    if task == "corridor-late":
        m = _LEN.search(prompt)
        return m is not None and step == int(m.group(1))
    return task == "bridge"


def good_action(task: str, digit: int) -> bool:
    return digit not in (8, 9) if task == "bridge" else digit in (1, 2, 3)


def batch_stats(task: str, batch: Batch) -> dict[str, Any]:
    """Where ``batch``'s scaled advantages put the loss's weight (see the module doc)."""
    from focus.format import ByteCodec

    codec = ByteCodec()
    toks: list[tuple[float, int, int]] = []  # (advantage, tokens, +1 good / -1 bad / 0 not decisive)
    invalid = 0
    for r in batch.actor:
        n = sum(r.loss_mask)
        if not n:
            continue
        d = _digit(codec.decode(r.completion_ids))
        invalid += d is None
        mark = 0
        if d is not None and decisive_turn(task, codec.decode(r.prompt_ids)):
            mark = 1 if good_action(task, d) else -1
        toks.append((r.advantage, n, mark))
    total = sum(n for _, n, _ in toks)
    mean = sum(a * n for a, n, _ in toks) / total
    std = math.sqrt(sum((a - mean) ** 2 * n for a, n, _ in toks) / total)
    s = 1.0 / std if std > 1e-8 else 1.0

    def avg(sel: list[tuple[float, int, int]], f: Any = lambda a: a) -> float | None:
        k = sum(n for _, n, _ in sel)
        return round(sum(f(a * s) * n for a, n, _ in sel) / k, 4) if k else None

    dec = [t for t in toks if t[2]]
    other = [t for t in toks if not t[2]]
    rms = avg(other, lambda a: a * a)
    return {
        "rows": len(batch.actor),
        "tokens": total,
        "decisive_tokens": sum(n for _, n, _ in dec),
        "decisive_token_share": round(sum(n for _, n, _ in dec) / total, 4),
        "decisive_good_share": round(sum(n for _, n, m in dec if m > 0) / max(1, sum(n for _, n, _ in dec)), 4),
        "signal": round(sum(a * s * n * m for a, n, m in dec) / total, 4),
        "decisive_good_mean": avg([t for t in dec if t[2] > 0]),
        "decisive_bad_mean": avg([t for t in dec if t[2] < 0]),
        "other_mean": avg(other),
        "other_rms": None if rms is None else round(math.sqrt(rms), 4),
        "raw_mean": round(mean, 4),
        "raw_std": round(std, 4),
        "invalid_turn_share": round(invalid / max(1, len(toks)), 4),
    }


def centred(batch: Batch, by: str) -> Batch:
    """``batch`` with advantages less their token-weighted mean over the batch or each tree."""
    groups: dict[str, list[float]] = {}
    for r in batch.actor:
        key = "" if by == "batch" else r.tree_id
        g = groups.setdefault(key, [0.0, 0.0])
        n = sum(r.loss_mask)
        g[0] += r.advantage * n
        g[1] += n
    means = {k: (a / n if n else 0.0) for k, (a, n) in groups.items()}
    rows = [replace(r, advantage=r.advantage - means["" if by == "batch" else r.tree_id]) for r in batch.actor]
    return Batch(batch.collection_id, batch.iteration, rows, batch.critic, batch.stats)


def p_gate(model: Any, openings: list[list[int]]) -> float:
    """Mean probability that the first digit said is a gate digit (1-3): at the opening,
    or, after an empty reply (the tiny model's usual first answer), at the re-ask."""
    import torch

    from focus.digit_tasks import INVALID
    from focus.format import ByteCodec

    gate = [ord(c) for c in "123"]
    reask = [ByteCodec.EOT, ByteCodec.USER, *INVALID.encode(), ByteCodec.EOT, ByteCodec.ASSISTANT]
    total = 0.0
    with torch.no_grad():
        for ids in openings:
            logits, _ = model(torch.tensor([ids]))
            first = torch.softmax(logits[0, len(ids) - 1].float(), dim=-1)
            logits2, _ = model(torch.tensor([ids + reask]))
            second = torch.softmax(logits2[0, -1].float(), dim=-1)
            total += float(first[gate].sum()) + float(first[ByteCodec.EOT]) * float(second[gate].sum())
    return round(total / len(openings), 4)


class CarriedTd(DirectBranchTd):
    """DirectBranchTd whose advantage at a checkpoint with one valid child also carries
    the advantage of the segment into that checkpoint (summed down unbranched chains:
    ``r + V(c)`` less the value at the last branching checkpoint above, less the rewards
    since). With one child, ``V(p)`` is mostly that child's own return, so ``r + V(c) -
    V(p)`` is shrunk to ``lambda(p) (r + V(c) - v(p))``: a baseline that knows the
    action it judges; the chain's credit went to the segment above instead."""

    def advantages(self, edges: Any, values: Any) -> dict[int, float]:
        td = super().advantages(edges, values)
        into = {e.child: e for e in edges}
        out: dict[int, float] = {}

        def carried(e: Any) -> float:
            if e.id not in out:
                up = into.get(e.parent)
                extra = carried(up) if up is not None and up.id in td and values.m.get(e.parent) == 1 else 0.0
                out[e.id] = td[e.id] + extra
            return out[e.id]

        for e in edges:
            if e.id in td:
                carried(e)
        return out


async def collect_variant(
    agent: Any, change: str, critic: Any, estimator: Any, tasks: list[Any], cid: str, it: int, seed: int
) -> Batch:
    """``learning.collect``'s FOCUS collection, with the variant's change to it."""
    from focus.collector import Collector
    from focus.execution import Execution
    from focus.priority import Phase, Selective

    evidence_n = int(change.split("=")[1]) if change.startswith("evidence=") else learning.EVIDENCE

    def collector(*phases: Phase) -> Collector:
        return Collector(
            agent, search=Selective(phases=phases), critic=critic, estimator=estimator,
            execution=Execution(max_concurrency=32), collection_id=cid, iteration=it, seed=seed,
            warm_start_critic=change != "cold",
        )  # fmt: skip

    evidence = Phase("evidence", rollouts_per_task=evidence_n)
    state = await collector(evidence).run_evidence(tasks)
    used = state.usage().transitions
    # the continuation budget: what 2 * EVIDENCE rollouts cost, less what the evidence took
    budget = round(used * 2 * learning.EVIDENCE / evidence_n) - used
    full = collector(evidence, Phase("continue", transitions=budget))
    wave = 0
    while not (plan := full.plan_wave(state, 1, wave)).empty:
        state = await full.run_wave(state, plan)
        wave += 1
    return full.prepare(state)


async def probe(
    task: str, variant: str, seed: int, iterations: int, n_tasks: int, eval_tasks: int, server: Any, workdir: Path
) -> dict[str, Any]:
    from focus.tinylm.model import DEFAULT_WEIGHTS
    from focus.train_local import PolicyTrainer, UpdateConfig, evaluate, train_iteration

    method, _, change = variant.partition(":")
    options = dict(learning.ADAM_TRAINER)
    if change.startswith("weights="):
        options["segment_weights"] = change.split("=")[1]
    await asyncio.to_thread(server.reload, DEFAULT_WEIGHTS)
    domain = learning.DOMAINS[task]()
    _, estimator, critic, fit = learning.make_method(method, seed)
    if change == "carry":
        estimator = CarriedTd()
    trainer = PolicyTrainer(None, UpdateConfig(seed=seed, **options))
    agent = domain.make_agent(server.url)
    held_out = domain.tasks(eval_tasks, 10_000 + seed)
    openings = [list((await agent.start(t)).context.prompt_ids) for t in held_out]
    ev = await evaluate(agent, held_out, seed=seed)
    points: list[dict[str, Any]] = [
        {"version": 0, "success": ev.success_rate, "p_gate": p_gate(trainer.model, openings)}
    ]
    try:
        for it in range(iterations):
            t0 = time.perf_counter()
            tasks = domain.tasks(n_tasks, derive_seed("tasks", seed, it))
            cid = f"{task}-{method}-s{seed}"
            cseed = derive_seed("learning", seed, it)
            if (
                method == "grpo"
                or not change
                or change.startswith("weights=")
                or change.startswith("center=")
                or change == "carry"
            ):
                batch = await learning.collect(agent, method, critic, estimator, tasks, cid, it, cseed)
            else:
                batch = await collect_variant(agent, change, critic, estimator, tasks, cid, it, cseed)
            if change.startswith("center="):
                batch = centred(batch, change.split("=")[1])
            stats = batch_stats(task, batch)
            path = workdir / f"{method}-s{seed}.pt"
            out = await asyncio.to_thread(train_iteration, trainer, critic if fit else None, batch, path)
            await asyncio.to_thread(server.reload, path)
            ev = await evaluate(agent, held_out, seed=seed)
            points.append(
                {
                    "version": it + 1,
                    "success": ev.success_rate,
                    "p_gate": p_gate(trainer.model, openings),
                    "transitions": int(batch.stats["transitions"]),
                    "approx_kl": round(out["train"]["final_kl"], 4),
                    "steps": out["train"]["steps"],
                    "critic_mse": round(out["critic"].get("mse", float("nan")), 4),
                    "wall_s": round(time.perf_counter() - t0, 1),
                    **stats,
                }
            )
    finally:
        await agent.policy.aclose()
    return {"task": task, "variant": variant, "seed": seed, "points": points}


async def main_async(args: argparse.Namespace) -> None:
    from focus.backends import LocalModelServer

    out = Path(args.out)
    with tempfile.TemporaryDirectory(prefix="focus-probe-") as tmp, LocalModelServer() as server:
        for seed in args.seeds:
            for variant in args.variants:
                r = await probe(
                    args.task, variant, seed, args.iterations, args.n_tasks, args.eval_tasks, server, Path(tmp)
                )
                with out.open("a") as f:
                    f.write(json.dumps(r) + "\n")
                for p in r["points"][1:]:
                    keys = ("success", "p_gate", "approx_kl", "decisive_token_share", "signal", "decisive_good_mean",
                            "decisive_bad_mean", "other_mean", "other_rms", "invalid_turn_share", "wall_s")  # fmt: skip
                    print(args.task, variant, seed, p["version"], " ".join(f"{k}={p[k]}" for k in keys), flush=True)
                print(
                    args.task,
                    variant,
                    seed,
                    0,
                    f"success={r['points'][0]['success']} p_gate={r['points'][0]['p_gate']}",
                )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # its readings (decisive turn, good action) know the constant-rule tasks only, not the cued ones
    ap.add_argument(
        "--task", default="corridor-early", choices=[t for t in learning.DOMAINS if not t.startswith("cued-")]
    )
    ap.add_argument("--variants", nargs="+", default=["focus", "grpo"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--iterations", type=int, default=1)
    ap.add_argument("--n-tasks", type=int, default=learning.DEFAULT_SIZES.tasks)
    ap.add_argument("--eval-tasks", type=int, default=100)
    ap.add_argument("--out", default="runs/probe.jsonl")
    args = ap.parse_args(argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
