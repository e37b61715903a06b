"""The search's knobs in the configuration (``search.explore``, ``search.depth_share``).

A knob a file, a variable or ``--set`` gives reaches the collector's search; one left
unset is not passed, so the search has the library's default whatever it is (the
tests below move a default in the library itself, as a release would); a bad value or
a knob the kind does not use is one line naming the field; and a collection or a train
loop resumed with another value, the library's default moved included, is refused,
naming the knob and its old and new value. Real parts: the config loader, the toy task
with a scripted policy, a local checkpoint store."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from focus.format import ByteCodec
from focus.priority import Priority, Selective, Uniform
from focus.testing import ScriptedPolicy
from storage import CheckpointStore
from tasks.config import ConfigError, FocusConfig, load_config
from tasks.config.search import LEFT_OUT, SELECTIVE_KNOBS
from tasks.config.sources import explain_config
from tasks.fingerprint import CONFIG_KEY, ResumeMismatch, fingerprint
from tasks.journal import CheckpointJournal
from tasks.loop_settings import LoopSettingsChanged, settle

#: A value of each knob other than the library's default.
SET = {"explore": 0.5, "depth_share": 2.0}


@contextlib.contextmanager
def library_default(name: str, value: float) -> Iterator[None]:
    """``Selective``'s default of ``name`` moved to ``value`` for the block, as a new
    release of the library would have it (restored after, whatever happens)."""
    info = Selective.model_fields[name]
    before = info.default
    info.default = value
    Selective.model_rebuild(force=True)
    try:
        assert getattr(Selective(), name) == value
        yield
    finally:
        info.default = before
        Selective.model_rebuild(force=True)


def test_every_public_field_of_the_librarys_searches_is_a_knob_or_left_out_with_a_reason():
    fields = set(Selective.model_fields) | set(Uniform.model_fields) | set(Priority.model_fields)
    in_config = set(FocusConfig.model_fields["search"].annotation.model_fields)  # type: ignore[union-attr]
    assert set(SELECTIVE_KNOBS) <= in_config
    assert fields - {"phases", "waves_in_flight"} == set(SELECTIVE_KNOBS) | set(LEFT_OUT)
    assert not set(SELECTIVE_KNOBS) & set(LEFT_OUT)


def test_a_config_that_sets_nothing_builds_the_librarys_search_whatever_its_defaults():
    cfg = load_config(environ={})
    built = cfg.search.build_search()
    assert built == Selective(phases=tuple(cfg.search.phases), waves_in_flight=cfg.search.waves_in_flight)
    assert built.model_fields_set == {"phases", "waves_in_flight"}  # no knob passed: the library's defaults
    with library_default("depth_share", 3.0), library_default("explore", 0.125):
        moved = load_config(environ={}).search.build_search()
        assert moved == Selective(phases=tuple(cfg.search.phases), waves_in_flight=cfg.search.waves_in_flight)
        assert (moved.depth_share, moved.explore) == (3.0, 0.125)
        assert {k: fingerprint(cfg)["search"][k] for k in SELECTIVE_KNOBS} == {"explore": 0.125, "depth_share": 3.0}


def test_config_show_gives_an_unset_knob_the_librarys_value_and_a_set_one_its_source():
    with library_default("depth_share", 2.5):
        rows = {key: (value, source) for key, value, source in explain_config(None, {"search.explore": 0.5}, {})[1]}
    assert rows["search.depth_share"] == (2.5, "library default")  # what the search gets, not null
    assert rows["search.explore"] == (0.5, "--set search.explore")
    uniform = {key: value for key, value, _ in explain_config(None, {"search.kind": "uniform"}, {})[1]}
    assert uniform["search.depth_share"] is None  # a kind without knobs has none to show


@pytest.mark.parametrize("suffix", ["toml", "yaml"])
def test_each_knob_in_a_file_reaches_the_collectors_search(tmp_path, suffix):
    path = tmp_path / f"c.{suffix}"
    if suffix == "toml":
        path.write_text("[search]\n" + "".join(f"{k} = {v}\n" for k, v in SET.items()))
    else:
        path.write_text("search:\n" + "".join(f"  {k}: {v}\n" for k, v in SET.items()))
    cfg = load_config(path, environ={})
    agent, _ = cfg.build_agent(ScriptedPolicy(["1"]))
    search = cfg.build_collector(agent).priority
    assert isinstance(search, Selective)
    assert {k: getattr(search, k) for k in SET} == SET
    assert {k: fingerprint(cfg)["search"][k] for k in SET} == SET
    by_variable = load_config(environ={"FOCUS_SEARCH__DEPTH_SHARE": "2.0", "FOCUS_SEARCH__EXPLORE": "0.5"})
    assert by_variable.build_search() == cfg.build_search()


def trees(**overrides: Any) -> list[list[tuple[int, int]]]:
    """The (parent, child) checkpoints of each tree a short collection grows."""
    over = {"env.n_tasks": 2, "search.phases.1.transitions": 40, "agent.max_steps": 5, **overrides}
    cfg = load_config(overrides=over, environ={})
    agent, tasks = cfg.build_agent(ScriptedPolicy(["1", "2", "3"]))
    state = asyncio.run(cfg.build_collector(agent).search(tasks))
    return [sorted((e.parent, e.child) for e in t.edges.values()) for t in state.trees]


def test_each_knob_changes_where_the_collection_branches():
    default = trees()
    assert trees() == default  # seeded: the same collection again
    assert trees(**{"search.explore": 1.0}) != default
    assert trees(**{"search.depth_share": 1.0}) != default
    lib = Selective()
    same = {f"search.{k}": getattr(lib, k) for k in SELECTIVE_KNOBS}
    assert trees(**same) == default  # the library's defaults spelt out: the same collection


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[search]\ndepth_share = -1.0\n", "search.depth_share: Input should be greater than or equal to 0"),
        ("[search]\nexplore = 1.5\n", "search.explore: Input should be less than or equal to 1"),
        ("[search]\nexplore = nan\n", "search.explore: Input should be less than or equal to 1"),
        ("[search]\ndepth_share = 'x'\n", "search.depth_share: Input should be a valid number"),
        (
            '[search]\nkind = "uniform"\ndepth_share = 3.0\n',
            "search.depth_share is set but search.kind is 'uniform', which does not use it",
        ),
    ],
)
def test_a_bad_knob_is_one_line_naming_the_field(tmp_path, text, expected):
    path = tmp_path / "c.toml"
    path.write_text(text)
    with pytest.raises(ConfigError) as bad:
        load_config(path, environ={})
    assert len(str(bad.value).splitlines()) == 1 and expected in str(bad.value), str(bad.value)


def test_a_uniform_search_has_no_knobs_and_fingerprints_none():
    cfg = load_config(overrides={"search.kind": "uniform"}, environ={})
    assert isinstance(cfg.build_search(), Uniform)
    assert all(fingerprint(cfg)["search"][k] is None for k in SELECTIVE_KNOBS)


def check_config(root: Path, **overrides: Any) -> None:
    """A collection's first step, as a run or a resume takes it: compare the config, and
    for a new collection save its record once the env's codec is known (tasks/collect.py)."""
    cfg = load_config(overrides={"collection_id": "c", "storage.root": str(root), **overrides}, environ={})
    journal = CheckpointJournal(cfg)

    async def first_step() -> None:
        await journal.check_config()
        await journal.codec.check(ByteCodec(), journal.save)

    asyncio.run(first_step())


def test_a_collection_resumed_with_another_knob_is_refused_naming_it(tmp_path):
    check_config(tmp_path)
    check_config(tmp_path)  # the same: resumes
    lib = Selective()
    check_config(tmp_path, **{f"search.{k}": getattr(lib, k) for k in SELECTIVE_KNOBS})  # the defaults, spelt out
    with pytest.raises(ResumeMismatch, match=rf"differs in: search.depth_share {lib.depth_share} → 2.0\)"):
        check_config(tmp_path, **{"search.depth_share": 2.0})
    with pytest.raises(ResumeMismatch, match=rf"differs in: search.explore {lib.explore} → 0.5\)"):
        check_config(tmp_path, **{"search.explore": 0.5})


def test_a_collection_resumed_after_the_librarys_default_moved_is_refused_until_the_old_value_is_set(tmp_path):
    check_config(tmp_path)
    before = Selective().depth_share
    with library_default("depth_share", before + 3.0):
        with pytest.raises(ResumeMismatch, match=rf"search.depth_share {before} → {before + 3.0}\)"):
            check_config(tmp_path)
        check_config(tmp_path, **{"search.depth_share": before})  # the value it was made with: resumes


def test_a_record_made_before_the_config_had_knobs_reads_as_the_defaults_of_that_time(tmp_path):
    """A stored fingerprint without the knobs (made before this change) ran with
    explore 0.25, depth_share 0 (the library's defaults then): it resumes while the
    library keeps them and is refused once a default moves."""
    cfg = load_config(overrides={"collection_id": "c", "storage.root": str(tmp_path)}, environ={})
    old = fingerprint(cfg)
    for knob in SELECTIVE_KNOBS:
        del old["search"][knob]
    CheckpointStore(str(tmp_path)).save("c", *CONFIG_KEY, json.dumps(old, sort_keys=True))
    with library_default("explore", 0.25), library_default("depth_share", 0.0):
        check_config(tmp_path)
        with pytest.raises(ResumeMismatch, match=r"search.explore 0.25 → 0.5\)"):
            check_config(tmp_path, **{"search.explore": 0.5})
    with library_default("explore", 0.25), library_default("depth_share", 3.0):
        with pytest.raises(ResumeMismatch, match=r"search.depth_share 0.0 → 3.0\)"):
            check_config(tmp_path)


def loop_config(root: Path, **overrides: Any) -> FocusConfig:
    return load_config(overrides={"collection_id": "L", "storage.root": str(root), **overrides}, environ={})


def test_a_train_loop_resumed_with_another_knob_or_default_is_refused_and_an_old_record_reads_as_then(tmp_path):
    store = CheckpointStore(str(tmp_path))
    settle(loop_config(tmp_path))
    store.save("L", "train", 0, {"policy_version": "v1"})  # a trainer step made with those settings
    settle(loop_config(tmp_path))
    with pytest.raises(LoopSettingsChanged, match=r"\(search.depth_share .* → 2.0\)"):
        settle(loop_config(tmp_path, **{"search.depth_share": 2.0}))
    # a loop whose record was made before the config had the knobs
    old = store.load("L", "settings", 0)
    for knob in SELECTIVE_KNOBS:
        del old["settings"]["search"][knob]
    other = CheckpointStore(str(tmp_path / "old"))
    other.save("L", "settings", 0, old)
    other.save("L", "train", 0, {"policy_version": "v1", "settings_recorded": True})
    with library_default("explore", 0.25), library_default("depth_share", 0.0):
        settle(loop_config(tmp_path / "old"))
    with library_default("explore", 0.25), library_default("depth_share", 3.0):
        with pytest.raises(LoopSettingsChanged, match=r"\(search.depth_share 0.0 → 3.0\)"):
            settle(loop_config(tmp_path / "old"))


@pytest.mark.parametrize("name", ["a/b", "x#%?", "e v", "évidence", "n" * 151])
def test_a_phase_name_the_store_cannot_hold_is_refused_with_the_configuration(name):
    """A phase's checkpoints are named after it in the store: ``a/b`` passed the
    configuration, and the collection ran its evidence phase, then stopped at the first
    wave's save (``phase name '1.a/b' is not a valid storage name``)."""
    phases = [{"name": "evidence", "rollouts_per_task": 2}, {"name": name, "transitions": 12}]
    with pytest.raises(ConfigError, match=r"search\.phases\.1\.name .* names the phase's checkpoints in the store"):
        load_config(overrides={"search.phases": phases}, environ={})
