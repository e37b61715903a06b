"""A Custom run from the Prefect UI, against a real server: the run changes the field the
operator edited and takes the rest from the serving process's ``FOCUS_*`` variables,
as a Quick run does.

The run is created the way the UI's form creates it: ``POST
/api/deployments/{id}/create_flow_run`` with the parameters the form posts for the
deployment's ``parameter_openapi_schema`` and stored parameters, one field edited
(:func:`fixtures.ui_form.form_post`, checked against what the real form sent in
``tests/test_config_form.py``).
"""

from __future__ import annotations

import json
import time

import pytest
from fixtures.prefect import kill_tree
from fixtures.ui_form import form_post
from test_deploy import BASE, FINAL, artifacts, create_run, deploy, deployment, run_logs, table, wait_state

from storage import BatchStore, CheckpointStore

pytestmark = pytest.mark.timeout(240)


def test_a_custom_run_edits_one_field_and_keeps_the_workers_store(prefect_server, prefect_env, tmp_path):
    api = prefect_server
    manual = tmp_path / "manual.toml"
    manual.write_text(BASE.format(transitions=6, marker=tmp_path / "critic-down", progress="false", latency=0))
    store = tmp_path / "worker-store"
    env = {**prefect_env, "FOCUS_STORAGE__ROOT": str(store), "FOCUS_EXECUTION__KIND": "local"}
    log = tmp_path / "deploy.log"
    since = time.time() - 1
    proc = deploy(env, "--manual-config", str(manual), "--cron", "0 3 * * *", log=log)
    try:
        dep = deployment(api, "manual", proc, log, since)
        parameters = form_post(dep["parameter_openapi_schema"], dep["parameters"], {"config.seed": 9})
        sent = parameters["config"]
        assert sent["seed"] == 9 and "storage" not in sent and sent["execution"]["processes"] is None  # switch unset
        run = create_run(api, dep["id"], parameters)
        done = wait_state(api, run["id"], FINAL, proc=proc)
        assert done["state_type"] == "COMPLETED", done["state"].get("message")
        stats = {r["statistic"]: r["value"] for r in table(artifacts(api, run["id"])["stats"])}
        cid = stats["collection_id"]
        # the serving process's FOCUS_STORAGE__ROOT decided where the batch went, not the default ./runs
        assert stats["batch_url"] == BatchStore(str(store)).url_for(cid, 0)
        assert BatchStore(str(store)).verify(stats["batch_url"])
        assert not (tmp_path / "runs").exists()
        stored = json.loads(CheckpointStore(str(store)).load(cid, "config", 0))
        assert stored["seed"] == 9 and stored["env"]["n_tasks"] == 2  # the edit, and the deployment's file

        # the API's (and `prefect deployment run --param config=...`'s) way: a config that
        # leaves out a stored field replaces the stored config whole, Prefect's rule for a
        # parameter; the run's log says which stored fields did not apply, once
        partial = {k: v for k, v in dep["parameters"]["config"].items() if k != "seed"}
        api_run = create_run(api, dep["id"], {"config": partial})
        done = wait_state(api, api_run["id"], FINAL, proc=proc)
        assert done["state_type"] == "COMPLETED", done["state"].get("message")
        notes = _replaced_notes(api, api_run["id"], wait_s=15)
        assert len(notes) == 1 and "not applied from the deployment: seed." in notes[0], notes
        stats = {r["statistic"]: r["value"] for r in table(artifacts(api, api_run["id"])["stats"])}
        assert json.loads(CheckpointStore(str(store)).load(stats["collection_id"], "config", 0))["seed"] == 0
        # the Custom run sent every stored field (the form starts from them): nothing to say
        assert _replaced_notes(api, run["id"]) == []
    finally:
        kill_tree(proc)


def _replaced_notes(api: str, run_id: str, wait_s: float = 0) -> list[str]:
    """The run's log lines about stored config fields its own config left out, waited for
    up to ``wait_s`` (logs reach the server in batches: the final state may come first)."""
    deadline = time.monotonic() + wait_s
    while True:
        notes = [x["message"] for x in run_logs(api, run_id) if "not applied from the deployment" in x["message"]]
        if notes or time.monotonic() > deadline:
            return notes
        time.sleep(0.5)
