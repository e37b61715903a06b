"""The flows' ``config`` parameter as the Prefect UI's run form shows and sends it.

A flow run's configuration is the worker's ``FOCUS_*`` variables overlaid with the
fields its ``config`` parameter sets (:func:`tasks.config.sources.config_at_runtime`).
The form Prefect builds from a parameter's JSON schema fills every input that has a
``default`` and sends it; a switch (a boolean) is always sent, ``false`` when untouched.
A Custom run then set every field, so ``FOCUS_STORAGE__ROOT`` and ``FOCUS_MODEL__URL``
lost to defaults the operator never chose. So :data:`ConfigParameter` gives the form a
schema of its own (:func:`form_schema`):

- no ``default`` anywhere: an input left empty is not sent (each description says the
  default, and that an empty field takes the worker's variable, else the default);
- a boolean is a choice between ``unset`` (sent as ``null``) and a switch;
- each field is titled by its name and described by its meaning
  (:mod:`tasks.config.reference`).

and reads what comes back (:func:`from_form`): a ``null`` for a field that cannot be
``None`` means "not set", and a JSON input left empty (``{"__prefect_kind": "json"}``,
no value) is dropped. What remains are the fields the deployment's file named and the
operator edited; pydantic records them as set, and only those win over the variables.
"""

from __future__ import annotations

import copy
import functools
import json
import types
import typing
from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator
from pydantic.json_schema import JsonSchemaValue

from tasks.config.errors import PARAMETER_SOURCE, ConfigError
from tasks.config.schema import FocusConfig

UNSET_NOTE = "Left empty: the worker's `FOCUS_*` variable, else the default."


def _nullable(annotation: Any) -> bool:
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return annotation is None or (union and type(None) in typing.get_args(annotation))


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _item_model(annotation: Any) -> type[BaseModel] | None:
    args = typing.get_args(annotation)
    return _model_of(args[0]) if typing.get_origin(annotation) in (list, tuple) and args else None


def _unkind(value: Any, path: str) -> Any:
    """A value of the form's JSON input: ``{"__prefect_kind": "json", "value": text}``
    is the parsed text; without a value it was left empty (``...``). Text that is no
    JSON is a :class:`ConfigError` naming the field (``path``): a deployment's run has it
    parsed by the server, which refuses it, but a run started without one (a flow called
    with the form's markers) stopped with a ``JSONDecodeError`` traceback naming nothing."""
    if not (isinstance(value, dict) and "__prefect_kind" in value):
        return value
    if "value" not in value:
        return ...
    inner = value["value"]
    if value["__prefect_kind"] != "json" or not isinstance(inner, str):
        return inner
    try:
        return json.loads(inner)
    except json.JSONDecodeError as e:
        raise ConfigError(f"invalid configuration: {path}: not JSON: {e} (from {PARAMETER_SOURCE})") from None


def _clean(data: dict[str, Any], cls: type[BaseModel], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, raw in data.items():
        info = cls.model_fields.get(key)
        value = _unkind(raw, f"{prefix}{key}")
        if value is ... or info is None:
            if info is None:
                out[key] = raw  # an unknown field: validation names it
            continue
        if value is None and not _nullable(info.annotation):
            continue  # "unset" in the form
        if (sub := _model_of(info.annotation)) is not None and isinstance(value, dict):
            value = _clean(value, sub, f"{prefix}{key}.")
        elif (item := _item_model(info.annotation)) is not None and isinstance(value, list):
            value = [_clean(v, item, f"{prefix}{key}.{i}.") if isinstance(v, dict) else v for i, v in enumerate(value)]
        out[key] = value
    return out


def from_form(value: Any) -> Any:
    """What the form (or a deployment's stored parameters) sent, with the form's markers
    of an untouched field removed; a :class:`FocusConfig` passes as it is."""
    return _clean(value, FocusConfig) if isinstance(value, dict) else value


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        if "$ref" in schema:
            target = defs[schema["$ref"].rsplit("/", 1)[-1]]
            return _inline({**target, **{k: v for k, v in schema.items() if k != "$ref"}}, defs)
        return {k: _inline(v, defs) for k, v in schema.items() if k != "$defs"}
    if isinstance(schema, list):
        return [_inline(v, defs) for v in schema]
    return schema


def _describe(prop: dict[str, Any], path: str) -> dict[str, Any]:
    from tasks.config.reference import default_text, meaning

    out = {k: v for k, v in prop.items() if k not in ("default", "title", "description")}
    out["title"] = path.rsplit(".", 1)[-1].removesuffix("[]")
    try:
        line = meaning(path).replace("\\|", "|")  # a table's escape; the form renders plain text or markdown
        text = line[0].upper() + line[1:] + "."
        default = default_text(path)
        text += f" Default: {default}." if default != "-" else ""
    except KeyError:  # a table (model, search) rather than a field
        text = ""
    if text and "[]" in path:
        text += " Left empty: the default." if "Default:" in text else ""  # a phase is given whole
    elif text:
        text += " " + UNSET_NOTE
    out["description"] = text
    if out.get("type") == "boolean":
        del out["type"]
        out["anyOf"] = [{"type": "null", "title": "unset"}, {"type": "boolean", "title": "set"}]
    elif any(o.get("type") == "boolean" for o in out.get("anyOf", [])):  # a switch that may be unset: unset first
        out["anyOf"] = sorted(out["anyOf"], key=lambda o: o.get("type") != "null")
    return out


def _strip(schema: dict[str, Any], prefix: str) -> dict[str, Any]:
    """Defaults out, names and meanings in, for an object schema and all it contains."""
    out = dict(schema)
    out.pop("default", None)
    if "properties" in out:
        props = {}
        for name, prop in out["properties"].items():
            path = f"{prefix}{name}"
            if prop.get("type") == "array" and isinstance(prop.get("items"), dict) and "properties" in prop["items"]:
                prop = {**prop, "items": _strip(prop["items"], f"{path}[].")}
            elif "properties" in prop:
                prop = _strip(prop, f"{path}.")
            props[name] = _describe(prop, path)
        out["properties"] = props
    return out


def form_schema() -> JsonSchemaValue:
    """The ``config`` parameter's JSON schema as the form should see it (see the module)."""
    return copy.deepcopy(_form_schema())


@functools.cache
def _form_schema() -> JsonSchemaValue:
    # Prefect derives a flow's parameter schema when the flow is defined (at import),
    # twice per flow: built once per process
    full = FocusConfig.model_json_schema()
    body = _strip(_inline(full, full.get("$defs", {})), "")
    body["title"] = "FocusConfig"
    body["description"] = (
        "Fields to set for this run. A field left empty takes the worker's FOCUS_* variable, else its default; "
        "only the fields filled in here (and those the deployment's file names) override them."
    )
    return {"anyOf": [body, {"type": "null"}], "title": "config"}


class _FormSchema:
    """Pydantic asks for the JSON schema only when one is wanted (a deployment is
    registered), so importing the flows does not build it."""

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> JsonSchemaValue:
        return form_schema()


#: The flows' ``config`` parameter: a :class:`FocusConfig` (or ``None``: the worker's
#: variables and the defaults), with the form schema and reading above.
ConfigParameter = Annotated[FocusConfig | None, BeforeValidator(from_form), _FormSchema()]
