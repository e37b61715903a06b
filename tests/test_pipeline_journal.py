"""The collector's one loop with the pipeline's journal, without Prefect: every step a
checkpoint in collection order, the batch of Collector.collect(), a replay that runs no
rollout, recording that never holds a wave back, and a critic failure that keeps the
wave it could not score."""

from __future__ import annotations

import asyncio
import gc
import threading
import time

import pytest
from fixtures.journal import refusing_policy, run_collect
from test_pipeline import direct_batch, rows, small_config

from focus.journal import wave_step
from storage import BatchStore
from tasks.journal import CheckpointJournal


def same_usage(a, b):
    """Counts equal; summed times equal up to the order of float additions."""
    a, b = a.as_dict(), b.as_dict()
    floats = {k for k, v in b.items() if isinstance(v, float)}
    return {k: v for k, v in a.items() if k not in floats} == {k: v for k, v in b.items() if k not in floats} and all(
        a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12) for k in floats
    )


def test_every_step_is_a_checkpoint_and_a_replay_runs_no_rollout(tmp_path):
    from focus.execution import GC_THRESHOLD_FROZEN, frozen_by_others

    cfg = small_config(str(tmp_path / "store"), "steps")
    before = gc.get_threshold()
    frozen = []

    class Watching(CheckpointJournal):
        async def record(self, step, value):
            frozen.append(frozen_by_others() and gc.get_threshold()[0] >= GC_THRESHOLD_FROZEN)
            await super().record(step, value)

    journal = Watching(cfg)
    out = run_collect(cfg, journal)
    # the state was out of GC's sight while the search ran, and Python's settings are back
    assert len(frozen) > 4 and all(frozen) and not frozen_by_others() and gc.get_threshold() == before
    batch = BatchStore(cfg.storage.root).read(out["batch_url"])
    assert rows(batch) == rows(direct_batch(cfg))

    saved = journal.store.list("steps")
    waves = [w for p, w in saved if p == "1.continue"]
    assert len(waves) >= 2 and waves == sorted(waves)
    assert saved[:4] == [("config", 0), ("critic", 0), ("evidence", 0), ("evidence.score", 0)]
    assert saved[4:6] == [("1.continue", 0), ("1.continue.score", 0)]
    assert saved[-3:] == [("1.continue.end", 0), ("trees.svg", 0), ("export", 0)]
    assert [r.kind for r in journal.records][:3] == ["config", "evidence", "evidence_scores"]

    # the usage a wave's record shows is a running total equal to a full recount
    policy = refusing_policy()
    agent, tasks = cfg.build_agent(policy)
    replayed = CheckpointJournal(cfg)
    state = asyncio.run(cfg.build_collector(agent).search(tasks, replayed))
    last = [r for r in journal.records if r.kind == "wave"][-1]
    assert same_usage(last.usage, state.usage()) and same_usage(last.phase_usage, state.usage(1))
    # every saved step but the config, the critic's identity, the picture and the export
    assert all(r.reused for r in replayed.records) and len(replayed.records) == len(saved) - 4
    assert rows(cfg.build_collector(agent).prepare(state)) == rows(batch)


def test_saving_a_wave_holds_no_wave_back(tmp_path):
    """While a wave is being saved, the waves planned after it keep getting answers
    from the model (they were launched before the wave was handed over)."""
    cfg = small_config(
        str(tmp_path / "store"),
        "ahead",
        **{"search.waves_in_flight": 2, "model.options": {"latency_s": 0.02}, "search.phases.1.transitions": 80},
    )
    calls = []
    counted = threading.Lock()

    class SlowSaves(CheckpointJournal):
        def save(self, key, value):
            if key == ("1.continue", 1):
                with counted:
                    calls.append(self.calls())
                time.sleep(0.3)
                calls.append(self.calls())
            super().save(key, value)

    from fixtures.prefect import DigitPolicy

    seen = [0]
    sample = DigitPolicy.sample

    async def counting(self, prompt_ids, params):
        out = await sample(self, prompt_ids, params)
        seen[0] += 1  # answers received
        return out

    SlowSaves.calls = lambda self: seen[0]
    DigitPolicy.sample = counting
    try:
        run_collect(cfg, SlowSaves(cfg))
    finally:
        DigitPolicy.sample = sample
    assert len(calls) == 2 and calls[1] > calls[0]


def test_a_critic_failure_keeps_the_wave_and_the_rerun_scores_it(tmp_path):
    """When the critic fails on a wave, the wave's rollouts are saved and the error is
    raised; a rerun scores that wave from its checkpoint (its rollouts are not run
    again) and ends with the batch of an uninterrupted collection."""
    from focus.critic import CriticError

    marker = tmp_path / "critic-down"
    critic = {"critic.kind": "factory", "critic.factory": "fixtures.digits:flaky_critic"}
    cfg = small_config(str(tmp_path / "store"), "flaky", **critic, **{"critic.options": {"marker": str(marker)}})
    want = direct_batch(cfg.with_updates(collection_id="flaky-direct"))

    class DownAfterEvidence(CheckpointJournal):
        async def record(self, step, value):
            await super().record(step, value)
            if step.kind == "evidence_scores":
                marker.write_text("down")  # the first wave is scored while the marker is there

    journal = DownAfterEvidence(cfg)
    with pytest.raises(CriticError, match="critic service unavailable"):
        run_collect(cfg, journal)
    assert journal.records[-1].kind == "wave" and journal.load(("1.continue", 0)) is not None
    assert journal.load(("1.continue.score", 0)) is None
    marker.unlink()
    again = CheckpointJournal(cfg)
    out = run_collect(cfg, again)
    first = next(r for r in again.records if r.kind == "wave")
    assert first.reused and first.wave == 0 and wave_step(1, 0).wave == 0
    assert not next(r for r in again.records if r.kind == "wave_scores").reused
    assert rows(BatchStore(cfg.storage.root).read(out["batch_url"])) == rows(want)


def test_a_resume_against_other_weights_is_refused_unless_allowed(tmp_path):
    """The collection's rollouts say which weights sampled them; a resume whose first new
    wave was sampled by others is refused before anything of it is saved, naming both,
    and goes ahead only when the user says so."""
    from fixtures.journal import StopAfter, Stopped

    from tasks.fingerprint import PolicyChanged

    served = tmp_path / "served-version"
    served.write_text("weights-a")
    model = {"model.factory": "fixtures.journal:served_version_policy", "model.options": {"version_file": str(served)}}
    cfg = small_config(str(tmp_path / "store"), "switched", **model)
    with pytest.raises(Stopped):
        run_collect(cfg, StopAfter(cfg, wave_step(1, 0)))
    served.write_text("weights-b")  # the service was restarted with other weights
    refused = CheckpointJournal(cfg)
    with pytest.raises(PolicyChanged, match="sampled by policy weights-a, the model service now serves weights-b"):
        run_collect(cfg, refused)
    assert refused.load(("1.continue", 1)) is None and refused.load(("1.continue", 0)) is not None
    out = run_collect(cfg, CheckpointJournal(cfg, allow_policy_change=True))
    versions = {r.policy_version for r in BatchStore(cfg.storage.root).read(out["batch_url"]).actor}
    assert versions == {"weights-a", "weights-b"}


def test_a_resume_with_another_embedded_model_version_names_both(tmp_path):
    from tasks.fingerprint import PolicyChanged

    cfg = small_config(str(tmp_path / "store"), "versions", **{"model.policy_version": "v1"})
    run_collect(cfg)
    other = cfg.with_updates(**{"model.policy_version": "v2"})
    with pytest.raises(PolicyChanged, match="sampled by policy v1, the model service now serves v2"):
        run_collect(other)
    assert run_collect(other, CheckpointJournal(other, allow_policy_change=True))["stats"]["steps_reused"] > 0
