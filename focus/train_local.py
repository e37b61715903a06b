"""The local trainer: updates the embedded tiny model from an exported batch, on CPU.

It closes the loop of the embedded default (collect -> export -> train -> reload ->
collect) without any service. The actor update is an importance-weighted policy
gradient with PPO's clipped ratio, over the batch's exact tokens:

    ratio_t = exp(log pi_theta(y_t | y_<t) - log mu(y_t | y_<t))
    loss    = - sum_t mask_t * min(ratio_t * A_t, clip(ratio_t, 1-eps, 1+eps) * A_t) / sum_t mask_t

where ``mu`` is the behaviour log-prob recorded at sampling time and ``A_t`` the
segment advantage (``focus.estimation``) carried by each generated token. The
sequences come from :func:`focus.exporters.actor_sequences`, the same token
alignment the Tinker and slime exporters use. The critic
(:class:`focus.critic.LocalCritic`) is fitted on the batch's critic table.

:func:`run_loop` is the whole loop against a running
:class:`focus.backends.LocalModelServer`: evaluate, collect with the FOCUS collector,
write and read back the batch (through the store it is given), train, save the weights, reload
them into the server (``/update_weights_from_disk``), repeat. Torch is imported
lazily, so importing this module stays light.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field

from focus.batch import Batch
from focus.exporters import TokenSequence, actor_sequences

if TYPE_CHECKING:
    import torch

    from focus.agent import Agent
    from focus.backends.local import LocalModelServer
    from focus.critic import Critic
    from focus.env import Task


class TrainConfig(BaseModel):
    """Hyper-parameters of one policy update (several epochs over one batch)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    lr: float = Field(1e-3, gt=0.0)
    epochs: int = Field(1, ge=1)
    minibatch: int = Field(32, ge=1)
    clip: float = Field(0.2, gt=0.0)
    max_grad_norm: float = Field(1.0, gt=0.0)
    #: Sampling temperature the batch was collected at; the new log-probs use it too,
    #: so that the ratio compares the same distributions (top-p must be 1).
    temperature: float = Field(1.0, gt=0.0)
    #: Scale advantages to unit standard deviation over the batch (their mean is kept:
    #: TD advantages already have a baseline).
    scale_advantages: bool = True
    weight_decay: float = Field(0.0, ge=0.0)
    #: Torch threads during an update. One is fastest on a 2-core machine that also
    #: runs the model server (measured: 2 threads were 11x slower, benchmarks/README.md).
    torch_threads: int = Field(1, ge=1)
    #: Train prefix-sharing sequences in one forward pass (see :func:`pack_prefixes`).
    pack: bool = True
    seed: int = 0


@dataclass(frozen=True)
class TrainStats:
    """What one update did; ``ratio`` and ``clip_fraction`` are over trained tokens."""

    sequences: int
    tokens: int
    steps: int
    loss: float
    ratio: float
    clip_fraction: float
    approx_kl: float
    advantage_mean: float
    advantage_std: float
    wall_s: float


@dataclass(frozen=True)
class Padded:
    """Sequences as padded tensors aligned for next-token prediction."""

    inputs: torch.Tensor  # (B, T) ids fed to the model: tokens[:-1]
    targets: torch.Tensor  # (B, T) ids predicted: tokens[1:]
    old_logprobs: torch.Tensor  # (B, T) behaviour log-probs of targets
    advantages: torch.Tensor  # (B, T)
    mask: torch.Tensor  # (B, T) 1.0 on trained tokens


@dataclass(frozen=True)
class Packed:
    """Per-token arrays like :class:`TokenSequence`'s, possibly from several sequences."""

    tokens: tuple[int, ...]
    logprobs: tuple[float, ...]
    advantages: tuple[float, ...]
    mask: tuple[int, ...]


def pack_prefixes(seqs: Sequence[TokenSequence | Packed]) -> list[Packed]:
    """Merge each sequence into a longer one that starts with the same tokens (pure).

    In a tree, a segment's sequence is usually a prefix of its child segments' prompts.
    A causal model gives the same log-probs at a position whatever follows it, so one
    forward pass over the longer sequence serves both: the shorter one's trained
    tokens are marked in the longer one's (untrained) prompt part. Sequences whose
    trained positions would collide stay apart. Cuts the training compute by about the
    number of segments per rollout.
    """
    carriers: list[dict[str, list[Any]]] = []
    for s in sorted(seqs, key=lambda q: len(q.tokens), reverse=True):
        trained = [i for i, m in enumerate(s.mask) if m]
        n = len(s.tokens)
        home = None
        for c in carriers:
            if len(c["tokens"]) >= n and tuple(c["tokens"][:n]) == s.tokens and not any(c["mask"][i] for i in trained):
                home = c
                break
        if home is None:
            carriers.append(
                {
                    "tokens": list(s.tokens),
                    "logprobs": list(s.logprobs),
                    "advantages": list(s.advantages),
                    "mask": list(s.mask),
                }
            )
            continue
        for i in trained:
            home["logprobs"][i], home["advantages"][i], home["mask"][i] = s.logprobs[i], s.advantages[i], s.mask[i]
    return [
        Packed(tuple(c["tokens"]), tuple(c["logprobs"]), tuple(c["advantages"]), tuple(c["mask"])) for c in carriers
    ]


def pad_sequences(seqs: Sequence[TokenSequence | Packed], pad_id: int) -> Padded:
    """Shift and pad ``seqs`` (pure; no model). Sequences shorter than 2 tokens are refused."""
    import torch

    if not seqs:
        raise ValueError("no sequences to pad")
    short = [i for i, s in enumerate(seqs) if len(s.tokens) < 2]
    if short:
        raise ValueError(f"sequences {short[:5]} have fewer than 2 tokens: nothing to predict")
    n = max(len(s.tokens) for s in seqs) - 1
    b = len(seqs)
    inputs = torch.full((b, n), pad_id, dtype=torch.long)
    targets = torch.full((b, n), pad_id, dtype=torch.long)
    old = torch.zeros((b, n), dtype=torch.float32)
    adv = torch.zeros((b, n), dtype=torch.float32)
    mask = torch.zeros((b, n), dtype=torch.float32)
    for i, s in enumerate(seqs):
        k = len(s.tokens) - 1
        inputs[i, :k] = torch.tensor(s.tokens[:-1])
        targets[i, :k] = torch.tensor(s.tokens[1:])
        old[i, :k] = torch.tensor(s.logprobs[1:], dtype=torch.float32)
        adv[i, :k] = torch.tensor(s.advantages[1:], dtype=torch.float32)
        mask[i, :k] = torch.tensor(s.mask[1:], dtype=torch.float32)
    return Padded(inputs, targets, old, adv, mask)


def clipped_loss(
    new_logprobs: torch.Tensor, p: Padded, clip: float, advantages: torch.Tensor | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped importance-weighted objective (negated: a loss), mean over trained tokens."""
    import torch

    adv = p.advantages if advantages is None else advantages
    m = p.mask
    denom = m.sum().clamp_min(1.0)
    log_ratio = (new_logprobs - p.old_logprobs) * m
    ratio = torch.exp(log_ratio)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * adv
    loss = -(torch.minimum(unclipped, clipped) * m).sum() / denom
    with torch.no_grad():
        stats = {
            "ratio": float((ratio * m).sum() / denom),
            "clip_fraction": float((((ratio - 1.0).abs() > clip).float() * m).sum() / denom),
            # k3 estimator of KL(mu || pi): unbiased and non-negative
            "approx_kl": float((((ratio - 1.0) - log_ratio) * m).sum() / denom),
        }
    return loss, stats


def token_logprobs(model: Any, inputs: torch.Tensor, targets: torch.Tensor, temperature: float) -> torch.Tensor:
    """Log-probs of ``targets`` under ``model`` at ``temperature`` (teacher forcing)."""
    import torch

    logits, _ = model(inputs)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)


class PolicyTrainer:
    """Holds the tiny model and its optimizer across iterations.

    ``weights``: the file to start from (default: the committed initial weights).
    """

    def __init__(self, weights: str | os.PathLike[str] | None = None, config: TrainConfig | None = None) -> None:
        import torch

        from focus.format import ByteCodec
        from focus.tinylm.model import load

        self.config = config or TrainConfig()
        torch.manual_seed(self.config.seed)
        self.model = load(weights)
        self.pad_id = ByteCodec.PAD
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        self._rng = random.Random(self.config.seed)
        self.updates = 0

    def update(self, batch: Batch) -> TrainStats:
        """Several epochs of clipped policy gradient over the batch's actor sequences."""
        import torch

        cfg = self.config
        t0 = time.perf_counter()
        raw = actor_sequences(batch)
        if not raw:
            raise ValueError(
                f"batch {batch.collection_id!r} iteration {batch.iteration} has no trainable actor sequences"
            )
        seqs: Sequence[TokenSequence | Packed] = pack_prefixes(raw) if cfg.pack else raw
        trained = [a for s in seqs for a, m in zip(s.advantages, s.mask, strict=True) if m]
        mean = sum(trained) / len(trained)
        std = math.sqrt(sum((a - mean) ** 2 for a in trained) / len(trained))
        scale = 1.0 / std if cfg.scale_advantages and std > 1e-8 else 1.0
        # denormal floats (Adam's second moments decay into them) slow CPU kernels badly
        threads = torch.get_num_threads()
        torch.set_flush_denormal(True)
        torch.set_num_threads(cfg.torch_threads)
        try:
            losses, agg, steps = self._epochs(seqs, scale)
        finally:
            torch.set_num_threads(threads)
            torch.set_flush_denormal(False)
        self.updates += 1
        return TrainStats(
            sequences=len(raw),
            tokens=len(trained),
            steps=steps,
            loss=sum(losses) / len(losses),
            ratio=agg["ratio"] / steps,
            clip_fraction=agg["clip_fraction"] / steps,
            approx_kl=agg["approx_kl"] / steps,
            advantage_mean=mean,
            advantage_std=std,
            wall_s=time.perf_counter() - t0,
        )

    def _epochs(
        self, seqs: Sequence[TokenSequence | Packed], scale: float
    ) -> tuple[list[float], dict[str, float], int]:
        import torch

        cfg = self.config
        self.model.train()
        losses: list[float] = []
        agg = {"ratio": 0.0, "clip_fraction": 0.0, "approx_kl": 0.0}
        steps = 0
        # Minibatches of similar lengths (less padding: the forward pass is the cost on
        # CPU), visited in a fresh random order each epoch.
        by_len = sorted(range(len(seqs)), key=lambda i: len(seqs[i].tokens))
        chunks = [by_len[i : i + cfg.minibatch] for i in range(0, len(by_len), cfg.minibatch)]
        for _ in range(cfg.epochs):
            self._rng.shuffle(chunks)
            for idx in chunks:
                chunk = [seqs[i] for i in idx]
                p = pad_sequences(chunk, self.pad_id)
                new = token_logprobs(self.model, p.inputs, p.targets, cfg.temperature)
                loss, stats = clipped_loss(new, p, cfg.clip, p.advantages * scale)
                self.optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                losses.append(float(loss.detach()))
                for k in agg:
                    agg[k] += stats[k]
                steps += 1
        self.model.eval()
        return losses, agg, steps

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the weights (the tiny model's format); returns their policy version."""
        from focus.tinylm.model import load, save

        version = save(self.model, path)
        # The file holds fp16 weights; train on from exactly what the server will serve,
        # so the next batch's behaviour log-probs match this model's at ratio 1.
        self.model.load_state_dict(load(path).state_dict())
        return version


def fit_critic(critic: Critic, batch: Batch) -> dict[str, Any]:
    """Fit a trainable critic (``LocalCritic``) on the batch's critic rows.

    Critics without a ``fit`` method (constant, remote services) are left as they are.
    """
    fit = getattr(critic, "fit", None)
    rows = [r for r in batch.critic if r.weight > 0 and r.context_ids]
    if fit is None or not rows:
        return {"fitted": False, "rows": len(rows)}
    t0 = time.perf_counter()
    mse = fit(rows)
    return {"fitted": True, "rows": len(rows), "mse": float(mse), "wall_s": time.perf_counter() - t0}


# --- the loop ---------------------------------------------------------------------------------


class LoopConfig(BaseModel):
    """One run of collect -> train -> reload on the toy task."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    iterations: int = Field(6, ge=1)
    seed: int = 0
    tasks_per_iteration: int = Field(32, ge=1)
    eval_tasks: int = Field(128, ge=1)
    rollouts_per_task: int = Field(4, ge=1)
    transitions: int = Field(96, ge=0)
    wave_size: int = Field(32, ge=1)
    max_branches: int = Field(3, ge=1)
    max_steps: int = Field(12, ge=1)
    max_concurrency: int = Field(32, ge=1)
    critic: str = Field("local", pattern="^(local|constant)$")
    train: TrainConfig = TrainConfig()
    store: str = "runs/train_local"
    collection_id: str = "train-local"


@dataclass(frozen=True)
class IterationRecord:
    """One row of the loop's table. ``success_rate`` is measured before the update."""

    iteration: int
    policy_version: str
    success_rate: float
    batch_url: str | None
    actor_rows: int
    transitions: int
    train: dict[str, Any] | None
    critic: dict[str, Any] | None
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def toy_agent(url: str, max_steps: int = 12, temperature: float = 1.0) -> Agent:
    from focus.agent import Agent
    from focus.backends import OpenAICompatPolicy
    from focus.format import ByteCodec
    from focus.policy import SamplingParams
    from focus.toy import ReachTarget, toy_format

    policy = OpenAICompatPolicy(url, vocab_size=ByteCodec.vocab_size)
    return Agent(
        policy,
        ReachTarget(),
        toy_format(),
        max_steps=max_steps,
        sampling=SamplingParams(max_tokens=4, temperature=temperature),
    )


async def success_rate(agent: Agent, tasks: Sequence[Task], seed: int, max_concurrency: int = 32) -> float:
    """Share of ``tasks`` solved by one plain rollout each (same seeds every call, so
    evaluations of different weights differ by the weights, not by the dice)."""
    from focus.agent import derive_seed

    sem = asyncio.Semaphore(max_concurrency)

    async def one(i: int, task: Task) -> bool:
        async with sem:
            rollout = await agent.rollout(await agent.start(task), derive_seed("eval", seed, i))
        return any(t.reward > 0 for t in rollout.turns)

    results = await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks)))
    return sum(results) / len(results)


def make_critic(kind: str, seed: int) -> Critic:
    from focus.critic import ConstantCritic

    if kind == "constant":
        return ConstantCritic(0.3)
    from focus.critic import LocalCritic

    critic: Critic = LocalCritic(seed=seed)
    return critic


async def run_loop(
    config: LoopConfig,
    server: LocalModelServer,
    workdir: str | os.PathLike[str],
    store: Any,
    *,
    on_iteration: Callable[[IterationRecord], None] | None = None,
) -> list[IterationRecord]:
    """``config.iterations`` rounds of evaluate -> collect -> export -> train -> reload,
    then a final evaluation (its record has no batch). Returns one record per round.

    ``store`` writes and reads back each batch (a ``storage.BatchStore``: the pipeline's
    store, passed in because the library does not import the pipeline)."""
    from focus.collector import Collector
    from focus.execution import Execution
    from focus.priority import Phase, Selective
    from focus.toy import reach_target_tasks

    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    trainer = PolicyTrainer(server.weights, config.train)
    critic = make_critic(config.critic, config.seed)
    eval_tasks = reach_target_tasks(config.eval_tasks, seed=10_000 + config.seed)
    search = Selective(
        phases=(
            Phase("evidence", rollouts_per_task=config.rollouts_per_task),
            Phase(
                "continue",
                transitions=config.transitions,
                wave_size=config.wave_size,
                max_branches=config.max_branches,
            ),
        )
    )
    records: list[IterationRecord] = []
    for it in range(config.iterations + 1):
        t0 = time.perf_counter()
        agent = toy_agent(server.url, config.max_steps, config.train.temperature)
        try:
            rate = await success_rate(agent, eval_tasks, config.seed, config.max_concurrency)
            version = server.policy_version
            if it == config.iterations:
                records.append(IterationRecord(it, version, rate, None, 0, 0, None, None, time.perf_counter() - t0))
                if on_iteration:
                    on_iteration(records[-1])
                break
            collector = Collector(
                agent,
                search=search,
                critic=critic,
                execution=Execution(max_concurrency=config.max_concurrency),
                collection_id=config.collection_id,
                iteration=it,
                seed=config.seed * 1000 + it,
            )
            batch = await collector.collect(
                reach_target_tasks(config.tasks_per_iteration, seed=config.seed * 1000 + it)
            )
        finally:
            await agent.policy.aclose()
        url = store.write(batch, overwrite=True)
        stored = store.read(url)  # train on what was exported, exactly as a remote trainer would
        stats = trainer.update(stored)
        critic_info = fit_critic(critic, stored)
        weights = workdir / f"policy-{it + 1:04d}.pt"
        trainer.save(weights)
        await asyncio.to_thread(server.reload, weights)
        rec = IterationRecord(
            it,
            version,
            rate,
            url,
            len(stored.actor),
            int(stored.stats.get("transitions", 0)),
            asdict(stats),
            critic_info,
            time.perf_counter() - t0,
        )
        records.append(rec)
        if on_iteration:
            on_iteration(rec)
    return records
