"""The steps of a collection without Prefect, sharing one Handoff as a flow run does:
one runtime for every step, incremental statistics equal to a full recount, the same
batch as Collector.collect(), and a runtime closed with the handoff."""

from __future__ import annotations

import gc
import time

import pytest
from test_pipeline import direct_batch, rows, small_config

from storage import BatchStore
from tasks.collection import steps_for
from tasks.steps import EVIDENCE, EVIDENCE_SCORED, Handoff, score_key, wave_key


def same_usage(a, b):
    """Counts equal; summed times equal up to the order of float additions."""
    floats = {k for k, v in b.items() if isinstance(v, float)}
    return {k: v for k, v in a.items() if k not in floats} == {k: v for k, v in b.items() if k not in floats} and all(
        a[k] == pytest.approx(b[k], rel=1e-9, abs=1e-12) for k in floats
    )


def test_steps_share_one_runtime_and_count_incrementally(tmp_path):
    from focus.execution import GC_THRESHOLD_FROZEN

    cfg = small_config(str(tmp_path / "store"), "steps")
    before = gc.get_threshold()
    with Handoff() as handoff:
        steps = steps_for(cfg, handoff)
        steps.check_config()
        steps.evidence()
        runtime = handoff.runtime(cfg, steps.make_execution)
        # the state is out of GC's sight and young collections spaced out while the run lasts
        assert gc.get_freeze_count() > 0 and gc.get_threshold()[0] >= GC_THRESHOLD_FROZEN
        steps.score(EVIDENCE, EVIDENCE_SCORED)
        source, wave = EVIDENCE_SCORED, 0
        while True:
            rec = steps_for(cfg, handoff).wave(source, 1, wave)  # a new Steps per task, as in the flow
            if rec["done"]:
                break
            state = handoff.get(wave_key(cfg, 1, wave))
            # the running totals equal a full recount of every rollout's usage
            assert same_usage(rec["usage"], state.usage().as_dict())
            assert same_usage(rec["phase_usage"], state.usage(1).as_dict())
            assert rec["usage"]["transitions"] == sum(t.stats()["transitions"] for t in state.trees)
            assert rec["nodes"] == sum(len(t.nodes) for t in state.trees)
            source = score_key(cfg, 1, wave)
            steps.score(wave_key(cfg, 1, wave), source)
            wave += 1
        assert wave >= 2
        # equal configs (even a copy) reuse the runtime; another config replaces it
        assert handoff.runtime(cfg.with_updates(), steps.make_execution) is runtime
        result = steps.export(source)
        assert handoff.runtime(cfg, steps.make_execution) is runtime and not runtime.closed
    assert runtime.closed and runtime.loop.is_closed()
    # the state was kept out of GC only while the run lasted; Python's thresholds are back
    assert gc.get_freeze_count() == 0 and gc.get_threshold() == before
    batch = BatchStore(cfg.storage.root).read(result["batch_url"])
    assert rows(batch) == rows(direct_batch(cfg))
    # checkpoints are listed in the order they were saved
    saved = steps.store.list("steps")
    assert saved[:3] == [("config", 0), ("evidence", 0), ("evidence.score", 0)] and saved[-1] == ("export", 0)


def test_a_steps_object_without_a_handoff_closes_its_runtime_after_each_step(tmp_path):
    cfg = small_config(
        str(tmp_path / "store"), "own", **{"search.phases": [{"name": "evidence", "rollouts_per_task": 1}]}
    )
    steps = steps_for(cfg)
    steps.check_config()
    steps.evidence()
    assert steps.handoff._runtime is None  # nothing left open
    steps.score(EVIDENCE, EVIDENCE_SCORED)
    assert steps.export(EVIDENCE_SCORED)["batch_url"]
    assert steps.handoff._runtime is None


def wait_for(condition, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_the_wave_driver_lands_the_next_wave_while_no_step_runs(tmp_path):
    """After a wave step returns, the driver lands, scores and launches on its own; the
    next wave step takes what it landed (the same driver, no restart), and the batch is
    Collector.collect()'s."""
    cfg = small_config(str(tmp_path / "store"), "ahead", **{"search.waves_in_flight": 2})
    with Handoff() as handoff:
        steps = steps_for(cfg, handoff)
        steps.check_config()
        steps.evidence()
        steps.score(EVIDENCE, EVIDENCE_SCORED)
        source, wave, ahead = EVIDENCE_SCORED, 0, 0
        while not steps_for(cfg, handoff).wave(source, 1, wave)["done"]:
            driver = handoff.driver
            # the outcome after this one (or the phase's end) arrives with no step waiting for it
            wait_for(lambda d=driver: d._queue.qsize() >= 1)
            ahead += 1
            source = score_key(cfg, 1, wave)
            steps_for(cfg, handoff).score(wave_key(cfg, 1, wave), source)
            assert handoff.driver is driver and driver.next_wave == wave + 1
            wave += 1
        assert ahead == wave >= 2 and handoff.driver is None  # the phase's end stops it
        batch = BatchStore(cfg.storage.root).read(steps.export(source)["batch_url"])
    assert rows(batch) == rows(direct_batch(cfg))


def test_a_critic_failure_in_the_driver_keeps_the_wave_and_the_rerun_finishes(tmp_path):
    """The driver scores each wave; when the critic fails, the wave step still stores the
    wave's rollouts and the score step raises the critic's error. A rerun scores that wave
    from its checkpoint (its rollouts are not run again) and ends with the batch of an
    uninterrupted collection."""
    from focus.critic import CriticError

    marker = tmp_path / "critic-down"
    critic = {"critic.kind": "factory", "critic.factory": "fixtures.prefect:flaky_critic"}
    cfg = small_config(str(tmp_path / "store"), "flaky", **critic, **{"critic.options": {"marker": str(marker)}})
    want = direct_batch(cfg.with_updates(collection_id="flaky-direct"))
    with Handoff() as handoff:
        steps = steps_for(cfg, handoff)
        steps.check_config()
        steps.evidence()
        steps.score(EVIDENCE, EVIDENCE_SCORED)
        marker.write_text("down")  # the driver's first wave is scored while the marker is there
        rec = steps.wave(EVIDENCE_SCORED, 1, 0)
        assert not rec["done"] and rec["jobs"] > 0 and steps.done(wave_key(cfg, 1, 0))
        with pytest.raises(CriticError, match="critic service unavailable"):
            steps.score(wave_key(cfg, 1, 0), score_key(cfg, 1, 0))
        assert handoff.driver is None and not steps.done(score_key(cfg, 1, 0))
    marker.unlink()
    fresh = steps_for(cfg)  # a rerun: the stored waves are reused, wave 1 is scored from its checkpoint
    source, wave, reused = EVIDENCE_SCORED, 0, []
    while not (rec := fresh.wave(source, 1, wave))["done"]:
        reused.append(rec["reused"])
        source = score_key(cfg, 1, wave)
        fresh.score(wave_key(cfg, 1, wave), source)
        wave += 1
    assert reused[0] and wave >= 2
    batch = fresh.batch_store.read(fresh.export(source)["batch_url"])
    assert rows(batch) == rows(want)
