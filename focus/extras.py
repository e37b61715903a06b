"""The optional parts of the project (pyproject.toml's extras) and the one-line error
for a part that is not installed.

``pip install focus-rl`` installs the library alone. A user who then starts the
embedded model server, the ``focus`` command or the local trainer met the import error
of whichever module came first (``No module named 'starlette'``, with the server's log
and a traceback), which names a module, not what to install. :func:`require` checks
before the part starts and :class:`MissingExtra` says it in one line.
"""

from __future__ import annotations

import importlib.util

#: The modules each extra provides that the project imports (top-level names), in the
#: order they are imported.
EXTRAS: dict[str, tuple[str, ...]] = {
    "pipeline": ("typer", "rich", "yaml", "prefect", "distributed"),
    "local": ("starlette", "uvicorn", "threadpoolctl", "prometheus_client"),
    "train": ("torch",),
    "s3": ("s3fs",),
    "tinker": ("tinker",),
}


class MissingExtra(ModuleNotFoundError):
    """A part of the project whose extra is not installed; ``str()`` is one line naming
    the extra to install. A :class:`ModuleNotFoundError`, so ``except ImportError``
    and ``pytest.importorskip`` treat it as the missing module it is."""

    def __init__(self, what: str, extra: str, missing: list[str]) -> None:
        names = ", ".join(missing)
        verb = "is" if len(missing) == 1 else "are"
        super().__init__(
            f"{what} needs the [{extra}] extra ({names} {verb} not installed): pip install 'focus-rl[{extra}]'",
            name=missing[0] if missing else None,
        )
        self.extra = extra
        self.missing = missing


def installed(module: str) -> bool:
    """Whether ``module`` (a top-level name) can be imported, without importing it."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken install, or a module set to None in sys.modules
        return False


def missing(extra: str, modules: tuple[str, ...] | None = None) -> list[str]:
    """The modules of ``extra`` (or only ``modules`` of it) that are not installed."""
    return [m for m in (EXTRAS[extra] if modules is None else modules) if not installed(m)]


def require(extra: str, what: str, modules: tuple[str, ...] | None = None) -> None:
    """Raise :class:`MissingExtra` if a module of ``extra`` is not installed (or one of
    ``modules``, the part of it that ``what`` uses); ``what`` names the part that needs
    it (``"the embedded model server"``)."""
    absent = missing(extra, modules)
    if absent:
        raise MissingExtra(what, extra, absent)


#: fsspec protocols whose filesystem an extra installs.
PROTOCOLS = {"s3": "s3", "s3a": "s3"}


def protocol_hint(protocol: str) -> str:
    """What to install for an fsspec ``protocol`` whose package is missing: ``"; pip
    install 'focus-rl[s3]'"`` for S3, else nothing (fsspec's own message names the package)."""
    extra = PROTOCOLS.get(protocol)
    return f"; pip install 'focus-rl[{extra}]'" if extra else ""
