"""Where a configuration's values come from, and which source set each one.

Sources, later ones win: the defaults, a TOML or YAML file, ``FOCUS_``-prefixed
environment variables (``FOCUS_MODEL__URL=http://...``: nested fields joined by
``__``, list entries by their index, values parsed as JSON unless the field is text),
then explicit overrides (CLI flags, ``--set`` dotted keys such as
``search.phases.1.transitions``). Each source is a :class:`Layer`; the same layers give
the configuration (:func:`load_config`), the source of every value (:func:`explain_config`,
``focus config show``) and the source named beside each invalid value in the error.

A flow run's configuration is layered the same way where it runs
(:func:`config_at_runtime`): the worker's ``FOCUS_*`` variables, then the fields the
run's ``config`` parameter sets.

pydantic-settings does environment loading with a nested delimiter, but not what the
pipeline needs around it: list indices in names, the variable or ``--set`` named beside
each bad value, a field's source for ``focus config show``, variables of other tools
sharing the prefix; and a settings model reads the environment whenever one is built,
which a configuration that travels to other processes as a flow parameter must not do.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
import pathlib
import re
import tomllib
import types
import typing
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from tasks.config.errors import PARAMETER_SOURCE
from tasks.config.schema import (
    ConfigError,
    FocusConfig,
    config_error,
    field_annotation,
    field_paths,
    problems_of,
    set_dotted,
    suggest_field,
)

ENV_PREFIX = "FOCUS_"


@dataclass(frozen=True)
class Layer:
    """The values one source gives: a mapping merged table by table (``data``: a file,
    the fields a run's parameter sets) or one dotted key (a ``FOCUS_*`` variable, a
    ``--set``)."""

    source: str
    data: Mapping[str, Any] = field(default_factory=dict)
    key: str | None = None
    value: Any = None

    def apply(self, data: dict[str, Any]) -> dict[str, Any]:
        """``data`` with this layer's values over it; the layer keeps its own (a later
        ``--set search.phases.2...`` appended to a file's list of phases in place)."""
        if self.key is None:
            return merge(data, copy.deepcopy(self.data))
        set_dotted(data, self.key, copy.deepcopy(self.value))
        return data

    def keys(self) -> list[str]:
        """Dotted names this layer sets (a list value counts as one)."""
        return [self.key] if self.key is not None else _set_keys(self.data)


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping in a TOML or YAML file; errors name the file."""
    p = pathlib.Path(path)
    try:
        # utf-8-sig: a file saved with a byte-order mark (Windows editors) was "not valid
        # TOML: Invalid statement (at line 1, column 1)"; YAML skipped it already
        text = p.read_bytes().decode("utf-8-sig")
    except OSError as e:
        raise ConfigError(f"cannot read config file {str(p)!r}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
            "save it as UTF-8"
        ) from None
    try:
        if p.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            data = _load_yaml(text, str(p)) or {}
        else:
            raise ConfigError(f"config file {str(p)!r} must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(
            f"config file {str(p)!r} is not valid {p.suffix[1:].upper()}: {e}{_toml_twice(e, text)}"
        ) from e
    except Exception as e:  # yaml.YAMLError without importing yaml at module level
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {_yaml_problem(e)}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    if not data:
        # refused, not warned about: a file named on purpose that sets nothing (never
        # saved, a template's wrong path) ran a whole collection on the defaults, into
        # the default store, and a warning scrolls away above hours of progress
        raise ConfigError(
            f"config file {str(p)!r} holds no settings (it is empty or holds only comments): "
            "was it saved, and is it the file you meant? To run with the defaults, leave out -c"
        )
    return data


def _toml_twice(error: Exception, text: str) -> str:
    """What tomllib's ``Cannot overwrite a value`` and ``Cannot declare ... twice`` mean
    (a key or table set twice), with the line they point at: the message named neither."""
    m = re.search(r"at line (\d+), column \d+\)$", str(error))
    if m is None or not str(error).startswith(("Cannot overwrite", "Cannot declare", "Cannot mutate")):
        return ""
    lines = text.splitlines()
    n = int(m.group(1))
    shown = f": {lines[n - 1].strip()!r}" if 0 < n <= len(lines) else ""
    return f"; a key or table is set twice (line {n}{shown}): keep one"


def _yaml_problem(error: Exception) -> str:
    """PyYAML's error on one line: what is wrong and where (it was several lines, with a
    copy of the line and a caret, and named the file '<unicode string>')."""
    problem, mark = getattr(error, "problem", None), getattr(error, "problem_mark", None)
    if not problem or mark is None:
        return " ".join(str(error).split())
    context = getattr(error, "context", None)
    return f"{problem} at line {mark.line + 1}, column {mark.column + 1}" + (f" ({context})" if context else "")


def _load_yaml(text: str, where: str) -> Any:
    """``yaml.safe_load`` that refuses a key set twice in one mapping: PyYAML keeps the
    last silently, so ``seed: 1`` below ``seed: 0`` changed the run without a word,
    where TOML refuses the file."""
    import yaml

    class Strict(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                line = key_node.start_mark.line + 1
                if isinstance(key, Hashable) and key in seen:
                    raise ConfigError(
                        f"config file {where!r}: key {key!r} is set twice in one mapping (lines {seen[key]} and "
                        f"{line}): keep one"
                    )
                if isinstance(key, Hashable):
                    seen[key] = line
            return super().construct_mapping(node, deep=deep)

    return yaml.load(text, Loader=Strict)  # noqa: S506 - a SafeLoader


def merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merge key by key, anything else (lists too) replaces."""
    out = dict(base)
    for k, v in top.items():
        out[k] = merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def _set_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        out += _set_keys(v, key + ".") if isinstance(v, Mapping) and v else [key]
    return out


def env_name(key: str) -> str:
    """The ``FOCUS_*`` variable that sets the dotted ``key``."""
    return ENV_PREFIX + key.upper().replace(".", "__")


def _wants_text(key: str) -> bool:
    """Whether the field ``key`` names takes free text (so ``"123"`` stays a string)."""
    annotation = field_annotation(key)
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    return str in (typing.get_args(annotation) if union else (annotation,))


def _env_value(key: str, text: str) -> Any:
    if _wants_text(key):
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def env_layers(environ: Mapping[str, str]) -> tuple[list[Layer], list[str]]:
    """One layer per ``FOCUS_*`` variable that names a field, and a line for each that
    looks meant to and names none.

    A variable whose first part names no field belongs to another tool
    (``FOCUS_WORK_POOL`` and ``FOCUS_PROJECT_DIR`` of ``deployments/prefect.yaml``) and
    is skipped, unless it nests (``__``), is close to a field's name, is the name of
    a nested field (``FOCUS_URL``) or a nested field's path with single underscores
    (``FOCUS_MODEL_URL``, which was ignored): those are errors with the field it likely meant.
    """
    fields = list(FocusConfig.model_fields)
    leaves = {p.rsplit(".", 1)[-1] for p in field_paths()}
    # a nested field's name with one underscore where the parts need two (FOCUS_MODEL_URL)
    flat = {p.replace(".", "_"): p for p in field_paths() if "." in p}
    layers, problems = [], []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX) or len(name) == len(ENV_PREFIX):
            continue
        key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
        top = key.split(".", 1)[0]
        if top in fields:
            layers.append(Layer(name, key=key, value=_env_value(key, environ[name])))
            continue
        if key in flat:
            problems.append(_line(key, "unknown field", name, flat[key]))
        elif "." in key or top in leaves or difflib.get_close_matches(top, fields, n=1, cutoff=0.8):
            problems.append(_line(key, "unknown field", name, suggest_field(key)))
    return layers, problems


def _line(key: str, why: str, source: str | None, hint: str | None = None) -> str:
    """One problem: the field, the reason, where the value came from and (for an unknown
    field) what it likely meant, as a variable when it came from one."""
    if hint and source and source.startswith(ENV_PREFIX):
        hint = " or ".join(env_name(h) for h in hint.split(" or "))
    notes = [f"from {source}"] if source else []
    notes += [f"did you mean {hint}?"] if hint else []
    return f"  {key}: {why}" + (f" ({'; '.join(notes)})" if notes else "")


def _override_value(key: str, value: Any) -> Any:
    # --set collection_id=123 arrives as the number 123 (values are JSON); the field is text
    return str(value) if isinstance(value, int) and not isinstance(value, bool) and _wants_text(key) else value


def override_layers(overrides: Mapping[str, Any] | None, labels: Mapping[str, str] | None = None) -> list[Layer]:
    """One layer per override, its source named as the user gave it: ``labels[key]``
    (a command's own flag, ``--tasks``) or ``--set key``."""
    labels = labels or {}
    return [
        Layer(labels.get(k) or f"--set {k}", key=k, value=_override_value(k, v)) for k, v in (overrides or {}).items()
    ]


def source_of(key: str, layers: list[Layer]) -> str | None:
    """The source that set dotted ``key`` (or a field inside or around it) last."""
    found = None
    for layer in layers:
        if any(k == key or k.startswith(key + ".") or key.startswith(k + ".") for k in layer.keys()):
            found = layer.source
    return found


def build_config(layers: list[Layer], problems: list[str] | None = None) -> FocusConfig:
    """The defaults with each layer applied in turn, validated; a :class:`ConfigError`
    names every bad value (and each unknown field's likely meaning) and its source."""
    data = FocusConfig.model_construct().model_dump()
    for layer in layers:
        data = layer.apply(data)
    lines = list(problems or [])
    try:
        config = FocusConfig.model_validate(data)
    except ValidationError as e:
        lines += [_line(loc, why, _blamed(loc, why, layers), hint) for loc, why, hint in problems_of(e)]
    if lines:
        raise config_error(lines)
    return config


def _blamed(loc: str, why: str, layers: list[Layer]) -> str | None:
    """The source of a bad value: a section's error that opens with one of its fields
    (``model: model.urls '...' must start with http://``) is that field's, where a layer set
    it. Else the last source that set anything in the section was named: with
    ``--set model.urls=... --set model.kind=openai`` the line said ``(from --set model.kind)``."""
    named = why.split(" ", 1)[0]
    if named.startswith(loc + ".") and (source := source_of(named, layers)) is not None:
        return source
    if why == "Field required" and (source := _adder(loc, layers)) is not None:
        return source
    return source_of(loc, layers)


def _adder(loc: str, layers: list[Layer]) -> str | None:
    """The source that added the list entry missing field ``loc`` belongs to, said so:
    ``--set search.phases.2.transitions=3`` adds a third phase, whose name was then
    reported required with no source (or, past a file's phases, blamed on the file)."""
    parts = loc.split(".")
    digits = [i for i, part in enumerate(parts[:-1]) if part.isdigit()]
    if not digits:
        return None
    entry = ".".join(parts[: digits[-1] + 1])
    data, adder = FocusConfig.model_construct().model_dump(), None
    for layer in layers:
        keys = layer.keys()
        if any(k == entry or entry.startswith(k + ".") for k in keys):
            adder = None  # the entry set whole (a file's list): that source is blamed, as before
        elif adder is None and any(k.startswith(entry + ".") for k in keys) and not _holds(data, entry):
            adder = f"{layer.source}, which adds {entry}"
        data = layer.apply(data)
    return adder


def _holds(data: Any, key: str) -> bool:
    """Whether dotted ``key`` (digit parts index lists) is present in ``data``."""
    for part in key.split("."):
        if isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        elif isinstance(data, dict) and part in data:
            data = data[part]
        else:
            return False
    return True


def file_layers(path: str | os.PathLike[str] | None) -> list[Layer]:
    return [Layer(str(path), read_file(path))] if path is not None else []


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> FocusConfig:
    """File, then ``FOCUS_*`` environment variables, then ``overrides`` (dotted keys);
    ``labels``: what an error calls the source of an override (a command's flag), where
    not ``--set <key>``."""
    env, problems = env_layers(os.environ if environ is None else environ)
    return build_config(file_layers(path) + env + override_layers(overrides, labels), problems)


def config_at_runtime(
    config: FocusConfig | Mapping[str, Any] | None, environ: Mapping[str, str] | None = None
) -> FocusConfig:
    """The configuration a flow run uses: the defaults, then the ``FOCUS_*`` variables of
    the process running it, then the fields its ``config`` parameter sets.

    A deployment stores only the fields its configuration files name, and a Custom run
    from the UI sends only the fields the operator edited (:mod:`tasks.config.form`);
    pydantic remembers which fields a parameter set. So a worker's or a ``focus
    deploy`` process's ``FOCUS_*`` variables - where the model service and the store
    are, say - fill in the rest at run time, the same way on both paths, and what a
    run's parameters say explicitly wins. A config built by :func:`load_config` sets
    every field, so a CLI run is unchanged.

    ``config`` may be the parameter as the API sent it (a mapping, the form's markers
    included): it is validated here, after the variables, so that a field another one
    needs may come from the worker (``model.kind = "openai"`` in the run,
    ``FOCUS_MODEL__URL`` on the worker), and a bad value is one
    :class:`ConfigError` line naming the field and the parameter as its source.
    """
    env, problems = env_layers(os.environ if environ is None else environ)
    if not isinstance(config, Mapping | FocusConfig | None):  # the API takes any JSON for it
        raise ConfigError(
            f"invalid configuration: config: {type(config).__name__} {str(config)[:60]!r} is not a table of fields "
            f'(a JSON object such as {{"seed": 1}}) or null (from {PARAMETER_SOURCE})'
        )
    if isinstance(config, Mapping):
        from tasks.config.form import from_form

        return build_config(env + [Layer(PARAMETER_SOURCE, from_form(dict(config)))], problems)
    if not env and not problems:
        return config if config is not None else FocusConfig()
    explicit = config.model_dump(mode="json", exclude_unset=True) if config is not None else {}
    return build_config(env + [Layer(PARAMETER_SOURCE, explicit)], problems)


def explain_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[FocusConfig, list[tuple[str, Any, str]]]:
    """The effective configuration (as :func:`load_config` builds it) and, per leaf
    field, ``(dotted name, value, source)``: ``default``, the file, the environment
    variable or ``--set`` that set it last. A search or estimator knob left unset shows
    the value it gets from the library (source ``library default``), not the unset marker."""
    env, problems = env_layers(os.environ if environ is None else environ)
    layers = file_layers(path) + env + override_layers(overrides)
    config = build_config(layers, problems)
    data = config.model_dump(mode="json")
    library = {f"search.{name}": value for name, value in config.search.knob_values().items()}
    library |= {f"estimator.{name}": value for name, value in config.estimator.knob_values().items()}
    rows = []
    for leaf in field_paths():
        value: Any = data
        for part in leaf.split("."):
            value = value[part]
        source = source_of(leaf, layers) or "default"
        if value is None and leaf in library:
            value, source = library[leaf], "library default"
        rows.append((leaf, value, source))
    return config, rows
