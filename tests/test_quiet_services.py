"""Prefect's background services on focus deploy's quiet console.

A Ctrl-C during a deployment run left Prefect's events worker's draining note
(``EventsWorker - Still processing items: 1 items remaining...``, a WARNING) among the
console's lines: the flow-run process's console shows warnings, and that note is not one
an operator acts on (seen in CI's test_deploy_console)."""

from __future__ import annotations

import logging

import pytest

from flows.cancel import SERVICE_LOGGERS, quiet_services


@pytest.fixture
def service_levels():
    loggers = [logging.getLogger(name) for name in SERVICE_LOGGERS]
    before = [lg.level for lg in loggers]
    yield loggers
    for lg, level in zip(loggers, before, strict=True):
        lg.setLevel(level)


def test_the_service_loggers_are_prefects():
    """Each service logs under its class name (``logging.getLogger(type(self).__name__)``)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    assert {EventsWorker.__name__, APILogWorker.__name__} == set(SERVICE_LOGGERS)


def test_a_warnings_only_console_keeps_the_services_errors_only(service_levels):
    for lg in service_levels:
        lg.setLevel(logging.NOTSET)
    quiet_services({})  # a console at Prefect's default level: as it was
    assert all(lg.isEnabledFor(logging.WARNING) or logging.getLogger().level > logging.WARNING for lg in service_levels)
    quiet_services({"PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING"})  # focus deploy's flow-run processes
    assert not any(lg.isEnabledFor(logging.WARNING) for lg in service_levels)
    assert all(lg.isEnabledFor(logging.ERROR) for lg in service_levels)
