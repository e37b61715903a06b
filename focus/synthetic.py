"""Small synthetic MDPs with exact values, run through the real Agent code path.

Used by the estimator tests and ``benchmarks/estimator_quality.py``: a finite-horizon
MDP with deterministic transitions and a stochastic policy with known action
probabilities, so dynamic programming gives the exact value of every state and the
exact advantage of every action. :class:`SyntheticEnv`, :class:`SyntheticPolicy` and
:class:`SyntheticCritic` implement the ordinary Env / Policy / Critic interfaces over
the byte codec: the opening message names the MDP (``task=<i>``) and every observation
names the state (``s=<id>``), so policy and critic read the state from the exact ids
they are sent, like a real model would from its context.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from focus.critic import Critic, Prediction
from focus.env import Action, Env, EnvError, Message, Reset, StepResult, Task
from focus.format import ActionParser, ByteCodec, ParseError, PolicyFormat
from focus.policy import Completion, Policy, SamplingParams
from focus.workspace import Workspace


@dataclass(frozen=True)
class TreeMDP:
    """States 0..n-1 (0 is the start); a state without actions is terminal.

    ``next[s][a]``, ``reward[s][a]``, ``probs[s][a]`` (the policy) and ``tokens[s][a]``
    (completion length of the action's response).
    """

    next: tuple[tuple[int, ...], ...]
    reward: tuple[tuple[float, ...], ...]
    probs: tuple[tuple[float, ...], ...]
    tokens: tuple[tuple[int, ...], ...]
    name: str = ""

    def terminal(self, s: int) -> bool:
        return not self.next[s]

    def values(self, gamma: float = 1.0) -> list[float]:
        """Exact V^π by backward induction (states are numbered parents first)."""
        v = [0.0] * len(self.next)
        for s in reversed(range(len(self.next))):
            v[s] = sum(
                p * (r + gamma * v[n]) for n, r, p in zip(self.next[s], self.reward[s], self.probs[s], strict=True)
            )
        return v

    def advantage(self, s: int, a: int, values: Sequence[float], gamma: float = 1.0) -> float:
        return self.reward[s][a] + gamma * values[self.next[s][a]] - values[s]


Transition = tuple[Hashable, float, float, int]  # (next key, reward, probability, tokens)


def build(start: Hashable, actions: Callable[[Any], list[Transition]], name: str = "") -> TreeMDP:
    """An MDP from a start key and ``actions(key)`` (empty list: terminal); keys are
    merged, so the state space may be a DAG. Numbered in breadth-first order."""
    ids: dict[Hashable, int] = {start: 0}
    order = [start]
    rows: list[list[Transition]] = []
    i = 0
    while i < len(order):
        trs = actions(order[i])
        total = sum(p for _, _, p, _ in trs)
        if trs and not math.isclose(total, 1.0, abs_tol=1e-9):
            raise ValueError(f"action probabilities at {order[i]!r} sum to {total}, not 1")
        for key, *_ in trs:
            if key not in ids:
                ids[key] = len(order)
                order.append(key)
        rows.append(trs)
        i += 1
    # Numbering is breadth-first, and every transition goes to a later layer when keys
    # carry the time step, so reversed order is a valid backward-induction order.
    for s, trs in enumerate(rows):
        for key, *_ in trs:
            if ids[key] <= s:
                raise ValueError("synthetic MDP keys must carry the time step (transitions must move forward)")
    return TreeMDP(
        tuple(tuple(ids[k] for k, *_ in trs) for trs in rows),
        tuple(tuple(r for _, r, _, _ in trs) for trs in rows),
        tuple(tuple(p for _, _, p, _ in trs) for trs in rows),
        tuple(tuple(t for *_, t in trs) for trs in rows),
        name,
    )


def _dirichlet(rng: random.Random, k: int) -> list[float]:
    xs = [rng.gammavariate(1.0, 1.0) + 1e-3 for _ in range(k)]
    total = sum(xs)
    return [x / total for x in xs]


def uniform_tree(seed: int, branching: int = 3, depth: int = 4) -> TreeMDP:
    """A full tree; 0/1 leaf rewards whose success rate varies by subtree."""
    rng = random.Random(seed)
    rates: dict[tuple[int, ...], float] = {}

    def actions(path: tuple[int, ...]) -> list[Transition]:
        if len(path) == depth:
            return []
        probs = _dirichlet(random.Random(hash((seed, path))), branching)
        out: list[Transition] = []
        for a in range(branching):
            child = (*path, a)
            rates[child] = min(1.0, max(0.0, rates.get(path, 0.5) + rng.uniform(-0.35, 0.35)))
            reward = float(rng.random() < rates[child]) if len(child) == depth else 0.0
            out.append((child, reward, probs[a], rng.randint(2, 12)))
        return out

    return build((), actions, "uniform")


def critical_decision(seed: int, depth: int = 6, critical: int = 1, p_good: float = 0.3) -> TreeMDP:
    """One decision matters: at step ``critical`` the good action (probability
    ``p_good``) is worth 0.8; the other steps add at most 0.2 together."""
    rng = random.Random(seed)
    lengths = {(t, a): rng.randint(2, 12) for t in range(depth) for a in (0, 1)}

    def actions(key: tuple[int, int, int]) -> list[Transition]:
        t, good, luck = key
        if t == depth:
            return []
        last = t + 1 == depth
        if t == critical:
            opts = [((t + 1, 1, luck), p_good), ((t + 1, 0, luck), 1 - p_good)]
        else:
            opts = [((t + 1, good, luck + 1), 0.5), ((t + 1, good, luck), 0.5)]
        out: list[Transition] = []
        for a, (nk, p) in enumerate(opts):
            r = 0.8 * nk[1] + 0.2 * float(nk[2] >= (depth - 1) / 2) if last else 0.0
            out.append((nk, r, p, lengths[(t, a)]))
        return out

    return build((0, 0, 0), actions, "critical")


def long_horizon(seed: int, horizon: int = 12, target: int = 2) -> TreeMDP:
    """A biased random walk of ``horizon`` steps; reward 1 if it ends at or above ``target``."""
    rng = random.Random(seed)
    bias = {(t, x): 0.5 + rng.uniform(-0.25, 0.25) for t in range(horizon) for x in range(-horizon, horizon + 1)}
    lengths = {(t, x): rng.randint(1, 8) for t in range(horizon) for x in range(-horizon, horizon + 1)}

    def actions(key: tuple[int, int]) -> list[Transition]:
        t, x = key
        if t == horizon:
            return []
        last = t + 1 == horizon
        out: list[Transition] = []
        for nx, p in ((x + 1, bias[(t, x)]), (x - 1, 1 - bias[(t, x)])):
            out.append(((t + 1, nx), float(nx >= target) if last else 0.0, p, lengths[(t, x)]))
        return out

    return build((0, 0), actions, "long")


SHAPES: dict[str, Callable[[int], TreeMDP]] = {
    "uniform": uniform_tree,
    "critical": critical_decision,
    "long": long_horizon,
}

_S = (ord("s"), ord("="))
_TASK = tuple(b"task=")


def _read_int(ids: Sequence[int], start: int) -> int:
    j = start
    while j < len(ids) and 48 <= ids[j] <= 57:
        j += 1
    if j == start:
        raise ValueError("no number where the synthetic protocol expects one")
    return int(bytes(ids[start:j]).decode())


def read_state(ids: Sequence[int]) -> tuple[int, int]:
    """(task index, state) named by a synthetic context: ``task=`` at the start, the
    last ``s=`` for the state (0 before any step)."""
    n = len(_TASK)
    for i in range(len(ids) - n + 1):
        if tuple(ids[i : i + n]) == _TASK:
            task = _read_int(ids, i + n)
            break
    else:
        raise ValueError("context names no synthetic task ('task=<i>')")
    for i in range(len(ids) - 2, -1, -1):
        if ids[i] == _S[0] and ids[i + 1] == _S[1]:
            return task, _read_int(ids, i + 2)
    return task, 0


class SyntheticEnv(Env):
    """Steps the MDP of ``task.data["mdp"]``; the action text is the action index."""

    def __init__(self, mdps: Sequence[TreeMDP]) -> None:
        self.mdps = list(mdps)

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        i = int(task.data["mdp"])
        return Reset((i, 0), (Message("user", f"task={i} s=0"),))

    async def step(self, state: Any, action: Action, workspace: Workspace | None) -> StepResult:
        i, s = state
        mdp = self.mdps[i]
        try:
            a = int(action.text)
            nxt, r = mdp.next[s][a], mdp.reward[s][a]
        except (ValueError, IndexError):
            raise EnvError(f"state {s} of synthetic task {i} has no action {action.text!r}") from None
        return StepResult((i, nxt), f"s={nxt}", r, mdp.terminal(nxt))


class SyntheticParser(ActionParser):
    def parse(self, text: str) -> Action | ParseError:
        head = text.split(".", 1)[0].strip()
        return Action("text", text=head) if head.isdigit() else ParseError("answer with an action index")


def synthetic_format() -> PolicyFormat:
    return PolicyFormat(ByteCodec(), SyntheticParser())


class SyntheticPolicy(Policy):
    """Samples action a with probability ``probs[s][a]`` (seeded by the request seed).

    The response is the action digit padded with dots to the action's token length;
    the first token carries log π(a|s), the others log-prob 0 (they are forced).
    """

    vocab_size = ByteCodec.vocab_size

    def __init__(self, mdps: Sequence[TreeMDP]) -> None:
        self.mdps = list(mdps)
        self.calls = 0

    async def sample(self, prompt_ids: Sequence[int], params: SamplingParams) -> Completion:
        self.calls += 1
        task, s = read_state(prompt_ids)
        mdp = self.mdps[task]
        rng = random.Random(params.seed)
        a = rng.choices(range(len(mdp.probs[s])), weights=mdp.probs[s])[0]
        n = max(1, mdp.tokens[s][a])
        ids = [48 + a] + [ord(".")] * (n - 1)
        lps = [math.log(mdp.probs[s][a])] + [0.0] * (n - 1)
        return Completion(tuple(ids + [ByteCodec.EOT]), tuple(lps + [0.0]), "stop")


class SyntheticCritic(Critic):
    """Exact values plus a fixed per-state error of standard deviation ``noise``
    (seeded; the same state always gets the same error, like a real critic)."""

    def __init__(
        self, mdps: Sequence[TreeMDP], noise: float = 0.0, seed: int = 0, gamma: float = 1.0, report_std: bool = False
    ) -> None:
        self.values = [m.values(gamma) for m in mdps]
        self.noise, self.seed, self.report_std = noise, seed, report_std

    def value(self, task: int, s: int) -> float:
        err = random.Random(hash((self.seed, task, s))).gauss(0.0, self.noise) if self.noise else 0.0
        return self.values[task][s] + err

    async def predict(self, contexts: Sequence[Sequence[int]]) -> list[float]:
        return [self.value(*read_state(c)) for c in contexts]

    async def predict_with_std(self, contexts: Sequence[Sequence[int]]) -> list[Prediction]:
        std = self.noise if self.report_std else None
        return [Prediction(v, std) for v in await self.predict(contexts)]
