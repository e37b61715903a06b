"""Files FOCUS reads and writes are UTF-8 whatever the locale. Under a locale whose
encoding is not UTF-8 (``LC_ALL=C`` with Python's UTF-8 mode off, as
``PYTHONUTF8=0`` gives; a Latin-1 or Windows locale is the same), ``open()`` without an
encoding reads ASCII or that code page: ``python -m tasks.config.reference --check`` and
``python -m benchmarks --render-only --check`` stopped with ``UnicodeDecodeError`` on
the docs' non-ASCII characters, and a Prefect profiles file with one (a comment) was
ignored, so its ``PREFECT_API_URL`` was not used. The console under such a locale takes
any text: ``focus collect --help`` stopped with a traceback, and a folder name the locale
could not decode stopped the log file and was printed as ``?``."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: Under an ASCII locale Python decodes a non-ASCII folder name to surrogates, and
#: pydantic_core (PyO3) cannot be imported from such a folder ("'utf-8' codec can't encode
#: characters: surrogates not allowed"): nothing that uses pydantic runs from a checkout or
#: venv there, FOCUS or not. The tests that import it are skipped in one.
importable = pytest.mark.skipif(
    not (str(ROOT) + sys.prefix).isascii(),
    reason="the checkout or venv is under a non-ASCII folder: an ASCII locale cannot import pydantic_core from it",
)


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


@importable
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


def test_an_ascii_console_takes_any_text_and_gives_back_undecodable_bytes():
    """The console's streams under an ASCII locale: a character the locale cannot encode
    (``…`` in the help, ``é`` in a task) no longer raises, and a surrogate that stands for
    a byte the locale could not decode (a folder ``st öre`` given on the command line) is
    written as that byte again, not as ``?``."""
    import io

    from cli.streams import ENCODE_ERRORS, install

    raw = io.BytesIO()
    ascii_out = io.TextIOWrapper(raw, encoding="ascii", errors="strict")
    latin = io.TextIOWrapper(io.BytesIO(), encoding="latin-1", errors="strict")
    saved = sys.stdout, sys.stderr
    try:
        sys.stdout, sys.stderr = ascii_out, latin
        install()
        out, err = sys.stdout, sys.stderr
    finally:
        sys.stdout, sys.stderr = saved
    folder = "st öre".encode().decode("ascii", "surrogateescape")
    out.write(f"more… {folder}\n")
    out.flush()
    assert raw.getvalue() == "more… st öre\n".encode()
    err.write("é … \udcc3\n")
    err.flush()
    assert latin.buffer.getvalue() == "é \\u2026 ".encode("latin-1") + b"\xc3\n"
    assert latin.errors == ENCODE_ERRORS


@importable
@pytest.mark.slow
def test_the_help_prints_under_an_ascii_locale():
    """``focus collect --help`` under ``LC_ALL=C`` with UTF-8 mode off: a 50-line
    ``UnicodeEncodeError`` traceback on the help's first ``…``, exit 1."""
    done = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--help"],
        cwd=ROOT,
        env=non_utf8_env(),
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode()[-2000:]
    assert "…".encode() in done.stdout and b"--transitions" in done.stdout


@importable
@pytest.mark.integration
@pytest.mark.slow
def test_a_collection_in_folders_the_locale_cannot_name(tmp_path):
    """A collection run from a folder ``dïr ü`` into a store ``st öre`` under an ASCII
    locale: it finished, but the log file stopped at its first line naming the folder
    (``'utf-8' codec can't encode characters: surrogates not allowed``) and the ``rerun
    or resume`` line said ``--store 'st ??re'``, a store that does not exist."""
    from fixtures.prefect import base_env

    work = tmp_path / "dïr ü"
    work.mkdir()
    env = {**base_env(tmp_path / "prefect"), **non_utf8_env(XDG_STATE_HOME=str(tmp_path / "state"))}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "tests")])
    args = ["collect", "--tasks", "2", "--transitions", "6", "--collection-id", "c1", "--store", "st öre"]
    done = subprocess.run(
        [sys.executable, "-m", "cli", *args],
        cwd=work,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        timeout=200,
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    assert b"cannot write the log file" not in done.stderr, done.stderr.decode(errors="replace")
    store = shlex.quote(f"{work}/st öre")  # the line names it absolute: it works from any folder
    assert f"rerun or resume: focus collect --store {store} ".encode() in done.stdout, done.stdout.decode(
        errors="replace"
    )
    assert f"batch: 'file://{work}/st öre/batches/c1/iter-000000'".encode() in done.stdout
    (log,) = (tmp_path / "state" / "focus" / "logs").glob("collect-*.log")
    assert f"collection c1: batch at file://{work}/st öre/".encode() in log.read_bytes()


@importable
def test_dask_workers_write_the_log_file_in_utf8(tmp_path):
    """The logging configuration Dask workers get (``flows.logs.dask_workers_log_to``)
    under an ASCII locale: a worker's line with a non-ASCII character was lost, and
    ``--- Logging error --- UnicodeEncodeError: 'ascii' codec`` went to its standard error."""
    log = tmp_path / "x.log"
    code = (
        "import sys; from pathlib import Path; from flows.logs import dask_workers_log_to; "
        "dask_workers_log_to(Path(sys.argv[1])); import logging, distributed; "
        "logging.getLogger('distributed.worker').warning('t\\u00e2che \\u2026 done')"
    )
    env = {k: v for k, v in non_utf8_env().items() if not k.startswith("DASK_")}
    done = run(["-c", code, str(log)], env)
    assert done.returncode == 0 and "Logging error" not in done.stderr, done.stderr[-2000:]
    assert "tâche … done" in log.read_text(encoding="utf-8")


def test_a_collection_id_the_locale_cannot_decode_is_told_the_rule():
    """``--collection-id naïve`` under ``LC_ALL=C`` (UTF-8 mode off) reaches the
    configuration as ``'na\\udcc3\\udcafve'``: it was told ``Input should be a valid string,
    unable to parse raw data as a unicode string``, not what an id may hold."""
    from tasks.config import ConfigError, load_config

    with pytest.raises(ConfigError) as refused:
        load_config(overrides={"collection_id": "na\udcc3\udcafve"}, environ={})
    assert "collection_id: 'naïve' is not a collection id: use letters, digits" in str(refused.value)
    assert "raw data" not in str(refused.value)
