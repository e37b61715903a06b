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

#: Fixtures that start a real server or process (the tiny model, Prefect, S3): a test
#: that uses one is an integration test, left out of ``make test-fast``.
SERVER_FIXTURES = frozenset(
    {
        "local_model_server",
        "fault_proxy",
        "prefect_server",
        "prefect_env",
        "prefect_api",
        "s3_server",
        "s3_bucket",
        "s3_relay",
    }
)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "integration: starts real servers or processes (deselect with -m 'not integration')"
    )


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
