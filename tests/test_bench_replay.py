"""benchmarks/replay.py: a captured collection replays to the live run's plans and batch,
and a capture that does not describe the run is caught."""

from __future__ import annotations

import pickle

import pytest

from benchmarks import replay as rp


@pytest.fixture(scope="module")
def cap() -> rp.Capture:
    return rp.capture("synthetic", 1500, 12, wave_size=32)


def test_replay_gives_the_live_plans_and_batch(cap: rp.Capture) -> None:
    # a pickle round trip (what --save / --load do) drops every cached ranking
    again = pickle.loads(pickle.dumps(cap))
    clock = rp.replay(again)  # raises ReplayMismatch on any difference
    out = rp.summary(again, [clock, rp.replay(again)])
    assert out["plans"]["first"] == 1 and out["plans"]["last"] == 1
    assert out["waves"] == len(cap.plans) == sum(out["plans"].values())  # evidence + continuation waves
    # the first plan builds every tree's ranking; later plans only bring them up to date
    assert "first.rank_build" in out["ms"] and "wave.rank_update" in out["ms"]
    assert not any(k.startswith("wave.rank_build") for k in out["ms"])
    groups = ("barrier", "prepare")
    assert out["search_ms_per_transition"] >= out["barrier_ms_per_transition"] > 0
    assert all(out[f"{g}_ms_per_transition"] > 0 for g in groups)


def test_a_changed_prediction_is_caught(cap: rp.Capture) -> None:
    bad = pickle.loads(pickle.dumps(cap))
    scores = bad.scores[1]
    key = next(iter(scores))
    value, std = scores[key]
    scores[key] = ((value or 0.0) + 0.25, std)
    with pytest.raises(rp.ReplayMismatch):
        rp.replay(bad)


def test_a_changed_plan_is_caught(cap: rp.Capture) -> None:
    bad = pickle.loads(pickle.dumps(cap))
    bad.plans[2] = bad.plans[2][1:]
    with pytest.raises(rp.ReplayMismatch, match="continuation wave 1"):
        rp.replay(bad)
