"""Can the tiny model learn a cued task's mapping at the record's update size from perfect data?

A ceiling for issue 32's cued tasks: if the record's trainer cannot teach the mapping
from the range named at a decisive step to a digit in it even from oracle batches,
no batch (FOCUS's or GRPO's) will within the record's three or six updates.

Each update trains on a batch of *oracle* rollouts: an in-process policy
(:class:`OraclePolicy`) says, at each decisive step (a cued corridor's gate, every
plank of the cued bridge), a right digit (in the range named at the gate; neither the
named digit nor 8, 9 on a plank) or, with probability ``wrong``, a wrong one (any
other digit), and a random digit 1-9 at the corridor's other steps. Its log-probs are
the current model's, so the batch is on-policy as far as the trainer can tell (ratio
1, KL 0 before the step). The batch holds ``TASKS x ROLLOUTS`` rollouts (``--shape``;
8x8 is the record's GRPO batch: 8 tasks, 8 rollouts each, the same transitions);
credit (``--credit``): ``trajectory``, GRPO's group-normalised return on every token
of a rollout (right rollouts positive, wrong negative: the record's estimator on
perfect data), or ``decisive``, +1 on a right and -1 on a wrong decisive turn and 0 on
every other turn (perfect credit assignment). The update is the record's
(``benchmarks.learning.TRAINER``: ``sgd`` to a KL of 0.2 per update), the held-out
tasks and evaluation the record's (50 tasks, one plain rollout each by the model
server). The answer: held-out success per update, and the first update at which it
passes ``--goal`` (0.8), against the record's 3 (and 6) updates.

``--supervised STEPS`` is not RL: plain supervised Adam steps on the gate's mapping
(:func:`supervised_gate`), to ask how many gradient steps this policy needs before the
mapping forms at all (docs/findings/learning-steps.md, "Ceilings of the cued tasks").

    .venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-early --seeds 0 1 2 --updates 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks import learning
from benchmarks.learning_cues import CUED, decisive, first_digit, judged
from focus.agent import derive_seed
from focus.policy import Completion, Policy, SamplingParams


class OraclePolicy(Policy):
    """Says a right digit at a decisive step (a wrong one with probability ``wrong``),
    a random digit 1-9 elsewhere; log-probs from ``model``, the weights being trained."""

    def __init__(self, model: Any, task: str, wrong: float) -> None:
        from focus.format import ByteCodec

        self.model, self.task, self.wrong = model, task, wrong
        self.codec = ByteCodec()
        self.vocab_size = ByteCodec.vocab_size
        self.calls = 0

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.calls += 1
        seed = params.seed if params.seed is not None else self.calls
        rng = random.Random(derive_seed("oracle", seed, len(prompt_ids), sum(prompt_ids)))
        cue = decisive(self.task, self.codec.decode(prompt_ids))
        if cue is None:
            digit = rng.randint(1, 9)
        else:
            right = rng.random() >= self.wrong
            digit = rng.choice([d for d in range(1, 10) if judged(self.task, cue, d)[0] == right])
        ids = [ord(str(digit)), self.codec.EOT]
        return Completion(tuple(ids), tuple(self.logprobs(list(prompt_ids), ids)), "stop")

    def logprobs(self, prompt: list[int], ids: list[int]) -> list[float]:
        import torch

        self.model.eval()
        with torch.no_grad():
            logits, _ = self.model(torch.tensor([prompt + ids[:-1]]))
            logp = torch.log_softmax(logits[0].float(), dim=-1)
        return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(ids)]


def gate_probabilities(model: Any, task: str, openings: list[list[int]], codec: Any) -> dict[str, float] | None:
    """On cued-corridor-early (its gate is the opening): the policy's mean probability
    over the held-out openings that its first token is a digit in the range named
    (``p_right``), in the other block (``p_other``), or 7-9 (``p_789``); no sampling."""
    import torch

    if task != "cued-corridor-early":
        return None
    sums = {"p_right": 0.0, "p_other": 0.0, "p_789": 0.0}
    model.eval()
    with torch.no_grad():
        for ids in openings:
            cue = decisive(task, codec.decode(ids))
            assert cue is not None
            probs = torch.softmax(model(torch.tensor([ids]))[0][0, -1].float(), dim=-1)
            for d in range(1, 10):
                key = "p_789" if d >= 7 else ("p_right" if judged(task, cue, d)[0] else "p_other")
                sums[key] += float(probs[ord(str(d))])
    return {k: round(v / len(openings), 4) for k, v in sums.items()}


def decisive_credit(task: str, batch: Any) -> Any:
    """``batch`` with +1 on every right and -1 on every wrong decisive turn, 0 elsewhere."""
    from focus.batch import Batch
    from focus.format import ByteCodec

    codec = ByteCodec()
    rows = []
    for r in batch.actor:
        digit = first_digit(codec.decode(r.completion_ids))
        cue = decisive(task, codec.decode(r.prompt_ids)) if digit is not None else None
        adv = 0.0 if cue is None or digit is None else (1.0 if judged(task, cue, digit)[0] else -1.0)
        rows.append(replace(r, advantage=adv))
    return Batch(batch.collection_id, batch.iteration, rows, batch.critic, batch.stats)


async def oracle_batch(agent: Any, task: str, tasks: list[Any], rollouts: int, credit: str, cid: str, it: int,
                       seed: int) -> Any:  # fmt: skip
    """One batch of oracle rollouts, ``rollouts`` per task, with the credit asked for."""
    from focus.collector import Collector
    from focus.critic import ConstantCritic
    from focus.estimation import GroupNormalized
    from focus.execution import Execution
    from focus.priority import Phase, Selective

    c = Collector(
        agent, search=Selective(phases=(Phase("evidence", rollouts_per_task=rollouts),)),
        critic=ConstantCritic(0.0), estimator=GroupNormalized(), execution=Execution(max_concurrency=32),
        collection_id=cid, iteration=it, seed=seed,
    )  # fmt: skip
    batch = c.prepare(await c.search(tasks))
    return decisive_credit(task, batch) if credit == "decisive" else batch


async def ceiling_run(task: str, seed: int, shape: tuple[int, int], credit: str, updates: int, wrong: float,
                      eval_tasks: int, server: Any, workdir: Path, given: dict[str, Any],
                      weights: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """One seed: evaluate v0, then ``updates`` x (oracle batch, the record's update, reload, evaluate),
    from ``weights`` (None: the committed weights; ``--start``)."""
    from focus.agent import Agent
    from focus.tinylm.model import DEFAULT_WEIGHTS
    from focus.train_local import PolicyTrainer, UpdateConfig, evaluate, train_iteration

    await asyncio.to_thread(server.reload, weights or DEFAULT_WEIGHTS)
    domain = learning.DOMAINS[task]()
    options = learning.task_trainer(task, learning.TRAINER, given)
    trainer = PolicyTrainer(weights, UpdateConfig(seed=seed, **options))
    agent = domain.make_agent(server.url)
    oracle = Agent(OraclePolicy(trainer.model, task, wrong), agent.env, agent.format, max_steps=agent.max_steps,
                   sampling=agent.sampling)  # fmt: skip
    held_out = domain.tasks(eval_tasks, 10_000 + seed)
    n_tasks, rollouts = shape
    openings = [list((await agent.start(t)).context.prompt_ids) for t in held_out]

    def probs() -> dict[str, float]:
        return gate_probabilities(trainer.model, task, openings, oracle.policy.codec) or {}  # type: ignore[attr-defined]

    points = [{"version": 0, "success": (await evaluate(agent, held_out, seed=seed)).success_rate, **probs()}]
    try:
        for it in range(updates):
            tasks = domain.tasks(n_tasks, derive_seed("tasks", seed, it))
            batch = await oracle_batch(oracle, task, tasks, rollouts, credit, f"ceiling-{task}-s{seed}", it,
                                       derive_seed("learning", seed, it))  # fmt: skip
            out = await asyncio.to_thread(train_iteration, trainer, None, batch, workdir / f"ceiling-s{seed}.pt")
            await asyncio.to_thread(server.reload, workdir / f"ceiling-s{seed}.pt")
            ev = await evaluate(agent, held_out, seed=seed)
            points.append({"version": it + 1, "success": ev.success_rate,
                           "transitions": int(batch.stats["transitions"]),
                           "approx_kl": round(out["train"]["final_kl"], 4), "tokens": out["train"]["tokens"],
                           **probs()})  # fmt: skip
    finally:
        await agent.policy.aclose()
    return {"task": task, "seed": seed, "shape": f"{n_tasks}x{rollouts}", "credit": credit, "wrong": wrong,
            "given": given, "start": "default" if weights is None else str(weights), "points": points}  # fmt: skip


def supervised_gate(task: str, seed: int, steps: int, lr: float, n_train: int, eval_tasks: int, scratch: bool,
                    every: int) -> dict[str, Any]:  # fmt: skip
    """Not RL: plain supervised Adam steps (16 gate openings each, drawn from ``n_train``
    training tasks) on the log of the probability of the range named at the gate, from the
    default weights (or a fresh init, ``scratch``). How many gradient steps the policy needs
    before the mapping forms at all, which the RL updates above never come near; the
    held-out gate probabilities every ``every`` steps. Cued-corridor-early only (its gate
    is the opening)."""
    import torch

    from focus.format import ByteCodec
    from focus.tinylm.model import TinyLM, load

    torch.set_num_threads(1)  # reproducible, and one core left to other work
    if task != "cued-corridor-early":
        raise SystemExit(f"--supervised: only cued-corridor-early has its gate at the opening, not {task!r}")
    codec, domain = ByteCodec(), learning.DOMAINS[task]()
    agent = domain.make_agent("http://127.0.0.1:9")  # only renders openings; never called

    async def openings(tasks: list[Any]) -> list[list[int]]:
        return [list((await agent.start(t)).context.prompt_ids) for t in tasks]

    held = asyncio.run(openings(domain.tasks(eval_tasks, 10_000 + seed)))
    train = asyncio.run(openings(domain.tasks(n_train, derive_seed("supervised", seed))))
    right = []
    for ids in train:
        cue = decisive(task, codec.decode(ids))
        assert cue is not None
        right.append([ord(str(d)) for d in range(1, 10) if judged(task, cue, d)[0]])
    torch.manual_seed(seed)
    model = TinyLM() if scratch else load()
    opt, rng = torch.optim.Adam(model.parameters(), lr=lr), random.Random(seed)
    points = [{"step": 0, **(gate_probabilities(model, task, held, codec) or {})}]
    for step in range(1, steps + 1):
        model.train()
        opt.zero_grad()
        picks = [rng.randrange(len(train)) for _ in range(16)]
        loss = sum(-torch.logsumexp(torch.log_softmax(model(torch.tensor([train[i]]))[0][0, -1].float(), -1)[right[i]], 0)
                   for i in picks) / len(picks)  # fmt: skip
        loss.backward()  # type: ignore[union-attr]
        opt.step()
        if step % every == 0 or step == steps:
            probs = gate_probabilities(model, task, held, codec) or {}
            points.append({"step": step, "loss": round(float(loss.detach()), 4), **probs})
    return {"task": task, "seed": seed, "supervised": {"steps": steps, "lr": lr, "train_tasks": n_train,
            "scratch": scratch}, "points": points}  # fmt: skip


def reached(run: dict[str, Any], goal: float) -> int | None:
    """The first update whose held-out success is at least ``goal`` (None: none did)."""
    return next((p["version"] for p in run["points"][1:] if p["success"] >= goal), None)


def _credit(run: dict[str, Any]) -> str:
    """The run's credit, with the trainer options it changed (``--set``)."""
    start = "" if run.get("start", "default") == "default" else " start=pretrained"
    return run["credit"] + "".join(f" {k}={v}" for k, v in sorted(run.get("given", {}).items())) + start


def table(runs: Sequence[dict[str, Any]], goal: float) -> str:
    """Per (task, shape, credit): mean held-out success per version, and per seed the
    first update at ``goal``."""
    runs = [r for r in runs if "supervised" not in r]
    if not runs:
        return ""
    keys = list(dict.fromkeys((r["task"], r["shape"], _credit(r)) for r in runs))
    n = max(len(r["points"]) for r in runs)
    lines = ["| task | shape | credit | seeds | " + " | ".join(f"v{v}" for v in range(n)) + f" | first update >= {goal} |",
             "|" + " --- |" * (n + 5)]  # fmt: skip
    for task, shape, credit in keys:
        sel = [r for r in runs if (r["task"], r["shape"], _credit(r)) == (task, shape, credit)]
        got = [[r["points"][v]["success"] for r in sel if len(r["points"]) > v] for v in range(n)]
        means = [f"{statistics.mean(g):.3f}" if g else "" for g in got]
        first = ", ".join(str(reached(r, goal) or "-") for r in sel)
        lines.append(f"| {task} | {shape} | {credit} | {len(sel)} | " + " | ".join(means) + f" | {first} |")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> None:
    from focus.backends import LocalModelServer

    shape = tuple(int(x) for x in args.shape.split("x"))
    from benchmarks.learning_start import start_weights

    given = learning.given_options(args)
    weights = start_weights(args.start)
    with tempfile.TemporaryDirectory(prefix="focus-ceiling-") as tmp, LocalModelServer() as server:
        for seed in args.seeds:
            for credit in args.credit:
                run = await ceiling_run(args.task, seed, (shape[0], shape[1]), credit, args.updates, args.wrong,
                                        args.eval_tasks, server, Path(tmp), given, weights)  # fmt: skip
                with args.out.open("a") as f:
                    f.write(json.dumps(run) + "\n")
                curve = " ".join(f"{p['success']:.2f}" for p in run["points"])
                kl = " ".join(f"{p['approx_kl']:.3f}" for p in run["points"][1:])
                if "p_right" in run["points"][0]:
                    kl += "; p_right/p_other/p_789 " + " ".join(
                        f"{p['p_right']:.2f}/{p['p_other']:.2f}/{p['p_789']:.2f}" for p in run["points"]
                    )
                print(
                    f"{args.task} {args.shape} {credit} {given} start {args.start} s{seed}: {curve}; KL {kl}",
                    flush=True,
                )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=CUED, default="cued-corridor-early")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--shape", default="8x8", help="TASKSxROLLOUTS per batch (8x8: the record's GRPO batch)")
    ap.add_argument("--credit", nargs="+", choices=["trajectory", "decisive"], default=["trajectory", "decisive"])
    ap.add_argument("--updates", type=int, default=8)
    ap.add_argument("--wrong", type=float, default=0.5, help="share of wrong digits at a decisive step")
    ap.add_argument("--eval-tasks", type=int, default=learning.DEFAULT_SIZES.eval_tasks)
    ap.add_argument("--goal", type=float, default=0.8)
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="a trainer option (UpdateConfig)")
    ap.add_argument("--out", type=Path, default=Path("runs/ceiling.jsonl"))
    ap.add_argument("--report", action="store_true", help="print the table of --out; run nothing")
    ap.add_argument("--start", choices=["default", "pretrained"], default="default",
                    help="the starting policy: the committed weights, or those with the cue lookup (learning_start)")  # fmt: skip
    ap.add_argument(
        "--supervised",
        type=int,
        default=0,
        metavar="STEPS",
        help="not RL: this many supervised Adam steps on the gate's mapping (cued-corridor-early)",
    )
    ap.add_argument("--supervised-lr", type=float, default=3e-3)
    ap.add_argument("--train-tasks", type=int, default=64, help="--supervised: distinct training openings")
    ap.add_argument("--scratch", action="store_true", help="--supervised: from a fresh init, not the default weights")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.supervised and not args.report:
        for seed in args.seeds:
            run = supervised_gate(args.task, seed, args.supervised, args.supervised_lr, args.train_tasks,
                                  args.eval_tasks, args.scratch, max(1, args.supervised // 10))  # fmt: skip
            with args.out.open("a") as f:
                f.write(json.dumps(run) + "\n")
            print(f"{args.task} supervised {run['supervised']} s{seed}: step loss p_right/p_other/p_789 " + " ".join(
                f"{p['step']}:{p.get('loss', '-')}:{p['p_right']:.2f}/{p['p_other']:.2f}/{p['p_789']:.2f}"
                for p in run["points"]), flush=True)  # fmt: skip
        return
    if not args.report:
        asyncio.run(main_async(args))
    print(table([json.loads(x) for x in args.out.read_text().splitlines() if x.strip()], args.goal))


if __name__ == "__main__":
    main()
