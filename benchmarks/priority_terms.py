"""Selective's predicted error change of one more continuation against a simulation.

For one cell of ``benchmarks/estimator_quality.py`` (family, budget, critic, seed), the
collection is stopped part-way through its continuation budget (``--fraction``). At up
to ``--per-depth`` eligible checkpoints per depth of every tree, the terms of
:class:`focus.priority.Selective`'s score (the new segments, the existing child
segments, the segments above, the critic targets) are set beside their simulated
values: ``--samples`` continuations from the checkpoint drawn from the MDP, each grafted
onto a copy of the tree, the tree valued again with the ranking's own noise model, and
the change of the summed squared error (advantages token-weighted in units of the mean
segment, critic targets weighted by m) against the exact advantages and values, split
by where it lands. ``--exact`` replaces the fitted noise model by the MDPs' own (s(d),
ν(d), t(d) on-policy per depth), which tests the model's terms apart from the fit.
``--fit N`` prints the fit itself instead: the noise model the estimator fits on the
collection (``noise_model`` of every tree, stopped at ``--fraction``) per depth beside the
MDPs' own, as the mean and the median over seeds 0..N−1, on ``--method``'s trees; a fit
whose median is far below its mean is read off a few heavy outcomes. ``--own-depth N``
reads the fit at each task's own decisive depth (families with one, ``decisive``) beside
the collection's exact s(D) and the task's own (:func:`own_depth`).
Means per depth are printed; ``_only`` columns are Selective's own (the new child
weighed as an only child: the view's ``fresh_error`` and ``chain_error``), the others
weigh it as the estimator weighs a sibling (:func:`as_sibling`). docs/findings/estimator-issue31.md
("Which terms of the ranking's model are off") reads them.

    .venv/bin/python -m benchmarks.priority_terms --family heavy_tail --critic noise_1 --exact
    .venv/bin/python -m benchmarks.priority_terms --family heavy_tail --critic noise_1 --method uniform --fraction 1 --fit 22
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
from collections import defaultdict
from typing import Any

import benchmarks.estimator_quality as eq
from focus.backups import critic_weight, value_influence
from focus.calibration import Calibration
from focus.critic import Critic
from focus.estimation import NoiseModel, critic_targets, noise_model, tree_values
from focus.node_view import node_evidence
from focus.priority import NodeEvidence, Selective
from focus.search import SearchState, copy_tree
from focus.synthetic import TreeMDP, read_state
from focus.synthetic_hard import depths
from focus.tree import Tree, Turn

#: The terms of the score (Selective's own "new" is ``new_only``). The simulation also reports ``rest``, the change on every
#: other segment, and two parts of it: ``anc``, the segments on the path above n's
#: parent (the model's "above" stops at the parent), and ``below``, those below n's
#: existing children.
TERMS = ("new", "kids", "above", "targets")


def collect_part(
    family: str, budget: int, critic: str, seed: int, fraction: float, n_tasks: int = 6, method: str = "selective"
) -> Any:
    """:func:`benchmarks.estimator_quality.search_state` with ``method``'s search
    (Selective unless told), stopped after ``fraction`` of the continuation budget: the
    state, search, MDPs, exact values, family, step limit and critic."""
    _, state, search, mdps, values, fam, max_steps, crit = eq.search_state(
        (family, n_tasks, budget, critic, method, seed), fraction=fraction
    )
    return state, search, mdps, values, fam, max_steps, crit


#: The fitted model's parts :func:`fit_bias` compares with the MDPs' own, by depth.
FIT_PARTS = {
    "s": NoiseModel.step_var,
    "a": NoiseModel.action_var,
    "nu": NoiseModel.noise_var,
    "t": NoiseModel.critic_error_at,
}


def fit_bias(args: argparse.Namespace) -> dict[str, list[tuple[float, float, float]]]:
    """Per part of the noise model (:data:`FIT_PARTS`) and depth: the mean and the
    median over seeds 0..``args.fit``−1 of the estimator's fit on the collection
    (``noise_model`` of every tree), and the mean of the MDPs' own (:func:`exact_noise`)."""
    fitted: dict[str, list[list[float]]] = defaultdict(list)
    exact: dict[str, list[list[float]]] = defaultdict(list)
    for seed in range(args.fit):
        state, _, mdps, values, fam, _, crit = collect_part(
            args.family, args.budget, args.critic, seed, args.fraction, method=args.method
        )
        model = noise_model(state.trees, gamma=fam.gamma)
        own = exact_noise(mdps, values, fam.gamma, crit, model)
        for name, part in FIT_PARTS.items():
            fitted[name].append([part(model, d) for d in range(len(own.step_vars))])
            exact[name].append([part(own, d) for d in range(len(own.step_vars))])
    out: dict[str, list[tuple[float, float, float]]] = {}
    for name in FIT_PARTS:
        depth = min(len(r) for r in fitted[name])
        out[name] = [
            (
                statistics.fmean(r[d] for r in fitted[name]),
                statistics.median(r[d] for r in fitted[name]),
                statistics.fmean(r[d] for r in exact[name]),
            )
            for d in range(depth)
        ]
    return out


def own_depth(args: argparse.Namespace) -> dict[str, float]:
    """At each task's decisive depth D (seeds 0..``args.own_depth``−1, six tasks each,
    ``method``'s trees at ``fraction``): the means over tasks of the fitted s(D), the
    collection's exact s(D) (pooled per depth, as the fit) and the task's own exact s(D);
    the fit's and the task's own mean over the task's other depths; and the share of
    tasks whose fitted s(D) is below a quarter of the collection's exact one. One model
    per collection reads each decision diluted by the tasks that decide elsewhere; this
    says by how much more the fit misses (docs/findings/estimator-issue31.md, "Each task's own s(d)")."""
    sums: dict[str, list[float]] = defaultdict(list)
    for seed in range(args.own_depth):
        state, _, mdps, values, fam, _, crit = collect_part(
            args.family, args.budget, args.critic, seed, args.fraction, method=args.method
        )
        model = noise_model(state.trees, gamma=fam.gamma)
        pooled = exact_noise(mdps, values, fam.gamma, crit, model)
        for i, m in enumerate(mdps):
            own, at = exact_noise([m], [values[i]], fam.gamma, crit, model, [i]), m.decisive
            other = [d for d in range(len(own.step_vars)) if d != at]
            sums["fit"].append(model.step_var(at))
            sums["exact_pooled"].append(pooled.step_var(at))
            sums["exact_own"].append(own.step_var(at))
            sums["fit_other"].append(statistics.fmean(model.step_var(d) for d in other))
            sums["exact_own_other"].append(statistics.fmean(own.step_var(d) for d in other))
            sums["below_quarter"].append(float(model.step_var(at) < pooled.step_var(at) / 4))
    return {k: statistics.fmean(v) for k, v in sums.items()}


def predict(critic: Critic, task: int, s: int) -> float:
    value = critic.value  # type: ignore[attr-defined]
    return float(value(task, s)) if callable(value) else float(value)


def exact_noise(
    mdps: list[TreeMDP],
    values: list[list[float]],
    gamma: float,
    critic: Critic,
    fitted: NoiseModel,
    tasks: list[int] | None = None,
) -> NoiseModel:
    """The MDPs' own noise model: per depth, on-policy, the variance of ``r + γV(s')``
    around V(s), the part the actions' Q values spread (a), and the critic's error.
    ``tasks``: the critic's task index of each MDP (their positions unless told)."""
    sums: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for ti, m, v in zip(tasks or range(len(mdps)), mdps, values, strict=True):
        visits, dep = m.visits(), depths(m)
        for s, w in enumerate(visits):
            if m.terminal(s) or not w:
                continue
            qs = [m.q(s, a, v, gamma) for a in range(len(m.probs[s]))]
            spread = sum(p * (q - v[s]) ** 2 for p, q in zip(m.probs[s], qs, strict=True))
            step = sum(
                pa * sum(p * (r + gamma * v[n] - v[s]) ** 2 for n, r, p in m.outcomes[s][a])
                for a, pa in enumerate(m.probs[s])
            )
            row = sums[dep[s]]
            for k, x in enumerate((step, spread, (predict(critic, ti, s) - v[s]) ** 2, 1.0)):
                row[k] += w * x
    rows = [sums[d] for d in range(max(sums) + 1)]
    s_ = tuple(r[0] / r[3] if r[3] else 0.0 for r in rows)
    nu = tuple((r[0] - r[1]) / r[3] if r[3] else 0.0 for r in rows)
    t_ = tuple(r[2] / r[3] if r[3] else 0.0 for r in rows)
    return dataclasses.replace(
        fitted, step_vars=s_, noise_vars=nu, critic_vars=t_, critic_var=sum(t_) / len(t_), shared=0.0
    )


def continue_once(
    tree: Tree, nid: int, mdp: TreeMDP, task: int, critic: Critic, max_steps: int, rng: random.Random
) -> tuple[Tree, list[int]]:
    """A copy of ``tree`` with one rollout from checkpoint ``nid`` drawn from the MDP
    (one node per transition, as the agent makes them), and the new edges' ids."""
    t = copy_tree(tree)
    node = t.nodes[nid]
    s = read_state(node.context_ids)[1]
    parent, steps, new = nid, node.steps, list[int]()
    while True:
        a = rng.choices(range(len(mdp.probs[s])), weights=mdp.probs[s])[0]
        outs = mdp.outcomes[s][a]
        nxt, r, _ = rng.choices(outs, weights=[p for *_, p in outs])[0]
        turn = Turn((), (48 + a, *([46] * (max(1, mdp.tokens[s][a]) - 1)), 0), (), 1, "stop", reward=r)
        steps += 1
        kind = "terminal" if mdp.terminal(nxt) else "truncated" if steps >= max_steps else "checkpoint"
        child = t.add_node(parent, (turn,), kind, steps=steps, context_ids=tuple(f"task={task} s={nxt}".encode()))
        child.value = None if kind == "terminal" else predict(critic, task, nxt)
        new.append(len(t.edges) - 1)
        if kind != "checkpoint":
            return t, new
        parent, s = child.id, nxt


def errors(
    tree: Tree, mdp: TreeMDP, exact: list[float], noise: NoiseModel, gamma: float, unit: float
) -> tuple[dict[int, float], float]:
    """Each segment's token-weighted squared advantage error (in mean segments) and the
    summed critic-target error, against the exact values."""
    tv = tree_values(tree, gamma=gamma, noise=noise)
    out = {}
    for e in tree.edges.values():
        vc, vp = tv.value.get(e.child), tv.value.get(e.parent)
        if vc is None or vp is None:
            continue
        s = read_state(tree.nodes[e.parent].context_ids)[1]
        adv = e.discounted_reward(gamma) + gamma**e.k * vc - vp
        out[e.id] = e.n_tokens / unit * (adv - mdp.advantage(s, e.turns[0].completion_ids[0] - 48, exact, gamma)) ** 2
    targets = 0.0
    for nid, c in critic_targets(tree, gamma=gamma).items():
        if c.weight:
            targets += c.weight * (c.target - exact[read_state(tree.nodes[nid].context_ids)[1]]) ** 2
    return out, targets


def as_sibling(ev: NodeEvidence, calib: Calibration, n: int) -> tuple[float, float]:
    """(noise of the new child segment, summed error of the segments below it) with the
    new child, the head of the fresh chain, weighed as the estimator weighs the
    ``n + 1``-th child of a checkpoint: with the influence of the segments above it,
    ``ι = γ²·n/(n + 1)`` (:func:`focus.backups.value_influence`), where the view's
    ``fresh_error`` and ``chain_error`` weigh it as an only child (λ = a/(a + e + t))."""
    noise, gamma = calib.noise, calib.gamma
    length = max(int(round(ev.expected_transitions)) - 1, 0)
    if n <= 0 or not length:
        return ev.fresh_error, ev.chain_error
    d = ev.depth + 1
    a, t = noise.action_var(d), noise.critic_error_at(d)
    e = noise.noise_var(d) + gamma * gamma * calib.fresh_chain(d + 1, length - 1).head_error
    only = critic_weight(a, a + e, t, 0.0)
    lam = critic_weight(a, a + e, t, value_influence(gamma, n + 1))
    value = (lam * lam - only * only) * t + ((1 - lam) ** 2 - (1 - only) ** 2) * (a + e)
    segment = (lam * lam - only * only) * (e + t) + ((1 - lam) ** 2 - (1 - only) ** 2) * a
    return ev.fresh_error + gamma * gamma * value, ev.chain_error + segment


def predicted(sel: Selective, ev: NodeEvidence, calib: Calibration) -> dict[str, float]:
    """The terms of ``sel(ev)`` (before the division by expected transitions), and the
    new segments' with the new child weighed as a sibling (:func:`as_sibling`)."""
    n, e = ev.m + ev.pending, ev.child_error
    fresh, chain = as_sibling(ev, calib, n)
    per_child = ev.child_tokens / ev.m if ev.m else 1.0
    kids = n * per_child * (sel.segment_error(ev, n + 1, e) - sel.segment_error(ev, n, e)) if n else 0.0
    return {
        "head_only": sel.segment_error(ev, n + 1, ev.fresh_error),
        "new_only": sel.segment_error(ev, n + 1, ev.fresh_error) + ev.chain_error,
        "head": sel.segment_error(ev, n + 1, fresh),
        "new": sel.segment_error(ev, n + 1, fresh) + chain,
        "kids": kids,
        "above": ev.influence * (sel.error(ev, n + 1) - sel.error(ev, n)),
        "targets": ev.target_weight * sel.target_change(ev),
    }


def simulated(
    tree: Tree, nid: int, env: tuple[Any, ...], base: tuple[dict[int, float], float], samples: int, rng: random.Random
) -> dict[str, float]:
    """Mean changes over ``samples`` continuations from ``nid``, split by where they land."""
    mdp, exact, task, critic, max_steps, noise, gamma, unit, weight = env
    node = tree.nodes[nid]
    kids = set(node.children)
    above = set(tree.nodes[tree.edges[node.parent_edge].parent].children) if node.parent_edge is not None else set()
    anc = {e.id for e in tree.path_to(nid)} - above
    below, stack = set(), [tree.edges[x].child for x in kids]
    while stack:
        for x in tree.nodes[stack.pop()].children:
            below.add(x)
            stack.append(tree.edges[x].child)
    acc: dict[str, float] = defaultdict(float)
    for _ in range(samples):
        t2, new = continue_once(tree, nid, mdp, task, critic, max_steps, rng)
        errs, targets = errors(t2, mdp, exact, noise, gamma, unit)

        def change(ids: set[int], errs: dict[int, float] = errs) -> float:
            return sum(errs.get(x, 0.0) - base[0].get(x, 0.0) for x in ids)

        acc["head"] += errs.get(new[0], 0.0)
        acc["new"] += sum(errs.get(x, 0.0) for x in new)
        acc["kids"] += change(kids)
        acc["above"] += change(above)
        acc["rest"] += change(set(base[0]) - kids - above)
        acc["anc"] += change(anc)
        acc["below"] += change(below)
        acc["targets"] += weight * (targets - base[1])
    return {k: v / samples for k, v in acc.items()}


def run(args: argparse.Namespace) -> dict[int, list[dict[str, float]]]:
    state, search, mdps, values, fam, max_steps, crit = collect_part(
        args.family, args.budget, args.critic, args.seed, args.fraction
    )
    assert isinstance(state, SearchState) and isinstance(search, Selective)
    calib = state.calibration(search)
    if args.exact:
        calib = dataclasses.replace(calib, noise=exact_noise(mdps, values, fam.gamma, crit, calib.noise), _chains={})
    rng = random.Random(args.seed)
    rows: dict[int, list[dict[str, float]]] = defaultdict(list)
    for ti, tree in enumerate(state.trees):
        views = node_evidence(tree, ti, search.values(tree, calib.noise), calib)
        env = (
            mdps[ti],
            values[ti],
            ti,
            crit,
            max_steps,
            calib.noise,
            fam.gamma,
            calib.mean_tokens,
            calib.target_weight,
        )
        base = errors(tree, mdps[ti], values[ti], calib.noise, fam.gamma, calib.mean_tokens)
        by_depth: dict[int, list[int]] = defaultdict(list)
        for nid, ev in views.items():
            if ev.branches < search.phases[1].max_branches and nid in tree.states and tree.nodes[nid].steps < max_steps:
                by_depth[ev.depth].append(nid)
        for d, nids in sorted(by_depth.items()):
            for nid in rng.sample(nids, min(args.per_depth, len(nids))):
                ev = views[nid]
                p = predicted(search, ev, calib)
                a = simulated(tree, nid, env, base, args.samples, rng)
                rows[d].append(
                    {"cost": ev.expected_transitions}
                    | {f"p_{k}": v for k, v in p.items()}
                    | {f"a_{k}": v for k, v in a.items()}
                )
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="heavy_tail", choices=sorted(eq.ALL_FAMILIES))
    ap.add_argument("--critic", default="noise_1", choices=eq.CRITICS)
    ap.add_argument("--budget", type=int, default=6, help="in multiples of H")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--fraction", type=float, default=0.5, help="share of the continuation budget run first")
    ap.add_argument("--samples", type=int, default=64, help="simulated continuations per checkpoint")
    ap.add_argument("--per-depth", type=int, default=8, help="checkpoints per depth and tree")
    ap.add_argument("--exact", action="store_true", help="the MDPs' own noise model instead of the fitted one")
    ap.add_argument(
        "--fit", type=int, default=0, help="print the fitted model against the exact one over this many seeds"
    )
    ap.add_argument(
        "--own-depth", type=int, default=0, help="print the fit at each task's decisive depth over this many seeds"
    )
    ap.add_argument("--method", default="selective", choices=("selective", "uniform"), help="whose trees --fit reads")
    args = ap.parse_args(argv)
    if not 0 < args.fraction <= 1:
        ap.error(f"--fraction must be in (0, 1], got {args.fraction}")
    if args.samples < 1 or args.per_depth < 1 or args.budget < 1 or args.fit < 0 or args.own_depth < 0:
        ap.error("--samples, --per-depth and --budget must be at least 1, --fit and --own-depth at least 0")
    if args.own_depth:
        print(" | ".join(f"{k} {v:.4f}" for k, v in own_depth(args).items()))
        return
    if args.fit:
        print_fit(fit_bias(args))
        return
    rows = run(args)
    cols = ["p_head_only", "p_head", "a_head", "p_new_only", "p_new", "a_new"]
    cols += [f"{w}_{k}" for k in ("kids", "above") for w in "pa"]
    cols += ["a_rest", "a_anc", "a_below", "p_targets", "a_targets"]
    print("| depth | checkpoints | " + " | ".join(cols) + " | predicted / transition | simulated / transition |")
    print("|" + " --- |" * (len(cols) + 4))
    for d, rs in sorted(rows.items()):
        mean = {k: sum(r[k] for r in rs) / len(rs) for k in rs[0]}
        p = sum(mean[f"p_{k}"] for k in ("new_only", *TERMS[1:]))
        a = sum(mean[f"a_{k}"] for k in (*TERMS, "rest"))
        cells = " | ".join(f"{mean[k]:.4f}" for k in cols)
        print(f"| {d} | {len(rs)} | {cells} | {p / mean['cost']:.4f} | {a / mean['cost']:.4f} |")


def print_fit(parts: dict[str, list[tuple[float, float, float]]]) -> None:
    """:func:`fit_bias`'s table: a row per part of the model, its depths in columns."""
    depths_ = len(next(iter(parts.values())))
    print("| part | " + " | ".join(str(d) for d in range(depths_)) + " |")
    print("|" + " --- |" * (depths_ + 1))
    for name, cols in parts.items():
        for i, what in enumerate(("mean", "median", "exact")):
            print(f"| {name} {what} | " + " | ".join(f"{c[i]:.3f}" for c in cols) + " |")


if __name__ == "__main__":
    main()
