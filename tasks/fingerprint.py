"""What determines a collection's result (its fingerprint), and the refusal to resume a
collection with another configuration: the pipeline's first step and the preflight
make the same comparison."""

from __future__ import annotations

from typing import Any

from tasks.config import FocusConfig

#: Fields that may differ between a run and its resume (where things run, not what).
#: The HTTP clients' timeouts, retries and hedging change how patiently a result is
#: fetched, not the result (requests are seeded).
RUNTIME_FIELDS = ("model.url", "model.http", "critic.http", "execution", "progress", "storage")


class ResumeMismatch(RuntimeError):
    """A collection id reused with a different configuration."""


def fingerprint(config: FocusConfig) -> dict[str, Any]:
    """What determines a collection's result: the config without where things run."""
    data = config.model_dump(mode="json")
    for dotted in RUNTIME_FIELDS:
        *path, last = dotted.split(".")
        node = data
        for part in path:
            node = node.get(part, {})
        node.pop(last, None)
    return data


def resume_mismatch(config: FocusConfig, stored: dict[str, Any], mine: dict[str, Any]) -> ResumeMismatch | None:
    """The error for resuming ``config``'s collection, whose stored fingerprint is
    ``stored``, with the fingerprint ``mine`` (``None`` if they agree)."""
    fields = ", ".join(_diff(stored, mine))
    if not fields:
        return None
    return ResumeMismatch(
        f"collection {config.collection_id!r} already exists in {config.storage.root} with a different "
        f"configuration (differs in: {fields}); resume it with the same configuration or use a new collection id"
    )


def _diff(a: Any, b: Any, prefix: str = "") -> list[str]:
    """Dotted names of the fields that differ. A field one side lacks counts as ``None``,
    so a field added to the config since a collection was stored, left unset, is no
    difference (the collection resumes)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b)):
            out += _diff(a.get(k), b.get(k), f"{prefix}{k}.")
        return out
    return [] if a == b else [prefix.rstrip(".")]
