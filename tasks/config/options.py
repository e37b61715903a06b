"""Checks of a section's ``options`` against what its built-in kind is constructed with.

``options`` are keyword arguments of a constructor or factory. A wrong name or shape
(``model.options = {config = {...}}``, a mapping where the client wants an HttpConfig)
used to pass validation and then fail every rollout; :func:`check_options` names it
when the configuration is validated. Factories named by import path are checked when
they are imported (:func:`tasks.config.build.check_factories`).
"""

from __future__ import annotations

import inspect
import typing
from typing import Any

from pydantic import TypeAdapter, ValidationError


def _keyword_params(fn: Any) -> dict[str, Any]:
    """Keyword parameters of ``fn`` (a class: its ``__init__``) with resolved annotations;
    an empty dict means "accepts anything" (``**kwargs`` or no signature)."""
    target = getattr(fn, "__init__") if isinstance(fn, type) else fn  # noqa: B009 - the class's, not an instance's
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return {}
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return {}
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - unresolvable annotations: check names only
        hints = {}
    return {
        name: hints.get(name, Any)
        for name, p in sig.parameters.items()
        if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _option_target(section: Any) -> tuple[Any, dict[str, str | None]] | None:
    """What a built-in kind is constructed with, and the parameters set by other fields
    of the section (``None``: not settable from a configuration at all)."""
    kind = getattr(section, "kind", None)
    if section._section == "model":
        if kind in ("local", "openai"):
            from focus.backends.openai_compat import OpenAICompatPolicy

            return OpenAICompatPolicy, {
                "base_url": "model.url",
                "model": "model.model",
                "config": "model.http",
                "transport": None,
            }
        if kind == "sglang":
            from focus.backends.sglang import SGLangPolicy

            return SGLangPolicy, {"base_url": "model.url", "config": "model.http", "transport": None}
        if kind == "llamacpp":
            from focus.backends.llamacpp import LlamaCppPolicy

            return LlamaCppPolicy, {"base_url": "model.url", "config": "model.http", "transport": None}
        return None  # tinker: optional dependency; factory: checked by check_factories
    if section._section == "critic":
        from focus import critic as critics

        if kind == "http":
            return critics.HttpCritic, {"url": "critic.url"}
        if kind == "local":
            return critics.LocalCritic, {}  # type: ignore[attr-defined]
        if kind == "constant":
            return (lambda: None), {}  # the value is critic.value; no options
        return None
    if kind == "factory":
        return None  # checked by check_factories
    if section._section == "agent.context" and kind == "summarize":
        from focus.context import Summarize

        return Summarize, {}
    if section._section == "agent.branch_points" and kind == "sparse":
        from focus.branching import SparseCheckpoints

        return SparseCheckpoints, {"every": "agent.sparse_every"}
    if section._section in ("agent.context", "agent.branch_points", "search", "estimator", "execution"):
        return (lambda: None), {}  # a built-in whose settings are the section's fields: no options
    return None


def check_options(section: Any) -> None:
    """``ValueError`` naming an option a built-in kind does not take, or of the wrong type.

    ``section`` is a pluggable section of the schema (:class:`tasks.config.parts.Pluggable`)."""
    if not section.options:
        return
    target = _option_target(section)
    if target is None:
        return
    fn, reserved = target
    where = f"{section._section}.options"
    params = _keyword_params(fn)
    accepted = sorted(set(params) - set(reserved))
    for name, value in section.options.items():
        if name in reserved:
            other = reserved[name]
            raise ValueError(
                f"{where}.{name}: set {other} instead" if other else f"{where}.{name} cannot be set in a configuration"
            )
        if name not in params:
            takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
            raise ValueError(f"{where}: kind {section.kind!r} has no option {name!r} ({takes})")
        try:
            TypeAdapter(params[name]).validate_python(value)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"{where}.{name}: {err['msg']} (got {value!r})") from None
