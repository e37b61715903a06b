"""Deterministic pretraining of the initial weights: the toy task's format, not its skill.

``python -m focus.tinylm.pretrain [--out PATH] [--steps N]`` trains the tiny model on
ReachTarget conversations rendered exactly as the Agent renders them (ByteCodec,
append-only segments), where every move is a digit drawn uniformly at random. The
loss covers only the assistant tokens (a digit and the end-of-turn id). The result
answers each turn with one valid move and ends its turn, choosing moves about
uniformly: it succeeds about one time in five, so RL has a clear signal and room to
improve. Fixed seeds and one CPU thread make the output file identical across runs.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch

from focus.env import Message
from focus.format import ByteCodec
from focus.tinylm.model import DEFAULT_WEIGHTS, TinyConfig, TinyLM, save
from focus.toy import MAX_TARGET, MIN_TARGET, observation_text, opening_text


def episode(rng: random.Random, codec: ByteCodec) -> tuple[list[int], list[int]]:
    """Ids of one random-policy episode and its loss mask (1 on assistant tokens)."""
    target = rng.randint(MIN_TARGET, MAX_TARGET)
    ids = codec.render([Message("user", opening_text(target))])
    mask = [0] * len(ids)
    total = 0
    while True:
        digit = rng.randint(1, 9)
        completion = [ord(str(digit)), ByteCodec.EOT]
        ids += completion
        mask += [1, 1]
        total += digit
        if total >= target:
            return ids, mask
        obs = codec.observation_ids(completion, [Message("user", observation_text(total))])
        ids += obs
        mask += [0] * len(obs)


def make_batch(rng: random.Random, codec: ByteCodec, size: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    eps = [episode(rng, codec) for _ in range(size)]
    n = max(len(ids) for ids, _ in eps)
    x = torch.full((size, n - 1), ByteCodec.PAD, dtype=torch.long)
    y = torch.full((size, n - 1), ByteCodec.PAD, dtype=torch.long)
    m = torch.zeros((size, n - 1))
    for i, (ids, mask) in enumerate(eps):
        x[i, : len(ids) - 1] = torch.tensor(ids[:-1])
        y[i, : len(ids) - 1] = torch.tensor(ids[1:])
        m[i, : len(ids) - 1] = torch.tensor(mask[1:], dtype=torch.float32)
    return x, y, m


def train(steps: int = 300, batch_size: int = 16, lr: float = 3e-3, seed: int = 0, log_every: int = 50) -> TinyLM:
    """The pretrained model, the same bits on every run: seeded, and on one CPU thread
    for the whole call (restored after), since a reduction split over several threads
    may add in another order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _train(steps, batch_size, lr, seed, log_every)
    finally:
        torch.set_num_threads(threads)


def _train(steps: int, batch_size: int, lr: float, seed: int, log_every: int) -> TinyLM:
    torch.manual_seed(seed)
    rng = random.Random(seed)
    codec = ByteCodec()
    model = TinyLM(TinyConfig())
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 20) * max(0.05, 1 - s / steps))
    model.train()
    t0 = time.perf_counter()
    for step in range(steps):
        x, y, m = make_batch(rng, codec, batch_size)
        logits, _ = model(x)
        loss_tok = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none"
        )
        loss = (loss_tok * m.reshape(-1)).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if log_every and (step % log_every == 0 or step == steps - 1):
            print(f"step {step:4d} loss {loss.item():.4f} ({time.perf_counter() - t0:.1f} s)", flush=True)
    model.eval()
    return model


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_WEIGHTS)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    model = train(args.steps, args.batch_size, seed=args.seed)
    version = save(model, args.out)
    print(f"wrote {args.out} ({args.out.stat().st_size} bytes, {model.n_params()} params, version {version})")


if __name__ == "__main__":
    main()
