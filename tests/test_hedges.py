"""benchmarks/hedges.py: the benchmark-only hedges of Selective. ``selective_unifirst``
places the first continuation wave uniformly (at 2H, the only wave, its batch is
uniform's) and ranks selectively once a checkpoint below a root has two children; the
explore variants are Selective with a larger exploration share."""

from __future__ import annotations

import math

import pytest

from benchmarks.estimator_quality import make_search, parse_args, run_one, search_state
from benchmarks.hedges import (
    HEDGE_METHODS,
    ChainMid,
    ChainMidHalf,
    HalfFirst,
    UniformFirst,
    branched_below_root,
    chain_midpoint,
    hedge_search,
)
from focus.noise import noise_model
from focus.priority import Phase, Selective
from focus.tree import Tree, Turn

KEYS = ("adv_mse", "target_mse", "transitions", "tokens")


def test_at_2h_the_first_wave_is_the_only_one_and_unifirst_collects_uniform_s_batch() -> None:
    job = ("heavy_tail", 3, 2, "biased", "{}", 1)
    uniform, selective, first = (
        run_one(job[:4] + (m,) + job[5:]) for m in ("uniform", "selective", "selective_unifirst")
    )
    assert selective["adv_mse"] != uniform["adv_mse"]  # otherwise the test could not fail
    for key in KEYS:
        assert first[key] == uniform[key], key


def test_from_the_second_wave_on_unifirst_ranks_like_selective_not_uniform() -> None:
    job = ("heavy_tail", 3, 6, "biased", "{}", 1)
    uniform, selective, first = (
        run_one(job[:4] + (m,) + job[5:]) for m in ("uniform", "selective", "selective_unifirst")
    )
    assert first["adv_mse"] != uniform["adv_mse"]
    assert first["adv_mse"] != selective["adv_mse"]  # the first wave differs from selective's


def test_branched_below_root_ignores_the_roots_spreads_and_the_segments_keep_drops() -> None:
    # 6H: two evidence rollouts per task branch every root, the continuations branch below
    _, state, search, *_ = search_state(("heavy_tail", 3, 6, "biased", "uniform", 1))
    trees = list(state.trees)
    assert branched_below_root(trees)
    assert not branched_below_root(trees, keep=lambda t, e: False)
    # the evidence segments only (those leaving a root): only the roots are branched
    assert not branched_below_root(trees, keep=lambda t, e: e.parent == t.ROOT)


def test_unifirst_s_calibration_is_the_unknown_model_until_something_below_a_root_branched() -> None:
    _, state, _, *_ = search_state(("heavy_tail", 3, 6, "biased", "uniform", 1))
    trees = list(state.trees)
    phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=100))
    first, plain = UniformFirst(phases=phases), Selective(phases=phases)
    assert first.calibrate(trees) == plain.calibrate(trees)
    evidence_only = lambda t, e: e.parent == t.ROOT  # noqa: E731
    c = first.calibrate(trees, evidence_only)
    assert not c.noise.known and math.isinf(c.noise.critic_at(0))
    assert plain.calibrate(trees, evidence_only).noise != c.noise


def test_the_hedges_are_named_methods_of_the_benchmark() -> None:
    assert parse_args(["--methods", ",".join(HEDGE_METHODS)]).methods == list(HEDGE_METHODS)
    phases = (Phase("evidence", rollouts_per_task=1), Phase("continue", transitions=10))
    assert hedge_search("selective_explore50", phases).explore == 0.5
    assert hedge_search("selective_explore100", phases).explore == 1.0
    assert type(make_search("selective_unifirst", 1, 10)[0]) is UniformFirst
    halved = hedge_search("selective_unifirst_w8", phases)
    assert type(halved) is UniformFirst and halved.phases[-1].wave_size == 8 and halved.phases[0] == phases[0]
    assert type(hedge_search("selective_halffirst", phases)) is HalfFirst
    assert type(hedge_search("selective_chainmid", phases)) is ChainMid
    assert type(hedge_search("selective_chainmid_half", phases)) is ChainMidHalf
    bounded = hedge_search("selective_depthshare3", phases)
    assert type(bounded) is Selective and bounded.depth_share_bound() == 3.0
    both = hedge_search("selective_chainmid_depthshare3", phases)
    assert type(both) is ChainMid and both.depth_share_bound() == 3.0
    unbounded = hedge_search("selective_nobound", phases)
    assert type(unbounded) is Selective and unbounded.depth_share_bound() == 0.0
    with pytest.raises(ValueError, match="unknown hedge"):
        hedge_search("selective_nothing", phases)


def test_the_depth_share_hedge_collects_another_batch_where_selective_concentrates() -> None:
    # long/6H: selective starts most continuations at the last depths; the bound spreads them
    job = ("long", 3, 6, "noise_1", "{}", 1)
    unbounded, bounded = (run_one(job[:4] + (m,) + job[5:]) for m in ("selective_nobound", "selective"))
    assert bounded["adv_mse"] != unbounded["adv_mse"]


def _coin_at_the_end(n: int) -> list[Tree]:
    """``n`` unbranched rollouts of 8 steps: seven rewards of variance 0.001, a last one
    of ±0.45 (an env coin, variance 0.2025), a critic nearly exact (seeded)."""
    import random

    rng = random.Random(1)
    trees = []
    for i in range(n):
        t = Tree.new(f"c{i}", None, (1,))
        node = t.root
        for step in range(1, 9):
            node.value = rng.gauss(0.0, 0.001)
            reward = rng.choice((-0.45, 0.45)) if step == 8 else rng.gauss(0.0, 0.001**0.5)
            turn = Turn((1,), (5, 5), (-0.5, -0.5), 1, "stop", reward=reward, transition=True)
            node = t.add_node(node.id, (turn,), "terminal" if step == 8 else "checkpoint", steps=step)
        trees.append(t)
    return trees


def test_the_chain_midpoint_splits_a_last_step_coin_the_library_gives_to_the_critic() -> None:
    """Every unbranched residual holds the last step's variance as it holds the critic's
    error: the library's fit (t free) gives a last-step coin of 0.2 all to t (s(7)
    0.002); the midpoint of that fit and the t = 0 one splits it (t about 0.10, s(7)
    about 0.09), the total kept."""
    trees = _coin_at_the_end(60)
    lib = noise_model(trees)
    mid = chain_midpoint(trees, 1.0, "bootstrap", None)
    assert mid is not None and lib.spreads == 0
    assert lib.critic_var > 0.18 and lib.step_var(7) < 0.01
    assert mid.critic_var < 0.15 and mid.step_var(7) > 0.05
    total = lambda m: m.critic_var + sum(m.step_var(d) for d in range(8))  # noqa: E731
    assert total(mid) == pytest.approx(total(lib), rel=0.15)
    assert mid.noise_var(7) == pytest.approx(mid.step_var(7) / 2, rel=1e-5)


def test_halffirst_plans_a_second_wave_at_2h_where_selective_plans_one() -> None:
    """At 2H the default continuation wave covers the whole budget; a wave planned before
    any spread that takes half of what is left leaves a second one."""
    waves = {}
    for method in ("selective", "selective_halffirst", "selective_chainmid_half"):
        _, state, *_ = search_state(("critical", 6, 2, "noise_1", method, 0))
        waves[method] = state.waves_done(1)
    assert waves["selective"] == 1
    assert waves["selective_halffirst"] == waves["selective_chainmid_half"] == 2
