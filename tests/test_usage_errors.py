"""A wrong command line is one line and status 2, like every other error of ``focus``.

Typer drew a usage line, a hint and a rich box around the message: five or six lines
on standard error for ``focus collect --bogus``. Run through the console entry
(the installed ``focus`` script), which is what a user runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.prefect import ROOT

FOCUS = str(Path(sys.executable).parent / "focus")  # the console script a user runs


@pytest.mark.parametrize(
    ("argv", "line"),
    [
        (
            ["collect", "--bogus"],
            "error: No such option: --bogus (Possible options: --verbose); focus collect -h lists the options",
        ),
        (
            ["train", "--iterations", "x"],
            "error: Invalid value for '--iterations': Input should be a valid integer, unable to parse string as an integer; focus train -h lists the options",
        ),
        (["inspect"], "error: Missing argument 'URL'; focus inspect -h lists the options"),
        (["nocommand"], "error: No such command 'nocommand'; focus -h lists the options"),
        (["config", "show", "--bogus"], "error: No such option: --bogus; focus config show -h lists the options"),
    ],
)
def test_a_wrong_command_line_is_one_line_and_status_2(argv, line, tmp_path):
    done = subprocess.run(
        [FOCUS, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "80"},
    )
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")


def test_no_command_still_prints_the_help_and_help_still_exits_0(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "COLUMNS": "80"}
    bare = subprocess.run([FOCUS], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert bare.returncode == 2 and "Usage: focus [OPTIONS] COMMAND" in bare.stdout and bare.stderr == ""
    helped = subprocess.run([FOCUS, "inspect", "-h"], cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert helped.returncode == 0 and "Usage: focus inspect" in helped.stdout and helped.stderr == ""
