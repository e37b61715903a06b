"""Files FOCUS reads and writes are UTF-8 whatever the locale. Under a locale whose
encoding is not UTF-8 (``LC_ALL=C`` with Python's UTF-8 mode off, as
``PYTHONUTF8=0`` gives; a Latin-1 or Windows locale is the same), ``open()`` without an
encoding reads ASCII or that code page: ``python -m tasks.config.reference --check`` and
``python -m benchmarks --render-only --check`` stopped with ``UnicodeDecodeError`` on
the docs' non-ASCII characters, and a Prefect profiles file with one (a comment) was
ignored, so its ``PREFECT_API_URL`` was not used."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def non_utf8_env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONPATH": str(ROOT), **extra}
    env.pop("PYTHONIOENCODING", None)
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, encoding="utf-8", timeout=120
    )


def test_the_locale_of_these_tests_is_not_utf8():
    probe = run(["-c", "import locale; print(locale.getpreferredencoding(False))"], non_utf8_env())
    assert probe.returncode == 0 and probe.stdout.strip().upper() not in ("UTF-8", "UTF8"), probe.stdout


@pytest.mark.parametrize(
    "args",
    [["-m", "tasks.config.reference", "--check"], ["-m", "benchmarks", "--render-only", "--check"]],
    ids=["config-reference", "benchmark-pages"],
)
def test_doc_checks_read_the_docs_as_utf8(args):
    done = run(args, non_utf8_env())
    assert "UnicodeDecodeError" not in done.stderr, done.stderr[-2000:]
    assert done.returncode == 0, done.stderr[-2000:]


def test_a_prefect_profile_with_non_ascii_text_is_read(tmp_path):
    profiles = tmp_path / "profiles.toml"
    text = 'active = "team"\n\n[profiles.team]  # équipe\nPREFECT_API_URL = "http://127.0.0.1:4999/api"\n'
    profiles.write_text(text, encoding="utf-8")
    code = "from flows.server import configured_api_url; print(configured_api_url())"
    env = non_utf8_env(PREFECT_PROFILES_PATH=str(profiles))
    env.pop("PREFECT_API_URL", None)
    env.pop("PREFECT_PROFILE", None)
    done = run(["-c", code], env)
    assert done.returncode == 0 and done.stdout.strip() == "http://127.0.0.1:4999/api", done.stdout + done.stderr
