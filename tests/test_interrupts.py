"""Ctrl-C and SIGTERM stop a collection cleanly, and the rerun writes the batch an
uninterrupted run writes, bit for bit.

The command runs on a real pseudo-terminal (``pty.fork``): typing Ctrl-C there makes
the terminal send SIGINT to the whole foreground process group, as it does for a
person. The first signal stops the collection (nothing in flight is recorded, finished
saves complete), stops what the command started and exits 130 (143 for SIGTERM) with
one line saying how to resume; a second signal exits at once. Interrupted at several
points - while the evidence runs, with continuation waves in flight, after a wave was
saved - the resumed batch has every row of the uninterrupted one, and no rollout
failed.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures._procs import children
from fixtures.prefect import base_env, from_template
from fixtures.resume import SLOW_DIGITS, mismatches

from storage import BatchStore, CheckpointStore

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

CID = "stopped"
CONFIG = SLOW_DIGITS


def config_file(tmp: Path, root: Path, *, latency: float = 0.1, execution: str = "local", cid: str = CID) -> Path:
    path = tmp / f"{cid}-{root.name}.toml"
    path.write_text(CONFIG.format(cid=cid, root=root, latency=latency, execution=execution))
    return path


def in_terminal(
    args: list[str],
    env: dict[str, str],
    when: Callable[[], bool],
    keys: list[bytes],
    timeout_s: float = 240,
    *,
    argv: list[str] | None = None,
    cwd: Path | None = None,
) -> tuple[int, str]:
    """Run ``focus <args>`` (or ``argv``) on a pseudo-terminal; once ``when()`` holds,
    type ``keys`` (0.05 s apart). Returns the exit status and what the terminal showed."""
    argv = argv or [sys.executable, "-m", "cli"]
    pid, fd = pty.fork()
    if pid == 0:  # the child: its own session, the terminal's foreground process group
        if cwd is not None:
            os.chdir(cwd)
        os.execve(argv[0], [*argv, *args], env)
    shown, typed, deadline = bytearray(), False, time.monotonic() + timeout_s
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 0.02)
            if ready:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # the terminal is gone: the command exited
                    chunk = b""
                if not chunk:
                    break
                shown += chunk
            if not typed and when():
                for key in keys:
                    os.write(fd, key)
                    time.sleep(0.05)
                typed = True
            assert time.monotonic() < deadline, (
                f"no exit within {timeout_s} s:\n{shown.decode(errors='replace')[-3000:]}"
            )
    finally:
        _, status = os.waitpid(pid, 0)
        os.close(fd)
    assert typed, "the command ended before it could be interrupted:\n" + shown.decode(errors="replace")[-3000:]
    return os.waitstatus_to_exitcode(status), shown.decode(errors="replace")


def saved(root: Path, cid: str = CID) -> set[tuple[str, int]]:
    try:
        return {(str(p), w) for p, w in CheckpointStore(str(root)).list(cid)}
    except Exception:  # noqa: BLE001 - the store does not exist yet
        return set()


def after(root: Path, key: tuple[str, int], delay_s: float = 0.0) -> Callable[[], bool]:
    """A condition: ``key`` is saved (and ``delay_s`` has passed since it was first seen)."""
    seen: list[float] = []

    def check() -> bool:
        if not seen and key in saved(root):
            seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] >= delay_s

    return check


def resume(cfg: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--config", str(cfg), "--json"],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def batch(root: Path, cid: str = CID):  # type: ignore[no-untyped-def]
    store = BatchStore(str(root))
    return store.read(store.url_for(cid, 0))


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """The uninterrupted collection's store."""
    tmp = tmp_path_factory.mktemp("clean")
    root = tmp / "store"
    resume(config_file(tmp, root, latency=0.0), base_env(tmp / "prefect"))
    return root


ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def one_line(shown: str) -> str:
    """The last line the terminal shows (colours, cursor moves and the echoed ^C removed)."""
    lines = [ln for ln in ANSI.sub("", shown).replace("\r", "\n").splitlines() if ln.strip()]
    return lines[-1].removeprefix("^C")


@pytest.mark.parametrize(
    "point",
    [
        pytest.param("evidence", id="while-the-evidence-runs"),
        pytest.param("waves", id="continuation-waves-in-flight"),
        pytest.param("saved-wave", id="after-a-wave-was-saved"),
    ],
)
def test_ctrl_c_stops_cleanly_and_the_rerun_gives_the_same_batch(point, clean, tmp_path):
    root = tmp_path / "store"
    cfg = config_file(tmp_path, root)
    env = base_env(tmp_path / "prefect")
    when = {
        "evidence": after(root, ("config", 0), 0.3),
        "waves": after(root, ("evidence.score", 0), 0.15),
        "saved-wave": after(root, ("1.continue", 1)),
    }[point]
    code, shown = in_terminal(["collect", "--config", str(cfg)], env, when, [b"\x03"])
    assert code == 130, shown[-3000:]
    line = one_line(shown)
    assert line.startswith("interrupted (SIGINT)") and line.endswith(
        f"focus collect -c {shlex.quote(str(cfg))} --collection-id {CID}"
    )
    assert "Traceback" not in shown and "error" not in ANSI.sub("", shown).lower(), shown[-3000:]
    before = saved(root) - {("critic", 0)}  # the critic's identity is saved, not a step
    assert ("export", 0) not in before
    out = resume(cfg, env)
    # every step saved before the interrupt is reused, nothing else
    assert json.loads(out.stdout.strip().splitlines()[-1])["stats"]["steps_reused"] == len(before)
    got, want = batch(root), batch(clean)
    assert got.stats["failed_rollouts"] == 0
    assert mismatches(got, want) == {"actor": 0, "critic": 0}


def test_sigterm_stops_cleanly_too(clean, tmp_path):
    root = tmp_path / "store"
    cfg = config_file(tmp_path, root)
    env = base_env(tmp_path / "prefect")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "collect", "--config", str(cfg)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while ("evidence.score", 0) not in saved(root):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)  # the command alone, as a service manager stops it
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGTERM)"), err[-3000:]
    resume(cfg, env)
    assert mismatches(batch(root), batch(clean)) == {"actor": 0, "critic": 0}


def test_a_second_signal_exits_at_once_with_a_line(clean, tmp_path):
    """A second signal exits at once (the test above); it did so without a word, so the
    terminal's last line was the first signal's echo or a progress line. SIGINT and
    SIGTERM sent together: two signals pending at once (Python runs their handlers in
    the signals' order, SIGINT first), so the second always lands before the first's
    stop can end the command."""
    root = tmp_path / "store"
    cfg = config_file(tmp_path, root)
    env = base_env(tmp_path / "prefect")
    log = tmp_path / "focus.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "collect", "--config", str(cfg), "--log-file", str(log)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while ("1.continue", 0) not in saved(root):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-3000:]
    line = (
        "interrupted again (SIGTERM): stopped at once, the command's servers killed; finished steps are saved; "
        f"resume with: PYTHONPATH={shlex.quote(env['PYTHONPATH'])} focus collect -c {shlex.quote(str(cfg))} --collection-id {CID}"
    )  # the configuration's model factory is found through PYTHONPATH
    assert err.strip().splitlines()[-1] == line, err[-3000:]
    assert line in log.read_text()
    resume(cfg, env)
    assert mismatches(batch(root), batch(clean)) == {"actor": 0, "critic": 0}


def test_the_resume_line_is_the_command_that_resumes(tmp_path):
    """The line said `resume with: focus collect --collection-id <id>` whatever the
    command's flags: run as it says, the store was ./runs and the configuration the
    default, a new collection instead of the resume. It now repeats the command's own
    flags and --set values (the id too, when the command made one up), and run as it
    says, it resumes: every saved step reused."""

    root = tmp_path / "elsewhere"
    args = ["collect", "--store", str(root), "--tasks", "3", "--transitions", "40", "--seed", "17"]
    args += ["--set", "model.kind=factory", "--set", "model.factory=fixtures.digits:digit_policy"]
    args += ["--set", 'model.options={"latency_s": 0.1}', "--set", "search.phases.1.wave_size=3"]
    env = base_env(tmp_path / "prefect")
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not any(("1.continue", 0) in saved(root, d.name) for d in (root / "checkpoints").glob("*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    (cid,) = [d.name for d in (root / "checkpoints").iterdir()]
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err[-3000:]
    line = err.strip().splitlines()[-1]
    assert line.startswith("interrupted (SIGTERM)") and " focus collect " in line, line
    command = shlex.split(line.split("resume with: ", 1)[1])[1:]  # after PYTHONPATH=...
    assert command[:2] == ["focus", "collect"] and command[-2:] == ["--collection-id", cid], command
    before = saved(root, cid) - {("critic", 0)}
    # pasted into another shell, whose PYTHONPATH does not name the factory's folder: the
    # line omitted the PYTHONPATH the factory was found through (`cannot import module`)
    assert line.split("resume with: ", 1)[1].startswith(f"PYTHONPATH={shlex.quote(env['PYTHONPATH'])} focus collect ")
    shell = {k: v for k, v in env.items() if k != "PYTHONPATH"}
    shell["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    done = subprocess.run(
        ["bash", "-c", line.split("resume with: ", 1)[1] + " --json"], cwd=tmp_path, env=shell,
        capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["collection_id"] == cid and result["stats"]["steps_reused"] == len(before), result
    assert not (tmp_path / "runs").exists()  # nothing went to the default store


def _silent_server() -> socket.socket:
    """A server on loopback that accepts connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    listener.settimeout(60)
    return listener


def _ctrl_c_once_connected(
    args: list[str], env: dict[str, str], cwd: Path, listener: socket.socket
) -> tuple[int, list[str]]:
    """Run ``focus <args>``, send SIGINT once it has connected to ``listener``: its exit
    status and the non-empty lines it printed."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        conn, _ = listener.accept()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
        listener.close()
    conn.close()
    return proc.returncode, [ln for ln in (out + err).splitlines() if ln.strip()]


def test_ctrl_c_before_the_work_begins_is_one_line(tmp_path):
    """A Ctrl-C while the command imports or reads its configuration printed a
    KeyboardInterrupt traceback (20-40 lines); in its preflight, nothing at all. Here the
    preflight waits on an object store that accepts connections and never answers; the
    signal comes once it has connected: one line, exit 130."""
    listener = _silent_server()
    env = {
        **base_env(tmp_path / "prefect"),
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{listener.getsockname()[1]}",
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    args = ["collect", "--store", "s3://silent/runs", "--collection-id", "c"]
    code, lines = _ctrl_c_once_connected(args, env, tmp_path, listener)
    assert code == 130 and lines == ["interrupted (SIGINT): nothing was running"], (code, lines)


@pytest.mark.parametrize("command", ["inspect", "deploy"])
def test_ctrl_c_of_the_other_commands_is_one_line(tmp_path, command):
    """`focus inspect` (reading a batch), `focus config show` and the start of `focus
    deploy` and `focus serve-model` answered Ctrl-C with a KeyboardInterrupt traceback
    of 18-51 lines. Here each waits on a server that accepts connections and never
    answers (an object store, a Prefect API); the signal comes once it has connected."""
    listener = _silent_server()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    env = {**base_env(tmp_path / "prefect"), "AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}
    if command == "inspect":
        env |= {"AWS_ENDPOINT_URL": url, "AWS_DEFAULT_REGION": "us-east-1"}
        args = ["inspect", "s3://silent/runs/batches/c/iter-000000"]
    else:
        env["PREFECT_API_URL"] = f"{url}/api"
        args = ["deploy", "--watchdog-only"]
    code, lines = _ctrl_c_once_connected(args, env, tmp_path, listener)
    assert code == 130 and lines == ["interrupted (SIGINT)"], (code, lines[-12:])


def test_a_second_ctrl_c_exits_at_once_and_the_store_still_resumes(clean, tmp_path):
    root = tmp_path / "store"
    cfg = config_file(tmp_path, root)
    env = base_env(tmp_path / "prefect")
    code, shown = in_terminal(
        ["collect", "--config", str(cfg)], env, after(root, ("1.continue", 0)), [b"\x03", b"\x03"]
    )
    assert code == 130, shown[-3000:]
    resume(cfg, env)
    got = batch(root)
    assert got.stats["failed_rollouts"] == 0 and mismatches(got, batch(clean)) == {"actor": 0, "critic": 0}


@pytest.mark.parametrize("how", ["dask", "prefect"])
def test_ctrl_c_stops_the_dask_and_the_prefect_paths_cleanly(how, clean, tmp_path, request):
    execution = "dask" if how == "dask" else "local"
    env = base_env(tmp_path / "prefect")
    if how == "prefect":  # the temporary server's database migrated already: its start is not what is tested
        from_template(request.getfixturevalue("prefect_template"), tmp_path / "prefect")
    root = tmp_path / "store"
    cfg = config_file(tmp_path, root, execution=execution)
    args = ["collect", "--config", str(cfg), *(["--prefect"] if how == "prefect" else [])]
    code, shown = in_terminal(args, env, lambda: ("1.continue", 0) in saved(root), [b"\x03"])
    assert code == 130, shown[-3000:]
    assert one_line(shown).startswith("interrupted (SIGINT)"), shown[-3000:]
    # the terminal's SIGINT reaches the whole process group: each Dask worker process
    # printed a 30-line KeyboardInterrupt traceback above the line
    assert "Traceback" not in shown and "KeyboardInterrupt" not in shown, shown[-3000:]
    resume(cfg, env)
    got = batch(root)
    # the uninterrupted batch: the module's collection (local execution, the same seed and id)
    assert got.stats["failed_rollouts"] == 0 and mismatches(got, batch(clean)) == {"actor": 0, "critic": 0}


def test_sigterm_stops_the_prefect_path_cleanly(prefect_env, tmp_path):
    """Under a flow, Prefect's engine puts its own SIGTERM handler in place of the
    command's: a SIGTERM (a scheduler's, Kubernetes') ended `focus collect --prefect` on
    the embedded model with a 50-line `prefect.exceptions.TerminationSignal` (or
    `CancelledError`) traceback and exit 1, 3 times in 3. It stops as without Prefect:
    exit 143, one line, and the rerun writes the uninterrupted batch. The flow runs on
    the session's Prefect server (the engine's handler is the same whichever server the
    run reports to): a temporary server the command starts, and stops on a signal, is
    test_ctrl_c_stops_the_dask_and_the_prefect_paths_cleanly[prefect]'s; its start cost
    this test 4-5 s and was not what it tested."""
    env = base_env(tmp_path / "prefect")  # the clean run and the rerun: directly, no Prefect server
    # 200 transitions: about 9 continuation waves, so the run stopped after its second is
    # stopped with most of them to go (500, about 20 waves, cost the clean run and the
    # rerun 1 CPU-s each more)
    flags = ["--tasks", "8", "--transitions", "200", "--collection-id", "term", "--json"]
    clean, root = tmp_path / "clean", tmp_path / "store"
    first = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--store", str(clean), *flags],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", "collect", "--store", str(root), *flags, "--prefect"],
        env=prefect_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while ("1.continue", 1) not in saved(root, "term"):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-3000:]
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143 and "Traceback" not in err, err[-3000:]
    assert err.strip().splitlines()[-1].startswith("interrupted (SIGTERM)"), err[-3000:]
    again = subprocess.run(
        [sys.executable, "-m", "cli", "collect", "--store", str(root), *flags],
        env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads(again.stdout.splitlines()[-1])["stats"]["steps_reused"] > 0
    assert BatchStore(str(root)).manifest(BatchStore(str(root)).url_for("term", 0)).fingerprint == (
        BatchStore(str(clean)).manifest(BatchStore(str(clean)).url_for("term", 0)).fingerprint
    )


@pytest.mark.needs("torch")  # the loop's critic is a LocalCritic
def test_ctrl_c_stops_focus_train_cleanly_and_the_rerun_ends_with_the_same_weights(
    prefect_env, clean_train_loop, tmp_path
):
    """Interrupted while iteration 0 collects, then while its trainer runs (weights
    written, result not yet recorded), the loop resumes and ends with the weights of a
    loop that was never interrupted (tests/test_train_resume.py's loop and trainer).

    The interrupted runs are train_loop flow runs (the session's Prefect server); the
    run that finishes runs directly (no server configured): one journal, either path
    resumes the other (tests/test_train_resume.py resumes killed direct runs with a flow
    run). It was a flow run too, 3-4 s of flow-run overhead checking nothing more."""
    import textwrap

    from test_train_resume import CONFIG as LOOP
    from test_train_resume import LAUNCHER, TRAINER

    from storage.weights import WeightStore

    user = tmp_path / "user"
    user.mkdir()
    (user / "slowtrain.py").write_text(textwrap.dedent(TRAINER))
    launcher = tmp_path / "focus_cli.py"
    launcher.write_text(LAUNCHER)
    root, markers = tmp_path / "store", tmp_path / "markers"
    (user / "loop.toml").write_text(LOOP.format(root=root, markers=markers, pause=30))
    args = ["train", "-c", "loop.toml"]
    argv = [sys.executable, str(launcher)]
    points = [
        lambda: any(p == "1.continue.score" for p, _ in saved(root, "r-it0")),
        lambda: (markers / "trained-0").exists(),
    ]
    for when in points:
        code, shown = in_terminal(args, prefect_env, when, [b"\x03"], argv=argv, cwd=user)
        assert code == 130, shown[-3000:]
        line = one_line(shown)
        resume = f"focus train -c {shlex.quote(str(user / 'loop.toml'))} --collection-id r"  # works from any folder
        assert line.startswith("interrupted (SIGINT)") and line.endswith(resume), line
    assert not CheckpointStore(str(root)).exists("r", "train", 0)  # the interrupted training was not recorded
    done = subprocess.run(
        [*argv, *args, "--set", "train.options.pause_s=0"], cwd=user, env=base_env(tmp_path / "prefect-home"),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    # the same loop never interrupted, run directly from a user's folder (once a session:
    # tests/test_train_resume.py compares with it too)
    clean, _ = clean_train_loop
    for name in ("policy.pt", "critic.pt", "optimizer.pt"):
        got = WeightStore(str(root)).read(f"{WeightStore(str(root)).folder('r', 2)}/{name}")
        want = WeightStore(str(clean)).read(f"{WeightStore(str(clean)).folder('r', 2)}/{name}")
        assert got == want, name


#: ``focus collect`` whose batch write sends the process SIGINT (as a Ctrl-C at that
#: moment would) and goes on writing while the signal is handled.
_SIGINT_IN_THE_WRITE = """
import os, signal, sys, time
from storage.batches import BatchStore
write = BatchStore.write
def interrupted_write(self, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.5)
    return write(self, *args, **kwargs)
BatchStore.write = interrupted_write
sys.argv = ["focus", *sys.argv[1:]]
from cli.entry import main
main()
"""


def test_ctrl_c_while_the_batch_is_written_says_the_collection_is_finished(tmp_path):
    """A signal while the batch is written lets the write complete (it is never left
    half-made); the line said "interrupted ... finished steps are saved ...; resume
    with: ..." of a collection whose rerun then said it was finished. It says now that
    the write completed and where the batch is; exit 130 all the same."""
    root = tmp_path / "store"
    args = ["collect", "--store", str(root), "--collection-id", "written", "--tasks", "2", "--transitions", "8"]
    env = base_env(tmp_path / "prefect")
    done = subprocess.run(
        [sys.executable, "-c", _SIGINT_IN_THE_WRITE, *args],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
    url = BatchStore(str(root)).url_for("written", 0)
    assert done.returncode == 130 and lines[-1] == (
        "interrupted (SIGINT): the batch's write had begun and was completed first: the collection is finished, "
        f"its batch is {url} (a rerun prints its statistics)"
    ), (done.returncode, done.stdout[-1000:], done.stderr[-2000:])
    again = subprocess.run(
        [sys.executable, "-m", "cli", *args, "--json"], env=env, cwd=tmp_path, capture_output=True, text=True,
        timeout=240, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert again.returncode == 0 and json.loads(again.stdout.splitlines()[-1])["already_finished"] is True


def test_ctrl_c_while_waiting_for_another_hosts_lease_stops_at_once(tmp_path):
    """A rerun that finds the lease of another host, expired by its clock, watches it for
    30 s before it takes it over (clocks may disagree). That wait ran on the event loop:
    nothing on the console said why the command sat silent, and a Ctrl-C took effect only
    once the lease was taken, 28 s later. Now the wait is one console line and a Ctrl-C
    ends it at once, the other host's lease left as it was."""
    root = tmp_path / "store"
    (root / "leases").mkdir(parents=True)
    now = time.time()
    theirs = {
        "format": "focus-lease", "collection_id": "c", "owner": "pod-7:42:abcd1234", "host": "pod-7", "pid": 42,
        "pid_start": None, "token": "abcd1234", "acquired_at": now - 60, "expires_at": now - 5, "ttl_s": 30.0,
    }  # fmt: skip
    lease = root / "leases" / "c.json"
    lease.write_text(json.dumps(theirs), encoding="utf-8")
    env = base_env(tmp_path / "prefect")
    args = ["collect", "--store", str(root), "--collection-id", "c", "--tasks", "2", "--transitions", "8"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        seen: list[str] = []
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stderr], [], [], 0.1)[0]:
                line = proc.stderr.readline()
                seen.append(line)
                if "waiting up to 30 s to be sure it is abandoned" in line:
                    break
        assert seen and "host pod-7" in seen[-1] and seen[-1].startswith("warning: "), seen[-12:]
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    # "at once" is read from the lease, not wall time (a loaded machine is slow): had the
    # wait run its 30 s out, the lease would be taken over, then released on the way out
    assert proc.returncode == 130, (proc.returncode, took, err[-2000:])
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert lines[-1].startswith("interrupted (SIGINT): finished steps are saved"), lines[-6:]
    assert "took over the write lease" not in out + err, (took, err[-2000:])
    assert json.loads(lease.read_text(encoding="utf-8")) == theirs  # not taken, not released


def _cmdline(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_signal_while_the_dask_cluster_starts_leaves_one_line(tmp_path):
    """SIGTERM while the LocalCluster's workers start: the cluster, half made, left its
    semaphores to multiprocessing's resource tracker, which printed `UserWarning:
    resource_tracker: There appear to be 12 leaked semaphore objects to clean up at
    shutdown` (two lines) below the command's line once it had exited. The tracker now
    writes to the log file."""
    log = tmp_path / "focus.log"
    args = ["collect", "--dask", "--store", str(tmp_path / "store"), "--collection-id", "c", "--log-file", str(log)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli", *args], cwd=tmp_path, env=base_env(tmp_path / "prefect"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not (workers := children(proc.pid, "spawn_main")) and proc.poll() is None:  # a worker is starting
            assert time.monotonic() < deadline, "no Dask worker process started"
            time.sleep(0.01)
        # once it has read its start from the pipe (it closes the pipe then): a signal
        # before that ends the command before it has written the start, and the worker
        # prints Python's own "EOFError: Ran out of input" traceback before any code of
        # ours runs in it (seen once on a loaded machine; a window of microseconds)
        for w in workers:
            pipe = re.search(r"pipe_handle=(\d+)", _cmdline(w))
            while pipe and os.path.exists(f"/proc/{w}/fd/{pipe.group(1)}") and time.monotonic() < deadline:
                time.sleep(0.005)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)  # the tracker holds the pipes until it has written
    finally:
        if proc.poll() is None:
            proc.kill()
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert proc.returncode == 143 and lines and lines[-1].startswith("interrupted (SIGTERM)"), (proc.returncode, lines)
    assert not [ln for ln in lines if "leaked" in ln or "Warning" in ln], lines
