"""A starting policy that has the cue lookup, the same for every method (issue 32).

With the committed weights no batch teaches the cued tasks' mapping within the record's
updates: even oracle batches stop at the constant part, because the lookup from the
range named in the observation to a digit needs hundreds of supervised gradient steps
to form (docs/findings/learning-steps.md, "Ceilings of the cued tasks"). Real LLM RL
starts from a model that can represent the task; this builds such a start for the tiny
model: a model after ``steps`` plain supervised Adam steps on a cue lookup made from
tasks *kept apart* from every benchmark task, with a *different* mapping, so
that RL must still learn the benchmark's own. The model trained is the committed weights
or (``init="scratch"``) a fresh random init; the start ``--start pretrained`` builds
(:data:`DEFAULT_START`) is a fresh init, as the committed weights never formed the lookup:

* the tasks: cued corridors (every step names 1-3 or 4-6) and cued bridges (each plank
  names one digit 1-7), drawn from their own seeds (``derive_seed("start", ...)``) and
  renamed ``start-...``, so no id is a benchmark task's (training or held out);
* the mapping: every range named read as ``shift`` higher. At each corridor step the
  right digits are the range named plus ``shift`` (``Step 1: 1-3.`` -> 3-5 at shift 2);
  at each plank every digit but 8, 9 and the digit named plus ``shift``. The walks that
  render the prompts say such digits, so their histories are those of a policy that
  follows the shifted rule;
* the loss: minus the log of the probability of the right digits (the first reply
  token), 16 prompts a step, the prompts of ``train_tasks`` corridors and as many bridges.

At shift 2 a policy following the shifted rule would pass a cued corridor's gate a third
of the time (3-5 holds one of 1-3; 6-8 one of 4-6) and cross a plank 5/6 of the time.
The default start learned less than the rule (it says 6 where the range named at the
opening ends in 6, mostly 5 otherwise): its held-out success before any update is
0.44-0.60 on the cued corridors and 0.50-0.54 on the bridge (docs/findings/learning-steps.md,
"A start with the cue lookup"). The build is deterministic in its settings (one thread, seeded), cached under
``runs/start/`` by a key of the settings and the committed weights' version; nothing is
downloaded or read from outside the repository.

    .venv/bin/python -m benchmarks.learning_start              # build (or find) the default start, print its figures
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from focus.agent import derive_seed
from focus.policy import Completion, Policy, SamplingParams

CACHE = Path("runs/start")


@dataclass(frozen=True)
class StartSettings:
    """What a start is built from; the cache key is these and the committed weights."""

    steps: int = 600
    lr: float = 3e-3
    shift: int = 2
    train_tasks: int = 64  # corridors, and as many bridges
    batch: int = 16  # prompts per Adam step
    seed: int = 0
    init: str = "default"  # the committed weights; "scratch": a fresh random init (TinyLM())
    steps_taught: str = "first"  # "first": the opening's range only (corridor step 1, plank 1); "every"

    def __post_init__(self) -> None:
        if self.init not in ("default", "scratch"):
            raise ValueError(f"init must be 'default' or 'scratch', got {self.init!r}")
        if self.steps_taught not in ("first", "every"):
            raise ValueError(f"steps_taught must be 'first' or 'every', got {self.steps_taught!r}")
        if min(self.train_tasks, self.batch) < 1 or self.steps < 0:
            raise ValueError(f"need train_tasks, batch >= 1 and steps >= 0, got {self}")


#: The start ``--start pretrained`` builds: from a fresh init, the opening's range only,
#: 500 steps at lr 1e-3 (docs/findings/learning-steps.md, "A start with the cue lookup":
#: the committed weights did not form the lookup within 500-600 steps, at lr 3e-3 or 1e-2,
#: on the openings or on every step; a fresh init did at steps 350-450).
DEFAULT_START = StartSettings(steps=500, lr=1e-3, init="scratch")


def right_digits(prompt: str, shift: int) -> list[int] | None:
    """The digits the shifted rule takes at the step ``prompt`` (decoded) is at: a
    corridor step's range plus ``shift``; a plank's 1-9 but 8, 9 and the digit named plus
    ``shift``. None if the prompt names no range."""
    from benchmarks.learning_cues import decisive

    bridge = "Bridge of" in prompt
    cue = decisive("cued-bridge" if bridge else "any", prompt)
    if cue is None:
        return None
    _, lo, hi = cue
    if bridge:
        return [d for d in range(1, 8) if d != lo + shift]
    return [d for d in range(lo + shift, hi + shift + 1) if 1 <= d <= 9]


def kept_apart_tasks(settings: StartSettings) -> list[Any]:
    """The start's tasks: cued corridors and bridges of their own seeds, named ``start-``."""
    from focus.digit_tasks import bridge_tasks, corridor_tasks

    n = settings.train_tasks
    corridors = corridor_tasks(n, derive_seed("start", "corridor", settings.seed), gate="early", width=3)
    bridges = bridge_tasks(n, derive_seed("start", "bridge", settings.seed), width=1)
    return [replace(t, id=f"start-{t.id}") for t in corridors + bridges]


class _Walker(Policy):
    """Says a digit the shifted rule takes (uniformly), recording every prompt with its
    right digits; no model."""

    def __init__(self, shift: int, seed: int) -> None:
        from focus.format import ByteCodec

        self.codec, self.vocab_size = ByteCodec(), ByteCodec.vocab_size
        self.shift, self.rng = shift, random.Random(seed)
        self.seen: list[tuple[list[int], list[int]]] = []

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        right = right_digits(self.codec.decode(prompt_ids), self.shift)
        assert right, "every step of a cued task names a range"
        self.seen.append((list(prompt_ids), right))
        ids = (ord(str(self.rng.choice(right))), self.codec.EOT)
        return Completion(ids, (0.0, 0.0), "stop")


def training_prompts(settings: StartSettings) -> list[tuple[list[int], list[int]]]:
    """Every prompt of one shifted-rule walk per kept-apart task, with its right digits."""
    from focus.agent import Agent
    from focus.digit_tasks import Bridge, Corridor
    from focus.format import ByteCodec
    from focus.toy import toy_format

    walker = _Walker(settings.shift, settings.seed)
    sampling = SamplingParams(max_tokens=4, temperature=1.0)  # the record's digit agents'

    async def walk() -> None:
        for i, task in enumerate(kept_apart_tasks(settings)):
            env = Bridge() if "bridge" in task.id else Corridor()
            agent = Agent(walker, env, toy_format(), max_steps=9, sampling=sampling)
            await agent.rollout(await agent.start(task), derive_seed("start-walk", settings.seed, i))

    asyncio.run(walk())
    if settings.steps_taught == "every":
        return walker.seen
    codec = ByteCodec()
    return [(ids, right) for ids, right in walker.seen if _step(codec.decode(ids)) == 1]


def _step(prompt: str) -> int:
    from benchmarks.learning_cues import decisive

    cue = decisive("any", prompt)
    assert cue is not None
    return cue[0]


def start_key(settings: StartSettings) -> str:
    from focus.tinylm.arch import DEFAULT_WEIGHTS, weights_version

    text = json.dumps({**asdict(settings), "from": weights_version(DEFAULT_WEIGHTS)}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def last_logits(model: Any, prompts: Sequence[Sequence[int]]) -> Any:
    """The next-token logits after each prompt, in one forward pass: right-padded, which a
    causal model's earlier positions never see."""
    import torch

    from focus.format import ByteCodec

    n = max(len(p) for p in prompts)
    ids = torch.tensor([list(p) + [ByteCodec.PAD] * (n - len(p)) for p in prompts])
    logits = model(ids)[0].float()
    return logits[torch.arange(len(prompts)), torch.tensor([len(p) - 1 for p in prompts])]


def train_start(settings: StartSettings, verbose: bool = False) -> tuple[Any, list[dict[str, float]]]:
    """The model ``settings.init`` names after ``settings.steps`` supervised steps, and the
    training loss and right-digit probability every tenth of the run."""
    import torch

    from focus.tinylm.model import TinyLM, load

    torch.set_num_threads(1)  # reproducible
    torch.manual_seed(settings.seed)
    data = training_prompts(settings)
    model = load() if settings.init == "default" else TinyLM()
    opt, rng = torch.optim.Adam(model.parameters(), lr=settings.lr), random.Random(settings.seed)
    every, trace = max(1, settings.steps // 10), []
    for step in range(1, settings.steps + 1):
        model.train()
        opt.zero_grad()
        picks = [data[rng.randrange(len(data))] for _ in range(settings.batch)]
        logp = torch.log_softmax(last_logits(model, [ids for ids, _ in picks]), -1)
        loss = -torch.stack([torch.logsumexp(logp[i, [ord(str(d)) for d in r]], 0) for i, (_, r) in enumerate(picks)])
        loss.mean().backward()
        opt.step()
        if step % every == 0 or step == settings.steps:
            trace.append({"step": step, "loss": round(float(loss.mean().detach()), 4), **p_right(model, data)})
            if verbose:
                print(trace[-1], flush=True)
    model.eval()
    return model, trace


def p_right(model: Any, data: Sequence[tuple[list[int], list[int]]]) -> dict[str, float]:
    """Mean probability of the right digits over ``data``'s corridor prompts (the lookup:
    chance between the two blocks is 0.5 once 7-9... are placed) and its bridge prompts
    (``p_right_bridge``); exact, no sampling."""
    import torch

    from focus.format import ByteCodec

    codec = ByteCodec()
    sums: dict[str, list[float]] = {"p_right": [], "p_right_bridge": []}
    model.eval()
    with torch.no_grad():
        for at in range(0, len(data), 64):
            chunk = data[at : at + 64]
            probs = torch.softmax(last_logits(model, [ids for ids, _ in chunk]), -1)
            for i, (ids, right) in enumerate(chunk):
                key = "p_right_bridge" if "Bridge of" in codec.decode(ids) else "p_right"
                sums[key].append(float(probs[i, [ord(str(d)) for d in right]].sum()))
    return {k: round(sum(v) / max(len(v), 1), 4) for k, v in sums.items()}


def build_start(settings: StartSettings = DEFAULT_START, cache: Path = CACHE, verbose: bool = False) -> Path:
    """The start's weights file, built once per settings (``cache/<key>.pt``, its
    training trace beside it as ``<key>.json``)."""
    from focus.tinylm.model import save

    path = cache / f"{start_key(settings)}.pt"
    if not path.exists():
        model, trace = train_start(settings, verbose)
        tmp = path.with_suffix(".tmp")
        save(model, tmp)
        path.with_suffix(".json").write_text(json.dumps({"settings": asdict(settings), "trace": trace}, indent=1))
        tmp.replace(path)  # atomic: parallel jobs read a whole file or build their own
    return path


def start_weights(start: str, cache: Path = CACHE) -> Path | None:
    """``--start``'s weights: None for ``default`` (the committed weights), the built
    start for ``pretrained``."""
    if start == "default":
        return None
    if start == "pretrained":
        return build_start(DEFAULT_START, cache)
    raise ValueError(f"--start takes 'default' or 'pretrained', got {start!r}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field, value in asdict(DEFAULT_START).items():
        ap.add_argument(f"--{field.replace('_', '-')}", type=type(value), default=value)
    ap.add_argument("--cache", type=Path, default=CACHE)
    args = ap.parse_args(argv)
    settings = StartSettings(**{f: getattr(args, f) for f in asdict(DEFAULT_START)})
    path = build_start(settings, args.cache, verbose=True)
    trace = json.loads(path.with_suffix(".json").read_text())["trace"]
    print(f"{path}: step:loss:p_right(corridor)/p_right(bridge) "
          + " ".join(f"{p['step']}:{p['loss']}:{p['p_right']:.2f}/{p['p_right_bridge']:.2f}" for p in trace))  # fmt: skip


if __name__ == "__main__":
    main()
