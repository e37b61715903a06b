"""Configuration: file (TOML/YAML) < FOCUS_* environment < flags; one clear error; pickles."""

from __future__ import annotations

import pickle

import pytest

from tasks.config import ConfigError, FocusConfig, import_object, load_config


def test_sources_layer_file_env_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text('seed = 1\n[env]\nn_tasks = 5\n[model]\nkind = "openai"\nurl = "http://127.0.0.1:9"\n')
    cfg = load_config(f, {"seed": 3}, environ={"FOCUS_SEED": "2", "FOCUS_ENV__N_TASKS": "6", "OTHER": "x"})
    assert (cfg.seed, cfg.env.n_tasks, cfg.model.url) == (3, 6, "http://127.0.0.1:9")
    y = tmp_path / "c.yaml"
    y.write_text("search:\n  phases:\n    - {name: evidence, rollouts_per_task: 3}\n")
    cfg = load_config(y, {"search.phases.0.rollouts_per_task": 5}, environ={})
    assert [p.rollouts_per_task for p in cfg.search.phases] == [5]


def test_defaults_are_the_embedded_run_and_pickle():
    cfg = load_config(environ={})
    assert (cfg.model.kind, cfg.model.url, cfg.env.kind, cfg.execution.kind) == ("local", None, "reach_target", "local")
    assert cfg.storage.root.startswith("file:///") and cfg.storage.root.endswith("/runs")
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert FocusConfig.model_validate(cfg.model_dump(mode="json")) == cfg  # travels as JSON flow parameters


def test_invalid_config_names_every_field_and_reason(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(
            overrides={"model.kind": "openai", "search.phases.1.wave_size": 0, "typo": 1},
            environ={"FOCUS_EXECUTION__N_WORKERS": "-1"},
        )
    msg = str(e.value)
    assert "model.url is required when model.kind is 'openai'" in msg
    assert "search.phases.1.wave_size: Input should be greater than or equal to 1" in msg
    assert "execution.n_workers: Input should be greater than 0" in msg
    assert "typo: unknown field" in msg
    assert "FOCUS_EXECUTION__N_WORKERS" in msg  # says where values came from
    with pytest.raises(ConfigError, match="only the first phase may be an evidence phase"):
        load_config(overrides={"search.phases.1": {"name": "again", "rollouts_per_task": 2}}, environ={})
    # a search that budgets nothing ran and returned an empty batch without a word
    with pytest.raises(ConfigError, match=r"the search's phases budget nothing"):
        load_config(overrides={"search.phases": [{"name": "continue", "transitions": 0}]}, environ={})


def test_bad_files_and_import_paths_are_named(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("seed = [")
    with pytest.raises(ConfigError, match="bad.toml.*not valid TOML"):
        load_config(bad, environ={})
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config(tmp_path / "missing.toml", environ={})
    with pytest.raises(ConfigError, match="model.factory"):
        load_config(overrides={"model.kind": "factory", "model.factory": "no_colon"}, environ={})
    with pytest.raises(ConfigError, match="has no attribute 'nope'"):
        import_object("focus.toy:nope")


def test_with_updates_validates():
    cfg = load_config(environ={})
    assert cfg.with_updates(**{"execution.address": "tcp://127.0.0.1:1"}).execution.address == "tcp://127.0.0.1:1"
    with pytest.raises(ConfigError, match="iteration"):
        cfg.with_updates(iteration=-1)


@pytest.mark.parametrize(
    "where,expected",
    [
        (
            {"overrides": {"model.urll": "http://x"}},
            "model.urll: unknown field (from --set model.urll; did you mean model.url?)",
        ),
        (
            {"environ": {"FOCUS_EXECUTION__N_WORKER": "3"}},
            "(from FOCUS_EXECUTION__N_WORKER; did you mean FOCUS_EXECUTION__N_WORKERS?)",
        ),
        ({"environ": {"FOCUS_MODLE__URL": "http://x"}}, "(from FOCUS_MODLE__URL; did you mean FOCUS_MODEL__URL?)"),
        ({"environ": {"FOCUS_SEEED": "3"}}, "seeed: unknown field (from FOCUS_SEEED; did you mean FOCUS_SEED?)"),
        # one underscore where nested fields need two: it was taken for another tool's variable and ignored
        (
            {"environ": {"FOCUS_MODEL_URL": "http://x"}},
            "model_url: unknown field (from FOCUS_MODEL_URL; did you mean FOCUS_MODEL__URL?)",
        ),
        (
            {"environ": {"FOCUS_MODEL_HTTP_TIMEOUT_S": "5"}},
            "(from FOCUS_MODEL_HTTP_TIMEOUT_S; did you mean FOCUS_MODEL__HTTP__TIMEOUT_S?)",
        ),
        ({"environ": {"FOCUS_STORAGE_ROOT": "/x"}}, "(from FOCUS_STORAGE_ROOT; did you mean FOCUS_STORAGE__ROOT?)"),
        ({"overrides": {"search.phases.1.wave_sise": 3}}, "did you mean search.phases.1.wave_size?"),
        ({"overrides": {"root": "/tmp/x"}}, "root: unknown field (from --set root; did you mean storage.root?)"),
    ],
)
def test_unknown_field_is_one_line_naming_its_source_and_the_likely_field(where, expected):
    with pytest.raises(ConfigError) as e:
        load_config(**{"environ": {}, **where})
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith("invalid configuration: ") and expected in msg, msg


def test_an_override_is_named_by_its_label_where_it_has_one():
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"env.n_tasks": 0, "seed": "x"}, environ={}, labels={"env.n_tasks": "--tasks"})
    msg = str(e.value)
    assert "env.n_tasks: Input should be greater than 0 (from --tasks)" in msg
    assert "(from --set seed)" in msg  # no label: the --set it came from


def test_unknown_field_in_a_file_names_the_file(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[agent]\nmax_step = 3\n[sampling]\ntemperature = 0.5\n")
    with pytest.raises(ConfigError) as e:
        load_config(f, environ={})
    msg = str(e.value)
    assert f"agent.max_step: unknown field (from {f}; did you mean agent.max_steps?)" in msg
    assert f"sampling: unknown field (from {f}; did you mean agent.sampling?)" in msg


def test_other_tools_variables_with_the_prefix_are_left_alone():
    cfg = load_config(environ={"FOCUS_WORK_POOL": "focus", "FOCUS_PROJECT_DIR": "/srv/focus"})
    assert cfg == load_config(environ={})


def test_text_fields_keep_text_from_variables_and_flags():
    cfg = load_config(environ={"FOCUS_COLLECTION_ID": "123", "FOCUS_MODEL__POLICY_VERSION": "7"})
    assert (cfg.collection_id, cfg.model.policy_version) == ("123", "7")
    assert load_config(overrides={"collection_id": 2026}, environ={}).collection_id == "2026"
    assert load_config(environ={"FOCUS_ENV__N_TASKS": "5"}).env.n_tasks == 5


def test_a_scheduler_address_selects_dask_however_the_config_is_built():
    """``ExecutionConfig(address=...)`` stayed ``local``: pydantic drops what an "after"
    validator returns in place of the model when ``__init__`` builds it."""
    from tasks.config.schema import ExecutionConfig

    addr = "tcp://127.0.0.1:1"
    assert ExecutionConfig(address=addr).kind == "dask"
    assert ExecutionConfig.model_validate({"address": addr}).kind == "dask"
    assert FocusConfig.model_validate({"execution": {"address": addr}}).execution.kind == "dask"
    assert ExecutionConfig().kind == "local" and ExecutionConfig(kind="dask").address is None


@pytest.mark.parametrize(
    "section,kind",
    [("env", "reach_target"), ("model", "local"), ("critic", "constant"), ("model", "openai")],
)
def test_a_factory_its_kind_does_not_use_is_refused(section, kind):
    """``--set env.factory=mypkg.envs:make`` without ``env.kind = "factory"`` collected
    the toy task instead, without a word (the import path was never even imported);
    the same for a model's or a critic's factory."""
    over = {f"{section}.factory": "mypkg.things:make", f"{section}.kind": kind}
    if kind == "openai":
        over["model.url"] = "http://127.0.0.1:8000"
    with pytest.raises(ConfigError) as e:
        load_config(None, over)
    assert (
        f"{section}.factory 'mypkg.things:make' is set but {section}.kind is '{kind}', which does not use it; "
        f"set {section}.kind = 'factory'" in str(e.value)
    ), str(e.value)
    assert (
        load_config(None, {**over, f"{section}.kind": "factory"}).model_dump()[section]["factory"]
        == "mypkg.things:make"
    )


def test_a_list_index_past_the_next_entry_is_refused_naming_the_key():
    """`--set search.phases.5.transitions=3` (two phases) added empty phases 2-4 and the
    error named their missing fields (`search.phases.2.name: Field required; ...`), not
    the key that made them. One past the end still adds a phase."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"search.phases.5.transitions": 3}, environ={})
    msg = str(e.value)
    assert msg == (
        "invalid configuration key 'search.phases.5.transitions': search.phases has 2 entries, "
        "so its next one is 2, not 5"
    ), msg
    with pytest.raises(ConfigError, match=r"search\.phases has 2 entries, so its next one is 2, not 3"):
        load_config(environ={"FOCUS_SEARCH__PHASES__3__TRANSITIONS": "3"})
    cfg = load_config(overrides={"search.phases.2.name": "more", "search.phases.2.transitions": 8}, environ={})
    assert [p.name for p in cfg.search.phases] == ["evidence", "continue", "more"]


def test_a_field_missing_from_an_entry_a_flag_added_names_the_flag(tmp_path):
    """`--set search.phases.2.transitions=3` (two phases) adds a third phase without a
    name; the line was `search.phases.2.name: Field required`, naming no source, so
    nothing said that the flag had made a new phase rather than edited one."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"search.phases.2.transitions": 3}, environ={})
    assert str(e.value).endswith(
        "search.phases.2.name: Field required (from --set search.phases.2.transitions, which adds search.phases.2)"
    ), str(e.value)
    with pytest.raises(ConfigError) as e:
        load_config(environ={"FOCUS_SEARCH__PHASES__2__TRANSITIONS": "3"})
    assert str(e.value).endswith(
        "search.phases.2.name: Field required (from FOCUS_SEARCH__PHASES__2__TRANSITIONS, which adds search.phases.2)"
    ), str(e.value)
    path = tmp_path / "c.toml"  # past a file's phases: the flag that added one, not the file
    path.write_text('[[search.phases]]\nname = "e"\nrollouts_per_task = 2\n')
    with pytest.raises(ConfigError) as e:
        load_config(path, {"search.phases.1.transitions": 3}, environ={})
    assert str(e.value).endswith(
        "search.phases.1.name: Field required (from --set search.phases.1.transitions, which adds search.phases.1)"
    ), str(e.value)


def test_a_set_value_in_tomls_inline_syntax_is_read_as_a_config_file_writes_it(capsys):
    """A --set list or table written as in a TOML file (`[{name = "e", ...}]`) was taken
    for text: `search.phases: Input should be a valid list`. It is read as TOML now; one
    that reads neither way is one line naming both readings."""
    import typer

    from cli.common import overrides

    got = overrides(['search.phases=[{name = "e", rollouts_per_task = 2}]', "seed=3", "model.model=Qwen/Qwen3"])
    assert got == {"search.phases": [{"name": "e", "rollouts_per_task": 2}], "seed": 3, "model.model": "Qwen/Qwen3"}
    assert [p.rollouts_per_task for p in load_config(overrides=got, environ={}).search.phases] == [2]
    with pytest.raises(typer.Exit) as e:
        overrides(['search.phases=[{name = "e"}'])
    assert e.value.exit_code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --set 'search.phases=[{name = \"e\"}': the value is neither JSON (") and (
        "nor a TOML inline value (" in err and "\n" not in err
    ), err


@pytest.mark.parametrize("address", ["127.0.0.1", "tcp://127.0.0.1", "localhost:abc"])
def test_a_dask_address_without_a_port_is_refused_before_anything_starts(address):
    """`focus collect --dask-address 127.0.0.1` got as far as connecting and stopped with
    distributed's `ValueError: missing port number in address '127.0.0.1'`, exit 1."""
    with pytest.raises(ConfigError) as e:
        load_config(
            overrides={"execution.address": address}, environ={}, labels={"execution.address": "--dask-address"}
        )
    msg = str(e.value)
    assert f"execution.address: {address!r} is not a Dask scheduler address: write host:port" in msg, msg
    assert msg.endswith("(from --dask-address)"), msg


@pytest.mark.parametrize("address", ["127.0.0.1:8786", "tcp://10.0.0.5:8786", "tls://[::1]:8786", "ucx://node-1"])
def test_dask_addresses_with_their_port_pass(address):
    cfg = load_config(overrides={"execution.address": address}, environ={})
    assert (cfg.execution.kind, cfg.execution.address) == ("dask", address)


def test_a_sections_error_is_blamed_on_the_field_it_names():
    """A section's check that names one of its fields (`model.urls '...' must start with
    http://`) named the last source that set anything in the section: with the URLs and
    the kind set apart, `(from --set model.kind)`."""
    overrides = {"model.urls": ["127.0.0.1:1"], "model.kind": "openai"}
    with pytest.raises(ConfigError) as e:
        load_config(overrides=overrides, environ={})
    assert str(e.value).endswith("model.urls '127.0.0.1:1' must start with http:// or https:// (from --set model.urls)")
    with pytest.raises(ConfigError) as e:  # the field named is not set: the section's source, as before
        load_config(overrides={"critic.kind": "http"}, environ={})
    assert str(e.value).endswith("critic.url is required when critic.kind is 'http' (from --set critic.kind)")


def test_a_trainer_that_is_neither_built_in_nor_an_import_path_names_the_built_ins():
    """`--trainer verl` said only `'verl' is not an import path of the form
    'package.module:name'`: the check meant to name the trainers FOCUS ships never ran."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"train.trainer": "verl"}, environ={}, labels={"train.trainer": "--trainer"})
    assert str(e.value) == (
        "invalid configuration: train.trainer: 'verl' is neither a trainer FOCUS ships ('local', 'tinker') nor an "
        "import path of the form 'package.module:name' (from --trainer)"
    ), str(e.value)
    assert load_config(overrides={"train.trainer": "mymod:train"}, environ={}).train.trainer == "mymod:train"


@pytest.mark.parametrize(("named", "kind"), [("vllm", "openai"), ("llama.cpp", "llamacpp"), ("SGLang", "sglang")])
def test_a_server_named_where_its_kind_belongs_names_the_kind(named, kind):
    """model.kind = "vllm" was refused with the list of kinds alone."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"model.kind": named, "model.url": "http://127.0.0.1:8000"}, environ={})
    assert str(e.value) == (
        f"invalid configuration: model.kind: {named!r} is not a model.kind; for that server write "
        f"model.kind = {kind!r} (from --set model.kind)"
    ), str(e.value)


def test_a_byte_order_mark_is_read_and_a_key_set_twice_is_refused_naming_it(tmp_path):
    """A TOML file saved with a UTF-8 byte-order mark (Windows editors) was 'not valid
    TOML: Invalid statement (at line 1, column 1)'; it is read. A key set twice in a YAML
    file was taken silently, the last value winning (``seed: 1`` under ``seed: 0`` changed
    the run); TOML refused it with 'Cannot overwrite a value', which named no key."""
    bom = tmp_path / "bom.toml"
    bom.write_bytes(b"\xef\xbb\xbfseed = 4\n")
    assert load_config(bom, environ={}).seed == 4
    twice = tmp_path / "twice.yaml"
    twice.write_text("seed: 0\nenv:\n  n_tasks: 2\nseed: 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(twice, environ={})
    assert (
        str(e.value) == f"config file {str(twice)!r}: key 'seed' is set twice in one mapping (lines 1 and 4): keep one"
    )
    nested = tmp_path / "nested.yaml"
    nested.write_text("search:\n  phases: []\n  phases: []\n")
    with pytest.raises(ConfigError, match=r"key 'phases' is set twice in one mapping \(lines 2 and 3\)"):
        load_config(nested, environ={})
    toml = tmp_path / "twice.toml"
    toml.write_text("seed = 0\n[env]\nn_tasks = 2\nn_tasks = 3\n")
    with pytest.raises(ConfigError) as e:
        load_config(toml, environ={})
    assert str(e.value).endswith("a key or table is set twice (line 4: 'n_tasks = 3'): keep one"), str(e.value)


def test_a_bad_collection_id_says_what_an_id_may_hold_not_its_regex():
    """It said ``String should match pattern '^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$'``,
    without the value, which an operator had to decode."""
    for bad in ("runs/c1", "tâche", ".hidden", "x" * 129):
        with pytest.raises(ConfigError) as e:
            load_config(overrides={"collection_id": bad}, environ={})
        assert str(e.value) == (
            f"invalid configuration: collection_id: {bad!r} is not a collection id: use letters, digits, '_', "
            "'.' and '-', at most 128, the first a letter or digit (from --set collection_id)"
        )
    assert load_config(overrides={"collection_id": "x" * 128}, environ={}).collection_id == "x" * 128


def test_a_yaml_error_is_one_line_naming_the_problem_and_where(tmp_path):
    """PyYAML's error went out as it came: several lines with a copy of the line and a
    caret, naming the file '<unicode string>' (``focus config show`` printed them all)."""
    tab = tmp_path / "tab.yaml"
    tab.write_text("seed: 1\n\tenv: 2\n")
    with pytest.raises(ConfigError) as e:
        load_config(tab, environ={})
    assert str(e.value) == (
        f"config file {str(tab)!r} is not valid YAML: found character '\\t' that cannot start any token at line 2, "
        "column 1 (while scanning for the next token)"
    )


@pytest.mark.parametrize("key", ["execution.bogus", "storage.xyz", "search.phases.0.bogus", "agent.sampling.bogus"])
def test_an_unknown_field_is_not_taken_for_its_own_section_or_a_sibling_alike_only_in_it(key):
    """An unknown field in a section was offered that section (``storage.xyz: unknown
    field (did you mean storage?)``) or a sibling whose whole path is alike only by the
    section they share (``agent.sampling.bogus``: ``agent.sampling.stop``): the whole
    paths were compared, and the section's own name made up most of the likeness. What
    the key names is not misspelt there: no suggestion."""
    with pytest.raises(ConfigError) as e:
        load_config(overrides={key: 1}, environ={})
    assert "did you mean" not in str(e.value), str(e.value)


@pytest.mark.parametrize(
    "name, text",
    [
        ("empty.toml", ""),
        ("comments.toml", "# seed = 3\n\n   # n_tasks = 8\n"),
        ("empty.yaml", "\n"),
        ("comments.yml", "# seed: 3\n---\n"),
    ],
)
def test_a_config_file_with_no_settings_is_refused_naming_it(tmp_path, name, text):
    """A config file with no setting in it (0 bytes, or only comments: a file that was
    never saved, a wrong path to a template) was taken as the defaults without a word, so
    `-c` at it ran a default collection into the default store. It is refused before
    anything starts: `-c` names a file because its settings are wanted."""
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as e:
        load_config(path, environ={})
    assert str(e.value) == (
        f"config file {str(path)!r} holds no settings (it is empty or holds only comments): "
        "was it saved, and is it the file you meant? To run with the defaults, leave out -c"
    ), str(e.value)
    assert "\n" not in str(e.value)


def test_a_config_file_with_only_an_empty_table_is_read(tmp_path):
    """An empty table is a setting someone wrote: the file is read (the defaults)."""
    path = tmp_path / "table.toml"
    path.write_text("[model]\n", encoding="utf-8")
    assert load_config(path, environ={}) == load_config(None, environ={})
