"""Configs users can read: configs/*.toml name every field of FocusConfig (with a
comment), load and run; the docs' reference names every field; each field's meaning is
written once (tasks/config/reference.py) and the docs' table and the configs' comments
are rendered from it; ``focus config show`` prints each effective value and its
source; ``model.kind = "tinker"`` builds."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.app import app
from tasks.config import FocusConfig, field_paths, load_config

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
KEY = re.compile(r"^#?\s*([A-Za-z_][A-Za-z0-9_]*)\s*=")


def toml_fields(path: Path) -> set[str]:
    """Dotted names of the keys a TOML file sets or shows commented out (``# key = ...``),
    list-of-table entries as ``name[].key``."""
    out: set[str] = set()
    section = ""
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if m := re.match(r"^\[\[([\w.]+)\]\]$", line):
            section = m.group(1) + "[]."
        elif m := re.match(r"^\[([\w.]+)\]$", line):
            section = m.group(1) + "."
        elif m := KEY.match(line):
            out.add(section + m.group(1))
    return out


def test_every_field_is_in_the_configs_and_the_docs():
    fields = set(field_paths(into_lists=True))
    assert "train.local.lr" in fields and "search.phases[].max_waves" in fields
    loop = toml_fields(CONFIGS / "loop.toml")
    collect = toml_fields(CONFIGS / "collect.toml")
    assert fields - loop == set(), "configs/loop.toml lacks these fields"
    assert {f for f in fields if not f.startswith("train.")} - collect == set(), "configs/collect.toml lacks these"
    assert (loop | collect) - fields - {"search.phases"} == set(), "the configs name fields that do not exist"
    docs = (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8").split("## Configuration reference", 1)[1]
    named = set(re.findall(r"^\| `([\w.\[\]]+)` \|", docs, flags=re.M))
    assert fields - named == set(), "docs/pipeline.md's Configuration reference lacks these fields"
    assert named - fields - {"search.phases"} == set(), "the reference names fields that do not exist"


def test_each_meaning_is_written_once_and_rendered_where_people_read_it(capsys):
    from tasks.config import reference

    documented = {p for p in reference.reference_paths() if not p.startswith(tuple(reference.SHARED))}
    assert set(reference.MEANING) == documented, "tasks/config/reference.py's MEANING and the schema disagree"
    for path in reference.reference_paths():
        comment = reference.plain(reference.meaning(path))
        assert not KEY.match("# " + comment), f"{path}: its comment would read as a TOML key"
    assert reference.main(["--check"]) == 0, capsys.readouterr().out  # docs/pipeline.md and configs/*.toml


def test_every_field_has_a_comment():
    """Each block of consecutive key lines (set, or commented out) follows a comment."""
    for path in CONFIGS.glob("*.toml"):
        prev = ""
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            is_key = bool(KEY.match(line.strip()))
            if is_key and not (prev.startswith("#") or KEY.match(prev)):
                pytest.fail(f"{path.name}:{n}: {line!r} has no comment above it")
            if not line.startswith("["):  # a table header continues the comment above it
                prev = line.strip()


def test_configs_load_and_collect_spells_out_the_defaults():
    collect = load_config(CONFIGS / "collect.toml", environ={})
    assert collect == load_config(environ={})
    loop = load_config(CONFIGS / "loop.toml", environ={})
    assert loop.train.trainer == "local" and loop.critic.kind == "local" and loop.train.eval_tasks > 0


def test_config_show_prints_values_and_sources(tmp_path):
    env = {"FOCUS_ENV__N_TASKS": "5"}
    out = CliRunner().invoke(
        app, ["config", "show", "-c", str(CONFIGS / "loop.toml"), "--set", "train.local.lr=0.01"], env=env
    )
    assert out.exit_code == 0, out.output
    lines = {line.split("=")[0].strip(): line for line in out.output.splitlines()}
    assert set(lines) == set(field_paths())
    assert lines["train.local.lr"].endswith("# --set train.local.lr") and " 0.01 " in lines["train.local.lr"]
    assert lines["env.n_tasks"].endswith("# FOCUS_ENV__N_TASKS") and " 5 " in lines["env.n_tasks"]
    assert lines["train.iterations"].endswith(f"# {CONFIGS / 'loop.toml'}")
    assert lines["estimator.gamma"].endswith(f"# {CONFIGS / 'loop.toml'}")
    assert lines["train.local.temperature"].endswith("# default")  # commented out in the file
    data = json.loads(CliRunner().invoke(app, ["config", "show", "--json"], env={}).output)
    assert data["model.kind"] == {"value": "local", "source": "default"}
    bad = CliRunner().invoke(app, ["config", "show", "--set", "train.trainer=nocolon"], env={})
    assert bad.exit_code == 2 and "train.trainer" in bad.output


@pytest.mark.needs("tinker")
def test_tinker_model_builds_from_config(monkeypatch):
    import pickle

    from focus.backends.tinker_backend import TinkerPolicy
    from focus.policy import PolicyError, SamplingParams
    from tasks.config import ConfigError

    monkeypatch.delenv("TINKER_API_KEY", raising=False)
    cfg = load_config(overrides={"model.kind": "tinker", "model.model": "Qwen/Qwen3-4B-Instruct-2507"}, environ={})
    policy = cfg.build_policy()
    assert isinstance(policy, TinkerPolicy) and policy.policy_version == "Qwen/Qwen3-4B-Instruct-2507"
    assert policy.client is None  # created on first use, where the policy samples
    assert pickle.loads(pickle.dumps(policy)).base_model == "Qwen/Qwen3-4B-Instruct-2507"
    with pytest.raises(PolicyError, match="TINKER_API_KEY is not set"):
        asyncio.run(policy.sample([1, 2, 3], SamplingParams(max_tokens=4)))
    path = load_config(overrides={"model.kind": "tinker", "model.weights": "tinker://run/sampler/v1"}, environ={})
    assert path.build_policy().policy_version == "tinker://run/sampler/v1"
    with pytest.raises(ConfigError, match="model.model .* or model.weights"):
        load_config(overrides={"model.kind": "tinker"}, environ={})


def test_user_trainer_imports_from_the_current_folder(tmp_path, monkeypatch):
    import sys

    from tasks.config import import_object

    (tmp_path / "my_trainer_mod.py").write_text("def train(batch_url, ctx):\n    return 'mine'\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    cfg = FocusConfig.model_validate({"train": {"trainer": "my_trainer_mod:train"}})
    assert import_object(cfg.train.trainer_path())("u", None) == "mine"
    assert FocusConfig().train.trainer_path() == "tasks.trainers:local_trainer"


def test_each_commented_import_path_of_this_repository_imports():
    """A ``# factory = "pkg.mod:name"`` example that names a package of this repository
    is one a reader copies: collect.toml's env factory was ``examples.math.factory:make``,
    a module that does not exist (the math example's is ``examples.math.env:env_factory``)."""
    import importlib

    ours = {p.name for p in ROOT.iterdir() if (p / "__init__.py").exists()}
    named = []
    for path in CONFIGS.glob("*.toml"):
        for line in path.read_text(encoding="utf-8").splitlines():
            m = re.match(r'^#?\s*\w+\s*=\s*"([\w.]+):(\w+)"', line.strip())
            if m and m.group(1).split(".")[0] in ours:
                named.append((path.name, m.group(1), m.group(2)))
    assert named, "no import path of this repository in the configs"
    missing = []
    for name, module, attr in named:
        try:
            getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            missing.append(f"{name}: {module}:{attr} ({e})")
    assert missing == []
