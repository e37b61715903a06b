"""benchmarks/learning_start.py (issue 32): the starting policy with the cue lookup is
built deterministically from tasks kept apart from every benchmark task, with a shifted
mapping, and ``--start`` hands the same file to every method."""

from __future__ import annotations

import pytest

from benchmarks import learning
from benchmarks.learning_start import (
    StartSettings,
    build_start,
    kept_apart_tasks,
    right_digits,
    start_key,
    start_weights,
    training_prompts,
)
from focus.agent import derive_seed
from focus.format import ByteCodec

TINY = StartSettings(steps=3, train_tasks=3, batch=4, init="scratch")  # as the default start: a fresh init


def test_the_shifted_rule_reads_the_range_named_at_the_current_step():
    assert right_digits("Corridor of 3. Step 1: 1-3.", 2) == [3, 4, 5]
    assert right_digits("Corridor of 3. Step 1: 1-3.4Step 2: 4-6.", 2) == [6, 7, 8]
    assert right_digits("Corridor of 3. Step 1: 4-6.", 0) == [4, 5, 6]  # shift 0: the benchmark's own
    assert right_digits("Bridge of 4. Plank 1: not 3.", 2) == [1, 2, 3, 4, 6, 7]  # not 5, 8, 9
    assert right_digits("Bridge of 4. Plank 1: not 3.1Plank 2: not 7.", 2) == [1, 2, 3, 4, 5, 6, 7]  # 9: as always
    assert right_digits("Reach 12.", 2) is None


def test_the_kept_apart_tasks_share_no_task_with_the_benchmarks():
    ours = kept_apart_tasks(StartSettings())
    assert len(ours) == 2 * StartSettings().train_tasks and all(t.id.startswith("start-") for t in ours)
    theirs = set()
    for name in ("cued-corridor-early", "cued-corridor-late", "cued-bridge"):
        domain = learning.DOMAINS[name]()
        for seed in range(40):  # the record's twenty seeds and as many more
            theirs |= {t.id for t in domain.tasks(50, 10_000 + seed)}  # held out
            for it in range(30):  # up to 30 updates of up to 16 tasks
                theirs |= {t.id for t in domain.tasks(16, derive_seed("tasks", seed, it))}
    assert not theirs & {t.id for t in ours}
    # the walks render every step's prompt with the shifted rule's digits in their history
    codec = ByteCodec()
    first = training_prompts(TINY)
    every = training_prompts(StartSettings(steps=3, train_tasks=3, batch=4, steps_taught="every"))
    assert len(first) == 2 * TINY.train_tasks < len(every)  # the openings; then every step's prompt too
    assert all(p in every for p in first)
    for ids, right in every:
        assert right == right_digits(codec.decode(ids), TINY.shift)
    assert all(" 1: " in codec.decode(ids) and "2: " not in codec.decode(ids) for ids, _ in first)


def test_the_start_is_deterministic_and_keyed_by_its_settings(tmp_path):
    a = build_start(TINY, tmp_path / "a")
    b = build_start(TINY, tmp_path / "b")
    assert a.name == b.name == f"{start_key(TINY)}.pt"
    assert a.read_bytes() == b.read_bytes()  # two builds, identical weights
    from focus.tinylm.arch import DEFAULT_WEIGHTS

    assert a.read_bytes() != DEFAULT_WEIGHTS.read_bytes()  # trained
    assert start_key(StartSettings(steps=3, train_tasks=3, batch=4, init="scratch", shift=1)) != start_key(TINY)
    assert build_start(TINY, tmp_path / "a") == a  # found, not rebuilt
    assert start_weights("default") is None
    with pytest.raises(ValueError, match="--start"):
        start_weights("warm")
    with pytest.raises(ValueError, match="init"):
        StartSettings(init="warm")
    with pytest.raises(ValueError, match="steps_taught"):
        StartSettings(steps_taught="last")


def test_start_pretrained_hands_every_job_the_same_weights(tmp_path, monkeypatch):
    import benchmarks.learning_start as ls

    made = tmp_path / "start.pt"
    monkeypatch.setattr(ls, "start_weights", lambda start: made if start == "pretrained" else None)
    got = []

    def worker(job):
        got.append(job[-1])
        return []

    monkeypatch.setattr(learning, "_task_worker", worker)
    monkeypatch.setattr(learning, "verdicts", lambda runs, tasks: {"tasks": {}})
    monkeypatch.setattr(learning, "plot", lambda *a: None)
    monkeypatch.setattr(learning, "summary", lambda r: "")
    args = ["--tasks", "cued-corridor-early", "cued-bridge", "--seeds", "0", "1", "--jobs", "1", "--quiet"]
    saved = learning.main([*args, "--start", "pretrained", "--out", str(tmp_path / "p")])
    assert got == [made] * 4 and saved["command"].endswith("--start pretrained")
    got.clear()
    saved = learning.main([*args, "--out", str(tmp_path / "d")])
    assert got == [None] * 4 and "--start" not in saved["command"]
