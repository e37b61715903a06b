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
from test_deploy import BASE, FINAL, artifacts, create_run, deploy, deployment, table, wait_state

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
    finally:
        kill_tree(proc)
