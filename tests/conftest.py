"""Shared test setup: offline Prefect settings and fixture plugins from tests/fixtures/."""

from __future__ import annotations

import os
import pathlib

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

pytest_plugins = sorted(
    f"fixtures.{p.stem}"
    for p in (pathlib.Path(__file__).parent / "fixtures").glob("*.py")
    if not p.stem.startswith("_")
)
