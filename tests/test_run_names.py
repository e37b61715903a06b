"""A flow run of a deployment is named after its collection (``flows.preflight``).

A scheduled or Quick run whose config names no collection id collects under one derived
from the run (``scheduled-<UTC scheduled start>-<6 hex>``), but kept Prefect's random
name (``sepia-chachalaca``, seen on a served ``collect/scheduled``): nothing in the UI's
list of runs tied a run to its collection and batch.
"""

from __future__ import annotations

from datetime import UTC, datetime

import prefect.runtime.deployment
import prefect.runtime.flow_run

from flows.preflight import collection_id_for_run, flow_run_name
from tasks.config import FocusConfig


def _run(monkeypatch, deployment: str | None, config: object = None) -> None:
    monkeypatch.delenv("FOCUS_COLLECTION_ID", raising=False)
    monkeypatch.setattr(prefect.runtime.deployment, "name", deployment, raising=False)
    run = prefect.runtime.flow_run
    monkeypatch.setattr(run, "id", "0675f2a4-1b2c-7d3e-8f40-5a6b7c3f9a2c", raising=False)
    monkeypatch.setattr(run, "name", "sepia-chachalaca", raising=False)
    monkeypatch.setattr(run, "scheduled_start_time", datetime(2026, 12, 6, 23, 41, tzinfo=UTC), raising=False)
    monkeypatch.setattr(run, "parameters", {"config": config} if config is not None else {}, raising=False)


def test_a_deployments_run_without_a_collection_id_is_named_after_the_one_it_collects(monkeypatch):
    _run(monkeypatch, "scheduled")
    cid = collection_id_for_run(FocusConfig()).collection_id
    assert flow_run_name() == cid == "scheduled-20261206-234100-3f9a2c"


def test_a_named_collection_or_a_run_of_no_deployment_keeps_its_name(monkeypatch):
    _run(monkeypatch, "manual", {"collection_id": "mine", "seed": 1})
    assert flow_run_name() == "mine"
    _run(monkeypatch, None)  # its id is derived from its name: renaming it would change the id
    assert flow_run_name() == "sepia-chachalaca"
    _run(monkeypatch, "scheduled")
    monkeypatch.setenv("FOCUS_COLLECTION_ID", "from-worker")
    assert flow_run_name() == "from-worker"
