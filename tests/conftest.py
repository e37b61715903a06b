"""Shared test setup: offline Prefect settings and fixture plugins from tests/fixtures/."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
#: One OpenMP/BLAS thread in this process and every command a test starts (they inherit
#: the environment), before torch or numpy is imported. ``make test`` runs two workers on
#: two cores: with the default (a thread per core) each torch or BLAS call of a worker
#: spread over both cores while the other worker used them too, and OpenMP's threads
#: spin while they wait for each other. tests/test_train_kl_step.py took 16-18 CPU-s with
#: the default, 6.9 with one thread (same machine, back to back, twice). The library's
#: own torch work sets its thread count itself (``train.local.torch_threads``, the
#: critic's single thread), so what it computes is what it computes for a user.
if not os.environ.get("OMP_NUM_THREADS"):  # unset or empty; a value given is kept
    os.environ["OMP_NUM_THREADS"] = "1"

#: Bytecode is kept (``__pycache__``, which .gitignore lists, or ``PYTHONPYCACHEPREFIX``)
#: by this process, the xdist workers and every command a test starts, also where the
#: suite is started with ``PYTHONDONTWRITEBYTECODE`` set (containers often set it). With
#: it, each of the hundreds of ``focus`` commands the tests start compiled the project's
#: modules again (a small ``focus collect``: 1.01 -> 0.88 CPU-s) and each worker rewrote
#: every test module's asserts again (collection 9.9 -> 5.4 CPU-s). Python's and the
#: installed packages' bytecode is already there (their installers wrote it).
if os.environ.pop("PYTHONDONTWRITEBYTECODE", ""):
    sys.dont_write_bytecode = False


def _temporary_folder_with_a_space() -> None:
    """Run the suite, and every command it starts, in a temporary folder whose path holds a
    space (``<temp>/focus tests-<uid>``, private), unless it already does: a user's
    ``TMPDIR`` may (``/tmp/probe tmp``, a macOS or Windows user folder), and tests that
    built an expected line or split output on whitespace passed here and failed there
    (the rerun line quotes the path, a printed URL held a space). Set before pytest picks
    its base folder; the xdist workers and the tests' subprocesses inherit ``TMPDIR``."""
    import tempfile

    if " " in tempfile.gettempdir():
        return
    path = pathlib.Path(tempfile.gettempdir()) / f"focus tests-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        path.mkdir(mode=0o700)
    st = os.lstat(path)
    if path.is_symlink() or not path.is_dir() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        path = pathlib.Path(tempfile.mkdtemp(prefix=f"focus tests-{os.getuid()}-"))  # not ours: a fresh one
    os.environ["TMPDIR"] = tempfile.tempdir = str(path)


_temporary_folder_with_a_space()


def _a_home_as_the_command_has() -> None:
    """``HOME`` set to the temporary folder where no home can be found (``HOME`` unset and
    a user id without a password entry: a container under an arbitrary id), as the
    ``focus`` command does for itself (``cli.entry.home_or_temporary``): the tests import
    Prefect in this process, whose settings call ``Path.home()`` on import, so every test
    that imported it stopped with ``RuntimeError: Could not determine home directory``.
    And ``PREFECT_HOME`` in the temporary folder where ``~/.prefect`` cannot be made (a
    read-only ``HOME``, or one that does not exist: a CI user made without one), as the
    command does (``cli.common.writable_prefect_home``): Prefect, imported here, warned
    "Failed to create the Prefect home directory" into every such run's summary."""
    from cli.common import writable_prefect_home
    from cli.entry import home_or_temporary

    home_or_temporary()
    writable_prefect_home()


_a_home_as_the_command_has()

#: Every module of tests/fixtures/ is a plugin, imported by every pytest process (the xdist
#: controller too, and the sessions tests start) whichever tests it runs, except those named
#: with a leading underscore: scripts, and helpers a few test files import themselves
#: (``_verl_metrics`` imports torch, 1.5-4.4 s a process as a plugin).
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
    config.addinivalue_line(
        "markers",
        "needs(module): needs an optional module (torch, tinker): skipped, naming the extra, where it is not installed",
    )
    config.addinivalue_line(
        "markers",
        "slow: a statistical or end-to-end check over about 2 s of CPU, or one that starts the focus command; "
        "in make test, left out of make test-fast",
    )
    children_take_ctrl_c()


def children_take_ctrl_c() -> None:
    """Let the processes the tests start take SIGINT as a terminal's would.

    A job a non-interactive shell starts in the background (``make test &``, a CI runner's
    script, ``nohup``) inherits SIGINT ignored, and an ignored signal stays ignored across
    ``exec``: a Python child then never raises KeyboardInterrupt, and the tests that send a
    child Ctrl-C waited out their timeouts (tests/test_train_interrupt_library.py, 60 s).
    A handled signal is reset to its default in a child, so handling it here is enough."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(config, items):
    import pytest

    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)
        for mark in item.iter_markers("needs"):
            if (why := not_installed(mark.args[0])) is not None:
                item.add_marker(pytest.mark.skip(reason=why))
    items[:] = longest_first(items)


#: Test files holding the suite's longest tests (30-85 s each on a loaded 2-core machine).
LONG_FILES = frozenset(
    {
        "test_interrupts.py",
        "test_resume_real_model.py",
        "test_train_resume.py",
        "test_deploy.py",
        "test_bench_scale.py",
        "test_cli.py",
        "test_context_limit.py",
        "test_bench_orchestration.py",
        "test_pipeline_resume.py",
        "test_train_direct.py",
        "test_bench_learning.py",
        "test_deploy_console.py",
        "test_cancel_unserved.py",
        "test_prefect_logs_sent.py",
        "test_abandoned_runs.py",
    }
)


def longest_first(items: list) -> list:
    """``items`` with whole files reordered: :data:`LONG_FILES`, then files with a test
    that starts servers or is slow, then the rest, each group in its collected order.

    ``pytest -n 2 --dist worksteal`` hands each worker a contiguous half and lets an idle
    worker steal the end of the other's queue, never a test already running: a long test
    near the end of a queue leaves the other worker idle for as long as it runs. With
    the long ones first, the last tests are the short unit tests. A file's tests stay
    together (its module fixtures are set up once); the order is no test's dependency."""
    rank: dict[str, int] = {}
    for item in items:
        name = item.nodeid.split("::")[0]
        short = 0 if name.rsplit("/", 1)[-1] in LONG_FILES else 1
        slow = item.get_closest_marker("integration") or item.get_closest_marker("slow")
        rank[name] = min(rank.get(name, 2), short if slow or short == 0 else 2)
    return sorted(items, key=lambda item: rank[item.nodeid.split("::")[0]])


def not_installed(module: str) -> str | None:
    """Why a test that imports ``module`` (an optional one) is skipped, or ``None`` if it
    is installed: ``pip install focus-rl`` without ``[train]`` has no torch."""
    from focus.extras import EXTRAS, installed

    if installed(module):
        return None
    extra = next((e for e, mods in EXTRAS.items() if module in mods), None)
    return f"{module} is not installed" + (f" (the [{extra}] extra)" if extra else "")


#: ``python -m <module>`` and programs that run a server: a test that starts one is an
#: integration test (``make test-fast`` promises none).
SERVER_MODULES = frozenset(
    {"uvicorn", "prefect", "focus.tinylm.server", "focus.testing.simserver", "focus.testing.faults", "moto.server"}
)
SERVER_PROGRAMS = frozenset({"prefect", "uvicorn", "moto_server", "dask", "dask-scheduler", "dask-worker"})


def _server_in(argv) -> str | None:
    """What ``argv`` starts, if it starts a server."""
    import os

    words = [str(argv)] if isinstance(argv, str | bytes | os.PathLike) else [str(a) for a in argv]
    if os.path.basename(words[0]) in SERVER_PROGRAMS:
        return words[0]
    for flag, module in zip(words, words[1:], strict=False):
        if flag == "-m" and module in SERVER_MODULES:
            return f"python -m {module}"
    return None


_REAL_LISTEN = socket.socket.listen
_REAL_POPEN_INIT = subprocess.Popen.__init__


@contextlib.contextmanager
def servers_started() -> Iterator[list[str]]:
    """Within the block, record each listening socket and server process started (in a
    list the block gets), and start them as usual."""
    started: list[str] = []
    # the real ones, not an enclosing block's: what a nested block sees, it alone records
    listen, popen_init = _REAL_LISTEN, _REAL_POPEN_INIT

    def guarded_listen(self, *args):  # type: ignore[no-untyped-def]
        started.append(f"a server listening on {self.getsockname()}")
        return listen(self, *args)

    def guarded_popen(self, args, *rest, **kw):  # type: ignore[no-untyped-def]
        server = _server_in(args)
        if server:
            started.append(f"a server process ({server})")
        return popen_init(self, args, *rest, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "listen", guarded_listen)
        mp.setattr(subprocess.Popen, "__init__", guarded_popen)
        yield started


@pytest.fixture(scope="session", autouse=True)
def _logs_in_the_session_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """``XDG_STATE_HOME`` in the session's temporary folder, for this process and the
    commands the tests start: their default log files (``flows.logs.default_log_file``)
    go there, not into the home of whoever runs the suite, and a home that cannot be
    written (a container's, a read-only one) does not add ``warning: cannot write the log
    file`` lines to the output tests count. A test of that fallback sets its own."""
    state = tmp_path_factory.mktemp("xdg_state")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_STATE_HOME", str(state))
        yield


@pytest.fixture(autouse=True)
def _fast_tests_start_no_servers(request):
    """Outside the integration tests, a listening socket or a server process fails the
    test (after it ran, so a server started in a thread cannot swallow the error): mark
    the test ``@pytest.mark.integration`` or use one of :data:`SERVER_FIXTURES`."""
    if request.node.get_closest_marker("integration"):
        yield
        return
    with servers_started() as started:
        yield
    if started:
        pytest.fail(
            f"{request.node.nodeid} is not marked integration but started {started[0]}: mark it "
            "@pytest.mark.integration (make test-fast starts no server)",
            pytrace=False,
        )


@pytest.fixture(autouse=True)
def _no_command_names_left():
    """Each test starts as a flow run does, with no ``focus`` command's setting names
    (``flows.preflight.COMMAND_NAMES``): a command run in-process by an earlier test on the
    same worker left its flags there, and a later test's flow-run line named them."""
    preflight = sys.modules.get("flows.preflight")
    if preflight is not None:
        preflight.COMMAND_NAMES.set(None)
    yield
