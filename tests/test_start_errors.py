"""No traceback reaches an operator from a command's start-up checks.

Each case runs the command in-process (:func:`cli.app.run`, what the console entry
calls): an exception that escapes the command's one-line boundary comes out of ``run``
here, as it printed a rich traceback on the terminal. What each command checks before
its work (the configuration, the store, the model server's host, the user's factories)
ends with one line and exit 2 for a setting to change (docs/operations.md, "Exit
statuses"); an error nobody described is one line too, exit 1, its traceback in the
log file, as for a bug anywhere else. Nothing starts: no server, no collection.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from cli.app import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def here(tmp_path, monkeypatch):
    """A folder to run in (the default store, ``./runs``, lands there), a home of its
    own and no ``FOCUS_*``/``PREFECT_API_URL`` from the machine running the tests."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in list(os.environ):
        if key.startswith("FOCUS_") or key == "PREFECT_API_URL":
            monkeypatch.delenv(key)
    return tmp_path


def focus(argv: list[str], capsys: pytest.CaptureFixture[str], log: Path) -> tuple[int, list[str]]:
    """``focus <argv>``'s exit status and the lines of its standard error."""
    code = run([*argv, "--log-file", str(log)] if argv[0] in ("collect", "train") else argv)
    return code, capsys.readouterr().err.splitlines()


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://" + "a" * 64 + ".example:8000", "names a host no lookup takes (encoding with 'idna' codec failed"),
        ("http://xn--zz:8000", "names a host no lookup takes (Invalid A-label)"),
        ("http://exämple..com:8000", "is not a URL an HTTP client takes (Invalid IDNA hostname"),
    ],
)
def test_a_model_url_whose_host_no_lookup_takes_is_one_line_and_status_2(url, why, here, capsys):
    # IDNAError, UnicodeError, httpx's InvalidURL from the first contact: a rich traceback, exit 1
    code, err = focus(["collect", "--model-url", url], capsys, here / "log")
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(f"error: invalid configuration: model: model.url {url!r} {why}"), err
    assert err[0].endswith("(from --model-url)") and not (here / "runs").exists()


def test_a_critic_url_whose_host_no_lookup_takes_is_one_line_and_status_2(here, capsys):
    sets = ["--set", "critic.kind=http", "--set", "critic.url=http://xn--zz:80"]
    code, err = focus(["collect", *sets], capsys, here / "log")
    assert code == 2 and len(err) == 1, err
    assert "critic.url 'http://xn--zz:80' names a host no lookup takes (Invalid A-label)" in err[0]


@pytest.mark.parametrize("command", ["collect", "train"])
def test_a_factory_module_that_raises_as_it_imports_is_one_line_naming_it_and_status_2(
    command, here, capsys, monkeypatch
):
    # it was `error: RuntimeError: no data here (traceback: <log>)`, exit 1: neither the module nor the setting
    (here / "brokenenv_h58k.py").write_text(
        textwrap.dedent("""\
        import os
        raise RuntimeError("no data here")
        """)
    )
    monkeypatch.syspath_prepend(str(here))
    sets = ["--set", "env.kind=factory", "--set", "env.factory=brokenenv_h58k:make"]
    code, err = focus([command, *sets], capsys, here / "log")
    assert code == 2 and len(err) == 1, err
    assert err[0] == (
        "error: cannot import module 'brokenenv_h58k' of 'brokenenv_h58k:make': it raised RuntimeError: "
        f"no data here (at {here / 'brokenenv_h58k.py'}:2)"
    )


def test_a_pre_check_that_raises_is_one_line_with_its_traceback_in_the_log(here, capsys, monkeypatch):
    """The structural case: ``focus collect``'s model checks ran outside its one-line
    boundary, so any of them that raised instead of returning its line (a probe's
    client meeting something unforeseen) showed the operator a traceback. An
    unexpected error stays visible as designed: one line, exit 1, the traceback in the log."""
    import flows.preflight

    def raises(cfg):
        raise RuntimeError("a probe that broke")

    monkeypatch.setattr(flows.preflight, "unreachable", raises)
    code, err = focus(["collect", "--model-url", "http://127.0.0.1:9"], capsys, here / "log")
    assert code == 1 and len(err) == 1, err
    assert err[0] == f"error: RuntimeError: a probe that broke (traceback: {here / 'log'})"
    logged = (here / "log").read_text()
    assert "Traceback (most recent call last)" in logged and "in raises" in logged


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (
            ["collect", "--store", "nosuchproto://x"],
            {},
            "error: invalid configuration: storage.root: unknown storage protocol 'nosuchproto' in 'nosuchproto://x' "
            "(from --store)",
        ),
        (
            ["collect", "--store", "{here}/afile"],
            {},
            "error: storage root file://{here}/afile: {here}/afile is a file, not a folder",
        ),
        (
            ["collect", "--model-url", "http://127.0.0.1:99999"],
            {},
            "error: invalid configuration: model: model.url 'http://127.0.0.1:99999' has a port that is not a number "
            "from 1 to 65535 (from --model-url)",
        ),
        (
            ["collect", "--model-url", "127.0.0.1:8000"],
            {},
            "error: invalid configuration: model: model.url '127.0.0.1:8000' must start with http:// or https:// "
            "(from --model-url)",
        ),
        (
            ["collect", "--set", "seed=abc"],
            {},
            "error: invalid configuration: seed: Input should be a valid integer, unable to parse string as an "
            "integer (from --set seed)",
        ),
        (
            ["collect", "-c", "{here}/bad.toml"],
            {},
            "error: config file '{here}/bad.toml' is not valid TOML: Invalid value (at end of document)",
        ),
        (["collect", "-c", "{here}"], {}, "error: cannot read config file '{here}': Is a directory"),
        (
            ["config", "show", "-c", "{here}/none.toml"],
            {},
            "error: cannot read config file '{here}/none.toml': No such file or directory",
        ),
        (
            ["train"],
            {"FOCUS_SEED": "abc"},
            "error: invalid configuration: seed: Input should be a valid integer, unable to parse string as an "
            "integer (from FOCUS_SEED)",
        ),
        (
            ["collect"],
            {"FOCUS_EXECUTION__MAX_CONCURRENCY": "-1"},
            "error: invalid configuration: execution.max_concurrency: Input should be greater than 0 "
            "(from FOCUS_EXECUTION__MAX_CONCURRENCY)",
        ),
    ],
)
def test_the_start_checks_that_said_one_line_still_do(argv, env, line, here, capsys, monkeypatch):
    """A guard, not a fix: these already ended with one line and status 2 (probed with
    the audit's list); kept so a change of the boundary cannot lose them."""
    (here / "afile").write_text("")
    (here / "bad.toml").write_text("seed = [\n")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    code, err = focus([a.format(here=here) for a in argv], capsys, here / "log")
    assert (code, err) == (2, [line.format(here=here)])


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_config_file_is_one_line(here, capsys):
    (here / "locked.toml").write_text("seed = 1\n")
    (here / "locked.toml").chmod(0)
    code, err = focus(["collect", "-c", str(here / "locked.toml")], capsys, here / "log")
    assert (code, err) == (2, [f"error: cannot read config file '{here / 'locked.toml'}': Permission denied"])


def test_python_m_examples_math_problems_warns_nothing():
    """``examples/math/__init__.py`` imported ``problems``, so ``python -m
    examples.math.problems`` printed Python's ``RuntimeWarning: 'examples.math.problems'
    found in sys.modules after import of package 'examples.math' ...``; ``-W error``
    made it fatal. The package's names are imported on first use now."""
    done = subprocess.run(
        [sys.executable, "-W", "error", "-m", "examples.math.problems"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout.startswith('{"id": "math-0-0"'), done.stdout[:200]
    import examples.math

    assert examples.math.generate_problems is not None and "MathEnv" in dir(examples.math)


@pytest.mark.parametrize("url", ["nosuchproto://x/batches/c", "nosuchproto://x/weights/loop"])
def test_inspect_of_a_url_with_an_unknown_protocol_is_one_line_and_status_2(url, here, capsys):
    # a batch: the store's ValueError came back out of the error's own handler (a rich
    # traceback, exit 1); a train loop's weights: "cannot read the metrics", exit 1
    code, err = focus(["inspect", url], capsys, here / "log")
    assert (code, err) == (
        2,
        ["error: storage root 'nosuchproto://x': unknown protocol 'nosuchproto' (no fsspec filesystem for it)"],
    )


def test_deploy_with_a_prefect_url_whose_host_no_lookup_takes_is_one_line(here, capsys, monkeypatch):
    # `IDNAError: Invalid A-label` from the health check: a rich traceback
    monkeypatch.setenv("PREFECT_API_URL", "http://xn--zz:4200/api")
    code, err = focus(["deploy"], capsys, here / "log")
    assert (code, err) == (
        1,
        [
            "error: the Prefect server at http://xn--zz:4200/api did not answer (IDNAError: Invalid A-label); "
            "start it or set PREFECT_API_URL, then run focus deploy again"
        ],
    )
