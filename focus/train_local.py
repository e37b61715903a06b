"""The local trainer: updates the embedded tiny model from an exported batch, on CPU.

It is the shipped trainer of the embedded default: the ``train_loop`` flow
(``focus train``, ``flows/train_loop.py``) runs collect -> train -> publish weights ->
collect with it, through the trainer step ``tasks.trainers:local_trainer``. The actor
update is an importance-weighted policy gradient with PPO's clipped ratio, over the
batch's exact tokens:

    ratio_t = exp(log pi_theta(y_t | y_<t) - log mu(y_t | y_<t))
    loss    = - sum_t mask_t * min(ratio_t * A_t, clip(ratio_t, 1-eps, 1+eps) * A_t) / sum_t mask_t

where ``mu`` is the behaviour log-prob recorded at sampling time and ``A_t`` the
segment advantage (``focus.estimation``) carried by each generated token. The
sequences come from :func:`focus.exporters.actor_sequences`, the same token
alignment the Tinker and slime exporters use. The critic
(:class:`focus.critic.LocalCritic`) is fitted on the batch's critic table
(:func:`fit_critic`); :func:`train_iteration` does both and writes the new weights.

An update is deterministic: one torch thread, minibatch order drawn from
``(seed, update index)``, and the optimizer state saved and restored with the
weights (:meth:`PolicyTrainer.state_bytes`), so a loop resumed from its last saved
version computes the same weights as one that never stopped. Torch is imported
lazily, so importing this module stays light.
"""

from __future__ import annotations

import io
import math
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from focus.batch import Batch
from focus.export_sequences import nothing_to_learn as nothing_to_learn  # re-exported: the trainers' common test
from focus.export_sequences import trainable_sequences
from focus.exporters import TokenSequence as TokenSequence  # re-exported: callers import them here
from focus.kl_bound import MAX_HALVINGS as MAX_HALVINGS  # re-exported: callers import them here
from focus.kl_bound import kl_reached, kl_verdict
from focus.kl_step import TOLERANCE as KL_TOLERANCE
from focus.kl_step import kl_step
from focus.local_eval import Evaluation as Evaluation  # re-exported: callers import them here
from focus.local_eval import evaluate as evaluate
from focus.local_eval import toy_agent as toy_agent
from focus.packing import Packed as Packed
from focus.packing import Padded as Padded
from focus.packing import Trainable, TreePacked, pack_sequences, pack_trees, pad_sequences, padded_logprobs
from focus.packing import pack_prefixes as pack_prefixes
from focus.packing import token_logprobs as token_logprobs
from focus.sums import left_sum
from focus.tree_weights import segment_weights as segment_weights
from focus.tree_weights import task_scaled, weighted
from focus.update_config import UpdateConfig as UpdateConfig  # re-exported: moved there

if TYPE_CHECKING:
    import torch

    from focus.critic import Critic


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
    #: Approximate KL(behaviour || policy) after the update, over every trained token.
    final_kl: float = 0.0
    #: The update stopped at ``target_kl`` before its last epoch.
    stopped_early: bool = False
    #: Approximate KL(behaviour || policy) before the update (``target_kl`` set; else 0):
    #: near 0 when the batch was sampled from this policy.
    initial_kl: float = 0.0
    #: Times an epoch overshot the KL bound and was run again at half the learning rate
    #: (``rule`` ``sgd``/``natural``: line-search probes past the bound).
    kl_halvings: int = 0
    #: Mean gradient norm of the steps, before ``max_grad_norm`` clips it (``adam``;
    #: 0 under the one-step rules): above ``max_grad_norm`` the clip was active.
    grad_norm: float = 0.0


@dataclass(frozen=True)
class UpdateStep:
    """One optimizer step, given to ``on_step`` as it is taken (what a watcher shows).

    ``step`` counts the update's steps so far, this one included; ``total`` is what it
    plans, epochs x minibatches (it may stop at ``target_kl`` before, and undo an epoch
    or run it again: then ``step`` restarts from the steps that stand before it, and
    :attr:`TrainStats.steps` is the count that stands); the rest are the minibatch's.
    """

    step: int
    total: int
    epoch: int
    loss: float
    approx_kl: float
    ratio: float
    clip_fraction: float
    #: The gradient norm before clipping (0 under the one-step rules).
    grad_norm: float = 0.0


class TrainingDiverged(ValueError):
    """An update produced a non-finite loss, gradient or weight. Raised before the step
    that would apply it (a loss or gradient), or by :meth:`PolicyTrainer.save` once the
    fp16 file it wrote reads back non-finite (a weight), so a loop records nothing for
    the iteration (a recorded step is reused forever) and a rerun with a smaller
    learning rate trains the batch again and writes that file anew."""


#: Called once per optimizer step, in the training thread; it must be cheap.
StepHook = Callable[[UpdateStep], None]


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


def training_units(raw: Sequence[TokenSequence], cfg: UpdateConfig) -> list[Trainable]:
    """What an update iterates over (pure): under the one-step rules with ``tree``, the
    pieces of the batch's token trie; otherwise the sequences, prefix-packed unless
    ``pack`` is ``none`` (under ``adam``, ``minibatch`` of them make a step)."""
    if cfg.pack == "tree" and cfg.rule != "adam":
        return pack_sequences(raw, "tree")
    return pack_sequences(raw, "none" if cfg.pack == "none" else "prefixes")


def _check_vocabulary(raw: Sequence[TokenSequence], vocab_size: int) -> None:
    """Refuse a batch holding a token id the embedded model has no embedding for (a batch
    another model sampled), naming the row: the embedding raised a bare IndexError."""
    for s in raw:
        if s.tokens and not 0 <= min(s.tokens) <= max(s.tokens) < vocab_size:
            for r in s.rows:
                bad = next((t for t in r.prompt_ids + r.completion_ids if not 0 <= t < vocab_size), None)
                if bad is not None:
                    raise ValueError(
                        f"actor row (task {r.task_id!r}, edge {r.edge_id}, turn {r.turn_index}) holds the token id "
                        f"{bad}, outside the embedded model's vocabulary of {vocab_size} ids: the local trainer "
                        "trains the embedded byte-level model, and this batch was sampled with another tokenizer"
                    )


def _check_lengths(raw: Sequence[TokenSequence], max_len: int) -> None:
    """Refuse a sequence longer than the embedded model's context, naming its last row: a
    batch sampled from a custom policy or another server (no 4096-token limit) failed
    deep in the forward pass with ``position 5292 exceeds the model's max_len 4096``,
    naming no row and not what to change. The embedded server refuses such prompts, so a
    batch it sampled always fits."""
    for s in raw:
        if len(s.tokens) > max_len:
            r = s.rows[-1]
            raise ValueError(
                f"actor row (task {r.task_id!r}, edge {r.edge_id}, turn {r.turn_index}) ends a sequence of "
                f"{len(s.tokens)} tokens, over the embedded model's context of {max_len}: the local trainer trains "
                f"the embedded model; collect with Agent(max_prompt_tokens=...) so that "
                "a prompt and its completion fit"
            )


class PolicyTrainer:
    """Holds the tiny model and its optimizer across iterations.

    ``weights``: the file to start from (default: the committed initial weights).
    ``state``: bytes from :meth:`state_bytes` of the trainer that wrote ``weights``
    (optimizer moments and update count), to continue exactly where it stopped.
    """

    def __init__(
        self,
        weights: str | os.PathLike[str] | None = None,
        config: UpdateConfig | None = None,
        *,
        state: bytes | None = None,
    ) -> None:
        from focus.extras import require

        require("train", "PolicyTrainer (the local trainer)")
        import torch

        from focus.format import ByteCodec
        from focus.tinylm.model import load

        self.config = config or UpdateConfig()
        torch.manual_seed(self.config.seed)
        self.model = load(weights)
        self.pad_id = ByteCodec.PAD
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=self.config.lr, weight_decay=self.config.weight_decay
        )
        self.updates = 0
        if state is not None:
            self.load_state_bytes(state)

    def state_bytes(self) -> bytes:
        """The optimizer state and update count (the model weights go with :meth:`save`)."""
        import torch

        buf = io.BytesIO()
        torch.save({"optimizer": self.optimizer.state_dict(), "updates": self.updates}, buf)
        return buf.getvalue()

    def load_state_bytes(self, data: bytes) -> None:
        import torch

        try:
            blob = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            self.optimizer.load_state_dict(blob["optimizer"])
            self.updates = int(blob["updates"])
        except Exception as e:  # noqa: BLE001 - torch raises many kinds on bad bytes
            raise ValueError(f"not a PolicyTrainer state: {type(e).__name__}: {e}") from e
        # hyper-parameters are this trainer's, not the saved ones
        for group in self.optimizer.param_groups:
            group["lr"], group["weight_decay"] = self.config.lr, self.config.weight_decay

    def update(self, batch: Batch, on_step: StepHook | None = None) -> TrainStats:
        """Several epochs of clipped policy gradient over the batch's actor sequences
        (``rule`` ``adam``), or one step sized to ``target_kl`` (:mod:`focus.kl_step`);
        ``on_step`` is told of each optimizer step (:class:`UpdateStep`).

        A batch with nothing to learn (:func:`nothing_to_learn`) takes no step under any
        rule (``steps`` 0, weights and optimizer state unchanged): its gradient is 0, but an
        Adam step still moved the weights by the momentum of earlier updates (and by weight
        decay)."""
        import torch

        cfg = self.config
        t0 = time.perf_counter()
        if cfg.scale_advantages == "task":
            batch = task_scaled(batch)
        # NothingToTrain naming why (no actor rows, or none trained), as every exporter refuses it
        w = weighted(batch, cfg.segment_weights) if cfg.segment_weights != "equal" else batch
        raw = trainable_sequences(w, merge_turns=True, skip_unmasked=True)
        _check_vocabulary(raw, self.model.cfg.vocab_size)
        _check_lengths(raw, self.model.cfg.max_len)
        seqs = training_units(raw, cfg)
        trained = [a for s in seqs for a, m in zip(s.advantages, s.mask, strict=True) if m]
        mean = left_sum(trained) / len(trained)
        std = math.sqrt(left_sum((a - mean) ** 2 for a in trained) / len(trained))
        scale = 1.0 / std if cfg.scale_advantages == "batch" and std > 1e-8 else 1.0
        # denormal floats (Adam's second moments decay into them) slow CPU kernels badly
        threads = torch.get_num_threads()
        torch.set_flush_denormal(True)
        torch.set_num_threads(cfg.torch_threads)
        try:
            initial_kl = self._kl(seqs) if cfg.target_kl is not None else 0.0
            taken: list[dict[str, float]] = []
            halvings, stopped_early = 0, False
            if nothing_to_learn(raw):
                pass  # no step: the gradient is 0, but an Adam step moves the weights by its momentum
            elif cfg.rule != "adam":
                taken, halvings = self._kl_steps(seqs, scale, initial_kl)
                if on_step is not None:
                    for i, t in enumerate(taken):
                        on_step(UpdateStep(i + 1, len(taken), 0, **t))
            else:
                rng = random.Random(f"{cfg.seed}/{self.updates}")
                taken, halvings, stopped_early = self._epochs(seqs, scale, rng, initial_kl, on_step)
            final_kl = self._kl(seqs)
        finally:
            self._set_lr(cfg.lr)
            torch.set_num_threads(threads)
            torch.set_flush_denormal(False)
        self.updates += 1
        steps, n = len(taken), max(len(taken), 1)  # n: no step stands when every try overshot
        return TrainStats(
            sequences=len(raw),
            tokens=len(trained),
            steps=steps,
            loss=left_sum(t["loss"] for t in taken) / n,
            ratio=left_sum(t["ratio"] for t in taken) / n if taken else 1.0,
            clip_fraction=left_sum(t["clip_fraction"] for t in taken) / n,
            approx_kl=left_sum(t["approx_kl"] for t in taken) / n,
            advantage_mean=mean,
            advantage_std=std,
            wall_s=time.perf_counter() - t0,
            final_kl=final_kl,
            stopped_early=stopped_early,
            initial_kl=initial_kl,
            kl_halvings=halvings,
            grad_norm=left_sum(t.get("grad_norm", 0.0) for t in taken) / n,
        )

    def _kl_steps(
        self, seqs: Sequence[Trainable], scale: float, initial_kl: float
    ) -> tuple[list[dict[str, float]], int]:
        """The one-step rules' update (:func:`kl_step`): the figures of every step that
        stands, and the probes that overshot. ``cfg.steps`` 1 (default): one step sized to
        ``target_kl``. More: up to that many steps, each along the loss gradient at the
        weights the one before left (ratio and clip against the batch's behaviour
        log-probs, as always) and sized to ``target_kl / steps`` of KL from those weights,
        ending early once the whole batch's KL from the behaviour policy reaches
        ``target_kl`` (within :data:`focus.kl_step.TOLERANCE`). A later step can take back
        part of an earlier one, so the update can land below ``target_kl`` (on GRPO's
        cued-corridor batches 0.12-0.15 at ``steps`` 2: TrainStats.final_kl says where)."""
        cfg = self.config
        by_len = sorted(seqs, key=lambda s: len(s.tokens))  # less padding
        p = [self._pad(by_len[i : i + cfg.minibatch]) for i in range(0, len(seqs), cfg.minibatch)]
        if cfg.steps == 1:
            return kl_step(self.model, p, cfg, self._loss_fn(scale), initial_kl, lambda: self._kl(seqs))
        target = float(cfg.target_kl or 0.0)
        each = cfg.model_copy(update={"target_kl": target / cfg.steps})
        taken: list[dict[str, float]] = []
        halvings = 0
        for _ in range(cfg.steps):
            ref = self._at_current_weights(p)
            got, over = kl_step(self.model, p, each, self._loss_fn(scale), 0.0, partial(self._kl_padded, ref))
            taken += got
            halvings += over
            if not got or self._kl(seqs) - initial_kl >= target * (1 - KL_TOLERANCE):
                break
        return taken, halvings

    def _at_current_weights(self, chunks: Sequence[Padded]) -> list[Padded]:
        """``chunks`` with the current policy's log-probs as their behaviour's (what a
        KL from the weights as they are now is measured against)."""
        import dataclasses

        import torch

        self.model.eval()
        with torch.no_grad():
            t = self.config.temperature or 1.0
            return [dataclasses.replace(c, old_logprobs=padded_logprobs(self.model, c, t).detach()) for c in chunks]

    def _kl_padded(self, chunks: Sequence[Padded]) -> float:
        """The token-mean approximate KL of ``chunks``' behaviour log-probs from the current policy."""
        import torch

        total, tokens = 0.0, 0.0
        self.model.eval()
        with torch.no_grad():
            for c in chunks:
                log_ratio = (padded_logprobs(self.model, c, self.config.temperature or 1.0) - c.old_logprobs) * c.mask
                total += float((((torch.exp(log_ratio) - 1.0) - log_ratio) * c.mask).sum())
                tokens += float(c.mask.sum())
        return total / max(tokens, 1.0)

    def _epochs(
        self,
        seqs: Sequence[Trainable],
        scale: float,
        rng: random.Random,
        initial_kl: float,
        on_step: StepHook | None,
    ) -> tuple[list[dict[str, float]], int, bool]:
        """The update's epochs: the figures of each optimizer step that stands, the
        learning-rate halvings it took (``target_kl``: :func:`kl_verdict` after each epoch),
        and whether ``target_kl`` ended it before its last epoch was done."""
        cfg = self.config
        taken: list[dict[str, float]] = []
        halvings = 0
        # Minibatches of similar lengths (less padding: the forward pass is the cost on
        # CPU), visited in a fresh random order each epoch (the same order when it is run again).
        by_len = sorted(range(len(seqs)), key=lambda i: (len(seqs[i].tokens), seqs[i].tokens))
        chunks = [by_len[i : i + cfg.minibatch] for i in range(0, len(by_len), cfg.minibatch)]
        plan = cfg.epochs * len(chunks)
        for epoch in range(cfg.epochs):
            rng.shuffle(chunks)
            if cfg.target_kl is None:
                taken += self._epoch(seqs, chunks, scale, epoch, len(taken), plan, on_step)[0]
                continue
            before = self._snapshot()
            while True:
                steps, stopped = self._epoch(seqs, chunks, scale, epoch, len(taken), plan, on_step)
                # a minibatch's KL understates the batch's after steps on the others:
                # check the whole batch once an epoch
                full = self._kl(seqs)
                verdict = kl_verdict(initial_kl, full, cfg.target_kl, halvings)
                if verdict == "accept":
                    taken += steps
                    break
                self._restore(before)
                if verdict == "undo":
                    return taken, halvings, True
                halvings += 1
                self._set_lr(cfg.lr / 2**halvings)
            if stopped or kl_reached(full, cfg.target_kl):
                return taken, halvings, stopped or epoch < cfg.epochs - 1
        return taken, halvings, False

    def _epoch(
        self,
        seqs: Sequence[Trainable],
        chunks: Sequence[Sequence[int]],
        scale: float,
        epoch: int,
        done: int,
        plan: int,
        on_step: StepHook | None,
    ) -> tuple[list[dict[str, float]], bool]:
        """One pass over ``chunks`` after ``done`` steps: each step's loss and minibatch
        figures, and whether a minibatch's KL passed ``target_kl`` (the pass ends there)."""
        import torch

        cfg = self.config
        self.model.train()
        steps: list[dict[str, float]] = []
        try:
            for idx in chunks:
                chunk = [seqs[i] for i in idx]
                p = self._pad(chunk)
                new = padded_logprobs(self.model, p, cfg.temperature or 1.0)
                loss, stats = clipped_loss(new, p, cfg.clip, p.advantages * scale)
                if kl_reached(stats["approx_kl"], cfg.target_kl) and done + len(steps) > 0:
                    return steps, True
                self.optimizer.zero_grad()
                loss.backward()  # type: ignore[no-untyped-call]
                norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.max_grad_norm))
                if not (math.isfinite(float(loss.detach())) and math.isfinite(norm)):
                    raise TrainingDiverged(
                        f"policy update diverged at step {done + len(steps) + 1} of {plan}: loss "
                        f"{float(loss.detach()):.4g}, gradient norm {norm:.4g} (learning rate {cfg.lr:g}); "
                        "nothing of this update was kept: lower the learning rate and rerun"
                    )
                self.optimizer.step()
                steps.append({"loss": float(loss.detach()), **stats, "grad_norm": norm})
                if on_step is not None:
                    on_step(UpdateStep(done + len(steps), plan, epoch, **steps[-1]))
            return steps, False
        finally:
            self.model.eval()

    def _loss_fn(self, scale: float) -> Callable[[Padded], tuple[torch.Tensor, dict[str, float]]]:
        cfg = self.config

        def loss_of(p: Padded) -> tuple[torch.Tensor, dict[str, float]]:
            new = padded_logprobs(self.model, p, cfg.temperature or 1.0)
            return clipped_loss(new, p, cfg.clip, p.advantages * scale)

        return loss_of

    def _set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def _snapshot(self) -> tuple[dict[str, Any], dict[str, Any]]:
        import copy

        return copy.deepcopy(self.model.state_dict()), copy.deepcopy(self.optimizer.state_dict())

    def _restore(self, snap: tuple[dict[str, Any], dict[str, Any]]) -> None:
        self.model.load_state_dict(snap[0])
        self.optimizer.load_state_dict(snap[1])

    def _pad(self, chunk: Sequence[Trainable]) -> Padded:
        """One forward pass's tensors: a chunk of sequences laid out as its token trie
        under ``pack="tree"`` (pieces of the batch's trie as they are)."""
        if self.config.pack == "tree" and not isinstance(chunk[0], TreePacked):
            return pad_sequences(pack_trees(chunk), self.pad_id)
        return pad_sequences(chunk, self.pad_id)

    def _kl(self, seqs: Sequence[Trainable]) -> float:
        """Approximate KL(behaviour || current policy), token mean over ``seqs`` (no update)."""
        total, tokens = self.kl_sums(seqs)
        return total / max(tokens, 1.0)

    def kl_sums(self, seqs: Sequence[Trainable]) -> tuple[float, float]:
        """The sum over ``seqs``' trained tokens of the approximate KL(behaviour || current
        policy), ``(r - 1) - log r`` with ``r`` the token's ratio, and the number of those
        tokens (no update; the model is left in eval mode)."""
        import torch

        total, tokens = 0.0, 0.0
        self.model.eval()
        with torch.no_grad():
            for i in range(0, len(seqs), self.config.minibatch):
                p = self._pad(seqs[i : i + self.config.minibatch])
                new = padded_logprobs(self.model, p, self.config.temperature or 1.0)
                log_ratio = (new - p.old_logprobs) * p.mask
                total += float((((torch.exp(log_ratio) - 1.0) - log_ratio) * p.mask).sum())
                tokens += float(p.mask.sum())
        return total, tokens

    def save(self, path: str | os.PathLike[str]) -> str:
        """Write the weights (the tiny model's format); returns their policy version."""
        import torch

        from focus.tinylm.model import load, save

        version = save(self.model, path)
        # The file holds fp16 weights; train on from exactly what the server will serve,
        # so the next batch's behaviour log-probs match this model's at ratio 1, and a
        # trainer restarted from the file continues from the same numbers.
        saved = load(path).state_dict()
        bad = [k for k, v in saved.items() if v.is_floating_point() and not bool(torch.isfinite(v).all())]
        if bad:  # weights past fp16's range (or NaN): the server would answer with NaN
            raise TrainingDiverged(
                f"policy update diverged: {len(bad)} weight tensor(s) are not finite in fp16 ({bad[0]}, ...) "
                f"(learning rate {self.config.lr:g}); lower the learning rate and rerun"
            )
        self.model.load_state_dict(saved)
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


def train_iteration(
    trainer: PolicyTrainer,
    critic: Critic | None,
    batch: Batch,
    weights_path: str | os.PathLike[str],
    on_step: StepHook | None = None,
) -> dict[str, Any]:
    """One training step of the loop: update the policy (telling ``on_step`` of each
    optimizer step), fit the critic (if it is trainable), write the new weights to
    ``weights_path``. Returns the new policy version and what the update and the fit did."""
    stats = trainer.update(batch, on_step)
    fitted = fit_critic(critic, batch) if critic is not None else {"fitted": False, "rows": 0}
    version = trainer.save(weights_path)
    return {"policy_version": version, "train": asdict(stats), "critic": fitted}
