"""A rerun with the same id and other settings: what is reused, what is refused.

``focus collect`` and ``focus train`` resumed with the settings their finished steps
were made with reuse them; a setting that would change those steps is refused in one
line naming each field with its old and new value (exit 2), or, for a train loop with
``--allow-config-change``, applies from the first iteration not yet begun; settings
that cannot change a result (where and how patiently things run, the log level) never
count. The loop's trainer is a user's one that trains nothing and reports the
``train.local.lr`` it was given, so each iteration says which settings it ran with."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.prefect import base_env

from storage import CheckpointStore
from tasks.config import load_config
from tasks.config.schema import resumable_fields
from tasks.fingerprint import changes, describe
from tasks.gaps import RecordMissing
from tasks.loop_settings import LoopSettingsChanged, settle

#: The digit policy (tests/fixtures/digits.py), not the embedded model: what is checked is
#: which settings a rerun takes, read from the store; the embedded model's start cost each
#: command 1.5-3 s, and the tests of it are tests/test_cli.py and tests/test_train_resume.py.
DIGITS = ["--set", "model.kind=factory", "--set", "model.factory=fixtures.digits:digit_policy"]
COLLECT = ["--tasks", "2", "--transitions", "6", "--set", "agent.sampling.max_tokens=4", "--set", "agent.max_steps=4"]
COLLECT += DIGITS
LOOP = [
    *("--tasks", "2", "--transitions", "4", "--set", "agent.sampling.max_tokens=4", "--set", "agent.max_steps=3"),
    *("--set", "search.phases.0.rollouts_per_task=2", "--set", "progress=false", "--trainer", "lrtrain:train"),
    *DIGITS,
]
#: Settings that say where and how patiently things run, and the log level: never a change.
HARMLESS = ["--set", "execution.max_concurrency=3", "--set", "model.http.timeout_s=30", "--set", "progress=true", "-v"]
TRAINER = '''
"""A trainer that trains nothing and reports the learning rate it was given."""
from tasks.trainers import TrainResult


def train(batch_url, ctx):
    return TrainResult(policy_version=ctx.policy_version, metrics={"lr": ctx.config.train.local.lr})
'''


def focus(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = base_env(cwd / "prefect")
    return subprocess.run(
        [sys.executable, "-m", "cli", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def refused(done: subprocess.CompletedProcess[str]) -> str:
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stdout[-1000:] + done.stderr[-2000:]
    return lines[0]


def loop(tmp_path: Path, *args: str) -> list[dict]:
    """``focus train`` of the loop ``L``; its records."""
    done = focus(["train", *LOOP, "--store", str(tmp_path / "s"), "--collection-id", "L", "--json", *args], tmp_path)
    assert done.returncode == 0, done.stdout[-1000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def reused(rec: dict) -> bool:
    """Whether the iteration's collection and trainer step were both taken from the store."""
    return rec["stats"]["steps_reused"] == rec["stats"]["steps"] and rec["train"]["reused"]


@pytest.mark.integration
def test_collect_names_each_changed_field_with_its_values_and_ignores_what_cannot_change_the_batch(tmp_path):
    first = focus(["collect", *COLLECT, "--store", str(tmp_path / "s"), "--collection-id", "c", "--json"], tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    again = ["collect", *COLLECT, "--store", str(tmp_path / "s"), "--collection-id", "c", "--json"]
    line = refused(focus([*again, "--set", "agent.sampling.temperature=0.7", "--transitions", "9"], tmp_path))
    assert "differs in: agent.sampling.temperature 1.0 → 0.7, search.phases.1.transitions 6 → 9)" in line, line
    assert "use a new collection id" in line
    # the train section (a collection never reads it) and where things run: the finished batch
    same = focus([*again, *HARMLESS, "--set", "train.local.lr=0.1", "--set", "model.group_siblings=false"], tmp_path)
    assert same.returncode == 0, same.stderr[-3000:]
    result = json.loads(same.stdout.strip().splitlines()[-1])
    assert result["already_finished"] and result["batch_url"] == json.loads(first.stdout.splitlines()[-1])["batch_url"]


@pytest.mark.integration
def test_train_refuses_settings_that_would_change_its_made_iterations_and_ignores_the_others(tmp_path):
    (tmp_path / "lrtrain.py").write_text(textwrap.dedent(TRAINER))
    [first] = loop(tmp_path, "--iterations", "1")
    assert first["train"]["metrics"]["lr"] == 0.001 and not first["train"]["reused"]
    base = ["train", *LOOP, "--store", str(tmp_path / "s"), "--collection-id", "L", "--iterations", "1"]
    line = refused(focus([*base, "--set", "train.local.lr=0.1"], tmp_path))
    assert line.startswith("error: train loop 'L' in file://") and "(train.local.lr 0.001 → 0.1)" in line, line
    assert "use a new --collection-id" in line and "--allow-config-change" in line
    assert "apply the new values from iteration 1 on" in line
    line = refused(focus([*base, "--seed", "3", "--set", "agent.sampling.temperature=0.5"], tmp_path))
    assert "(agent.sampling.temperature 1.0 → 0.5, seed 0 → 3)" in line, line
    [again] = loop(tmp_path, "--iterations", "1", *HARMLESS)
    assert reused(again) and again["train"]["metrics"]["lr"] == 0.001


@pytest.mark.integration  # starts focus commands
def test_a_settings_record_deleted_outright_stops_the_rerun_in_one_line(tmp_path):
    """A loop whose settings record was deleted (manifest and data: no damage to see)
    was taken for one made before loops kept a record: a rerun with another learning
    rate warned, took the new settings for those its trained iteration was made with
    and recorded them. A trainer step now says that the record was saved before it, so
    the rerun stops in one line naming the record, exit 1; nothing is written."""
    (tmp_path / "lrtrain.py").write_text(textwrap.dedent(TRAINER))
    loop(tmp_path, "--iterations", "1")
    store = CheckpointStore(str(tmp_path / "s"))
    manifest = Path(store.url_for("L", "settings", 0).removeprefix("file://") + ".manifest.json")
    for f in manifest.parent.glob("n-settings-w00000*"):
        f.unlink()
    base = ["train", *LOOP, "--store", str(tmp_path / "s"), "--collection-id", "L", "--iterations", "1"]
    done = focus([*base, "--set", "train.local.lr=0.1"], tmp_path)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stdout[-1000:] + done.stderr[-2000:]
    # the store's URL: "file://" and the path as it is (as_uri() writes a space as %20)
    assert lines[0].startswith(f"error: train loop L: its settings record file://{manifest} is missing while 1 ")
    assert "the latest made after the record was" in lines[0] and "or train under a new --collection-id" in lines[0]
    assert not store.exists("L", "settings", 0)


@pytest.mark.integration
def test_train_extends_and_applies_accepted_changes_from_the_first_iteration_not_begun(tmp_path):
    (tmp_path / "lrtrain.py").write_text(textwrap.dedent(TRAINER))
    loop(tmp_path, "--iterations", "1")
    one, two = loop(tmp_path, "--iterations", "2")  # more iterations extend the loop: no change
    assert reused(one) and not two["train"]["reused"] and two["train"]["metrics"]["lr"] == 0.001
    store = ["--store", str(tmp_path / "s"), "--collection-id", "L"]
    change = ["--set", "train.local.lr=0.1", "--set", "agent.sampling.temperature=0.5"]
    done = focus(["train", *LOOP, *store, "--iterations", "3", *change, "--allow-config-change", "--json"], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        "warning: train loop L: from iteration 2 on with agent.sampling.temperature 1.0 → 0.5, train.local.lr "
        "0.001 → 0.1 (--allow-config-change); the iterations before it keep the settings they were made with"
    ], done.stderr
    recs = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["train"]["metrics"]["lr"] for r in recs] == [0.001, 0.001, 0.1]
    assert reused(recs[0]) and reused(recs[1]) and not recs[2]["train"]["reused"]
    made = CheckpointStore(str(tmp_path / "s"))
    temperatures = [
        json.loads(made.load(f"L-it{i}", "config", 0))["agent"]["sampling"]["temperature"] for i in range(3)
    ]
    assert temperatures == [1.0, 1.0, 0.5]
    # the new settings are now the loop's: a rerun with them reuses all; the old ones are refused
    assert all(reused(r) for r in loop(tmp_path, "--iterations", "3", *change))
    line = refused(focus(["train", *LOOP, *store, "--iterations", "3"], tmp_path))
    assert "its iteration 2 was made with other settings (agent.sampling.temperature 0.5 → 1.0" in line, line


# ---- the rule alone: a real store, no server ----


def test_which_fields_a_resume_ignores_is_read_off_the_schema():
    collection, loop_ = set(resumable_fields("collection")), set(resumable_fields("loop"))
    runtime = {"model.url", "model.urls", "model.http", "critic.http", "execution", "storage", "progress"}
    assert runtime <= collection and runtime <= loop_
    assert "train" in collection and not any(
        f.startswith("train") for f in loop_ - {"train.iterations", "train.eval_tasks"}
    )
    for result_field in ("seed", "agent.sampling", "search", "env", "estimator", "model.weights", "train.local"):
        assert not any(f == result_field or f.startswith(result_field + ".") for f in collection | loop_), result_field


def test_changes_walk_lists_of_tables_and_say_old_and_new():
    a = {"seed": 0, "search": {"phases": [{"name": "e"}, {"transitions": 6}]}, "model": {"weights": None}}
    b = {"seed": 5, "search": {"phases": [{"name": "e"}, {"transitions": 9}]}, "model": {"weights": "w.pt"}}
    diffs = changes(a, b)
    assert describe(diffs) == "model.weights unset → w.pt, search.phases.1.transitions 6 → 9, seed 0 → 5"
    assert describe(diffs, most=1) == "model.weights unset → w.pt and 2 more"


def config(root: Path, **overrides: object):
    return load_config(None, overrides={"collection_id": "L", "storage.root": str(root), **overrides}, environ={})


def test_a_change_that_nothing_made_depends_on_is_taken_and_one_that_something_does_is_refused(tmp_path):
    store = CheckpointStore(str(tmp_path))
    settle(config(tmp_path))  # the first run records its settings
    # a collection begun, no trainer step: a trainer setting changed is simply taken
    store.save("L-it0", "config", 0, "{}")
    taken = settle(config(tmp_path, **{"train.local.lr": 0.1}))
    assert [(start, made["train"]["local"]["lr"]) for start, made in taken.records] == [(0, 0.1)]
    with pytest.raises(LoopSettingsChanged, match=r"its iteration 0 was made with other settings \(seed 0 → 3\)"):
        settle(config(tmp_path, seed=3, **{"train.local.lr": 0.1}))
    # a trainer step made: the trainer's settings count from now on
    store.save("L", "train", 0, {"policy_version": "v1"})
    with pytest.raises(LoopSettingsChanged, match=r"train.local.lr 0.1 → 0.01\); .* from iteration 1 on$"):
        settle(config(tmp_path, **{"train.local.lr": 0.01}))
    now = config(tmp_path, **{"train.local.lr": 0.01, "train.iterations": 5})
    accepted = settle(now, allow_change=True)
    assert [accepted.config_for(now, i).train.local.lr for i in (0, 1, 4)] == [0.1, 0.01, 0.01]
    assert settle(now).config_for(now, 0).train.local.lr == 0.1  # recorded: the next run agrees


def test_a_loop_made_before_loops_recorded_their_settings_is_recorded_once_a_run_ends(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.save("L", "train", 0, {"policy_version": "v1"})  # a trained step, no settings record
    first = settle(config(tmp_path))
    assert first.unrecorded and not store.exists("L", "settings", 0)  # a collection may yet refuse this run
    first.record(config(tmp_path))
    with pytest.raises(LoopSettingsChanged, match=r"its iteration 0 was made with other settings \(seed 0 → 1\)"):
        settle(config(tmp_path, seed=1))


def test_a_missing_settings_record_is_told_from_one_never_made_by_the_trainer_steps_mark(tmp_path):
    store = CheckpointStore(str(tmp_path))
    store.save("L", "train", 0, {"policy_version": "v1", "settings_recorded": False})  # made before records
    store.save("L", "train", 1, {"policy_version": "v2", "settings_recorded": True})  # made after one was saved
    with pytest.raises(
        RecordMissing, match=r"^train loop L: its settings record file://.*/n-settings-w00000\.manifest"
    ):
        settle(config(tmp_path), record=False)
    store.save("M", "train", 0, {"policy_version": "v1"})  # a loop made before its steps said so
    assert settle(config(tmp_path, collection_id="M")).unrecorded


@pytest.mark.parametrize("damage", ["manifest", "data"])
def test_a_damaged_settings_record_is_restored_not_computed_again(tmp_path, damage):
    """A loop's settings record cut short said what a damaged step says: `remove <its
    manifest> and rerun to compute it again`. A record is not computed: done as told,
    the loop took the rerun's settings (another learning rate) for those its trained
    iterations were made with, with a warning meant for loops made before records."""
    store = CheckpointStore(str(tmp_path))
    settle(config(tmp_path))
    store.save("L", "train", 0, {"policy_version": "v1"})
    manifest = Path(store.url_for("L", "settings", 0).removeprefix("file://") + ".manifest.json")
    if damage == "manifest":
        manifest.write_text(manifest.read_text()[:10])
    else:
        data = next(manifest.parent.glob("n-settings-w00000.*.pkl"))
        data.write_bytes(data.read_bytes()[:20])
    with pytest.raises(RecordMissing) as e:
        settle(config(tmp_path, **{"train.local.lr": 0.1}))
    line = str(e.value)
    assert line.startswith("train loop L: its settings record is damaged (") and line.endswith(
        "); restore it from where the store came from, or train under a new --collection-id"
    ), line
    assert "compute it again" not in line and "\n" not in line


@pytest.mark.integration  # a Prefect server
def test_the_train_loop_flow_refuses_the_same_way_before_anything_starts(prefect_api, tmp_path):
    import asyncio

    from flows.train_loop import train_loop

    settle(config(tmp_path))
    CheckpointStore(str(tmp_path)).save("L", "train", 0, {"policy_version": "v1"})
    changed = {"collection_id": "L", "storage": {"root": str(tmp_path)}, "train": {"local": {"lr": 0.1}}}
    state = asyncio.run(train_loop(changed, return_state=True))
    assert state.is_failed() and "(train.local.lr 0.001 → 0.1)" in (state.message or ""), state.message
