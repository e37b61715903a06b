"""A collect flow run's ``config`` parameter as a deployment's run gets it from the API
(a mapping), against the session's real Prefect server.

- A value the form's JSON schema allows but the configuration refuses (``model.url =
  "ftp://x"``) fails the run with one line naming the field and the parameter as its
  source. Prefect's own parameter check made it two lines under "Validation of flow
  parameters failed with error: ParameterTypeError", with nothing in the run's log.
- A field another one needs may come from the worker: ``model.kind = "openai"`` in the
  run and ``FOCUS_MODEL__URL`` in the worker's environment (docs/pipeline.md,
  "Run-time configuration"). The parameter was validated alone and the run failed with
  ``model.url is required``.
- A failure whose line explains it (a critic that is down) is that line as the state
  message and one line in the run's log; it was ``Flow run encountered an exception:
  CriticError: ...`` with two tracebacks in the log. Awaiting the flow still raises the
  error.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from flows.errors import CollectionFailed, explained
from focus.critic import CriticError
from storage import BatchStore, LeaseHeld
from tasks.config import ConfigError

pytestmark = pytest.mark.timeout(120)

SMALL: dict[str, Any] = {
    "seed": 2,
    "env": {"n_tasks": 2},
    "search": {
        "phases": [
            {"name": "evidence", "rollouts_per_task": 2},
            {"name": "continue", "transitions": 6, "wave_size": 3, "max_depth": 4},
        ]
    },
    "execution": {"kind": "local", "heartbeat_s": 0.5},
    "progress": False,
}


async def flushed(call: Any) -> Any:
    """Await the flow call, then send the run's log lines (they go in batches)."""
    from prefect.logging.handlers import APILogHandler

    try:
        return await call
    finally:
        await APILogHandler.aflush()


def run_logs(api: str, run_id: str) -> list[tuple[int, str]]:
    body = {"logs": {"flow_run_id": {"any_": [run_id]}}, "sort": "TIMESTAMP_ASC", "limit": 200}
    return [(x["level"], x["message"]) for x in httpx.post(f"{api}/logs/filter", json=body, timeout=30).json()]


def run_named(api: str, name: str) -> dict[str, Any]:
    runs = httpx.post(f"{api}/flow_runs/filter", json={"flow_runs": {"name": {"any_": [name]}}}, timeout=30).json()
    assert len(runs) == 1, runs
    return dict(runs[0])


def test_a_value_the_form_allows_but_the_config_refuses_fails_the_run_in_one_line(prefect_api, tmp_path):
    from flows.collect import collect

    sent = {
        **SMALL,
        "model": {"url": "ftp://x", "options": {"__prefect_kind": "json"}},
        "storage": {"root": str(tmp_path)},
    }
    t0 = time.monotonic()
    state = asyncio.run(flushed(collect(sent, return_state=True)))
    assert state.is_failed()
    line = state.message or ""
    assert line == (
        "invalid configuration: model: model.url 'ftp://x' must start with http:// or https:// "
        "(from the run's config parameter)"
    ), line
    assert time.monotonic() - t0 < 30  # at once: nothing started
    logs = run_logs(prefect_api, str(state.state_details.flow_run_id))
    assert any(lv == 40 and m == f"the collection failed: {line}" for lv, m in logs), logs
    assert not any("Traceback" in m for _, m in logs), logs
    with pytest.raises(ConfigError):  # awaited, the flow raises the error itself
        asyncio.run(collect(sent))


def test_the_workers_variables_may_complete_a_runs_config(prefect_api, local_model_server, tmp_path, monkeypatch):
    from flows.collect import collect

    store = tmp_path / "worker-store"
    monkeypatch.setenv("FOCUS_MODEL__URL", local_model_server.url)
    monkeypatch.setenv("FOCUS_STORAGE__ROOT", str(store))
    # the form sends model.kind alone: the URL is the worker's
    result = asyncio.run(collect({**SMALL, "collection_id": "url-from-worker", "model": {"kind": "openai"}}))
    assert result["batch_url"] == BatchStore(str(store)).url_for("url-from-worker", 0)
    assert BatchStore(str(store)).verify(result["batch_url"])


def test_a_failure_that_names_its_cause_is_one_line_in_the_state_and_the_log(prefect_api, tmp_path):
    from flows.collect import collect

    marker = tmp_path / "critic-down"
    marker.write_text("down")
    cfg = {
        **SMALL,
        "collection_id": "critic-down",
        "model": {"kind": "factory", "factory": "fixtures.digits:digit_policy"},
        "critic": {"kind": "factory", "factory": "fixtures.digits:flaky_critic", "options": {"marker": str(marker)}},
        "storage": {"root": str(tmp_path / "store")},
    }
    with pytest.raises(CriticError) as caught:  # awaited, the flow raises the error itself
        asyncio.run(flushed(collect(cfg)))
    line = f"critic service unavailable (marker {marker} present)"
    assert str(caught.value) == line
    run = run_named(prefect_api, "critic-down")
    assert run["state_type"] == "FAILED" and run["state"]["message"] == line
    logs = run_logs(prefect_api, run["id"])
    assert [m for lv, m in logs if lv >= 40] == [
        f"collection critic-down failed: {line}",
        f"Finished in state Failed({line!r})",
    ]
    assert not any("Traceback" in m for _, m in logs), logs


def test_a_train_loop_run_is_named_after_its_loop(prefect_api, tmp_path):
    """As a collection's run is named after the collection: the UI's list of runs showed
    a train loop's run by Prefect's random name (``polite-seagull``), which tied it to no
    loop; its collections' runs were ``<loop>-it<i>``."""
    from flows.train_loop import train_loop

    sent = {"collection_id": "named-loop", "model": {"url": "ftp://x"}, "storage": {"root": str(tmp_path)}}
    state = asyncio.run(train_loop(sent, return_state=True))
    assert state.is_failed()
    assert run_named(prefect_api, "named-loop")["id"] == str(state.state_details.flow_run_id)


def test_only_an_error_nobody_described_keeps_its_traceback():
    assert explained(CriticError("critic service unavailable"))
    assert explained(LeaseHeld("collection 'c' is being written by another run"))
    assert explained(ConfigError("invalid configuration: seed: ..."))
    assert explained(OSError(28, "No space left on device"))
    assert explained(CollectionFailed("the Dask scheduler is gone: ..."))
    assert not explained(ValueError("bad thing"))
    assert not explained(KeyError("x"))


def test_focus_deploy_checks_its_files_under_its_own_variables(tmp_path, monkeypatch):
    """``focus deploy`` serves the runs itself: a file naming ``model.kind = "openai"`` and
    no URL is complete under ``FOCUS_MODEL__URL`` there, and is stored as it is (it was
    refused: "model.url is required"). Without the variable it is refused, naming the file."""
    from deployments.serve import explicit_config

    cfg = tmp_path / "vllm.toml"
    cfg.write_text('[model]\nkind = "openai"\n[env]\nn_tasks = 2\n')
    monkeypatch.setenv("FOCUS_MODEL__URL", "http://gpu:8000")
    assert explicit_config(cfg, {"seed": 3}) == {"model": {"kind": "openai"}, "env": {"n_tasks": 2}, "seed": 3}
    monkeypatch.delenv("FOCUS_MODEL__URL")
    with pytest.raises(ConfigError, match=r"model\.url is required .*\(from .*vllm\.toml\)"):
        explicit_config(cfg)


def test_the_train_loop_validates_its_config_after_the_variables_too(prefect_api, tmp_path):
    """...and fails as the collect flow does: the line as the state's message and once in
    the run's log, no traceback. It was ``Flow run encountered an exception: ConfigError:
    ...`` with the traceback in the run's log; a lease held by another loop the same."""
    from flows.train_loop import train_loop

    sent = {"model": {"url": "ftp://x"}, "storage": {"root": str(tmp_path)}}
    state = asyncio.run(flushed(train_loop(sent, return_state=True)))
    assert state.is_failed()
    line = (
        "invalid configuration: model: model.url 'ftp://x' must start with http:// or https:// "
        "(from the run's config parameter)"
    )
    assert state.message == line, state.message
    logs = run_logs(prefect_api, str(state.state_details.flow_run_id))
    assert [m for lv, m in logs if lv >= 40] == [
        f"the train loop failed: {line}",
        f"Finished in state Failed({line!r})",
    ]
    assert not any("Traceback" in m for _, m in logs), logs
    with pytest.raises(ConfigError):  # awaited, the flow raises the error itself
        asyncio.run(train_loop(sent))


def test_the_fields_a_runs_config_leaves_out_are_the_stored_ones_it_does_not_name():
    """What the run's WARNING line names (``flows.preflight.note_deployment``): a stored table is looked
    into, a list counts as one field, and a field the run names (even as null) is not left out."""
    from flows.preflight import left_out

    stored = {"seed": 3, "model": {"kind": "openai", "url": "http://gpu:8000"}, "search": {"phases": [{"name": "a"}]}}
    assert left_out(stored, {"seed": 5}) == ["model", "search"]
    assert left_out(stored, {"model": {"kind": "local", "url": None}, "search": {"phases": []}}) == ["seed"]
    assert left_out(stored, {"seed": 3, "model": {"kind": "openai"}, "search": {}}) == ["model.url", "search.phases"]
    assert left_out(stored, stored) == [] and left_out({}, {"seed": 1}) == []


def test_a_run_of_a_deployment_with_an_open_schema_says_how_to_close_it(prefect_api, tmp_path):
    """A deployment whose parameter schema is open (what `prefect deploy` stores, before
    `focus deploy --work-pool`) takes runs naming parameters the flow lacks, which crash
    before the flow begins: the runs it does start say so, once, with the command that
    closes it. A run whose config leaves out stored fields names them."""
    from prefect.client.orchestration import get_client
    from prefect.flow_engine import run_flow

    from flows.collect import collect

    stored = {**SMALL, "model": {"kind": "factory", "factory": "fixtures.digits:digit_policy"}}
    stored |= {"storage": {"root": str(tmp_path / "store")}}

    async def run() -> str:
        deployment = await asyncio.to_thread(collect.to_deployment, name="open-schema", parameters={"config": stored})
        deployment_id = await deployment.aapply()
        async with get_client() as client:
            try:
                given = {k: v for k, v in stored.items() if k != "seed"}
                flow_run = await client.create_flow_run_from_deployment(deployment_id, parameters={"config": given})
                await flushed(run_flow(collect, flow_run=flow_run, parameters=flow_run.parameters))
            finally:
                await client.delete_deployment(deployment_id)
        return str(flow_run.id)

    lines = [m for level, m in run_logs(prefect_api, asyncio.run(run())) if level == 30]
    assert [m for m in lines if "focus deploy --work-pool" in m] == [
        "deployment 'open-schema' takes runs with parameters its flow does not take (its parameter schema is "
        "open, as prefect deploy stores it); run 'focus deploy --work-pool' against this server to close it"
    ], lines
    assert [m for m in lines if "not applied from the deployment: seed." in m] != [], lines


def test_a_flows_wrapped_failure_keeps_the_exit_status_of_the_error_it_stands_for():
    """Awaiting a failed flow raises :func:`flows.errors.as_failure` of the error: the error
    itself, or ``CollectionFailed`` with its one line when its own text is not that line (a
    message over several lines). ``focus train --prefect`` (and ``focus collect``) exit with
    the status of the error it stands for: 2 for a configuration refused; it was 1."""
    from flows.errors import as_failure, exit_code

    error = ConfigError("invalid configuration:\n  seed: not an integer")
    wrapped = as_failure(error)
    assert isinstance(wrapped, CollectionFailed) and wrapped.__cause__ is error
    assert exit_code(error) == 2 and exit_code(wrapped) == 2
    assert exit_code(as_failure(ValueError("a\nb"))) == 1
