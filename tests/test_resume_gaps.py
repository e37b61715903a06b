"""A checkpoint missing from the middle of a collection: the resume computes it again.

A collection resumes by replaying its saved steps in order (:mod:`focus.journal`), which
is exact while they form a prefix of it. A checkpoint removed from the store (damage, a
partial copy, an operator deleting a file) breaks that: a rerun whose phase end was saved
ended the phase at the gap, writing a batch without the waves after it, or refused with
``<url> already holds a different batch`` where the finished batch was still there. Now
the resume finds the first missing step (its manifest or its data file gone), discards
the saved steps after it, which were computed from it, and computes them again
(:mod:`tasks.gaps`). Real parts: the embedded tiny model server (seeded sampling: its
answers repeat), a local store and moto's S3 on loopback; each rerun's batch is compared
with the finished collection's bit for bit (every row, the Parquet files' digests).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest
from fixtures.journal import run_collect
from fixtures.resume import mismatches

from focus.agent import Agent
from focus.batch import Batch
from focus.collector import Collector
from focus.critic import ConstantCritic
from focus.env import Task
from focus.execution import Execution
from focus.journal import MemoryJournal, wave_step
from focus.priority import Phase, Selective
from focus.synthetic import SHAPES, SyntheticEnv, SyntheticPolicy, synthetic_format
from focus.testing import run
from storage import BatchExistsError, BatchStore, CheckpointStore, CorruptDataError
from storage.lease import Lease
from storage.manifest import Manifest
from tasks.config import load_config
from tasks.gaps import Gap, find_gap

pytestmark = pytest.mark.timeout(240)

CID = "gaps"
PHASES = [
    {"name": "evidence", "rollouts_per_task": 2},
    {"name": "continue", "transitions": 30, "wave_size": 4, "max_depth": 6},
]


def config(root: str, url: str):  # type: ignore[no-untyped-def]
    return load_config(
        overrides={
            "collection_id": CID,
            "seed": 13,
            "model.kind": "openai",
            "model.url": url,
            "env.n_tasks": 3,
            "agent.sampling.max_tokens": 16,
            "search.phases": PHASES,
            "search.depth_share": 0.0,  # the ranking unbounded: CASES count this collection's 4 waves
            "critic.kind": "factory",
            "critic.factory": "fixtures.resume:varied_critic",  # scores that steer the plans
            "execution.kind": "local",
            "storage.root": root,
            "progress": False,
        },
        environ={},
    )


def run_finished(server_url: str, tmp_path_factory) -> tuple[Path, Batch, Manifest]:
    """(store folder, batch, its manifest) of the collection run once, uninterrupted."""
    root = tmp_path_factory.mktemp("finished") / "store"
    out = run_collect(config(str(root), server_url))
    store = BatchStore(str(root))
    return root, store.read(out["batch_url"]), store.manifest(out["batch_url"])


@pytest.fixture(scope="module")
def finished(local_model_server, tmp_path_factory):
    return run_finished(local_model_server.url, tmp_path_factory)


def copy_without(finished, tmp_path: Path, *names: str, batch: bool = False) -> Path:
    """A copy of the finished store without the checkpoint files ``names`` (globs) and,
    unless ``batch``, without its batch."""
    root = tmp_path / "store"
    shutil.copytree(finished[0], root)
    folder = root / "checkpoints" / CID
    for name in names:
        (hit,) = folder.glob(name)
        hit.unlink()
    if not batch:
        shutil.rmtree(root / "batches")
    return root


def rerun(root: Path, url: str, caplog) -> tuple[dict, list[str]]:  # type: ignore[no-untyped-def]
    """Run the collection again; its result and the warnings it logged."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tasks.gaps"):
        out = run_collect(config(str(root), url))
    return out, [r.getMessage() for r in caplog.records if r.name == "tasks.gaps"]


def assert_finished_batch(out: dict, finished) -> None:  # type: ignore[no-untyped-def]
    """The rerun's batch is the finished collection's: every row bit for bit, the same
    Parquet bytes (the manifest's fingerprint is the digest of the table files)."""
    store = BatchStore(out["batch_url"].rsplit("/batches/", 1)[0])
    got, want = store.read(out["batch_url"]), finished[1]
    assert len(want.actor) >= 30 and len(want.critic) >= 8, "too small a batch to say anything"
    assert mismatches(got, want) == {"actor": 0, "critic": 0}
    assert store.manifest(out["batch_url"]).fingerprint == finished[2].fingerprint


def waves(root: Path) -> int:
    return sum(1 for p, _ in CheckpointStore(str(root)).list(CID) if p == "1.continue")


#: (what goes, its manifest named in the warning, steps replayed by the rerun, saved steps discarded)
#: The finished collection saved 4 continuation waves: its steps are the evidence and its
#: scores, 4 waves and their scores, the phase end, then the trees' picture and the export.
CASES = {
    "a middle wave's manifest": ("n-1.continue-w00002.manifest.json", 6, 5),
    "the last wave's manifest": ("n-1.continue-w00003.manifest.json", 8, 3),
    "the evidence's manifest": ("n-evidence-w00000.manifest.json", 0, 11),
    "a middle wave's data file": ("n-1.continue-w00001.*.pkl", 4, 7),
    "the phase end's manifest": ("n-1.continue.end-w00000.manifest.json", 10, 1),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_missing_checkpoint_is_computed_again_with_what_follows_it(
    case, finished, local_model_server, tmp_path, caplog
):
    """An unfinished collection (no batch, no export record) missing one checkpoint: the
    rerun replays the steps before it, discards the saved ones after it, computes them
    again and writes the finished collection's batch. Before, a phase whose end was
    saved ended at the gap: a batch of 34 actor rows where the collection has 49 for a
    missing middle wave, 43 for the last; a missing data file stopped the rerun."""
    name, replayed, discarded = CASES[case]
    assert waves(finished[0]) == 4  # the figures in CASES are for 4 waves
    root = copy_without(finished, tmp_path, name, "n-export-w00000.manifest.json")
    out, warned = rerun(root, local_model_server.url, caplog)
    assert_finished_batch(out, finished)
    assert out["stats"]["steps_reused"] == replayed + 1  # and the configuration check
    (line,) = warned
    assert f"{discarded} saved step(s) after it" in line and "computing again from" in line, line
    if name.endswith(".manifest.json"):
        assert f"checkpoints/{CID}/{name} is missing" in line
    else:
        assert "lists a data file that is missing" in line
    # the store holds every step again, each once; a second rerun replays them all
    assert waves(root) == 4
    again, warned = rerun(root, local_model_server.url, caplog)
    assert not warned and again["stats"]["steps_reused"] == 2  # configuration, export


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_middle_wave_missing_beside_the_finished_batch_gives_that_batch(
    finished, local_model_server, tmp_path, caplog
):
    """The audit's case: the batch is there but not the export record that says the
    collection finished, and a middle wave's manifest is gone. The rerun refused with
    '<url> already holds a different batch' (its phase ended at the gap); now it
    computes the waves again, their batch is the one there, and it is kept as it is."""
    root = copy_without(
        finished, tmp_path, "n-1.continue-w00002.manifest.json", "n-export-w00000.manifest.json", batch=True
    )
    store = BatchStore(str(root))
    written = store.manifest(store.url_for(CID, 0))
    out, warned = rerun(root, local_model_server.url, caplog)
    assert_finished_batch(out, finished)
    assert store.manifest(out["batch_url"]) == written and len(warned) == 1


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_finished_collection_keeps_its_batch_when_a_checkpoint_went(finished, local_model_server, tmp_path, caplog):
    """A finished collection whose batch checks out needs none of its steps: a missing
    wave changes nothing, and nothing is discarded or computed."""
    root = copy_without(finished, tmp_path, "n-1.continue-w00002.manifest.json", batch=True)
    out, warned = rerun(root, local_model_server.url, caplog)
    assert not warned and out["stats"]["steps_reused"] == 2
    assert_finished_batch(out, finished)
    assert waves(root) == 3  # the gap stays: no step needed it


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_recomputed_batch_that_differs_from_the_one_there_is_refused_in_one_line(
    finished, local_model_server, tmp_path, caplog
):
    """Where the model's answers do not repeat, the waves computed again give another
    batch than the one an earlier run left: the rerun names the missing step and what to
    do, never just 'a different batch'; doing it gives the recomputed batch. (The batch
    there is made different here: the embedded model's answers do repeat.)"""
    root = copy_without(
        finished, tmp_path, "n-1.continue-w00002.manifest.json", "n-export-w00000.manifest.json", batch=True
    )
    store = BatchStore(str(root))
    url = store.url_for(CID, 0)
    there = store.read_tables(url)
    store.write(Batch(CID, 0, there.actor.slice(0, 10), there.critic, there.stats), overwrite=True)
    with pytest.raises(BatchExistsError) as refused:
        rerun(root, local_model_server.url, caplog)
    line = str(refused.value)
    assert "\n" not in line and "1.continue wave 2 went missing" in line and f"remove {url} and rerun" in line, line
    shutil.rmtree(url.removeprefix("file://"))
    out, _ = rerun(root, local_model_server.url, caplog)
    assert_finished_batch(out, finished)


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_damaged_checkpoint_stops_the_resume_saying_what_to_do(finished, local_model_server, tmp_path, caplog):
    """A data file whose bytes differ from its manifest is kept for the operator to look
    at, and the resume stops naming it and what to do; done, the batch is the finished one."""
    root = copy_without(finished, tmp_path, "n-export-w00000.manifest.json")
    (data,) = (root / "checkpoints" / CID).glob("n-1.continue-w00001.*.pkl")
    data.write_bytes(data.read_bytes()[:-1] + b"\x00")
    manifest = root / "checkpoints" / CID / "n-1.continue-w00001.manifest.json"
    with pytest.raises(CorruptDataError) as stopped:
        rerun(root, local_model_server.url, caplog)
    line = str(stopped.value)
    assert "checksum differs from the manifest" in line and f"remove file://{manifest} and rerun" in line, line
    manifest.unlink()
    out, warned = rerun(root, local_model_server.url, caplog)
    assert_finished_batch(out, finished)
    assert len(warned) == 1 and "n-1.continue-w00001.manifest.json is missing" in warned[0]


@pytest.mark.parametrize("damage", ["cut short", "garbage bytes"])
@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_a_damaged_checkpoint_manifest_stops_the_resume_saying_what_to_do(
    damage, finished, local_model_server, tmp_path, caplog
):
    """A manifest whose JSON is cut short or garbled stopped the resume with `manifest is
    not valid JSON (...); the write may have been cut short` and no word of what to do;
    it now gives the damaged data file's advice, and following it gives the finished batch."""
    root = copy_without(finished, tmp_path, "n-export-w00000.manifest.json")
    manifest = root / "checkpoints" / CID / "n-1.continue-w00001.manifest.json"
    text = manifest.read_bytes()
    manifest.write_bytes(text[:-20] if damage == "cut short" else text[:100] + b"\x00\xff\xfe" + text[103:])
    with pytest.raises(CorruptDataError) as stopped:
        rerun(root, local_model_server.url, caplog)
    line = str(stopped.value)
    assert "manifest is not valid JSON" in line and f"remove file://{manifest} and rerun" in line, line
    manifest.unlink()
    out, _ = rerun(root, local_model_server.url, caplog)
    assert_finished_batch(out, finished)


@pytest.mark.needs("torch")  # the finished collection's critic is a LocalCritic
def test_on_s3_a_missing_middle_wave_is_computed_again(finished, local_model_server, s3_bucket, caplog):
    """The same on an object store (moto's S3 on loopback): listing, discarding and the
    rewrite go through the store's own requests."""
    import fsspec

    fs = fsspec.filesystem("s3")
    fs.put(str(finished[0]) + "/", s3_bucket.removeprefix("s3://") + "/", recursive=True)
    folder = f"{s3_bucket.removeprefix('s3://')}/checkpoints/{CID}"
    fs.rm([f"{folder}/n-1.continue-w00002.manifest.json", f"{folder}/n-export-w00000.manifest.json"])
    fs.rm(f"{s3_bucket.removeprefix('s3://')}/batches", recursive=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="tasks.gaps"):
        out = run_collect(config(s3_bucket, local_model_server.url))
    assert out["batch_url"].startswith(s3_bucket)
    assert out["stats"]["steps_reused"] == 7
    assert any("n-1.continue-w00002.manifest.json is missing" in r.getMessage() for r in caplog.records)
    assert_finished_batch(out, finished)


# ---- the decision (pure) ----

SEARCH = [Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=30)]


def saved(*keys: tuple[str, int], broken: tuple[tuple[str, int], ...] = ()) -> dict[tuple[str, int], bool]:
    out = {k: True for k in [("config", 0), ("critic", 0), *keys]}
    return out | {k: False for k in broken}


def steps(n: int, end: bool = False) -> list[tuple[str, int]]:
    """The keys of a collection with ``n`` continuation waves saved (and its end)."""
    out = [("evidence", 0), ("evidence.score", 0)]
    for w in range(n):
        out += [("1.continue", w), ("1.continue.score", w)]
    return out + ([("1.continue.end", 0)] if end else [])


def test_a_prefix_of_the_steps_is_no_gap():
    """What an interrupted run leaves: a prefix of the steps, maybe with the unfinished
    record of the wave it stopped at (bad responses), or of the evidence."""
    assert find_gap(SEARCH, saved(), {}) is None
    assert find_gap(SEARCH, saved(("0.evidence.unfinished", 0)), {}) is None
    assert find_gap(SEARCH, saved(*steps(3)), {}) is None
    assert find_gap(SEARCH, saved(*steps(3), ("1.continue", 3)), {}) is None  # stopped before the wave's scores
    assert find_gap(SEARCH, saved(*steps(3), ("1.continue.unfinished", 3)), {}) is None
    assert find_gap(SEARCH, saved(*steps(3), ("1.continue.unfinished", 1)), {}) is None  # rerun and saved whole
    done = saved(*steps(3, end=True), ("trees.svg", 0), ("export", 0))
    assert find_gap(SEARCH, done, {("1.continue.end", 0): 3}) is None


def test_the_first_missing_step_and_everything_saved_after_it_are_found():
    full = steps(5, end=True)
    ends = {("1.continue.end", 0): 5}
    gap = find_gap(SEARCH, saved(*[k for k in full if k != ("1.continue", 2)], ("trees.svg", 0)), ends)
    after = [("1.continue.score", 2), *steps(5, end=True)[8:], ("trees.svg", 0)]
    assert gap == Gap(("1.continue", 2), False, tuple(after))
    # the end's data file gone and nothing after the phase: the end is what is missing
    gap = find_gap(SEARCH, saved(*full[:-1], broken=(("1.continue.end", 0),)), {})
    assert gap == Gap(("1.continue.end", 0), True, (("1.continue.end", 0),))
    # a data file gone at the frontier: it goes too, or the loop would load it
    gap = find_gap(SEARCH, saved(*steps(2), broken=(("1.continue.unfinished", 2),)), {})
    assert gap == Gap(("1.continue", 2), False, (("1.continue.unfinished", 2),))
    # the last wave gone, its scores saved: a phase end that says 5 waves finds it
    gap = find_gap(SEARCH, saved(*[k for k in full if k != ("1.continue", 4)]), ends)
    assert gap == Gap(("1.continue", 4), False, (("1.continue.score", 4), ("1.continue.end", 0)))


def test_the_store_lists_checkpoints_by_name_and_discards_only_those_named(tmp_path):
    """``saved`` reads one listing (no manifest): which checkpoints have a manifest and
    whether their data file is there; ``discard`` removes the named ones, manifest and
    data, and nothing of a checkpoint whose name starts the same."""
    root = str(tmp_path / "store")
    store = CheckpointStore(root)
    with Lease(root, CID):
        for key in [("evidence", 0), ("1.continue", 0), ("1.continue.score", 0), ("1.continue", 1), (3, 2)]:
            store.save(CID, *key, key)
        (data,) = (tmp_path / "store" / "checkpoints" / CID).glob("n-1.continue-w00001.*.pkl")
        data.unlink()
        assert store.saved(CID) == {
            ("evidence", 0): True,
            ("1.continue", 0): True,
            ("1.continue.score", 0): True,
            ("1.continue", 1): False,
            (3, 2): True,
        }
        store.discard(CID, [("1.continue", 1), ("1.continue", 0)])
        assert store.saved(CID) == {("evidence", 0): True, ("1.continue.score", 0): True, (3, 2): True}
        data_files = sorted(p.name.rsplit(".", 2)[0] for p in (tmp_path / "store" / "checkpoints" / CID).glob("*.pkl"))
        assert data_files == ["n-1.continue.score-w00000", "n-evidence-w00000", "p003-w00002"]
        assert store.load(CID, "1.continue.score", 0) == ("1.continue.score", 0)


def test_the_collector_refuses_a_journal_whose_phase_ends_after_a_missing_wave():
    """The library's own guard, for journals other than the pipeline's (which mends its
    gaps first): a recorded phase end after a missing wave would end the phase short."""

    def collector() -> tuple[Collector, list[Task]]:
        mdps = [SHAPES[s](i) for i, s in enumerate(["uniform", "critical", "long"])]
        agent = Agent(SyntheticPolicy(mdps), SyntheticEnv(mdps), synthetic_format(), max_steps=20)
        phases = (
            Phase("evidence", rollouts_per_task=2),
            Phase("continue", transitions=40, wave_size=4, wave_unit="jobs"),
        )
        col = Collector(agent, Selective(phases=phases), ConstantCritic(0.5), execution=Execution(max_concurrency=4))
        return col, [Task(f"t{i}", {"mdp": i}) for i in range(3)]

    journal = MemoryJournal()
    col, tasks = collector()
    run(col.search(tasks, journal))
    assert wave_step(1, 3) in journal.steps
    del journal.steps[wave_step(1, 1)]
    col, tasks = collector()
    with pytest.raises(ValueError, match="phase 1 ending after .* waves but holds only its first 1"):
        run(col.search(tasks, journal))
