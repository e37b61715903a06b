"""The error a configuration raises, and the syntax rules the schema and the
builders check (kept apart so that neither imports the other to share them)."""

from __future__ import annotations

import re


class ConfigError(ValueError):
    """A configuration that cannot run; the message names each field and the reason."""


#: What a configuration error calls the fields a flow run's ``config`` parameter sets.
PARAMETER_SOURCE = "the run's config parameter"


def check_import_path(value: str | None) -> str | None:
    """``value`` if it has the form ``package.module:name`` (or is ``None``), else ``ValueError``."""
    if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
        raise ValueError(f"{value!r} is not an import path of the form 'package.module:name'")
    return value


def check_env_name(name: str, variable: str | None) -> None:
    """``ValueError`` unless ``variable`` (the value of field ``name``) can name an environment variable."""
    if variable is not None and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", variable):
        raise ValueError(
            f"{name} {variable!r} is not an environment variable's name: it names the variable that holds "
            "the key (e.g. VLLM_API_KEY), not the key itself"
        )
