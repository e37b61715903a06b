"""The library's learning signals against a second implementation written from
docs/algorithm.md alone (tests/fixtures/reference.py: a plain recursion over nested
trees), on hand-built trees that hold what collections produce: branching at several
depths with unequal sibling counts, γ < 1, terminal, truncated (bootstrapped or
counted as terminal), failed and unscored leaves, multi-turn segments with parse errors
and compactions between transitions, a segment without turns (the context limit), one
token segments, a single unbranched rollout, rewards at the last step only or at every
step. Then the same trees through ``Collector.prepare`` and a Parquet write, read back
with polars: every actor and critic row."""

from __future__ import annotations

import copy
import json
import math
import random
import statistics
from collections import Counter

import polars as pl
import pytest
from fixtures.reference import (
    Noise,
    RNode,
    Seg,
    Step,
    backup,
    cp,
    direct_td,
    edges,
    failed,
    grpo,
    node_mc,
    nodes,
    seg,
    targets,
    term,
    trunc,
)

from focus.agent import Agent
from focus.branching import SparseCheckpoints
from focus.collector import Collector
from focus.critic import ConstantCritic, Critic
from focus.env import Env, EnvError, Message, Reset, StepResult, Task
from focus.estimation import DirectBranchTd, GroupNormalized, NodeMonteCarlo, NoiseModel, critic_targets, tree_values
from focus.format import ByteCodec
from focus.policy import Completion, Policy
from focus.priority import Phase, Selective, Uniform
from focus.testing import ScriptedPolicy, run
from focus.toy import ReachTarget, toy_format
from focus.tree import Tree, Turn
from storage import BatchStore

# --- trees ------------------------------------------------------------------------------------


def unbranched_last_reward() -> RNode:
    """One rollout, three checkpoints, the reward at the last step only."""
    return cp(0.3, seg(cp(0.4, seg(cp(0.6, seg(term(), Step(1.0)))))))


def unbranched_per_step_truncated() -> RNode:
    """One rollout with a reward at every step, cut by max_steps (bootstraps on v̂ = 0.8)."""
    return cp(0.1, seg(cp(0.2, seg(cp(0.5, seg(trunc(0.8), Step(0.25))), Step(0.5))), Step(0.25)))


def branched() -> RNode:
    """Branching at depths 0, 1 and 2 with 4, 2 and 3 children; every kind of leaf; a
    checkpoint whose only continuation failed (it keeps v̂) and one without a prediction
    whose continuation failed too (no value: its segment gets nothing)."""
    deep = cp(
        0.45,
        seg(term(), Step(1.0)),
        seg(term(), Step(0.0), Step(0.0, transition=False), Step(0.5)),  # a parse error between transitions
        seg(trunc(0.9), Step(0.2), Step(0.2)),
    )
    left = cp(0.5, seg(deep, Step(0.1)), seg(term(), Step(0.0)))
    return cp(
        0.35,
        seg(left),
        seg(cp(0.7, seg(failed(), Step(0.3))), Step(0.0)),  # only continuation failed: V = v̂
        seg(cp(None, seg(failed())), Step(0.4)),  # nothing known below, no prediction
        seg(trunc(0.25), Step(0.1, tokens=1)),  # one-token segment
        seg(failed(), Step(0.2), Step(0.2)),
    )


def multi_turn() -> RNode:
    """Sparse checkpoints: segments of several turns, compactions (mask 0, no transition),
    a checkpoint whose next prompt no longer fits (a truncated child without a turn), a
    truncated leaf the critic never scored."""
    mid = cp(
        0.6,
        seg(trunc(0.55), Step(0.0), Step(0.0, transition=False, kind="compaction", mask=0, tokens=5), Step(0.3)),
        Seg([], trunc(0.6)),  # context limit right at the checkpoint: no turn, no transition
        seg(term(), Step(0.0), Step(1.0)),
        seg(trunc(None), Step(0.5)),  # never scored: no value under bootstrap, 0 under terminal
    )
    return cp(0.2, seg(mid, Step(0.0), Step(0.5), Step(0.0, transition=False)), seg(term(), Step(0.0), Step(0.0)))


TREES = {
    "unbranched_last_reward": unbranched_last_reward,
    "unbranched_per_step_truncated": unbranched_per_step_truncated,
    "branched": branched,
    "multi_turn": multi_turn,
}


def to_tree(root: RNode, task: str = "t") -> Tree:
    """The focus Tree of ``root`` (idents of nodes and segments set to the tree's ids).
    Each turn's prompt extends the previous turn's prompt and completion by observation
    tokens (9, 9), as ``Segments`` contexts do; log-probs differ per token."""
    tree = Tree.new(task, None, (1, 2, 3))
    tree.root.value = root.v_hat
    root.ident = 0
    counter = [0]

    def grow(n: RNode, prompt: tuple[int, ...]) -> None:
        for s in n.children:
            turns, p = [], prompt
            for st in s.steps:
                counter[0] += 1
                ids = tuple(100 + (counter[0] * 7 + i) % 150 for i in range(st.tokens))
                lps = tuple(-0.01 * (counter[0] + i) for i in range(st.tokens))
                turns.append(Turn(p, ids, lps, st.mask, "stop", st.kind, st.reward, st.transition))
                p = (*p, *ids, 9, 9)
            c = s.child
            node = tree.add_node(n.ident, tuple(turns), c.kind, steps=0, context_ids=p if c.kind != "terminal" else ())
            node.value = c.v_hat
            c.ident, s.ident = node.id, node.parent_edge  # type: ignore[assignment]
            grow(c, p)

    grow(root, (1, 2, 3))
    return tree


CASES = [
    (name, gamma, kappa, truncation)
    for name in TREES
    for gamma in (1.0, 0.9, 0.5)
    for kappa in (0.0, 1.0, 3.0)
    for truncation in ("bootstrap", "terminal")
]


@pytest.mark.parametrize(("name", "gamma", "kappa", "truncation"), CASES)
def test_values_advantages_targets_and_baselines_match_the_reference(name, gamma, kappa, truncation):
    root = TREES[name]()
    tree = to_tree(root)
    backup(root, gamma, kappa=kappa, truncation=truncation)
    est = DirectBranchTd(gamma=gamma, kappa=kappa, truncation=truncation)
    tv = est.values(tree)
    for n in nodes(root):
        got = tv.value[n.ident]
        assert (got is None) == (n.value is None), n.ident
        if n.value is not None:
            assert got == pytest.approx(n.value, abs=1e-12), n.ident
    want = direct_td(root, gamma)
    got = est.advantages(list(tree.edges.values()), tv)
    assert set(got) == set(want)
    assert got == pytest.approx(want, abs=1e-12)
    tg = targets(root, gamma, truncation)
    lib = critic_targets(tree, gamma=gamma, truncation=truncation)
    assert set(lib) == set(tg)
    for i, c in lib.items():
        assert (c.target, c.weight) == pytest.approx(tg[i], abs=1e-12), i
    # the baselines
    for scale in (True, False):
        g = GroupNormalized(gamma=gamma, kappa=kappa, truncation=truncation, scale=scale)
        lib_g = g.advantages(list(tree.edges.values()), g.values(tree))
        assert lib_g == pytest.approx(grpo(root, gamma, scale=scale, truncation=truncation), abs=1e-9)
    mc = NodeMonteCarlo(gamma=gamma, kappa=kappa, truncation=truncation)
    assert mc.advantages(list(tree.edges.values()), mc.values(tree)) == pytest.approx(
        node_mc(root, gamma, truncation), abs=1e-12
    )


NOISES = [
    # s(d), ν(d), t(d) by depth: a critic better early than late; an env random at depth 1
    Noise((0.04, 0.02, 0.03, 0.01), (0.0, 0.015, 0.005, 0.0), (0.002, 0.01, 0.05, 0.05)),
    # an exact critic (t = 0) and a noiseless env: λ = 1 wherever the critic predicts
    Noise((0.05,), (0.0,), (0.0,)),
    # a critic far worse than the evidence: λ near 0
    Noise((0.01, 0.02), (0.005, 0.0), (4.0,)),
]


@pytest.mark.parametrize("noise", NOISES)
@pytest.mark.parametrize("gamma", [1.0, 0.8])
@pytest.mark.parametrize("truncation", ["bootstrap", "terminal"])
@pytest.mark.parametrize("name", list(TREES))
def test_the_critic_weight_of_a_given_noise_model_matches_the_reference(name, truncation, gamma, noise):
    """λ(n) from s(d), ν(d), t(d) as docs/algorithm.md derives it, at every depth of trees
    whose segments hold several transitions (their later ones add ``γ^{2i}s(d)``), whose
    children's errors back up from below and whose checkpoints weigh the segments above
    (ι from the parent's valid children): the weights, values, errors and advantages."""
    root = TREES[name]()
    tree = to_tree(root)
    backup(root, gamma, noise=noise, truncation=truncation)
    model = NoiseModel(tuple(noise.s), 0.02, tuple(noise.nu), critic_vars=tuple(noise.t))
    tv = tree_values(tree, gamma=gamma, noise=model, truncation=truncation)
    for n in nodes(root):
        if n.kind != "checkpoint" or n.value is None:
            continue
        assert tv.critic_weight[n.ident] == pytest.approx(n.lam, abs=1e-12), n.ident
        assert tv.value[n.ident] == pytest.approx(n.value, abs=1e-12), n.ident
        assert tv.error[n.ident] == pytest.approx(n.err, abs=1e-12), n.ident
    est = DirectBranchTd(gamma=gamma, truncation=truncation)
    assert est.advantages(list(tree.edges.values()), tv) == pytest.approx(direct_td(root, gamma), abs=1e-12)
    # an unknown model (no spreads, no usable residuals) is the plain backup
    plain = copy.deepcopy(TREES[name]())
    backup(plain, gamma, kappa=0.0, truncation=truncation)
    tv0 = tree_values(to_tree(plain), gamma=gamma, noise=NoiseModel.unknown(), truncation=truncation)
    assert [tv0.value[n.ident] for n in nodes(plain)] == pytest.approx([n.value for n in nodes(plain)], abs=1e-12)


def _collector(estimator) -> Collector:
    agent = Agent(ScriptedPolicy(["1"]), ReachTarget(), toy_format())
    return Collector(agent, Uniform(), ConstantCritic(0.0), estimator, collection_id="ref")


@pytest.mark.parametrize("kappa", [1.0, None])
def test_the_written_batch_holds_the_reference_numbers_row_for_row(tmp_path, kappa):
    """Collector.prepare over every hand tree (one collection, so a fitted noise model sees
    them all), written to Parquet and read back with polars: one actor row per turn of
    each segment with an advantage (failed and unvalued segments left out), its ids,
    log-probs and mask as recorded, the reference's advantage on every turn of the
    segment, each turn's own reward, ``truncated`` on the segments that end in a
    truncated leaf; one critic row per checkpoint with the λ = 0 target and weight m."""
    gamma = 0.9
    est = DirectBranchTd(gamma=gamma, kappa=kappa)
    roots = {name: make() for name, make in TREES.items()}
    trees = [to_tree(root, name) for name, root in roots.items()]
    col = _collector(est)
    batch = col.prepare(trees)
    url = BatchStore(str(tmp_path)).write(batch)
    files = BatchStore(str(tmp_path)).parquet_files(url, "actor")
    actor = pl.read_parquet(files).sort("tree_id", "edge_id", "turn_index")
    critic = pl.read_parquet(BatchStore(str(tmp_path)).parquet_files(url, "critic")).sort("tree_id", "node_id")
    if kappa is None:
        nm = est.noise(trees)
        assert nm.known
        depths = range(8)
        noise = Noise(
            tuple(nm.step_var(d) for d in depths),
            tuple(nm.noise_var(d) for d in depths),
            tuple(nm.critic_error_at(d) for d in depths),
        )
    want_actor, want_critic = [], []
    for ti, (name, root) in enumerate(roots.items()):
        tree, tree_id = trees[ti], f"{name}#{ti}"
        backup(root, gamma, kappa=kappa, noise=None if kappa is not None else noise)
        adv = direct_td(root, gamma)
        for p, s in edges(root):
            if s.ident not in adv:
                continue
            for j, turn in enumerate(tree.edges[s.ident].turns):
                want_actor.append(
                    {
                        "tree_id": tree_id,
                        "task_id": name,
                        "node_id": p.ident,
                        "edge_id": s.ident,
                        "turn_index": j,
                        "kind": s.steps[j].kind,
                        "prompt_ids": list(turn.prompt_ids),
                        "completion_ids": list(turn.completion_ids),
                        "logprobs": list(turn.logprobs),
                        "loss_mask": [s.steps[j].mask] * s.steps[j].tokens,
                        "advantage": adv[s.ident],
                        "reward": s.steps[j].reward,
                        "truncated": s.child.kind == "truncated",
                    }
                )
        for n, (target, weight) in targets(root, gamma).items():
            node = next(x for x in nodes(root) if x.ident == n)
            want_critic.append((tree_id, n, target, weight, node.v_hat, list(tree.nodes[n].context_ids)))
    want_actor.sort(key=lambda r: (r["tree_id"], r["edge_id"], r["turn_index"]))
    left_out = sum(1 for root in roots.values() for _p, s in edges(root) if s.ident not in direct_td(root, gamma))
    assert batch.stats["excluded_segments"] == left_out == 5
    got = actor.drop("collection_id", "iteration", "policy_version", "finish_reason").to_dicts()
    assert len(got) == len(want_actor)
    for g, w in zip(got, want_actor, strict=True):
        assert g["advantage"] == pytest.approx(w.pop("advantage"), abs=1e-12), g
        assert {k: g[k] for k in w} == w
    assert set(actor["collection_id"]) == {"ref"}
    want_critic.sort(key=lambda r: (r[0], r[1]))
    assert len(critic) == len(want_critic)
    for row, (tree_id, n, target, weight, v_hat, ctx) in zip(critic.iter_rows(named=True), want_critic, strict=True):
        assert (row["tree_id"], row["node_id"], row["weight"], row["prediction"]) == (tree_id, n, weight, v_hat)
        assert row["target"] == pytest.approx(target, abs=1e-12) and row["context_ids"] == ctx


@pytest.mark.parametrize("kappa", [0.0, 2.0, None])
@pytest.mark.parametrize("name", list(TREES))
def test_sibling_advantages_average_to_the_critics_share_of_the_disagreement(name, kappa):
    """Σ_j A(e_j)/m = Q̄(p) − V(p) = λ(p)·(Q̄(p) − v̂(p)) over a checkpoint's valid
    children: zero for a plain backup (λ = 0), so an only child backed up with λ = 0 gets
    exactly 0 (docs/algorithm.md, "Advantages"); with λ > 0 the siblings share the
    critic's correction. Failed children are not among them."""
    gamma = 0.9
    tree = to_tree(TREES[name]())
    model = NoiseModel(NOISES[0].s, 0.02, NOISES[0].nu, critic_vars=NOISES[0].t)
    tv = tree_values(tree, gamma=gamma, kappa=kappa, noise=model if kappa is None else None)
    adv = DirectBranchTd(gamma=gamma, kappa=kappa).advantages(list(tree.edges.values()), tv)
    checked = 0
    for node in tree.checkpoints():
        kids = [eid for eid in node.children if eid in adv]
        if not kids or tv.value[node.id] is None:
            continue
        assert len(kids) == tv.m[node.id]
        lam, v_hat = tv.critic_weight[node.id], node.value
        shift = lam * (tv.q_bar[node.id] - v_hat) if v_hat is not None else 0.0
        assert sum(adv[e] for e in kids) / len(kids) == pytest.approx(shift, abs=1e-12)
        if kappa == 0.0:
            assert sum(adv[e] for e in kids) == pytest.approx(0.0, abs=1e-12)
            if len(kids) == 1:
                assert adv[kids[0]] == 0.0
        checked += 1
    assert checked >= 2


def test_group_normalized_is_deepseekmaths_outcome_supervision_with_the_population_std():
    """G independent rollouts from the root (each of two segments): every segment of
    rollout i gets (R_i − mean R)/(std R + 1e-6), std the population standard deviation
    (ddof 0; verl's compute_grpo_outcome_advantage takes torch.std, ddof 1, which is
    sqrt(G/(G−1)) times larger, and gives a group of one its raw return, FOCUS 0); scale=False only centres (Dr. GRPO). A truncated
    rollout's return bootstraps on v̂ like any value; a failed one is not in the group."""
    rewards = [1.0, 0.0, 0.0, 1.0, 0.5]
    root = cp(
        0.5,
        *[seg(cp(0.5, seg(term(), Step(r))), Step(0.0)) for r in rewards],
        seg(cp(0.5, seg(trunc(0.4), Step(0.1))), Step(0.0)),
        seg(cp(0.5, seg(failed(), Step(1.0))), Step(0.0)),
    )
    tree = to_tree(root)
    returns = [*rewards, 0.1 + 0.4]
    mu = sum(returns) / len(returns)
    sd = math.sqrt(sum((r - mu) ** 2 for r in returns) / len(returns))
    g = GroupNormalized()
    adv = g.advantages(list(tree.edges.values()), g.values(tree))
    for i, s in enumerate(root.children[:6]):
        want = (returns[i] - mu) / (sd + 1e-6)
        assert adv[s.ident] == pytest.approx(want, rel=1e-12)
        assert adv[s.child.children[0].ident] == pytest.approx(want, rel=1e-12)
    # the failed rollout's first segment reaches no complete path: no advantage
    assert root.children[6].ident not in adv and root.children[6].child.children[0].ident not in adv
    centred = GroupNormalized(scale=False)
    assert centred.advantages(list(tree.edges.values()), centred.values(tree))[root.children[0].ident] == (
        pytest.approx(1.0 - mu, rel=1e-12)
    )
    assert grpo(root, 1.0, ddof=1)[root.children[0].ident] != pytest.approx(adv[root.children[0].ident], rel=1e-3)
    alone = to_tree(cp(0.5, seg(term(), Step(1.0)), seg(failed())))
    assert g.advantages(list(alone.edges.values()), g.values(alone)) == {0: 0.0}


@pytest.mark.parametrize("reward", [1.0, 0.1, 0.0])
@pytest.mark.parametrize("eps", [1e-6, 0.0])
def test_group_normalized_gives_a_group_whose_returns_are_all_equal_zero_advantages(reward, eps):
    """All-success or all-failure groups are GRPO's commonest: no signal. With ``eps=0``
    a group of returns 1.0 stopped the collection with a bare ZeroDivisionError, and
    returns 0.1, whose mean rounds to 0.10000000000000002, gave every segment -1.0 (a
    rounding error over a spread of 1.4e-17); with the default eps, -1.4e-11. A negative
    or non-finite eps is refused where the estimator is made."""
    # two rollouts through the first checkpoint (its mean return may round too), one alone
    root = cp(
        0.5,
        seg(cp(0.5, *[seg(term(), Step(reward)) for _ in range(2)]), Step(0.0)),
        seg(cp(0.5, seg(term(), Step(reward))), Step(0.0)),
    )
    tree = to_tree(root)
    for scale in (True, False):
        g = GroupNormalized(eps=eps, scale=scale)
        adv = g.advantages(list(tree.edges.values()), g.values(tree))
        assert len(adv) == 5 and set(adv.values()) == {0.0}
    for bad in (-1e-6, math.nan, math.inf):
        with pytest.raises(ValueError, match="eps"):
            GroupNormalized(eps=bad)


def test_an_infinite_kappa_is_refused_before_a_collection_runs():
    """κ → ∞ is λ = 1 (V = v̂: one-step TD on the critic), but κ/(κ + m) at κ = ∞ is
    ∞/∞: every refined value was NaN, and ``Collector.prepare`` refused the batch only
    after the whole collection had run. Refused where it is set; a large finite κ is the
    limit the reference computes."""
    from pydantic import ValidationError

    from tasks.config import FocusConfig

    for bad in (math.inf, math.nan):
        with pytest.raises(ValidationError, match="finite"):
            DirectBranchTd(kappa=bad)
        with pytest.raises(ValidationError, match="finite"):
            FocusConfig.model_validate({"estimator": {"kappa": bad}})
        with pytest.raises(ValidationError, match="finite"):  # a search built with its own κ
            Selective(kappa=bad)
    root = branched()
    tree = to_tree(root)
    backup(root, 0.9, kappa=math.inf)
    tv = tree_values(tree, gamma=0.9, kappa=1e15)
    assert [tv.value[n.ident] for n in nodes(root)] == pytest.approx([n.value for n in nodes(root)], abs=1e-12)


# --- a collection in process: parse errors, env failures, both truncations -------------------


class DigitPolicy(Policy):
    """Answers by the sampling seed: ``x`` (a parse error) or a digit, then the stop id;
    log-probs differ per token and per call."""

    vocab_size = ByteCodec.vocab_size

    async def sample(self, prompt_ids, params):
        text = ["x", "2", "3", "4", "5", "1"][params.seed % 6]
        ids = (*text.encode(), ByteCodec.EOT)
        return Completion(ids, tuple(-0.05 * (i + 1) - (params.seed % 11) / 100 for i in range(len(ids))), "stop")


class BrittleReach(ReachTarget):
    """The toy task whose step raises when the total would be 6 (a failed env step)."""

    async def step(self, state, action, workspace):
        out = await super().step(state, action, workspace)
        if out.state.total == 6:
            raise EnvError("the tool crashed at 6")
        return out


class LengthCritic(Critic):
    async def predict(self, contexts):
        return [len(c) / 200 for c in contexts]


def test_a_collection_with_parse_errors_env_failures_and_both_truncations_matches_the_reference(tmp_path):
    """An in-process collection whose rollouts hit everything at once: two-turn segments
    (sparse checkpoints), parse errors inside them (a step, not a transition: not
    discounted, reward 0, its message shown back), env steps that raise (failed leaves:
    their segments are not in the batch), max_steps and context-limit truncations (the
    latter right at a checkpoint: a segment without a turn), a critic whose predictions
    differ per state, γ = 0.8 and the fitted noise model. The Parquet (polars) holds the
    reference's advantages and targets, and what the tokens say: a turn is a transition
    exactly when its completion holds a digit, rewards follow the env's rule, a
    truncated segment bootstraps on the critic's prediction of its leaf's context."""
    codec = toy_format().codec
    agent = Agent(
        DigitPolicy(),
        BrittleReach(),
        toy_format(),
        branch_points=SparseCheckpoints(every=2),
        max_steps=6,
        max_prompt_tokens=80,
    )
    phases = (
        Phase("evidence", rollouts_per_task=4),
        Phase("continue", transitions=40, wave_size=8, max_branches=3, max_depth=4),
    )
    col = Collector(agent, Uniform(phases=phases), LengthCritic(), DirectBranchTd(gamma=0.8), collection_id="a")
    state = run(col.search([Task(f"t{i}", {"target": 9 + i}) for i in range(3)]))
    trees = state.trees
    store = BatchStore(str(tmp_path))
    url = store.write(col.prepare(state))
    actor = pl.read_parquet(store.parquet_files(url, "actor"))
    critic = pl.read_parquet(store.parquet_files(url, "critic"))

    nm = col.estimator.noise(trees)
    noise = Noise(*(tuple(f(d) for d in range(8)) for f in (nm.step_var, nm.noise_var, nm.critic_error_at)))
    want, want_targets, segs = {}, {}, {}
    for ti, tree in enumerate(trees):
        root, tid = from_tree(tree), f"{tree.task_id}#{ti}"
        backup(root, 0.8, noise=noise)
        want.update({(tid, e): a for e, a in direct_td(root, 0.8).items()})
        want_targets.update({(tid, n): tw for n, tw in targets(root, 0.8).items()})
        segs.update({(tid, s.ident): (tree, s) for _p, s in edges(root)})
    kinds = Counter(s.child.kind for _t, s in segs.values())
    turnless = sum(1 for _t, s in segs.values() if not s.steps)
    parse_errors = sum(1 for _t, s in segs.values() for st in s.steps if not st.transition)
    assert min(kinds["failed"], kinds["truncated"], kinds["terminal"], turnless, parse_errors) >= 2, kinds

    rows = actor.sort("tree_id", "edge_id", "turn_index").iter_rows(named=True)
    seen = set()
    for r in rows:
        key = (r["tree_id"], r["edge_id"])
        seen.add(key)
        tree, s = segs[key]
        assert r["advantage"] == pytest.approx(want[key], abs=1e-12)
        assert r["truncated"] == (s.child.kind == "truncated")
        text = codec.decode(r["completion_ids"])
        assert s.steps[r["turn_index"]].transition == any(c in "123456789" for c in text)
        assert len(r["logprobs"]) == len(r["loss_mask"]) == len(r["completion_ids"]) and set(r["loss_mask"]) == {1}
        prompt = codec.decode(r["prompt_ids"])
        target = int(prompt.split("Reach ")[1].split(".")[0])
        total = int(prompt.rsplit("Total ", 1)[1].split(".")[0])
        digit = next((int(c) for c in text if c in "123456789"), 0)
        assert r["reward"] == (1.0 if digit and total + digit == target else 0.0)
        turn = tree.edges[r["edge_id"]].turns[r["turn_index"]]
        if not turn.transition:  # the parse error's message is what the model sees next
            assert turn.observation == "Say one digit 1-9."
    # every segment with an advantage and a turn; a turnless one carries no token to train
    assert seen == {k for k in want if segs[k][1].steps}
    assert not any(segs[k][1].child.kind == "failed" for k in seen)
    # truncated leaves: bootstrapped on the critic's prediction of their own context,
    # the context limit's beyond max_prompt_tokens
    for tree, s in segs.values():
        if s.child.kind == "truncated":
            leaf = tree.nodes[s.child.ident]
            assert s.child.value == len(leaf.context_ids) / 200
            assert (leaf.cause == "context limit") == (len(leaf.context_ids) > 80)
    got_targets = {(r["tree_id"], r["node_id"]): (r["target"], r["weight"]) for r in critic.iter_rows(named=True)}
    assert got_targets.keys() == want_targets.keys()
    for k, tw in want_targets.items():
        assert got_targets[k] == pytest.approx(tw, abs=1e-12)


class SeedDigits(Policy):
    """A digit 1-8 by the sampling seed: odd and even equally often."""

    vocab_size = ByteCodec.vocab_size

    async def sample(self, prompt_ids, params):
        return Completion((ord("1") + params.seed % 8, ByteCodec.EOT), (-1.0, -0.1), "stop")


class Fork(Env):
    """An odd first move ends the episode at once with reward 0; an even one leads to four
    more steps and reward 1. V(root) = 1/2 exactly."""

    async def reset(self, task, workspace):
        return Reset(-1, (Message("user", "Go."),))

    async def step(self, state, action, workspace):
        if state < 0:
            odd = int(action.text) % 2 == 1
            return StepResult(0 if odd else 4, "End." if odd else "Long.", 0.0, odd)
        return StepResult(state - 1, f"{state - 1} left.", 1.0 if state == 1 else 0.0, state == 1)


def test_per_node_monte_carlo_is_biased_under_uniform_branching_and_the_backup_is_not():
    """Uniform branching spreads continuations over eligible checkpoints, and a rollout
    that went the long way made more of them: the long branch gets most continuations,
    so the mean return of every rollout through the root (NodeMonteCarlo's V_MC) leans
    to its outcome, though no choice looked at a return. Backing up through children
    counts each child once. Measured over 200 seeded trees (true value 0.5): V_MC 0.755
    (standard error 0.011), the λ = 0 backup 0.498 (0.006)."""
    agent = Agent(SeedDigits(), Fork(), toy_format(), max_steps=8)
    phases = (
        Phase("evidence", rollouts_per_task=2),
        Phase("continue", transitions=12 * 200, wave_size=400, max_branches=4),
    )
    col = Collector(agent, Uniform(phases=phases), ConstantCritic(0.0), DirectBranchTd(kappa=0.0))
    trees = run(col.search([Task(f"t{i}", {}) for i in range(200)])).trees
    mc = [NodeMonteCarlo(kappa=0.0).values(t).mc[0] for t in trees]
    backed = [DirectBranchTd(kappa=0.0).values(t).value[0] for t in trees]
    se = statistics.stdev(backed) / math.sqrt(len(backed))
    assert abs(statistics.mean(backed) - 0.5) < 3 * se
    assert statistics.mean(mc) - 0.5 > 0.15  # about 20 standard errors


# --- a real collection ------------------------------------------------------------------------


def from_tree(tree: Tree) -> RNode:
    """The reference's tree of a focus Tree (the data only: kinds, predictions, turns)."""

    def node(i: int) -> RNode:
        n = tree.nodes[i]
        r = RNode(n.kind, n.value, ident=i)
        for eid in n.children:
            e = tree.edges[eid]
            steps = [Step(t.reward, t.transition, len(t.completion_ids), t.kind, t.loss_mask) for t in e.turns]
            r.children.append(Seg(steps, node(e.child), eid))
        return r

    return node(tree.ROOT)


COLLECT_TOML = """
collection_id = "ref"
progress = false
[env]
n_tasks = 4
[agent]
max_steps = 5
branch_points = "sparse"
[estimator]
gamma = 0.9
[storage]
root = "runs"
"""


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_a_focus_collect_batch_read_with_duckdb_holds_the_reference_numbers(tmp_path, monkeypatch):
    """``focus collect`` with the embedded tiny model on the toy task (γ = 0.9, sparse
    checkpoints: segments of two model turns with the env's observation between them,
    max_steps 5: truncated leaves, the constant critic's 0.5 to bootstrap on, the noise
    model fitted from the collection), its Parquet read back with DuckDB, against the
    reference computed on the trees replayed from the run's checkpoints (no model call):
    each row's advantage; rewards as the env defines them (1 where the digits said so far
    land on the target, read off the token ids); truncated segments bootstrap on v̂ and
    terminal ones do not; critic targets and weights; token positions: a segment's first
    prompt is its checkpoint's critic context, each later turn's prompt extends the
    previous prompt and completion by the observation ``Total N.``, log-probs and mask
    one per completion token, each log-prob the model's for its own token."""
    import asyncio
    import subprocess
    import sys

    import duckdb
    from fixtures.prefect import base_env

    from focus.journal import Journal
    from storage import CheckpointStore
    from storage.errors import CheckpointNotFound
    from tasks.config.sources import load_config
    from tasks.journal import checkpoint_key

    (tmp_path / "cfg.toml").write_text(COLLECT_TOML)
    done = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "-c", "cfg.toml", "--transitions", "60", "--json"],
        cwd=tmp_path,
        env=base_env(tmp_path / "prefect"),
        capture_output=True,
        text=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    url = json.loads(done.stdout.strip().splitlines()[-1])["batch_url"]
    store = BatchStore(str(tmp_path / "runs"))
    rows = duckdb.sql(
        "select tree_id, node_id, edge_id, turn_index, prompt_ids, completion_ids, logprobs, loss_mask, advantage, "
        "reward, truncated, finish_reason from read_parquet($f) order by tree_id, edge_id, turn_index",
        params={"f": store.parquet_files(url, "actor")},
    ).fetchall()
    crit = duckdb.sql(
        "select tree_id, node_id, context_ids, target, weight, prediction from read_parquet($f)",
        params={"f": store.parquet_files(url, "critic")},
    ).fetchall()

    # the trees, replayed from the run's checkpoints
    monkeypatch.chdir(tmp_path)
    cfg = load_config("cfg.toml")
    saved = CheckpointStore(cfg.storage.root)

    class Replay(Journal):
        async def recorded(self, step):
            try:
                return saved.load(cfg.collection_id, *checkpoint_key(cfg, step))
            except CheckpointNotFound:
                return None

        async def record(self, step, value):
            raise AssertionError(f"{step} was not saved by the run")

    agent, tasks = cfg.build_agent(ScriptedPolicy(["1"]))
    col = cfg.build_collector(agent)
    trees = asyncio.run(col.search(tasks, Replay())).trees
    assert sum(len(t.edges) for t in trees) == len({(r[0], r[2]) for r in rows})  # nothing failed or left out
    nm = col.estimator.noise(trees)
    depths = range(8)
    noise = Noise(
        tuple(nm.step_var(d) for d in depths),
        tuple(nm.noise_var(d) for d in depths),
        tuple(nm.critic_error_at(d) for d in depths),
        nm.known,
    )
    gamma = 0.9
    want: dict[tuple[str, int], float] = {}
    want_targets: dict[tuple[str, int], tuple[float, float]] = {}
    kinds: dict[tuple[str, int], RNode] = {}
    weights = []
    for ti, tree in enumerate(trees):
        root, tid = from_tree(tree), f"{tree.task_id}#{ti}"
        backup(root, gamma, noise=noise)
        want.update({(tid, e): a for e, a in direct_td(root, gamma).items()})
        want_targets.update({(tid, n): tw for n, tw in targets(root, gamma).items()})
        kinds.update({(tid, s.ident): s.child for _p, s in edges(root)})
        weights += [n.lam for n in nodes(root) if n.kind == "checkpoint" and n.children]
    assert {"terminal", "truncated"} <= {c.kind for c in kinds.values()}
    assert nm.known and max(weights) > 0.05  # the critic's weight is in play

    context = {(t, n): list(ctx) for t, n, ctx, *_ in crit}
    codec = toy_format().codec
    prev: tuple | None = None
    for tid, node, edge, j, prompt, completion, logprobs, mask, adv, reward, truncated, _fr in rows:
        assert adv == pytest.approx(want[(tid, edge)], abs=1e-12)
        assert truncated == (kinds[(tid, edge)].kind == "truncated")
        assert len(logprobs) == len(mask) == len(completion) and all(m == 1 for m in mask)
        assert all(lp <= 0.0 for lp in logprobs)
        if j == 0:
            assert prompt == context[(tid, node)]  # the critic reads what the continuation was sent
        else:
            assert prev is not None and prev[0] == (tid, edge, j - 1)
            p_prompt, p_completion, p_total = prev[1], prev[2], prev[3]
            assert prompt[: len(p_prompt) + len(p_completion)] == p_prompt + p_completion
            obs = codec.decode(prompt[len(p_prompt) + len(p_completion) :])
            assert f"Total {p_total}." in obs
        text = codec.decode(prompt)
        target = int(text.split("Reach ")[1].split(".")[0])
        before = int(text.rsplit("Total ", 1)[1].split(".")[0])
        digit = next(c for c in codec.decode(completion) if c in "123456789")
        now = before + int(digit)
        assert reward == (1.0 if now == target else 0.0)  # the env's rule, from the tokens alone
        prev = ((tid, edge, j), prompt, completion, now)
    # a truncated segment bootstraps on the critic (0.5 here), a terminal one on nothing
    for child in kinds.values():
        if child.kind != "checkpoint":
            assert child.value == (0.5 if child.kind == "truncated" else 0.0)
    assert len(crit) == len(want_targets)
    for tid, node, _ctx, target, weight, prediction in crit:
        assert (target, weight) == pytest.approx(want_targets[(tid, node)], abs=1e-12)
        assert prediction == 0.5
    # behaviour log-probs: logprobs[i] is the served model's log-probability of
    # completion[i] after prompt + completion[:i] (temperature 1), recomputed by a forward
    # of the training model on the committed weights
    from focus.tinylm.model import load, prompt_logprobs

    model = load()
    for *_ids, prompt, completion, logprobs, _mask, _adv, _r, _tr, _fr in rows:
        lp = prompt_logprobs(model, list(prompt) + list(completion))
        want_lp = [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(completion)]
        assert list(logprobs) == pytest.approx(want_lp, abs=1e-4)


def random_tree(rng: random.Random, depth: int = 0) -> RNode:
    """A checkpoint with 1-4 children of every kind, segments of 0-3 turns (some not
    transitions), predictions sometimes missing, rewards anywhere."""
    kids = []
    for _ in range(rng.randint(1, 4)):
        roll = rng.random()
        if depth < 4 and roll < 0.45:
            child = random_tree(rng, depth + 1)
        elif roll < 0.65:
            child = term()
        elif roll < 0.85:
            child = trunc(rng.uniform(-1, 1) if rng.random() < 0.8 else None)
        else:
            child = failed()
        steps = [
            Step(rng.choice([0.0, 0.0, 1.0, rng.uniform(-1, 1)]), rng.random() < 0.8, rng.randint(1, 3))
            for _ in range(rng.choice([0, 1, 1, 2, 3]))
        ]
        kids.append(Seg(steps, child))
    return cp(rng.uniform(-1, 1) if rng.random() < 0.85 else None, *kids)


def test_random_trees_match_the_reference():
    """300 seeded random trees, each under a random γ, truncation rule and either a fixed
    κ or a random noise model: values, critic weights, advantages, targets and both
    baselines as the reference computes them."""
    rng = random.Random(7)
    for _ in range(300):
        root = random_tree(rng)
        tree = to_tree(root)
        gamma, truncation = rng.choice([1.0, 0.95, 0.5]), rng.choice(["bootstrap", "terminal"])
        if rng.random() < 0.5:
            kappa, noise, model = rng.choice([0.0, 0.5, 4.0]), None, None
        else:
            s = tuple(rng.uniform(0, 0.1) for _ in range(5))
            noise = Noise(s, tuple(x * rng.random() for x in s), tuple(rng.uniform(0, 0.2) for _ in range(5)))
            kappa, model = None, NoiseModel(noise.s, 0.05, noise.nu, critic_vars=noise.t)
        backup(root, gamma, kappa=kappa, noise=noise, truncation=truncation)
        tv = tree_values(tree, gamma=gamma, kappa=kappa, noise=model, truncation=truncation)
        for n in nodes(root):
            assert (tv.value[n.ident] is None) == (n.value is None)
            if n.value is not None:
                assert tv.value[n.ident] == pytest.approx(n.value, abs=1e-9)
            if n.kind == "checkpoint" and n.value is not None and any(s.child.value is not None for s in n.children):
                assert tv.critic_weight[n.ident] == pytest.approx(n.lam, abs=1e-9)
        est = DirectBranchTd(gamma=gamma, kappa=kappa, truncation=truncation)
        assert est.advantages(list(tree.edges.values()), tv) == pytest.approx(direct_td(root, gamma), abs=1e-9)
        lib = critic_targets(tree, gamma=gamma, truncation=truncation)
        assert {i: (c.target, c.weight) for i, c in lib.items()} == {
            i: pytest.approx(tw, abs=1e-9) for i, tw in targets(root, gamma, truncation).items()
        }
        g = GroupNormalized(gamma=gamma, kappa=0.0, truncation=truncation)
        assert g.advantages(list(tree.edges.values()), g.values(tree)) == pytest.approx(
            grpo(root, gamma, truncation=truncation), abs=1e-6
        )
        mc = NodeMonteCarlo(gamma=gamma, kappa=0.0, truncation=truncation)
        assert mc.advantages(list(tree.edges.values()), mc.values(tree)) == pytest.approx(
            node_mc(root, gamma, truncation), abs=1e-9
        )
