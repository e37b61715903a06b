"""The error a configuration raises, and the one syntax rule both the schema and the
builders check (kept apart so that neither imports the other to share them)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration that cannot run; the message names each field and the reason."""


def check_import_path(value: str | None) -> str | None:
    """``value`` if it has the form ``package.module:name`` (or is ``None``), else ``ValueError``."""
    if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
        raise ValueError(f"{value!r} is not an import path of the form 'package.module:name'")
    return value
