"""Synthetic MDP families and critics made after issue 31, to look for where the ranking fails.

The issue-31 families (:mod:`focus.synthetic_hard`) were made in the image of the
held-out ones that had shown the failures, and the ranking was then worked on against
them. These five families and three critics were designed afterwards, each around a
structure no earlier family has, and run once before any change to the ranking, so
that what they show is what a family the project has never seen does to it
(``benchmarks/estimator_quality.py``; ``estimator_quality_unseen`` in
``benchmarks/QUALITY.md``):

* :func:`early_gate`: the decision that matters is the first; fifteen steps of a coin
  flip worth ±0.1 each follow, whose actions differ by a hundredth;
* :func:`risky_bridge`: at each of twelve steps a safe move or a risky one that pays a
  little now and may end the episode at once with a loss (episodes of every length);
* :func:`multi_key`: three key steps at random depths of twenty; the return is 1 only
  when every key was turned (a sparse success);
* :func:`wide`: six actions per step over five steps, a policy that favours a few of
  them, and a coin at the end whose chance every path sets (most of a step's variance
  in the last step's coin);
* :func:`gauss_noise`: every step pays its action's mean (±0.05) plus a near-Gaussian
  noise of deviation 0.3, γ = 0.95.

Critics (:func:`unseen_critic`): ``stale`` gives the values of another policy (the
uniform one: a critic fitted on an older policy's data); ``shrunk`` halfway between the
exact value and the on-policy mean value of the states at the same depth (a critic
regularised toward the mean); ``biased_early`` the depth's mean value up to a hidden
depth and the exact value after it (the mirror of ``biased``: it has not learnt what
the early states differ by); ``wrong_state`` exact everywhere but at the one state past
the root that episodes reach most often, where it is ten RMS advantages off (a state
it never saw in training, predicted with confidence; issue 31's "wrong where the
search does not look" at one state rather than one depth).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from focus.synthetic import Family, SyntheticCritic, Transition, TreeMDP, _dirichlet, build
from focus.synthetic_hard import depth_means, depths

#: Critics of :func:`unseen_critic`.
UNSEEN_CRITICS = ("stale", "shrunk", "biased_early", "wrong_state")
#: How far off ``wrong_state`` is at its state, in the task's RMS advantages.
WRONG_STATE_OFFSET = 10.0


def early_gate(seed: int, horizon: int = 16) -> TreeMDP:
    """The first step decides: its good action (probability 0.2-0.5) is worth 0.6 at the
    end. Then ``horizon − 1`` steps of two actions, each a fair coin worth ±0.1 that also
    moves a bounded position, the two actions 0.01 apart: later advantages are
    hundredths against a return deviation of about 0.4."""
    p_good = random.Random(seed).uniform(0.2, 0.5)

    def actions(key: tuple[int, int, int]) -> list[Transition]:
        t, gate, x = key
        if t == horizon:
            return []
        if t == 0:
            return [((1, 1, 0), 0.0, p_good, 3), ((1, 0, 0), 0.0, 1 - p_good, 4)]
        local = random.Random(hash((101, seed, t, gate, x)))
        probs = _dirichlet(local, 2, 2.0)
        bonus = 0.6 * gate if t + 1 == horizon else 0.0
        out: list[Transition] = []
        for a in range(2):
            outs = [((t + 1, gate, max(-3, min(3, x + dx))), 0.1 * dx + bonus + 0.01 * a, 0.5) for dx in (1, -1)]
            out.append((outs, probs[a], local.randint(2, 8)))
        return out

    return build((0, 0, 0), actions, "early_gate")


def risky_bridge(seed: int, horizon: int = 12) -> TreeMDP:
    """Twelve steps to cross, worth 1 at the far end. Each step: a safe move (nothing
    now) or a risky one that pays 0.08 now and, with a chance set per step (5-30%),
    ends the episode at once with −0.3."""
    rng = random.Random(seed)
    fail = [rng.uniform(0.05, 0.3) for _ in range(horizon)]

    def actions(key: tuple[int, ...]) -> list[Transition]:
        t = key[0]
        if len(key) > 1 or t == horizon:
            return []
        local = random.Random(hash((102, seed, t)))
        probs = _dirichlet(local, 2, 2.0)
        end = 1.0 if t + 1 == horizon else 0.0
        q = fail[t]
        safe = ((t + 1,), end, probs[0], local.randint(2, 6))
        risky = ([((t + 1, "fell"), -0.3, q), ((t + 1,), 0.08 + end, 1 - q)], probs[1], local.randint(2, 6))
        return [safe, risky]

    return build((0,), actions, "risky_bridge")


def multi_key(seed: int, horizon: int = 20, keys: int = 3) -> TreeMDP:
    """``keys`` key steps at random depths; at the i-th, turning the key (probability
    0.35-0.7) counts only if every earlier key was turned. The return is 1 when all
    were, plus 0.005 per unit of a position the other steps' second action raises."""
    rng = random.Random(seed)
    at = sorted(rng.sample(range(1, horizon - 1), keys))
    p_turn = [rng.uniform(0.35, 0.7) for _ in at]

    def end(t: int, turned: int, x: int) -> float:
        return (float(turned == keys) + 0.005 * x) if t + 1 == horizon else 0.0

    def actions(key: tuple[int, int, int]) -> list[Transition]:
        t, turned, x = key
        if t == horizon:
            return []
        if t in at:
            i = at.index(t)
            nk = turned + 1 if turned == i else turned
            return [
                ((t + 1, nk, x), end(t, nk, x), p_turn[i], 3),
                ((t + 1, turned, x), end(t, turned, x), 1 - p_turn[i], 5),
            ]
        local = random.Random(hash((103, seed, t, turned, x)))
        probs = _dirichlet(local, 2, 2.0)
        up = min(3, x + 1)
        return [
            ((t + 1, turned, x), end(t, turned, x), probs[0], local.randint(2, 8)),
            ((t + 1, turned, up), end(t, turned, up), probs[1], local.randint(2, 8)),
        ]

    return build((0, 0, 0), actions, "multi_key")


def wide(seed: int, horizon: int = 5, width: int = 6) -> TreeMDP:
    """``width`` actions per step for ``horizon`` steps (a full tree of paths), the
    policy drawn from a Dirichlet(0.5) per state (a few actions most of the time); the
    last action's path sets the chance (uniform in 0-1) of a coin worth 1."""

    def actions(path: tuple[int | str, ...]) -> list[Transition]:
        if len(path) >= horizon:
            return []
        local = random.Random(hash((104, seed, path)))
        probs = _dirichlet(local, width, 0.5)
        out: list[Transition] = []
        for a in range(width):
            nxt = (*path, a)
            if len(nxt) < horizon:
                out.append((nxt, 0.0, probs[a], local.randint(2, 8)))
                continue
            rate = random.Random(hash((105, seed, nxt))).uniform(0.0, 1.0)
            out.append(([((*nxt, "won"), 1.0, rate), ((*nxt, "lost"), 0.0, 1 - rate)], probs[a], local.randint(2, 8)))
        return out

    return build((), actions, "wide")


def gauss_noise(seed: int, horizon: int = 12) -> TreeMDP:
    """Two actions per step, each with its own mean reward (±0.05) plus a noise of
    deviation about 0.3 (five outcomes, binomial weights), which also moves a bounded
    position the means depend on."""
    weights = ((-2, 0.0625), (-1, 0.25), (0, 0.375), (1, 0.25), (2, 0.0625))

    def actions(key: tuple[int, int]) -> list[Transition]:
        t, x = key
        if t == horizon:
            return []
        local = random.Random(hash((106, seed, t, x)))
        probs = _dirichlet(local, 2, 2.0)
        out: list[Transition] = []
        for a in range(2):
            mean = local.uniform(-0.05, 0.05)
            outs = [((t + 1, max(-2, min(2, x + (z > 0) - (z < 0)))), mean + 0.3 * z, q) for z, q in weights]
            out.append((outs, probs[a], local.randint(2, 8)))
        return out

    return build((0, 0), actions, "gauss_noise")


UNSEEN_FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        Family("early_gate", early_gate, 1.0, 16, "the first step decides; 15 coin-flip steps follow"),
        Family("risky_bridge", risky_bridge, 1.0, 12, "risky steps may end the episode with a loss"),
        Family("multi_key", multi_key, 1.0, 20, "three key steps at random depths; sparse success"),
        Family("wide", wide, 1.0, 5, "six actions, a skewed policy, a coin at the end"),
        Family("gauss_noise", gauss_noise, 0.95, 12, "near-Gaussian reward noise at every step, γ = 0.95"),
    )
}


def unseen_critic(
    kind: str, mdps: Sequence[TreeMDP], gamma: float, seed: int, reach: int | None = None
) -> SyntheticCritic:
    """A :class:`SyntheticCritic` whose predictions follow ``kind``:

    * ``stale``: the exact values under the uniform policy (every action alike), not
      the policy that collects;
    * ``shrunk``: ``(V(s) + m(d)) / 2``, ``m(d)`` the on-policy mean value at s's depth;
    * ``biased_early``: ``m(d)`` at depths up to a hidden one (seeded per task, in the
      middle half of the depths a rollout reaches, at most ``reach``), ``V(s)`` after;
    * ``wrong_state``: ``V(s)``, but ``V(s*) + WRONG_STATE_OFFSET·scale`` at the state
      s* past the root (and before ``reach``) with the highest visit probability
      (lowest id on ties), ``scale`` the task's RMS advantage."""
    if kind not in UNSEEN_CRITICS:
        raise ValueError(f"unknown critic {kind!r} (known: {', '.join(UNSEEN_CRITICS)})")
    critic = SyntheticCritic(mdps, 0.0, seed=seed, gamma=gamma)
    table: list[list[float]] = []
    for i, (mdp, exact) in enumerate(zip(mdps, critic.values, strict=True)):
        if kind == "stale":
            uniform = tuple(tuple(1.0 / len(row) for _ in row) for row in mdp.probs)
            table.append(TreeMDP(mdp.outcomes, uniform, mdp.tokens).values(gamma))
            continue
        dep, means = depths(mdp), depth_means(mdp, exact)
        if kind == "wrong_state":
            table.append(_wrong_at_one_state(mdp, exact, dep, gamma, reach))
            continue
        if kind == "shrunk":
            table.append([0.5 * (v + means.get(d, v)) for v, d in zip(exact, dep, strict=True)])
            continue
        deepest = max(dep) if reach is None else min(max(dep), reach)
        cut = random.Random(f"biased_early/{seed}/{i}").randint(max(1, deepest // 4), max(1, 3 * deepest // 4))
        table.append([means.get(d, v) if d <= cut else v for v, d in zip(exact, dep, strict=True)])
    critic.values = table
    critic.noises = [0.0] * len(mdps)
    return critic


def _wrong_at_one_state(
    mdp: TreeMDP, exact: Sequence[float], dep: Sequence[int], gamma: float, reach: int | None
) -> list[float]:
    """``exact`` with the most visited state past the root (before ``reach``) moved by
    :data:`WRONG_STATE_OFFSET` RMS advantages (:func:`unseen_critic`, ``wrong_state``)."""
    visits = mdp.visits()
    states = [s for s, d in enumerate(dep) if d >= 1 and (reach is None or d < reach)]
    out = list(exact)
    if states:
        star = max(states, key=lambda s: (visits[s], -s))
        out[star] += WRONG_STATE_OFFSET * mdp.advantage_scale(gamma)
    return out
