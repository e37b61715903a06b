"""The exit statuses docs/operations.md lists ("Exit statuses") are the ones the
commands give: one case of each that needs no server, run through the command line's
own handling (:func:`cli.app.run`); the interrupt statuses are tests/test_interrupts.py's."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import pytest

from cli.app import run

DOC = Path(__file__).resolve().parent.parent / "docs" / "operations.md"


def _documented() -> set[str]:
    section = DOC.read_text(encoding="utf-8").split("### Exit statuses", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| status")]
    return {s for row in rows for s in re.findall(r"\d+", row.split("|")[1])}


def test_every_status_is_documented():
    assert _documented() == {"0", "1", "2", "130", "143", "129"}


@pytest.mark.parametrize(
    ("args", "status"),
    [
        (["config", "show"], 0),
        (["collect", "--bogus"], 2),
        (["collect", "--tasks", "-1"], 2),
        (["inspect", "{tmp}/nothing-here"], 2),  # a path typed wrong
        (["inspect", "{tmp}/runs/batches/c"], 1),  # a collection with no finished batch
    ],
)
def test_a_command_exits_with_the_documented_status(tmp_path, args, status):
    (tmp_path / "runs" / "batches" / "c").mkdir(parents=True)
    argv = [a.format(tmp=tmp_path) for a in args]
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = run(argv, obj={"warm_model": None})
    assert code == status, err.getvalue()
    assert str(code) in _documented()
    if status:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()  # one line per error
