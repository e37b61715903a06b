"""The Prefect UI's Custom run changes only the fields the operator edited.

``fixtures/prefect_form.json`` holds what Prefect 3.9's run form (v1 and v2 UIs, driven
by headless Chromium) posted for a deployment of ``collect`` with one field edited,
with the flows' ``config`` parameter and with the plain ``FocusConfig | None`` it
replaced; :func:`fixtures.ui_form.form_post` reproduces both. The plain parameter's
form sent every field with its default, so the worker's ``FOCUS_*`` variables lost.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures.ui_form import form_post
from prefect.utilities.callables import parameter_schema

from flows.collect import collect
from flows.train_loop import train_loop
from tasks.config import FocusConfig, config_at_runtime
from tasks.config.form import from_form
from tasks.config.reference import meaning, reference_paths

RECORD = json.loads((Path(__file__).parent / "fixtures" / "prefect_form.json").read_text(encoding="utf-8"))
WORKER = {"FOCUS_STORAGE__ROOT": "memory://worker-store", "FOCUS_MODEL__URL": "http://127.0.0.1:9/v1"}


@pytest.mark.parametrize("schema_name", sorted(RECORD["schemas"]))
def test_form_post_is_what_both_uis_sent(schema_name):
    got = form_post(RECORD["schemas"][schema_name], RECORD["parameters"], RECORD["edit"])
    assert got == RECORD["posted"][schema_name]["v1"] == RECORD["posted"][schema_name]["v2"]


def test_a_plain_config_parameter_lost_the_workers_variables():
    posted = from_form(RECORD["posted"]["plain_focus_config"]["v1"]["config"])  # as the server hydrates it
    run = config_at_runtime(FocusConfig.model_validate(posted), WORKER)
    assert run.storage.root != WORKER["FOCUS_STORAGE__ROOT"] and run.model.url is None  # the defaults the form sent


@pytest.mark.parametrize("ui", ["v1", "v2"])
def test_a_custom_run_keeps_the_workers_variables_and_the_edit(ui):
    posted = RECORD["posted"]["config_parameter"][ui]["config"]
    config = collect.validate_parameters({"config": posted})["config"]
    assert config.model_dump(mode="json", exclude_unset=True, exclude_defaults=False) == {
        "seed": 9,
        "env": {"n_tasks": 2},
        "model": {"http": {}},
        "critic": {"http": {}},
        "execution": {},
        "train": {"local": {}, "tinker": {}},
    }
    run = config_at_runtime(config, {**WORKER, "FOCUS_PROGRESS": "false", "FOCUS_SEED": "4"})
    assert (run.storage.root, run.model.url, run.progress) == (
        "memory://worker-store",
        WORKER["FOCUS_MODEL__URL"],
        False,
    )
    assert (run.seed, run.env.n_tasks) == (9, 2)  # what the run says wins over the worker


@pytest.mark.parametrize("flow", [collect, train_loop], ids=["collect", "train_loop"])
def test_the_flows_form_has_no_defaults_and_describes_every_field(flow):
    schema = parameter_schema(flow.fn).model_dump()
    config = schema["properties"]["config"]
    assert config["default"] is None and schema["definitions"] == {}
    body = config["anyOf"][0]
    described: list[str] = []

    def walk(node: dict, prefix: str) -> None:
        for name, prop in node.get("properties", {}).items():
            path = f"{prefix}{name}"
            assert "default" not in prop and prop["title"] == name, path
            assert "boolean" not in json.dumps(prop.get("type")), f"{path}: a switch is always sent"
            if "properties" in prop:
                walk(prop, path + ".")
            elif prop.get("type") == "array" and "properties" in prop.get("items", {}):
                described.append(path)
                walk(prop["items"], path + "[].")
            else:
                described.append(path)
                required = name in node.get("required", [])
                assert required or "Default:" in prop["description"], path
                assert meaning(path).replace("\\|", "|")[1:] in prop["description"], path

    walk(body, "")
    assert sorted(described) == sorted(reference_paths())
    # an untouched form sends nothing but a "null" per switch, which reads as unset
    untouched = form_post(schema, {"config": {}}, {})
    assert config_at_runtime(flow.validate_parameters(untouched)["config"], WORKER) == config_at_runtime(None, WORKER)


def test_from_form_reads_the_forms_markers_and_keeps_explicit_values():
    sent = {
        "progress": None,  # a switch left "unset"
        "model": {"url": None, "options": {"__prefect_kind": "json"}, "http": {"jitter": None}},
        "env": {"options": {"__prefect_kind": "json", "value": '{"span": 3}'}},
        "search": {"phases": [{"name": "evidence", "rollouts_per_task": 2, "max_waves": None}]},
    }
    assert from_form(sent) == {
        "model": {"url": None, "http": {}},  # url may be None: an explicit "no URL" (start the embedded server)
        "env": {"options": {"span": 3}},
        "search": {"phases": [{"name": "evidence", "rollouts_per_task": 2, "max_waves": None}]},
    }
    config = FocusConfig()
    assert from_form(config) is config
    run = config_at_runtime(FocusConfig.model_validate(from_form(sent)), WORKER)
    assert run.model.url is None and run.storage.root == "memory://worker-store"


@pytest.mark.parametrize(
    ("config", "names"),
    [
        ({"env": {"options": {"__prefect_kind": "json", "value": "{span: 3}"}}}, ["env.options: not JSON"]),
        (
            {"search": {"phases": [{"name": "evidence", "options": {"__prefect_kind": "json", "value": "["}}]}},
            ["search.phases.0.options: not JSON"],
        ),
        ("seed=1", ["config: str 'seed=1' is not a table of fields"]),
        ([1, 2], ["config: list '[1, 2]' is not a table of fields"]),
    ],
)
def test_a_run_config_that_is_no_table_or_no_json_is_one_line_naming_the_field(config, names):
    """A run's ``config`` parameter comes from the API as any JSON: a JSON input whose text
    is no JSON (a deployment's server refuses it; a flow called with the form's markers
    does not) stopped the run with a ``JSONDecodeError`` traceback, a string or a list
    with ``AttributeError: 'str' object has no attribute 'collection_id'``."""
    from tasks.config import ConfigError

    with pytest.raises(ConfigError) as e:
        config_at_runtime(config, WORKER)
    line = str(e.value)
    assert "\n" not in line and line.startswith("invalid configuration: ") and "the run's config parameter" in line
    assert all(n in line for n in names), line


def test_focus_deploy_registers_a_schema_that_refuses_a_parameter_the_flow_does_not_take():
    """The server validates a run's parameters against the deployment's schema when the
    run is created. Prefect's schema left unknown parameters open, so a run with one
    (``prefect deployment run collect/manual --param bogus=1``, the API) was created and
    crashed in the engine: ``Process exited with status code: 1``, its cause only in the
    serving process's console (measured against a real server before the fix)."""
    from prefect.utilities.schema_tools.validation import ValidationError, validate

    from deployments.serve import DeploySpec, build_deployments

    for served in build_deployments(DeploySpec(manual={"seed": 42})):
        schema = served._parameter_openapi_schema.model_dump(exclude_unset=True)  # what is registered
        validate({"config": {"seed": 1}, "allow_policy_change": True}, schema, raise_on_error=True)
        with pytest.raises(ValidationError, match="'bogus' was unexpected"):
            validate({"config": {"seed": 1}, "bogus": 1}, schema, raise_on_error=True)
