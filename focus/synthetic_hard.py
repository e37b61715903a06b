"""Synthetic MDP families and critics built to break the estimator's assumptions.

Issue 31: on families the project had never seen, selective branching lost to uniform
branching where a critic is exact until a hidden event and wrong after it, and its
batch-MSE gains came partly from the batch's composition. These families and critics
are made in that image (designed here, not copies of the held-out ones), so that
``benchmarks/estimator_quality.py`` measures what those did:

* :func:`decisive`: a 32-step horizon with one decisive step at a random depth (per
  instance); every other step moves the return by a few hundredths;
* :func:`heavy_tail`: rewards with a rare large payoff (a heavy right tail) whose
  chance the actions change;
* :func:`truncated_walk`: episodes of 24 steps cut at 8 by the agent's step limit, so
  every leaf is truncated and bootstraps on the critic, siblings on the same states.

Critics (:func:`depth_critic`): ``biased`` is exact up to a hidden depth (the decisive
step's, or a random one per instance) and after it predicts the mean value of the
states at that depth (it knows the time, not the hidden fact that decided the return:
a systematic error shared by every state that agrees on it); ``early_late`` is good
early and noisy late (a per-state error whose deviation grows with depth, from 0 at
the root to 3x the task's RMS advantage at the horizon).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from focus.synthetic import Family, SyntheticCritic, Transition, TreeMDP, _dirichlet, build


def decisive(seed: int, horizon: int = 32) -> TreeMDP:
    """One decision at a random depth D (2..horizon−3) decides the return: its good
    action (probability 0.2-0.5) is worth 1 at the end, the other 0. Every other step
    chooses between holding and a drift of ±1 (a coin flip) on a position worth 0.01
    per unit at the end, so their advantages are a few hundredths. The decisive depth is
    :attr:`TreeMDP.decisive`."""
    rng = random.Random(seed)
    depth = rng.randint(2, horizon - 3)
    p_good = rng.uniform(0.2, 0.5)

    def actions(key: tuple[int, int, int]) -> list[Transition]:
        t, flag, x = key
        if t == horizon:
            return []
        local = random.Random(hash((seed, t, flag, x)))
        last = t + 1 == horizon
        if t == depth:
            out: list[Transition] = []
            for a, (nf, p) in enumerate(((1, p_good), (0, 1 - p_good))):
                end = nf + 0.01 * x if last else 0.0
                out.append(((t + 1, nf, x), end, p, 2 + a + local.randint(0, 6)))
            return out
        probs = _dirichlet(local, 2, 2.0)
        hold_end = flag + 0.01 * x if last else 0.0
        drift = []
        for dx in (1, -1):
            nx = max(-4, min(4, x + dx))
            drift.append(((t + 1, flag, nx), flag + 0.01 * nx if last else 0.0, 0.5))
        return [((t + 1, flag, x), hold_end, probs[0], local.randint(2, 8)), (drift, probs[1], local.randint(2, 8))]

    mdp = build((0, 0, 0), actions, "decisive")
    return TreeMDP(mdp.outcomes, mdp.probs, mdp.tokens, mdp.name, depth)


def heavy_tail(seed: int, horizon: int = 10) -> TreeMDP:
    """Ten steps, three actions each; every action pays a small reward (±0.02) and, with
    a chance the action sets (0.5%-4%), a payoff of 2 or, rarer still, 10: a return
    whose variance is dominated by a few rollouts, and a mean the actions move by
    hundredths. A walk position (push ±1) changes the chances a little."""
    rng = random.Random(seed)
    base = [rng.uniform(0.005, 0.04) for _ in range(3)]

    def actions(key: tuple[int, int]) -> list[Transition]:
        t, x = key
        if t == horizon:
            return []
        local = random.Random(hash((seed, t, x)))
        probs = _dirichlet(local, 3)
        out: list[Transition] = []
        for a, dx in enumerate((-1, 0, 1)):
            nx = max(-3, min(3, x + dx))
            p = base[a] * (1.0 + 0.15 * nx)
            small = 0.02 if local.random() < 0.5 else -0.02
            outs = [((t + 1, nx), 10.0, p * 0.1), ((t + 1, nx), 2.0, p * 0.9), ((t + 1, nx), small, 1.0 - p)]
            out.append((outs, probs[a], local.randint(2, 10)))
        return out

    return build((0, 0), actions, "heavy_tail")


#: Steps of :func:`truncated_walk`'s episodes and the agent's limit that cuts them.
TRUNCATED_LENGTH, TRUNCATED_AT = 24, 8


def truncated_walk(seed: int, horizon: int = TRUNCATED_LENGTH) -> TreeMDP:
    """A walk of ``horizon`` steps (left, stay, right, each slipping with probability
    0.2) that pays 0.05 per step spent at or above a target; the benchmark's agent stops
    at :data:`TRUNCATED_AT` steps, so every rollout ends truncated and its value past
    the cut comes from the critic."""
    rng = random.Random(seed)
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
                p = 0.8 if other == move else 0.1
                nx = max(-6, min(6, x + other))
                outs.append(((t + 1, nx), 0.05 * float(nx >= target), p))
            out.append((outs, probs[a], local.randint(2, 10)))
        return out

    return build((0, 0), actions, "truncated")


#: Held-out-style families (issue 31). ``horizon`` is the budget's unit (the most
#: transitions of a rollout the agent allows); ``max_steps`` the agent's limit.
HARD_FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("decisive", decisive, 1.0, 32, "32 steps, one decisive step at a random depth"),
        Family("heavy_tail", heavy_tail, 1.0, 10, "rare large payoffs (heavy-tailed rewards)"),
        Family(
            "truncated", truncated_walk, 1.0, TRUNCATED_AT, "24-step walk cut at 8 (truncated leaves)", TRUNCATED_AT
        ),
    )
}

#: Critics of :func:`depth_critic`.
DEPTH_CRITICS = ("biased", "early_late")


def depths(mdp: TreeMDP) -> list[int]:
    """Each state's depth (transitions from the start; states carry the time step, so
    every path to a state has the same length)."""
    d = [0] * len(mdp.outcomes)
    for s, row in enumerate(mdp.outcomes):
        for outs in row:
            for n, _, _ in outs:
                d[n] = d[s] + 1
    return d


def depth_means(mdp: TreeMDP, values: Sequence[float]) -> dict[int, float]:
    """The on-policy mean of ``values`` over the states at each depth a rollout reaches
    (weighted by how often an episode visits each state)."""
    num: dict[int, float] = {}
    den: dict[int, float] = {}
    for s, (d, p) in enumerate(zip(depths(mdp), mdp.visits(), strict=True)):
        num[d] = num.get(d, 0.0) + p * values[s]
        den[d] = den.get(d, 0.0) + p
    return {d: num[d] / den[d] for d in num if den[d]}


def event_depth(mdp: TreeMDP, seed: int, reach: int | None = None) -> int:
    """The depth after which the ``biased`` critic is wrong: just past the decisive step
    where the family has one, else a random depth in the middle half of the depths a
    rollout reaches (``reach``: the agent's step limit, when it cuts episodes)."""
    if mdp.decisive >= 0:
        return mdp.decisive + 1
    deepest = max(depths(mdp)) if reach is None else min(max(depths(mdp)), reach)
    return random.Random(f"event/{seed}").randint(max(1, deepest // 4), max(1, 3 * deepest // 4))


def depth_critic(
    kind: str, mdps: Sequence[TreeMDP], gamma: float, seed: int, reach: int | None = None
) -> SyntheticCritic:
    """A :class:`SyntheticCritic` whose per-state predictions follow ``kind``:

    * ``biased``: exact at depths up to :func:`event_depth`, then the on-policy mean
      value of the states at the same depth (a bias shared by every state on the same
      side of the hidden event);
    * ``early_late``: exact values plus a seeded per-state error of standard deviation
      ``3·scale·depth/deepest`` (``scale`` the task's RMS advantage, ``deepest`` the
      deepest state a rollout reaches, at most ``reach``)."""
    if kind not in DEPTH_CRITICS:
        raise ValueError(f"unknown depth critic {kind!r} (known: {', '.join(DEPTH_CRITICS)})")
    critic = SyntheticCritic(mdps, 0.0, seed=seed, gamma=gamma)
    scales = [m.advantage_scale(gamma) for m in mdps]
    table: list[list[float]] = []
    for i, (mdp, exact) in enumerate(zip(mdps, critic.values, strict=True)):
        dep = depths(mdp)
        if kind == "biased":
            cut = event_depth(mdp, 1000 * seed + i, reach)
            means = depth_means(mdp, exact)
            table.append([v if d <= cut or d not in means else means[d] for v, d in zip(exact, dep, strict=True)])
        else:
            deepest = (max(dep) if reach is None else min(max(dep), reach)) or 1
            rng = random.Random(f"early_late/{seed}/{i}")
            table.append([v + rng.gauss(0.0, 3.0 * scales[i] * d / deepest) for v, d in zip(exact, dep, strict=True)])
    critic.values = table
    critic.noises = [0.0] * len(mdps)
    return critic
