"""A part whose extra is not installed says which extra to install, in one line.

Each test runs Python in a subprocess where the extra's modules cannot be imported (a
``sitecustomize`` that refuses them, inherited by the processes it starts), as after
``pip install focus-rl`` without that extra."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from focus.extras import EXTRAS, MissingExtra, installed, missing, protocol_hint, require

ROOT = Path(__file__).resolve().parent.parent

HIDE = """
import os, sys
_HIDDEN = frozenset(filter(None, os.environ.get("HIDE_MODULES", "").split(",")))
class _Hide:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, _Hide)
"""


def run_without(tmp_path: Path, hidden: tuple[str, ...], argv: list[str], timeout: float = 120):
    """``python argv`` with the modules ``hidden`` not importable."""
    site = tmp_path / "site"
    site.mkdir(exist_ok=True)
    (site / "sitecustomize.py").write_text(HIDE)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "FOCUS_"))}
    env.update(
        HIDE_MODULES=",".join(hidden),
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]),
        PREFECT_HOME=str(tmp_path / "prefect"),
        DO_NOT_TRACK="1",
        XDG_STATE_HOME=str(tmp_path / "state"),
    )
    return subprocess.run(
        [sys.executable, *argv],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def raised(tmp_path: Path, hidden: tuple[str, ...], code: str) -> tuple[str, str]:
    """The type and message of what ``code`` raises with ``hidden`` missing."""
    wrapped = f"try:\n{''.join('    ' + line + chr(10) for line in code.splitlines())}except BaseException as e:\n"
    wrapped += (
        "    print(type(e).__name__, isinstance(e, ModuleNotFoundError)); print(str(e))\nelse:\n    print('none')"
    )
    out = run_without(tmp_path, hidden, ["-c", wrapped])
    assert out.returncode == 0, out.stderr
    head, _, message = out.stdout.partition("\n")
    return head, message.rstrip("\n")


def test_missing_extra_is_a_one_line_module_not_found_error():
    e = MissingExtra("the thing", "local", ["starlette", "uvicorn"])
    assert isinstance(e, ModuleNotFoundError) and e.name == "starlette"
    assert str(e) == (
        "the thing needs the [local] extra (starlette, uvicorn are not installed): pip install 'focus-rl[local]'"
    )
    # this environment has every extra the suite needs
    assert installed("pydantic") and not installed("no_such_module_focus") and missing("local") == []
    require("local", "the thing")
    assert protocol_hint("s3") == "; pip install 'focus-rl[s3]'" and protocol_hint("gcs") == ""


def test_every_extra_in_the_table_is_one_of_pyprojects():
    import tomllib

    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(extras)


def test_the_embedded_server_without_the_local_extra(tmp_path):
    """It said ``the embedded model server did not start: ModuleNotFoundError: No
    module named 'starlette'`` with the server's log (a traceback) as a note."""
    head, message = raised(
        tmp_path, ("starlette",), "from focus.backends import LocalModelServer\nLocalModelServer().start()"
    )
    assert head == "MissingExtra True"
    assert message == (
        "the embedded model server (LocalModelServer) needs the [local] extra (starlette is not installed): "
        "pip install 'focus-rl[local]'"
    )


def test_the_local_trainer_and_critic_without_the_train_extra(tmp_path):
    """They said ``No module named 'torch'`` (the critic only at its first prediction)."""
    for code, what in (
        ("from focus.train_local import PolicyTrainer\nPolicyTrainer()", "PolicyTrainer (the local trainer)"),
        ("from focus.critic import LocalCritic\nLocalCritic()", "LocalCritic"),
    ):
        head, message = raised(tmp_path, ("torch",), code)
        assert head == "MissingExtra True"
        assert message == f"{what} needs the [train] extra (torch is not installed): pip install 'focus-rl[train]'"


@pytest.mark.integration
def test_dask_execution_without_the_pipeline_extra(tmp_path):
    """It said ``No module named 'distributed'`` when the first wave needed the cluster.
    (Integration: with Dask there, the second call starts a LocalCluster.)"""
    head, message = raised(
        tmp_path, ("distributed",), "from focus.dask_execution import DaskExecution\nDaskExecution().client()"
    )
    assert head == "MissingExtra True"
    assert message == (
        "DaskExecution needs the [pipeline] extra (distributed is not installed): pip install 'focus-rl[pipeline]'"
    )
    # Dask without the rest of the pipeline (Prefect, typer) is enough for it
    head, message = raised(
        tmp_path, ("prefect", "typer"), "from focus.dask_execution import DaskExecution\nDaskExecution().client()"
    )
    assert head == "none", message


def test_an_s3_root_without_the_s3_extra(tmp_path):
    head, message = raised(tmp_path, ("s3fs",), "from storage.urls import Location\nLocation('s3://bucket/x')")
    assert head == "ValueError False"
    assert message.endswith("pip install 'focus-rl[s3]'") and "\n" not in message


def test_the_focus_command_without_the_pipeline_extra(tmp_path):
    """It printed a traceback ending in ``ModuleNotFoundError: No module named 'typer'``."""
    out = run_without(tmp_path, ("typer",), ["-m", "cli", "collect"])
    assert out.returncode == 1
    assert out.stderr == (
        "error: the focus command needs the [pipeline] extra (typer is not installed): "
        "pip install 'focus-rl[pipeline]'\n"
    )


@pytest.mark.slow
def test_focus_collect_without_the_local_extra(tmp_path):
    """``focus collect`` on the embedded default, with the pipeline but not the model server."""
    out = run_without(tmp_path, ("starlette",), ["-m", "cli", "collect", "--store", str(tmp_path / "runs")])
    assert out.returncode == 1
    lines = out.stderr.strip().splitlines()
    assert lines[-1].startswith(
        "error: the embedded model server (LocalModelServer) needs the [local] extra (starlette is not installed): "
        "pip install 'focus-rl[local]'"
    ), out.stderr
    assert not any("Traceback" in line for line in lines)
