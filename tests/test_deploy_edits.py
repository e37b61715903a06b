"""A deployment's ``config`` edited in the UI (or through the API) is replaced when
``focus deploy`` starts again: Prefect's ``serve`` registers each deployment whole, from
the command's files. The edit was lost without a word; the command now says which
fields it replaces, and where to put them to keep them (``deployments.serve.edited_on_server``).
Against the session's real Prefect server, through the call the UI's edit form makes
(``PATCH /api/deployments/{id}``)."""

from __future__ import annotations

import time
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from fixtures.prefect import kill_tree
from test_deploy import deploy, deployment

from deployments.serve import differing

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CONFIG = """
seed = 3
progress = false
[model]
kind = "factory"
factory = "fixtures.digits:digit_policy"
[env]
n_tasks = 2
"""


def served_once(env: dict[str, str], api: str, cfg: Path, log: Path, after: float = 0.0) -> tuple[dict, str]:
    """Start ``focus deploy``, wait until it registered ``collect/manual`` (a registration
    later than ``after`` too, a server time), stop it; the deployment and what the
    command printed."""
    since = max(time.time() - 1, after)
    proc = deploy(env, "--config", str(cfg), "--crash-after", "0", log=log)
    try:
        manual = deployment(api, "manual", proc, log, since)
    finally:
        kill_tree(proc)
    return manual, log.read_text(encoding="utf-8")


def test_a_restart_of_focus_deploy_says_which_edited_fields_it_replaces(prefect_server, prefect_env, tmp_path):
    api = prefect_server
    cfg = tmp_path / "collect.toml"
    cfg.write_text(CONFIG, encoding="utf-8")
    manual, _ = served_once(prefect_env, api, cfg, tmp_path / "first.log")
    stored = manual["parameters"]["config"]
    edited = {**stored, "seed": 11, "env": {**stored["env"], "n_tasks": 5}}
    r = httpx.patch(f"{api}/deployments/{manual['id']}", json={"parameters": {"config": edited}}, timeout=30)
    assert r.status_code == 204, r.text
    # the next registration is told from the edit by the server's own time of the edit
    # (a sleep of 1.5 s did it with the command's start time and 1 s of slack)
    edit = httpx.get(f"{api}/deployments/{manual['id']}", timeout=30).json()
    assert edit["parameters"]["config"] == edited

    again, out = served_once(prefect_env, api, cfg, tmp_path / "second.log", after=updated_at(edit))
    assert again["parameters"]["config"] == stored  # the edit is gone: serve registered the file's
    lines = [ln for ln in out.splitlines() if ln.startswith("warning: deployment collect/")]
    assert lines == [
        "warning: deployment collect/manual: the server's config differs from the one served now in env.n_tasks, "
        "seed (edited in the UI or the API?): replaced by this command's; put the change in the configuration "
        "file (or --set) to keep it"
    ], out[-3000:]
    # started again with nothing edited: no line
    _, out = served_once(prefect_env, api, cfg, tmp_path / "third.log")
    assert "warning: deployment" not in out, out[-3000:]


def updated_at(deployment: dict) -> float:
    return datetime.fromisoformat(deployment["updated"]).timestamp()


def test_the_fields_that_differ_are_named_by_their_dotted_path():
    assert differing({"seed": 1, "env": {"n_tasks": 2}}, {"seed": 1, "env": {"n_tasks": 3}}) == ["env.n_tasks"]
    assert differing({"seed": 1}, {"seed": 1, "model": {"kind": "openai"}}) == ["model"]
    assert differing({"search": {"phases": [{"a": 1}]}}, {"search": {"phases": [{"a": 2}]}}) == ["search.phases"]
    assert differing({}, {}) == [] and differing({"x": None}, {"x": None}) == []
