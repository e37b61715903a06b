"""The custom search and context manager of tests/fixtures/parts.py, named in the
configuration, through the two ways a collection runs: the ``focus collect`` command
(once, in a subprocess: its ``--set`` into ``search.options``) and the Prefect flow (on
the session's server, which the pipeline tests start anyway). Each makes the batch the
same configuration makes in process (tests/test_config_parts.py holds that one to the
``Collector`` given the parts by hand), and shows the parts' effect."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest
from fixtures.prefect import base_env
from test_config_parts import CUSTOM, collected, root_fan_out, rows, small

from storage import BatchStore

pytestmark = pytest.mark.timeout(180)


@pytest.mark.slow  # starts the focus command
def test_focus_collect_runs_the_custom_parts_named_by_set(tmp_path):
    root = tmp_path / "runs"
    sets = ["model.kind=factory", "model.factory=fixtures.digits:digit_policy", "env.n_tasks=3", "seed=7",
            "search.phases.0.rollouts_per_task=2", "search.phases.1.transitions=24", "search.phases.1.wave_size=4",
            "search.phases.1.max_depth=6", "search.kind=factory", "search.factory=fixtures.parts:AtDepth",
            "search.options.depth=4", "agent.context.kind=factory", "agent.context.factory=fixtures.parts:tagged",
            "agent.context.options.tag=%"]  # fmt: skip
    args = ["collect", "--store", str(root), "--collection-id", "parts", "--json"]
    args += [a for s in sets for a in ("--set", s)]
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args], cwd=tmp_path, env=base_env(tmp_path / "prefect"),
        capture_output=True, text=True, timeout=150,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    batch = BatchStore(str(root)).read(result["batch_url"])
    assert rows(batch) == rows(collected(small(**CUSTOM))) and batch.actor
    assert set(root_fan_out(batch).values()) == {2}  # the custom priority continued no root
    assert any(ord("%") in r.prompt_ids for r in batch.actor)  # the custom context manager's tag


def test_the_prefect_flow_runs_the_custom_parts_and_refuses_other_options_on_resume(prefect_api, tmp_path):
    from flows.collect import collect
    from tasks.fingerprint import ResumeMismatch

    config = small(str(tmp_path / "store"), **{**CUSTOM, "search.options": {"depth": 0}, "collection_id": "flow-parts"})
    out = asyncio.run(collect(config))
    batch = BatchStore(config.storage.root).read(out["batch_url"])
    assert rows(batch) == rows(collected(config)) and batch.actor
    assert set(root_fan_out(batch).values()) == {4}  # depth 0: every root to its max_branches first
    with pytest.raises(ResumeMismatch, match=r"differs in: search\.options\.depth 0 → 1"):
        asyncio.run(collect(config.with_updates(**{"search.options": {"depth": 1}})))
