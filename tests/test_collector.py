"""Collector contract: step-wise API, determinism and resume, batch rows, failures."""

from __future__ import annotations

import copy
import pickle

import cloudpickle
import pytest

from focus.agent import Agent
from focus.batch import Batch
from focus.collector import Collector
from focus.context import Summarize
from focus.critic import ConstantCritic, Critic, CriticError, Prediction
from focus.env import Action, Env, EnvError, Message, Reset, StepResult, Task, accepts_seed
from focus.estimation import DirectBranchTd, NoiseModel, critic_targets
from focus.execution import Execution
from focus.format import ByteCodec, FinalAnswerParser, PolicyFormat
from focus.priority import Phase, Selective, Uniform
from focus.search import SearchState
from focus.synthetic import (
    FAMILIES,
    SHAPES,
    SyntheticCritic,
    SyntheticEnv,
    SyntheticPolicy,
    TreeMDP,
    build,
    synthetic_format,
)
from focus.testing import EnvConformance, ScriptedPolicy, run

PHASES = [
    Phase("evidence", rollouts_per_task=3),
    # waves of 8 jobs: several waves from a small budget
    Phase("continue", transitions=60, wave_size=8, max_branches=4, max_depth=8, wave_unit="jobs"),
]


def synthetic(seed: int = 0, search=None, critic_noise: float = 0.1, max_steps: int = 20, execution=None):
    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long"])]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=max_steps)
    tasks = [Task(f"t{i}", {"mdp": i}) for i in range(3)]
    col = Collector(
        agent,
        search or Selective(phases=PHASES),
        SyntheticCritic(mdps, critic_noise),
        DirectBranchTd(),
        execution or Execution(max_concurrency=4),
        collection_id="c1",
        iteration=2,
        seed=seed,
    )
    return col, tasks, mdps


def batch_key(batch):
    return (
        [(r.tree_id, r.edge_id, r.turn_index, r.completion_ids, round(r.advantage, 12)) for r in batch.actor],
        [(r.tree_id, r.node_id, round(r.target, 12), r.weight) for r in batch.critic],
    )


def test_stepwise_api_matches_collect_and_is_deterministic():
    col, tasks, _ = synthetic()
    whole = run(col.collect(tasks))

    async def steps():
        state = await col.run_evidence(tasks)
        state = await col.score(state)  # idempotent: nothing left unscored
        wave = 0
        while not (plan := col.plan_wave(state, 1, wave)).empty:
            assert all(j.seed == col.plan_wave(state, 1, wave).jobs[i].seed for i, j in enumerate(plan.jobs))
            state = await col.run_wave(state, plan)
            wave += 1
        return state

    state = run(steps())
    assert batch_key(col.prepare(state.trees)) == batch_key(whole)
    # the user's guide's two steps: search, look at the trees, then prepare
    searched = run(synthetic()[0].search(tasks))
    assert sum(len(t.nodes) for t in searched.trees) > len(tasks)
    assert batch_key(col.prepare(searched)) == batch_key(whole)
    assert batch_key(run(synthetic(seed=0)[0].collect(tasks))) == batch_key(whole)
    assert batch_key(run(synthetic(seed=1)[0].collect(tasks))) != batch_key(whole)


@pytest.mark.parametrize(("lag_spreads", "waves"), [(None, 1), (0, 1), (0, 2), (0, 3)])
def test_resume_from_a_pickled_state_reproduces_the_batch(lag_spreads, waves, monkeypatch):
    """Also with refits lagged (LAG_SPREADS 0: from the first fit on), where a resumed
    state fits again, from the trees, the calibrations the live run carried over from the
    state before each graft (focus.search.REFIT_LAG)."""
    if lag_spreads is not None:
        import focus.search.state as search_state

        monkeypatch.setattr(search_state, "LAG_SPREADS", lag_spreads)
    col, tasks, _ = synthetic(seed=3)
    whole = run(col.collect(tasks))

    async def interrupted():
        state = await col.run_evidence(tasks)
        for w in range(waves):
            state = await col.run_wave(state, col.plan_wave(state, 1, w))
        blob = cloudpickle.dumps(state)  # what the pipeline persists after a wave
        fresh, _, _ = synthetic(seed=3)  # a new process: new collector, same config
        state = pickle.loads(blob)
        wave = state.waves_done(1)
        while not (plan := fresh.plan_wave(state, 1, wave)).empty:
            state = await fresh.run_wave(state, plan)
            wave += 1
        return fresh.prepare(state)

    assert batch_key(run(interrupted())) == batch_key(whole)


def test_plan_is_pure_and_checks_wave_order():
    col, tasks, _ = synthetic()
    state = run(col.run_evidence(tasks))
    before = cloudpickle.dumps(state.trees)
    a, b = col.plan_wave(state, 1, 0), col.plan_wave(state, 1, 0)
    assert [(j.tree_index, j.node_id, j.seed, j.branch) for j in a.jobs] == [
        (j.tree_index, j.node_id, j.seed, j.branch) for j in b.jobs
    ]
    assert cloudpickle.dumps(state.trees) == before
    assert col.plan_wave(state, 0, 1).empty  # evidence is one wave
    with pytest.raises(ValueError, match="cannot plan wave 2"):
        col.plan_wave(state, 1, 2)
    with pytest.raises(ValueError, match="out of range"):
        col.plan_wave(state, 5, 0)
    new = run(col.run_wave(state, a))
    with pytest.raises(ValueError, match="already grafted"):
        run(col.run_wave(new, a))


def test_budget_accounting_is_exact():
    col, tasks, _ = synthetic()
    state = run(col.search(tasks))
    batch = col.prepare(state)
    ev, cont = batch.stats["phases"]
    trees_transitions = sum(t.stats()["transitions"] for t in state.trees)
    assert batch.stats["transitions"] == ev["transitions"] + cont["transitions"] == trees_transitions
    assert batch.stats["tokens"] == sum(t.stats()["tokens"] for t in state.trees) == batch.n_tokens
    assert ev["rollouts"] == 3 * len(tasks) and ev["waves"] == 1
    # the continuation phase stops launching once its budget is covered; launched
    # rollouts finish, so it overshoots by less than one wave of full rollouts
    assert 60 <= cont["transitions"] < 60 + 8 * 20
    last_wave = max(r.wave for t in state.trees for r in t.log if r.phase == 1)
    before_last = sum(r.usage.transitions for t in state.trees for r in t.log if r.phase == 1 and r.wave < last_wave)
    assert before_last < 60
    # branch limits hold
    for t in state.trees:
        for n in t.checkpoints():
            continued = sum(1 for r in t.log if r.node == n.id)
            assert continued <= 4 or n.id == t.ROOT


def test_batch_rows_cover_every_turn_with_the_segment_advantage():
    col, tasks, _ = synthetic()
    state = run(col.search(tasks))
    batch = col.prepare(state)
    n_turns = sum(len(e.turns) for t in state.trees for e in t.edges.values())
    assert len(batch.actor) == n_turns
    assert len(batch.critic) == sum(1 for t in state.trees for _ in t.checkpoints())
    est = DirectBranchTd()
    noise = est.noise(state.trees)  # fitted once on the whole collection
    for ti, t in enumerate(state.trees):
        adv = est.advantages(list(t.edges.values()), est.values(t, noise))
        for r in (r for r in batch.actor if r.tree_id == f"{t.task_id}#{ti}"):
            e = t.edges[r.edge_id]
            assert r.advantage == pytest.approx(adv[e.id])
            turn = e.turns[r.turn_index]
            assert r.completion_ids == turn.completion_ids and r.prompt_ids == turn.prompt_ids
            assert r.loss_mask == (1,) * len(r.completion_ids) and r.logprobs == turn.logprobs
    root_rows = [r for r in batch.critic if r.node_id == 0]
    assert all(r.weight >= 3 and r.prediction is not None for r in root_rows)


class _FlakyEnv(SyntheticEnv):
    """Fails on a fixed subset of (state, action) pairs."""

    async def step(self, state, action, workspace):
        if state[1] % 5 == 3:
            raise EnvError("simulated tool crash")
        return await super().step(state, action, workspace)


def test_failed_rollouts_are_excluded_and_counted():
    col, tasks, mdps = synthetic()
    col.agent.env = _FlakyEnv(mdps)
    state = run(col.search(tasks))
    batch = col.prepare(state)
    assert batch.stats["failed_rollouts"] > 0
    assert "env: simulated tool crash" in batch.stats["failure_causes"]
    failed_edges = {
        (f"{t.task_id}#{ti}", e.id)
        for ti, t in enumerate(state.trees)
        for e in t.edges.values()
        if t.nodes[e.child].kind == "failed"
    }
    assert failed_edges and not failed_edges & {(r.tree_id, r.edge_id) for r in batch.actor}
    assert batch.stats["excluded_segments"] >= len(failed_edges)
    # values stay finite and only valid children are backed up
    assert all(abs(r.advantage) < 10 for r in batch.actor)


class _Exploding(Execution):
    async def run(self, agent, jobs):
        async def boom(start, seed):
            if seed % 2:
                raise RuntimeError("kaboom")
            return await original(start, seed)

        original = agent.rollout
        agent.rollout = boom
        try:
            return await super().run(agent, jobs)
        finally:
            del agent.rollout


def test_a_crashing_job_becomes_a_failed_rollout_and_keeps_the_others():
    col, tasks, _ = synthetic(execution=_Exploding(max_concurrency=2))
    state = run(col.run_evidence(tasks))
    leaves = [r.leaf for t in state.trees for r in t.log]
    assert "failed" in leaves and set(leaves) - {"failed"}
    causes = {r.cause for t in state.trees for r in t.log if r.failed}
    assert causes == {"error: RuntimeError: kaboom"}


class _Counter(Env):
    """Reward 1 for answering the number of the step; the prompt grows every step."""

    async def reset(self, task, workspace):
        return Reset(0, (Message("user", "count"),))

    async def step(self, state, action: Action, workspace):
        return StepResult(state + 1, "more " * 10, float(action.text == str(state + 1)), state + 1 >= 4)


def test_compaction_turns_keep_their_mask_and_use_no_transition():
    codec = ByteCodec()
    agent = Agent(
        ScriptedPolicy(["Answer: 1", "Answer: 2"], codec),
        _Counter(),
        PolicyFormat(codec, FinalAnswerParser()),
        context=Summarize(max_prompt_tokens=120),
        max_steps=12,
    )
    col = Collector(
        agent,
        Uniform(phases=[Phase("evidence", rollouts_per_task=2), Phase("more", transitions=6, wave_size=2)]),
        ConstantCritic(0.5),
        collection_id="c",
        seed=0,
    )
    batch = run(col.collect([Task("a")]))
    comp = [r for r in batch.actor if r.kind == "compaction"]
    assert comp and all(set(r.loss_mask) == {0} for r in comp)
    assert batch.stats["compactions"] == len(comp)
    assert batch.stats["rollout_steps"] == batch.stats["transitions"] + batch.stats["compactions"]


def test_bad_configuration_fails_clearly():
    with pytest.raises(ValueError, match="rollouts_per_task .* or transitions"):
        Phase("x")
    with pytest.raises(ValueError, match="only the first phase"):
        Selective(phases=[Phase("a", transitions=3), Phase("b", rollouts_per_task=2)])
    col, _, _ = synthetic()
    with pytest.raises(ValueError, match="at least one task"):
        run(col.collect([]))


def test_configs_and_state_pickle():
    s = Selective(phases=PHASES, kappa=2.0)
    assert pickle.loads(pickle.dumps(s)) == s
    assert pickle.loads(pickle.dumps(Execution(max_concurrency=3))).max_concurrency == 3
    col, tasks, _ = synthetic()
    state = run(col.run_evidence(tasks))
    again = pickle.loads(pickle.dumps(state))
    assert isinstance(again, SearchState) and len(again.trees) == 3 and again.waves == [(0, 0)]


def stochastic(seed: int = 0, max_steps: int = 20):
    """Slippery walks: the same action from the same state may land in different states."""
    mdps = [FAMILIES["slippery"].make(i) for i in range(3)]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=max_steps)
    search = Selective(phases=[Phase("evidence", rollouts_per_task=3), Phase("more", transitions=80, wave_size=8)])
    col = Collector(agent, search, SyntheticCritic(mdps, 0.05), collection_id="s", seed=seed)
    return col, [Task(f"t{i}", {"mdp": i}) for i in range(3)]


def test_a_stochastic_env_replays_exactly_and_siblings_draw_independently():
    col, tasks = stochastic(seed=5)
    whole = run(col.collect(tasks))
    assert batch_key(run(stochastic(seed=5)[0].collect(tasks))) == batch_key(whole)

    async def resumed():
        state = await col.run_evidence(tasks)
        state = await col.run_wave(state, col.plan_wave(state, 1, 0))
        fresh, _ = stochastic(seed=5)
        state = pickle.loads(cloudpickle.dumps(state))
        wave = state.waves_done(1)
        while not (plan := fresh.plan_wave(state, 1, wave)).empty:
            state = await fresh.run_wave(state, plan)
            wave += 1
        return fresh.prepare(state), state

    batch, state = run(resumed())
    assert batch_key(batch) == batch_key(whole)
    # siblings that took the same action from one checkpoint: the env drew each its own outcome
    same, differ = 0, 0
    for t in state.trees:
        for n in t.checkpoints():
            firsts: dict = {}
            for e in t.child_edges(n.id):
                firsts.setdefault(e.turns[0].completion_ids[:1], set()).add(e.turns[0].observation)
                same += 1
            differ += sum(1 for obs in firsts.values() if len(obs) > 1)
    assert differ > 0, same
    # an env without the seed keyword is stepped as before (backward compatible)
    assert not accepts_seed(_FlakyEnv([])) and accepts_seed(SyntheticEnv([]))


def test_truncated_segments_are_flagged_counted_and_bootstrapped_or_terminal():
    col, tasks = stochastic(max_steps=4)  # slippery walks take 8 transitions: every rollout is cut
    state = run(col.search(tasks))
    batch = col.prepare(state)
    assert batch.stats["truncated_rollouts"] == batch.stats["rollouts"] > 0
    assert batch.stats["phases"][1]["truncated_rollouts"] == batch.stats["phases"][1]["rollouts"]
    flagged = {(r.tree_id, r.edge_id) for r in batch.actor if r.truncated}
    expected = {
        (f"{t.task_id}#{ti}", e.id)
        for ti, t in enumerate(state.trees)
        for e in t.edges.values()
        if t.nodes[e.child].kind == "truncated"
    }
    assert flagged == expected and flagged
    terminal = Collector(
        col.agent,
        col.priority.model_copy(update={"truncation": None}),
        col.critic,
        DirectBranchTd(truncation="terminal"),
        collection_id="s",
        seed=0,
    )
    other = terminal.prepare(state)
    assert terminal.priority.truncation == "terminal"
    moved = [a for a, b in zip(batch.actor, other.actor, strict=True) if a.truncated and a.advantage != b.advantage]
    assert moved  # a truncated leaf counted as terminal (value 0) instead of the critic's prediction


def test_search_and_estimator_share_one_gamma():
    col, _, _ = synthetic()
    est = DirectBranchTd(gamma=0.9)
    c = Collector(col.agent, Selective(phases=PHASES), col.critic, est)
    assert c.priority.gamma == 0.9 and c.priority.truncation == "bootstrap"
    with pytest.raises(ValueError, match="differs from the estimator"):
        Collector(col.agent, Selective(phases=PHASES, gamma=0.5), col.critic, est)


class TestStochasticSyntheticEnv(EnvConformance):
    def make_env(self):
        return SyntheticEnv([FAMILIES["slippery"].make(0)])

    def make_task(self):
        return Task("t0", {"mdp": 0})

    def make_action(self):
        return Action("text", text="2")


def test_the_heap_stays_frozen_for_the_whole_collection_and_is_released_after():
    """With ``freeze_gc`` (the default), the trees stay out of cyclic GC between waves
    (while the critic scores) and while the batch is prepared, with young collections
    spaced out; afterwards Python's own settings are back."""
    import gc

    from focus.execution import GC_THRESHOLD_FROZEN, frozen_by_others

    col, tasks, mdps = synthetic(execution=Execution(max_concurrency=4))
    seen: list[tuple[int, int]] = []

    class Recording(SyntheticCritic):
        async def predict_with_std(self, contexts):
            seen.append((frozen_by_others(), gc.get_threshold()[0]))
            return await super().predict_with_std(contexts)

    class RecordingEstimator(type(col.estimator)):
        def values(self, tree, noise=None):
            seen.append((frozen_by_others(), gc.get_threshold()[0]))
            return super().values(tree, noise)

    before = gc.get_threshold()
    col.critic = Recording(mdps, 0.1)
    col.estimator = RecordingEstimator(**col.estimator.model_dump())
    batch = run(col.collect(tasks))
    scoring, preparing = seen[: -len(tasks)], seen[-len(tasks) :]  # prepare: one values() per tree
    assert len(scoring) >= 3 and all(frozen and t0 >= GC_THRESHOLD_FROZEN for frozen, t0 in seen)
    assert len(preparing) == len(tasks)
    assert not frozen_by_others() and gc.get_threshold() == before
    unfrozen = synthetic(execution=Execution(max_concurrency=4, freeze_gc=False))[0]
    assert batch_key(batch) == batch_key(run(unfrozen.collect(tasks)))


def test_what_was_made_while_the_heap_was_held_joins_the_oldest_generation_unwalked():
    """Releasing the heap moves the objects made since the last freeze into the oldest
    generation, as the frozen ones go, rather than leaving them young for one
    collection to walk them all once Python's threshold is back."""
    import gc

    from focus.execution import frozen_by_others, frozen_heap

    with frozen_heap() as froze:
        made = [[i] for i in range(5_000)]  # young, tracked, alive
    more = [[i] for i in range(1_000)]  # past Python's threshold of young allocations again
    assert froze and not frozen_by_others()
    oldest = {id(o) for o in gc.get_objects(generation=2)}
    assert id(made) in oldest and all(id(x) in oldest for x in made)
    del made, more


def test_the_wave_tail_s_slices_keep_what_they_make_out_of_young_collections(monkeypatch):
    """While a collection holds the heap frozen, the wave tail's slices
    (``focus.waves._sliced``: grafts, scores, noise rows, all alive with the trees)
    freeze what each made, so no young collection walks it; outside a holder, or with
    ``freeze_gc`` off, nothing is frozen."""
    import gc

    from focus import execution, waves

    monkeypatch.setattr(execution, "GC_THRESHOLD_FROZEN", 2_000)
    monkeypatch.setattr(waves, "SLICE_S", -1.0)  # a slice per item
    young: list[int] = []

    def meter(phase, info):  # type: ignore[no-untyped-def]
        if phase == "start" and info["generation"] == 0:
            young.append(1)

    kept: list[list[list[int]]] = []

    def make(i: int) -> None:
        kept.append([[j] for j in range(1_500)])  # alive and tracked: 1,501 containers a slice

    gc.collect()
    gc.callbacks.append(meter)
    try:
        with execution.frozen_heap() as froze:
            run(waves._sliced(make, list(range(20))))  # 30,000 of them, 15 thresholds
            walked = len(young)
    finally:
        gc.callbacks.remove(meter)
    assert froze and walked == 0 and len(kept) == 20
    count = gc.get_freeze_count()
    execution.refreeze()
    with execution.frozen_heap(False):
        execution.refreeze()
    assert gc.get_freeze_count() == count


def test_freeze_gc_off_leaves_the_garbage_collector_alone():
    import gc

    from focus.execution import frozen_by_others

    col, tasks, _ = synthetic(execution=Execution(max_concurrency=4, freeze_gc=False))
    seen = []

    class Watching(type(col.estimator)):
        def values(self, tree, noise=None):
            seen.append((frozen_by_others(), gc.get_threshold()))
            return super().values(tree, noise)

    before = gc.get_threshold()
    col.estimator = Watching(**col.estimator.model_dump())
    run(col.collect(tasks))
    assert seen and all(not frozen and t == before for frozen, t in seen)


class _BadCritic(Critic):
    """A user's critic that answers with ``answer(n)`` for ``n`` contexts."""

    def __init__(self, answer) -> None:
        self.answer = answer

    async def predict(self, contexts):  # pragma: no cover - predict_with_std is overridden
        raise AssertionError

    async def predict_with_std(self, contexts):
        return self.answer(len(contexts))


@pytest.mark.parametrize(
    ("answer", "match"),
    [
        (lambda n: [Prediction(0.5)] * (n - 1) + [Prediction(float("nan"))], "non-finite value nan at position"),
        (lambda n: [Prediction(0.5, -0.1)] * n, "negative std -0.1 at position 0"),
        (lambda n: [Prediction(0.5, float("inf"))] * n, "std at position 0.*non-finite value inf"),
        (lambda n: [Prediction(0.5)] * (n + 1), r"returned \d+ predictions for \d+ contexts"),
    ],
)
def test_a_critic_answering_nan_or_out_of_shape_fails_clearly(answer, match) -> None:
    """Any critic, not only the HTTP one, is checked where the collector reads it: a NaN
    would travel silently into every advantage and target of its tree."""
    col, tasks, _ = synthetic()
    col.critic = _BadCritic(answer)
    state = run(col.evidence(tasks))
    with pytest.raises(CriticError, match=f"critic _BadCritic.*{match}"):
        run(col.score(state))


def test_a_critic_answering_nan_names_the_state_it_scored() -> None:
    """A NaN is named by the node it was asked about, not only by its position in one
    call of many contexts (which told a user nothing about which state their critic fails
    on): kind, node id, depth and tree, as the batch names trees. Three steps of two
    actions; the critic is exact except at depth 2 of the second task."""

    def chain(seed: int) -> TreeMDP:
        def actions(key: tuple[int, int]) -> list[tuple[object, ...]]:
            t, x = key
            return [] if t == 3 else [((t + 1, x + a), float(a) * (seed + 1), 0.5, 2 + a) for a in (0, 1)]

        return build((0, 0), actions)

    mdps = [chain(0), chain(1)]
    depth: list[dict[int, int]] = [{0: 0} for _ in mdps]
    for m, d in zip(mdps, depth, strict=True):
        for s, acts in enumerate(m.outcomes):  # states are numbered parents first
            d.update({nxt: d[s] + 1 for outs in acts for nxt, _, _ in outs})

    class NanAtDepthTwo(SyntheticCritic):
        def value(self, task: int, s: int) -> float:
            return float("nan") if task == 1 and depth[task][s] == 2 else super().value(task, s)

    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=5)
    col = Collector(agent, Selective(phases=PHASES), NanAtDepthTwo(mdps), DirectBranchTd(), seed=0)
    tasks = [Task(f"t{i}", {"mdp": i}) for i in range(2)]
    where = r"critic NanAtDepthTwo returned a non-finite value nan at position \d+ \(checkpoint node \d+ at depth 2 of tree t1#1\)"
    with pytest.raises(CriticError, match=where):
        run(col.collect(tasks))


@pytest.mark.needs("torch")
def test_an_unfitted_trainable_critic_is_fitted_on_the_evidence_before_it_scores():
    """A LocalCritic before its first batch predicts its default (0) everywhere, which as
    a TD baseline never gives an action that led to reward 0 a negative advantage: the
    collector fits it on the evidence's critic targets first (docs/algorithm.md). A
    fitted critic, or one without ``fit``, is left as it is; ``warm_start_critic=False``
    turns it off."""
    from focus.critic import LocalCritic
    from focus.estimation import critic_targets

    mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long"])]
    agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
    tasks = [Task(f"t{i}", {"mdp": i}) for i in range(3)]

    def evidence(critic, **kw):
        col = Collector(agent, Selective(phases=PHASES), critic, DirectBranchTd(), Execution(max_concurrency=4), **kw)
        return run(col.run_evidence(tasks))

    warm = LocalCritic(buckets=256, hidden=8, seed=0)
    state = evidence(warm)
    assert warm.fitted
    nodes = [n for t in state.trees for n in t.nodes.values() if n.value is not None]
    scored = [n.value for n in nodes]
    # every prediction is the fitted critic's, and they track the targets it was fitted on
    assert scored == run(warm.predict([n.context_ids for n in nodes]))
    targets = [(t.target, t.weight) for tree in state.trees for t in critic_targets(tree).values() if t.weight > 0]
    mean_target = sum(t * w for t, w in targets) / sum(w for _, w in targets)
    assert abs(sum(scored) / len(scored) - mean_target) < 0.25 * abs(mean_target)

    cold = LocalCritic(buckets=256, hidden=8, seed=0)
    state = evidence(cold, warm_start_critic=False)
    assert not cold.fitted and {n.value for t in state.trees for n in t.nodes.values() if n.value is not None} == {0.0}
    again = run(warm.predict([nodes[0].context_ids]))
    evidence(warm)  # fitted already: not fitted again
    assert run(warm.predict([nodes[0].context_ids])) == again


@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_preparing_a_state_reads_its_search_s_rows_and_segments_and_gives_the_same_batch(gamma):
    """A state's batch takes each tree's noise rows and edge segments from what its
    search computed (:meth:`SearchState.batch_parts`); the batch is the one the trees
    alone give, bit for bit, and so is the batch of an estimator whose own ``values``
    takes no segments (it gets none)."""
    col, tasks, _ = synthetic()
    col = Collector(col.agent, Selective(phases=PHASES), col.critic, DirectBranchTd(gamma=gamma), seed=0)
    state = run(col.search(tasks))
    kept = [state.facts(ti).segments(gamma) for ti in range(len(state.trees))]
    assert all(kept) and any(state.facts(ti).rank is not None for ti in range(len(state.trees)))
    from_state, from_trees = col.prepare(state), col.prepare(list(state.trees))
    assert from_state.actor_table.equals(from_trees.actor_table)
    assert from_state.critic_table.equals(from_trees.critic_table)
    assert from_state.stats["noise_model"] == from_trees.stats["noise_model"]
    # the backups and critic targets on kept segments are those on segments made afresh
    est = col.estimator
    for tree, segs in zip(state.trees, state.batch_parts(gamma, "bootstrap")[1], strict=True):
        fresh, known = est.values(tree, NoiseModel.unknown()), est.values(tree, NoiseModel.unknown(), segs)
        assert (fresh.value, fresh.error, fresh.mc) == (known.value, known.error, known.mc)
        targets = critic_targets(tree, gamma=gamma)
        assert critic_targets(tree, gamma=gamma, segments=known.segments) == targets

    class OwnValues(DirectBranchTd):
        def values(self, tree, noise=None):  # the signature before segments
            return super().values(tree, noise)

    own = Collector(col.agent, Selective(phases=PHASES), col.critic, OwnValues(gamma=gamma), seed=0)
    assert own.prepare(state).actor_table.equals(from_state.actor_table)


def test_batches_of_the_same_rows_are_equal_whatever_their_wall_times():
    """``Batch.__eq__`` compared every statistic, the wall times among them, so the same
    collection run twice (or resumed) gave unequal batches. It compares the rows and the
    statistics that are no times (``*_s``, ``*_ms``, at any depth)."""
    tasks = synthetic()[1]
    a, b = (run(synthetic()[0].collect(tasks)) for _ in range(2))
    assert a.stats["wall_s"] != b.stats["wall_s"] and a.stats["phases"][0]["wall_s"] != b.stats["phases"][0]["wall_s"]
    assert a == b
    c = Batch(b.collection_id, b.iteration, b.actor_table, b.critic_table, copy.deepcopy(b.stats))
    c.stats["phases"][0]["rollouts"] += 1  # a deterministic figure, in a phase
    assert a != c
    c = Batch(b.collection_id, b.iteration, b.actor_table, b.critic_table, {**b.stats, "noise_model": {}})
    assert a != c
    c = Batch(b.collection_id, b.iteration, b.actor_table.slice(1), b.critic_table, b.stats)  # one row less
    assert a != c
    assert a != Batch(b.collection_id, b.iteration + 1, b.actor_table, b.critic_table, b.stats)
