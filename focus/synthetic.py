"""Small synthetic MDPs with exact values, run through the real Agent code path.

Used by the estimator tests and ``benchmarks/estimator_quality.py``: a finite-horizon
MDP (transitions may be stochastic) and a stochastic policy with known action
probabilities, so dynamic programming gives the exact value of every state and the
exact advantage ``Q(s, a) − V(s)`` of every action. :class:`SyntheticEnv`,
:class:`SyntheticPolicy` and :class:`SyntheticCritic` implement the ordinary Env /
Policy / Critic interfaces over the byte codec: the opening message names the MDP
(``task=<i>``) and every observation names the state (``s=<id>``), so policy and critic
read the state from the exact ids they are sent, like a real model would from its
context. The env draws stochastic outcomes from the seed the agent passes to
``Env.step`` (see :mod:`focus.env`), so a collection replays exactly.

:data:`FAMILIES` lists the MDP families of the benchmark, each with its discount and
horizon; :data:`SHAPES` the original three (undiscounted, deterministic).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from focus.critic import Critic, Prediction
from focus.env import Action, Env, EnvError, Message, Reset, StepResult, Task
from focus.format import ActionParser, ByteCodec, ParseError, PolicyFormat
from focus.policy import Completion, Policy, SamplingParams
from focus.sums import left_sum
from focus.workspace import Workspace

#: One possible result of an action: (next state, reward, probability).
Outcome = tuple[int, float, float]


@dataclass(frozen=True)
class TreeMDP:
    """States 0..n-1 (0 is the start); a state without actions is terminal.

    ``outcomes[s][a]`` lists the (next state, reward, probability) results of action a
    (one entry when the transition is deterministic); ``probs[s][a]`` is the policy and
    ``tokens[s][a]`` the completion length of the action's response.
    """

    outcomes: tuple[tuple[tuple[Outcome, ...], ...], ...]
    probs: tuple[tuple[float, ...], ...]
    tokens: tuple[tuple[int, ...], ...]
    name: str = ""
    #: Depth of the one step that decides the return, where the family has one (-1: none).
    decisive: int = -1

    def terminal(self, s: int) -> bool:
        return not self.outcomes[s]

    def q(self, s: int, a: int, values: Sequence[float], gamma: float = 1.0) -> float:
        """Exact Q^π(s, a): the expected reward plus discounted next value."""
        return left_sum(p * (r + gamma * values[n]) for n, r, p in self.outcomes[s][a])

    def values(self, gamma: float = 1.0) -> list[float]:
        """Exact V^π by backward induction (states are numbered parents first)."""
        v = [0.0] * len(self.outcomes)
        for s in reversed(range(len(self.outcomes))):
            v[s] = left_sum(pa * self.q(s, a, v, gamma) for a, pa in enumerate(self.probs[s]))
        return v

    def advantage(self, s: int, a: int, values: Sequence[float], gamma: float = 1.0) -> float:
        """Exact A^π(s, a) = Q^π(s, a) − V^π(s) (the expectation over next states)."""
        return self.q(s, a, values, gamma) - values[s]

    def visits(self) -> list[float]:
        """Probability that an on-policy episode visits each state."""
        d = [0.0] * len(self.outcomes)
        d[0] = 1.0
        for s in range(len(self.outcomes)):
            for a, pa in enumerate(self.probs[s]):
                for n, _, p in self.outcomes[s][a]:
                    d[n] += d[s] * pa * p
        return d

    def advantage_scale(self, gamma: float = 1.0) -> float:
        """On-policy root-mean-square advantage per step, sqrt(E[A²]) over visited
        (state, action) pairs: the scale critic noise is set relative to."""
        v, d = self.values(gamma), self.visits()
        num = den = 0.0
        for s, ds in enumerate(d):
            if ds and not self.terminal(s):
                num += ds * left_sum(pa * self.advantage(s, a, v, gamma) ** 2 for a, pa in enumerate(self.probs[s]))
                den += ds
        return math.sqrt(num / den) if den else 0.0

    def expected_length(self) -> float:
        """Expected number of transitions of an on-policy episode."""
        return left_sum(ds for s, ds in enumerate(self.visits()) if not self.terminal(s))


#: An action of :func:`build`: ``(next key, reward, probability, tokens)`` when the
#: transition is deterministic, or ``(outcomes, probability, tokens)`` with outcomes a
#: list of ``(next key, reward, probability)``.
Transition = tuple[Any, ...]


def build(start: Hashable, actions: Callable[[Any], list[Transition]], name: str = "") -> TreeMDP:
    """An MDP from a start key and ``actions(key)`` (empty list: terminal); keys are
    merged, so the state space may be a DAG. Numbered in breadth-first order."""
    ids: dict[Hashable, int] = {start: 0}
    order = [start]
    rows: list[list[tuple[list[tuple[Hashable, float, float]], float, int]]] = []
    i = 0
    while i < len(order):
        row = []
        for tr in actions(order[i]):
            if len(tr) == 4:
                key, reward, p, tokens = tr
                row.append(([(key, float(reward), 1.0)], float(p), int(tokens)))
            else:
                outs, p, tokens = tr
                row.append(([(k, float(r), float(q)) for k, r, q in outs], float(p), int(tokens)))
        total = left_sum(p for _, p, _ in row)
        if row and not math.isclose(total, 1.0, abs_tol=1e-9):
            raise ValueError(f"action probabilities at {order[i]!r} sum to {total}, not 1")
        for outs, _, _ in row:
            if not math.isclose(left_sum(q for *_, q in outs), 1.0, abs_tol=1e-9):
                raise ValueError(f"outcome probabilities of an action at {order[i]!r} do not sum to 1")
            for key, *_ in outs:
                if key not in ids:
                    ids[key] = len(order)
                    order.append(key)
        rows.append(row)
        i += 1
    # Numbering is breadth-first, and every transition goes to a later layer when keys
    # carry the time step, so reversed order is a valid backward-induction order.
    for s, row in enumerate(rows):
        for outs, _, _ in row:
            if any(ids[k] <= s for k, *_ in outs):
                raise ValueError("synthetic MDP keys must carry the time step (transitions must move forward)")
    return TreeMDP(
        tuple(tuple(tuple((ids[k], r, q) for k, r, q in outs) for outs, _, _ in row) for row in rows),
        tuple(tuple(p for _, p, _ in row) for row in rows),
        tuple(tuple(t for *_, t in row) for row in rows),
        name,
    )


def _dirichlet(rng: random.Random, k: int, alpha: float = 1.0) -> list[float]:
    xs = [rng.gammavariate(alpha, 1.0) + 1e-3 for _ in range(k)]
    total = left_sum(xs)
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


def slippery_walk(seed: int, horizon: int = 8) -> TreeMDP:
    """Stochastic transitions: move left, stay or right, but with probability ``slip``
    (0.1-0.35 per instance) the move is one of the other two; reward 1 if the walk ends
    at or above a target."""
    rng = random.Random(seed)
    slip = rng.uniform(0.1, 0.35)
    target = rng.randint(0, 2)

    def actions(key: tuple[int, int]) -> list[Transition]:
        t, x = key
        if t == horizon:
            return []
        local = random.Random(hash((seed, t, x)))
        probs = _dirichlet(local, 3)
        out: list[Transition] = []
        for a, move in enumerate((-1, 0, 1)):
            outs = []
            for other in (-1, 0, 1):
                p = 1 - slip if other == move else slip / 2
                nx = x + other
                outs.append(((t + 1, nx), float(nx >= target) if t + 1 == horizon else 0.0, p))
            out.append((outs, probs[a], local.randint(2, 10)))
        return out

    return build((0, 0), actions, "slippery")


def forage(seed: int, horizon: int = 10) -> TreeMDP:
    """Discounted (γ = 0.9 in :data:`FAMILIES`), episodes of 3 to 10 transitions,
    rewards at every step: forage (a random find, costs energy), rest (a small cost,
    regains energy), stop (from the third step: ends with a reward for the energy
    left), sprint (from the sixth step: a reward now for two energy). Two to four
    actions depending on depth."""
    rng = random.Random(seed)
    find = [rng.uniform(0.15, 0.6) for _ in range(5)]  # chance of a find by energy level
    rest_cost = rng.uniform(0.02, 0.08)

    def actions(key: tuple[Any, ...]) -> list[Transition]:
        if key[0] == "end" or key[0] == horizon:
            return []
        t, e = key
        local = random.Random(hash((seed, t, e)))
        names = ["forage", "rest"] + (["stop"] if t >= 2 else []) + (["sprint"] if t >= 5 else [])
        probs = _dirichlet(local, len(names), 2.0)
        out: list[Transition] = []
        for a, name in enumerate(names):
            tokens = local.randint(2, 10)
            if name == "forage":
                nxt = (t + 1, max(e - 1, 0))
                p = find[e] if e > 0 else 0.0
                outs = [(nxt, 0.3, p), (nxt, -0.02, 1 - p)] if p > 0 else [(nxt, -0.02, 1.0)]
                out.append((outs, probs[a], tokens))
            elif name == "rest":
                out.append(((t + 1, min(e + 1, 4)), -rest_cost, probs[a], tokens))
            elif name == "stop":
                out.append((("end", t + 1), 0.1 * e, probs[a], tokens))
            else:
                out.append(((t + 1, max(e - 2, 0)), 0.2 if e >= 2 else -0.05, probs[a], tokens))
        return out

    return build((0, 2), actions, "forage")


def project(seed: int, horizon: int = 6) -> TreeMDP:
    """Costs at every step beside a terminal reward: plan (cheap, +1 progress), build
    (dearer, +2), skip (free, +0); the end pays 1 if progress reached the goal, else a
    part of it."""
    rng = random.Random(seed)
    goal = rng.randint(5, 8)
    costs = (rng.uniform(0.01, 0.05), rng.uniform(0.05, 0.15), 0.0)

    def actions(key: tuple[int, int]) -> list[Transition]:
        t, prog = key
        if t == horizon:
            return []
        local = random.Random(hash((seed, t, prog)))
        probs = _dirichlet(local, 3)
        out: list[Transition] = []
        for a, step in enumerate((1, 2, 0)):
            nprog = min(prog + step, goal)
            end = (1.0 if nprog >= goal else 0.4 * nprog / goal) if t + 1 == horizon else 0.0
            out.append(((t + 1, nprog), end - costs[a], probs[a], local.randint(2, 10)))
        return out

    return build((0, 0), actions, "project")


def timing(seed: int, horizon: int = 8, mature: int = 4) -> TreeMDP:
    """An action good early and bad late: invest costs now and pays at the end only if
    made at least ``mature`` steps before it. Collect pays a little now; wait (from the
    fourth step) nothing; gamble (from the seventh) a coin flip. Two to four actions by
    depth."""
    rng = random.Random(seed)
    cost, pay, small = rng.uniform(0.08, 0.15), rng.uniform(0.2, 0.35), rng.uniform(0.02, 0.06)

    def actions(key: tuple[int, int]) -> list[Transition]:
        t, k = key
        if t == horizon:
            return []
        local = random.Random(hash((seed, t, k)))
        names = ["invest", "collect"] + (["wait"] if t >= 3 else []) + (["gamble"] if t >= 6 else [])
        probs = _dirichlet(local, len(names))
        out: list[Transition] = []
        for a, name in enumerate(names):
            nk = min(k + 1, 3) if name == "invest" and t <= horizon - mature else k
            end = pay * nk if t + 1 == horizon else 0.0
            tokens = local.randint(2, 10)
            if name == "gamble":
                out.append(([((t + 1, nk), end + 0.3, 0.4), ((t + 1, nk), end - 0.15, 0.6)], probs[a], tokens))
            else:
                now = -cost if name == "invest" else (small if name == "collect" else 0.0)
                out.append(((t + 1, nk), end + now, probs[a], tokens))
        return out

    return build((0, 0), actions, "timing")


def subtle(seed: int, horizon: int = 10) -> TreeMDP:
    """Every property at once, with advantages small next to the outcome noise:
    discounted (γ = 0.9), episodes of 3 to 10 transitions, a random walk whose steps
    slip, rewards and costs at every step (a ±0.1 coin flip on each), an investment
    that pays only if made early, a stop action from the fifth step; two to four
    actions by depth. Action effects are a few hundredths."""
    rng = random.Random(seed)
    drift, cost = rng.uniform(0.5, 0.7), rng.uniform(0.02, 0.06)

    def actions(key: tuple[Any, ...]) -> list[Transition]:
        if key[0] == "end" or key[0] == horizon:
            return []
        t, x, k = key
        local = random.Random(hash((seed, t, x, k)))
        names = ["steady", "push"] + (["invest"] if t >= 1 else []) + (["stop"] if t >= 4 else [])
        probs = _dirichlet(local, len(names), 3.0)
        last = t + 1 == horizon
        out: list[Transition] = []
        for a, name in enumerate(names):
            tokens = local.randint(2, 10)
            if name == "stop":
                out.append((("end", t + 1), 0.05 * x + 0.08 * k, probs[a], tokens))
                continue
            moves = [(1, drift), (-1, 1 - drift)] if name == "push" else [(0, 1.0)]
            nk = min(k + 1, 2) if name == "invest" and t <= 4 else k
            now = -cost if name in ("push", "invest") else 0.0
            outs = []
            for dx, pm in moves:
                end = 0.05 * (x + dx) + 0.08 * nk if last else 0.0
                for coin in (0.1, -0.1):
                    outs.append(((t + 1, x + dx, nk), now + coin + end, pm / 2))
            out.append((outs, probs[a], tokens))
        return out

    return build((0, 0, 0), actions, "subtle")


SHAPES: dict[str, Callable[[int], TreeMDP]] = {
    "uniform": uniform_tree,
    "critical": critical_decision,
    "long": long_horizon,
}


@dataclass(frozen=True)
class Family:
    """An MDP family: instances by seed, the discount to collect with, the horizon H
    (most transitions of an episode: budgets are counted in multiples of it)."""

    name: str
    make: Callable[[int], TreeMDP]
    gamma: float
    horizon: int
    properties: str = ""
    #: The agent's step limit (None: ``horizon + 2``, so no rollout is cut).
    max_steps: int | None = None


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("uniform", uniform_tree, 1.0, 4, "full tree, 0/1 leaf rewards"),
        Family("critical", critical_decision, 1.0, 6, "one decision matters"),
        Family("long", long_horizon, 1.0, 12, "long random walk"),
        Family("slippery", slippery_walk, 1.0, 8, "stochastic transitions"),
        Family("forage", forage, 0.9, 10, "γ=0.9, 3-10 transitions, rewards every step, 2-4 actions"),
        Family("project", project, 1.0, 6, "step costs beside a terminal reward"),
        Family("timing", timing, 1.0, 8, "an action good early and bad late, 2-4 actions"),
        Family("subtle", subtle, 0.9, 10, "all of the above, advantages small next to outcome noise"),
    )
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
    """Steps the MDP of ``task.data["mdp"]``; the action text is the action index.

    A stochastic transition draws its outcome from the ``seed`` the agent passes (one
    per branch and step), so sibling branches draw independently and a resumed
    collection replays the same outcomes. Without a seed the draw is a fixed function
    of (task, state, action): every branch from a checkpoint gets the same outcome.
    """

    def __init__(self, mdps: Sequence[TreeMDP]) -> None:
        self.mdps = list(mdps)

    async def reset(self, task: Task, workspace: Workspace | None) -> Reset:
        i = int(task.data["mdp"])
        return Reset((i, 0), (Message("user", f"task={i} s=0"),))

    async def step(
        self, state: Any, action: Action, workspace: Workspace | None, *, seed: int | None = None
    ) -> StepResult:
        i, s = state
        mdp = self.mdps[i]
        try:
            a = int(action.text)
            outs = mdp.outcomes[s][a]
        except (ValueError, IndexError):
            raise EnvError(f"state {s} of synthetic task {i} has no action {action.text!r}") from None
        if len(outs) == 1:
            nxt, r, _ = outs[0]
        else:
            rng = random.Random(seed if seed is not None else hash((i, s, a)))
            nxt, r, _ = rng.choices(outs, weights=[p for *_, p in outs])[0]
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
    """Exact values plus a fixed per-state error of standard deviation ``noise`` (one
    number, or one per task), seeded: the same state always gets the same error, like
    a real critic."""

    row_wise: ClassVar[bool] = True  # a function of each context's state

    def __init__(
        self,
        mdps: Sequence[TreeMDP],
        noise: float | Sequence[float] = 0.0,
        seed: int = 0,
        gamma: float = 1.0,
        report_std: bool = False,
    ) -> None:
        self.values = [m.values(gamma) for m in mdps]
        self.noises = [float(noise)] * len(mdps) if isinstance(noise, (int, float)) else [float(x) for x in noise]
        if len(self.noises) != len(mdps):
            raise ValueError(f"SyntheticCritic got {len(self.noises)} noise levels for {len(mdps)} tasks")
        self.seed, self.report_std = seed, report_std

    def value(self, task: int, s: int) -> float:
        noise = self.noises[task]
        err = random.Random(hash((self.seed, task, s))).gauss(0.0, noise) if noise else 0.0
        return self.values[task][s] + err

    async def predict(self, contexts: Sequence[Sequence[int]]) -> list[float]:
        return [self.value(*read_state(c)) for c in contexts]

    async def predict_with_std(self, contexts: Sequence[Sequence[int]]) -> list[Prediction]:
        out = []
        for c in contexts:
            task, s = read_state(c)
            out.append(Prediction(self.value(task, s), self.noises[task] if self.report_std else None))
        return out
