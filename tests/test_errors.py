"""One line per error: every error a user can cause or meet ends ``focus collect`` with
one line naming the cause and a non-zero exit, the traceback in the log file, and - when
the flow had started - the same line as the failed Prefect run's state message.

Errors decided before anything starts (configuration, factories, option shapes, files
that are not UTF-8, resume with another configuration, storage roots that cannot be
used) run the CLI with ``PREFECT_API_URL`` pointing at a closed port: reaching Prefect
would fail, so a clean one-line answer proves nothing was started. The others run
against real servers on loopback: the session's Prefect server, moto's S3 (with its
credential check switched on for the bad-credentials case) and, for a full and a
read-only disk, a real tmpfs mounted in a private mount namespace (``unshare``; skipped
where the machine allows no such namespace).
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from fixtures.mounts import private_mounts
from fixtures.prefect import base_env, free_port

from flows.errors import CollectionFailed, as_failure, exit_code, one_line
from storage.errors import StorageAccessDenied, StorageFull
from storage.urls import Retry, refused, retrying
from tasks.config import ConfigError, load_config

pytestmark = pytest.mark.timeout(180)

SMALL = [
    "--tasks",
    "2",
    "--transitions",
    "8",
    "--set",
    "agent.max_steps=4",
    "--set",
    "model.kind=factory",
    "--set",
    "model.factory=fixtures.digits:digit_policy",
]


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cli", "collect", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


#: Progress lines (into a pipe the bars become one line per step), printed before an error.
PROGRESS = re.compile(r"^\d+\.\w+( wave \d+)?: ")


def error_line(done: subprocess.CompletedProcess[str]) -> str:
    """The one line naming the error; fails if the command exited 0 or printed anything
    else but progress lines (no traceback, no log chatter)."""
    lines = [ln for ln in (done.stdout + done.stderr).splitlines() if ln.strip()]
    assert done.returncode != 0, done.stdout + done.stderr
    assert lines and lines[-1].startswith("error: "), lines[-20:]
    others = [ln for ln in lines[:-1] if not PROGRESS.match(ln)]
    assert not others, others
    assert "Traceback" not in done.stderr
    return lines[-1]


def no_prefect_env(tmp_path: Path) -> dict[str, str]:
    """Offline env whose Prefect API is a closed port: anything reaching Prefect fails."""
    return {**base_env(tmp_path / "prefect"), "PREFECT_API_URL": f"http://127.0.0.1:{free_port()}/api"}


# ---- the mapping itself ----


def test_one_line_flattens_and_names_causes():
    with pytest.raises(ConfigError) as e:
        load_config(overrides={"agent.max_steps": 0, "seed": "x"}, environ={})
    line = one_line(e.value)
    assert "\n" not in line and "agent.max_steps" in line and "seed" in line and exit_code(e.value) == 2
    full = OSError(errno.ENOSPC, "No space left on device", "/data/x.pkl")
    assert one_line(full) == "no space left on the device writing /data/x.pkl; free space and rerun to resume"
    assert one_line(PermissionError("Forbidden")) == "permission denied: Forbidden"
    assert one_line(ValueError("a\nb")) == "ValueError: a b" and exit_code(ValueError()) == 1

    class ModelServiceOutage(RuntimeError):  # a library error this module does not import
        pass

    outage = ModelServiceOutage("wave 1.continue/3: 9 of 16 rollouts failed on the model service")
    assert one_line(outage) == str(outage) and as_failure(outage) is outage
    wrapped = as_failure(PermissionError("Forbidden"))
    assert isinstance(wrapped, CollectionFailed) and str(wrapped) == "permission denied: Forbidden"
    assert one_line(ExceptionGroup("g", [KeyError("k")])) == "KeyError: 'k'"


def test_a_line_too_long_is_cut_in_the_middle_and_keeps_what_to_do():
    """A foreign text (a server's page) is cut to MAX_CHARS; the cut keeps the line's end,
    where the lines written here say what to do. Before, the end was cut: a missing
    record's line (its store path three times) lost ', or pass --allow-policy-change'
    under a 70-character temporary folder."""
    from flows.errors import MAX_CHARS

    class StorageError(RuntimeError):  # self-explained, by name
        pass

    text = "collection c: its record file://" + "/long folder" * 150 + "/m.json is missing; restore the file"
    line = one_line(StorageError(text))
    assert len(line) <= MAX_CHARS and " … " in line, len(line)
    assert line.startswith("collection c: its record file:///long folder") and line.endswith("; restore the file")
    assert one_line(StorageError(text[:MAX_CHARS])) == text[:MAX_CHARS]  # short enough: whole


def test_storage_errors_are_typed_at_the_edge():
    assert isinstance(refused(PermissionError("Forbidden"), "write s3://b/x"), StorageAccessDenied)
    assert isinstance(refused(OSError(errno.EROFS, "Read-only file system"), "write /x"), StorageAccessDenied)
    assert isinstance(refused(OSError(errno.ENOSPC, "No space"), "write /x"), StorageFull)
    assert isinstance(refused(OSError(errno.EFBIG, "File too large"), "write /x"), StorageFull)
    assert refused(FileNotFoundError("x"), "read /x") is None

    def full() -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StorageFull, match="write /x: no space left"):
        retrying(full, "write /x", Retry(attempts=2, backoff_s=0))


_OVER_THE_FILE_SIZE_LIMIT = """
import os, resource, sys
from storage import CheckpointStore
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # `ulimit -f 4`: a file of over 4 KiB fails
try:
    CheckpointStore(sys.argv[1]).save("c", 1, 0, os.urandom(16384))  # zstd cannot shrink it
except Exception as e:
    print(f"{type(e).__name__}: {e}")
"""


def test_a_file_over_the_file_size_limit_is_one_line_naming_it_and_the_limit(tmp_path):
    """A write past the file-size limit (RLIMIT_FSIZE: `ulimit -f` in a batch job or a
    container, or a file system's largest file) fails with EFBIG, which the store passed
    on as `OSError: [Errno 27] File too large`: no file named, nothing to do (probed:
    `focus collect` under `ulimit -f 3`, and `ulimit -f 8`, which the batch's first
    Parquet file crossed). It says which file and what to change; nothing half-written stays."""
    done = subprocess.run(
        [sys.executable, "-c", _OVER_THE_FILE_SIZE_LIMIT, str(tmp_path / "store")],
        capture_output=True, text=True, timeout=60, cwd=Path(__file__).resolve().parents[1],
    )  # fmt: skip
    line = done.stdout.strip()
    assert line.startswith(f"StorageFull: write file://{tmp_path}/store/checkpoints/c/p001-w00000."), line
    assert "larger than this process may write (File too large)" in line and "ulimit -f" in line, line
    assert line.endswith("then run again: a collection resumes from its last saved step with the same collection id")
    left = [p.name for p in (tmp_path / "store" / "checkpoints" / "c").iterdir()]
    assert left == [], left  # no temporary file, no data file without its manifest


def test_a_local_folder_that_became_unwritable_is_not_blamed_on_credentials(tmp_path):
    """A local store whose folder lost its write permission mid-run (a `chmod -R a-w`, a
    folder handed to another user) said `access denied ([Errno 13] Permission denied:
    '<path>'); check the credentials (for S3: AWS_ACCESS_KEY_ID and ...)`: no credential
    opens a local folder. It names the permission and the user, as the read-only file
    system's line names the file system; an S3 store's line still names the credentials."""
    path = f"{tmp_path}/store/checkpoints/c/p001-w00000.abc.pkl"
    denied = PermissionError(errno.EACCES, "Permission denied", path)
    line = str(refused(denied, f"write file://{path}"))
    assert line.startswith(f"write file://{path}: permission denied (this process runs as user "), line
    assert "make the folder writable for that user again" in line and "AWS_" not in line, line
    assert "credentials" not in line and line.endswith("resumes from its last saved step with the same collection id")
    # a store named by its path (`focus inspect <folder>` of another user's store, umask 077)
    manifest = f"{tmp_path}/store/batches/c/iter-000000/_manifest.json"
    line = str(refused(PermissionError(errno.EACCES, "Permission denied", manifest), f"read {manifest}"))
    assert line.startswith(f"read {manifest}: permission denied (this process runs as user "), line
    assert "AWS_" not in line, line
    s3 = str(refused(PermissionError(errno.EACCES, "Access Denied"), "write s3://b/p/x"))
    assert "AWS_ACCESS_KEY_ID" in s3, s3


def test_model_client_timeout_and_retries_from_file_and_flags(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(
        '[model]\nkind = "openai"\nurl = "http://127.0.0.1:9"\n[model.http]\ntimeout_s = 7.5\nmax_retries = 1\n'
    )
    cfg = load_config(f, environ={})
    assert cfg.build_policy().http.config.timeout_s == 7.5  # type: ignore[attr-defined]
    cfg = load_config(f, {"model.http.max_retries": 0}, environ={"FOCUS_MODEL__HTTP__TIMEOUT_S": "3"})
    policy = cfg.build_policy()
    assert (policy.http.config.timeout_s, policy.http.config.max_retries) == (3.0, 0)  # type: ignore[attr-defined]
    # the CLI flags set the same fields (checked through --set to stay in-process)
    from typer.testing import CliRunner

    from cli.app import app

    out = CliRunner().invoke(app, ["collect", "--help"], env={"COLUMNS": "200"})
    assert "--model-timeout" in out.output and "--model-retries" in out.output


# ---- decided before anything starts ----


@pytest.mark.parametrize(
    "extra,needle,code",
    [
        (["--set", "model.factory=no_such_module:make"], "cannot import module 'no_such_module'", 2),
        (
            ["--set", "env.kind=factory", "--set", "env.factory=focus.toy:toy_format"],
            "env.factory 'focus.toy:toy_format' cannot be called",
            2,
        ),
        (["--set", "env.kind=factory", "--set", "env.factory=focus.toy:nope"], "has no attribute 'nope'", 2),
        (["--store", "s3:/bucket"], "storage.root", 2),
    ],
)
@pytest.mark.slow
def test_usage_errors_before_prefect(tmp_path, extra, needle, code):
    done = run_cli([*SMALL, "--collection-id", "u", *extra], no_prefect_env(tmp_path), tmp_path, timeout=60)
    line = error_line(done)
    assert needle in line and done.returncode == code


@pytest.mark.slow
def test_option_mapping_of_the_wrong_shape_and_non_utf8_file(tmp_path):
    env = no_prefect_env(tmp_path)
    cfg = tmp_path / "c.toml"
    cfg.write_text('[model]\nkind = "openai"\nurl = "http://127.0.0.1:9"\n[model.options.config]\ntimeout_s = 5\n')
    line = error_line(run_cli(["--config", str(cfg)], env, tmp_path, timeout=60))
    assert "model.options.config is not accepted: set timeouts and retries in model.http" in line
    latin = tmp_path / "latin.toml"
    latin.write_bytes("seed = 1\n# café\n".encode("latin-1"))
    line = error_line(run_cli(["--config", str(latin)], env, tmp_path, timeout=60))
    assert str(latin) in line and "not UTF-8" in line and "0xe9" in line


@pytest.mark.slow
def test_storage_root_that_is_a_file(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    done = run_cli([*SMALL, "--store", str(blocker / "runs")], no_prefect_env(tmp_path), tmp_path, timeout=60)
    line = error_line(done)
    # a path typed wrong, fixed by naming another root: exit 2 as any wrong option, no traceback
    assert str(blocker) in line and "is a file, not a folder" in line and done.returncode == 2
    assert "traceback" not in line
    plain = run_cli([*SMALL, "--store", str(blocker)], no_prefect_env(tmp_path), tmp_path, timeout=60)
    line = error_line(plain)
    assert line.startswith("error: storage root ") and line.endswith(f": {blocker} is a file, not a folder")
    assert plain.returncode == 2


@pytest.mark.parametrize("folder", ["batches", "checkpoints", "leases", "_staging", "weights"])
def test_a_folder_of_the_store_that_is_a_file_is_refused_before_anything_starts(tmp_path, folder):
    """A file where the store keeps a folder (a botched copy, a stray `touch`) stopped the
    run with `FileExistsError: [Errno 17] File exists: '<root>/leases'`, or, for
    `batches`, `NotADirectoryError: ...` once every rollout had run."""
    from flows.preflight import check_root
    from storage.errors import RootNotFound

    (tmp_path / folder).write_text("x")
    with pytest.raises(RootNotFound) as e:
        check_root(str(tmp_path))
    assert (
        str(e.value)
        == f"storage root {tmp_path}: {tmp_path / folder} is a file, not a folder (the store keeps its {folder} there)"
    )


@pytest.mark.skipif(not os.path.isdir("/proc") or os.statvfs("/proc").f_blocks != 0, reason="needs Linux's procfs")
def test_storage_root_on_a_file_system_without_storage():
    """/proc reports no blocks: the root is refused as such, not as a full disk."""
    from flows.preflight import check_root
    from storage.errors import RootNotFound

    with pytest.raises(RootNotFound, match="/proc is on a virtual file system that stores nothing"):
        check_root("/proc/focus-runs")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into any folder: this runs as another user")
def test_storage_root_in_a_folder_this_user_cannot_write(tmp_path):
    """A folder of another user's (here one made read-only to its owner): refused before
    anything starts, as not writable, not as a read-only file system."""
    from flows.preflight import check_root
    from storage.errors import StorageAccessDenied

    theirs = tmp_path / "theirs"
    theirs.mkdir()
    theirs.chmod(0o555)
    try:
        with pytest.raises(StorageAccessDenied, match=r"is not writable \(permission denied\)"):
            check_root(str(theirs / "runs"))
    finally:
        theirs.chmod(0o755)


def test_a_working_folder_that_cannot_be_written_says_to_give_store_a_folder(tmp_path, monkeypatch):
    """The default store is ``./runs``: a command run in a folder it cannot write said
    ``storage root runs: <folder> is not writable (permission denied)``, naming the
    folder but not the way out (``--store``, or ``storage.root`` in the config). As root
    (CI) every folder is writable, so the permission is refused by ``os.access``."""
    from flows.preflight import check_root
    from storage.errors import StorageAccessDenied

    work = tmp_path / "work"
    work.mkdir()
    work.chmod(0o555)
    monkeypatch.chdir(work)
    if os.geteuid() == 0:
        real = os.access
        monkeypatch.setattr(os, "access", lambda p, m, **kw: os.fspath(p) != str(work) and real(p, m, **kw))
    try:
        with pytest.raises(StorageAccessDenied) as e:
            check_root("runs")
    finally:
        work.chmod(0o755)
    line = str(e.value)
    assert line.startswith(f"storage root runs: {work} is not writable (permission denied); "), line
    assert line.endswith("give --store a folder you can write (or set storage.root in the config)"), line


# ---- object storage: moto's S3 server ----


def test_s3_bucket_missing_and_endpoint_down(tmp_path, s3_server):
    env = {**no_prefect_env(tmp_path)}
    done = run_cli([*SMALL, "--store", "s3://no-such-bucket-focus/runs"], env, tmp_path, timeout=60)
    line = error_line(done)
    assert "bucket 'no-such-bucket-focus' does not exist" in line
    down = {**env, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    line = error_line(run_cli([*SMALL, "--store", "s3://any-bucket/runs"], down, tmp_path, timeout=60))
    assert "storage unreachable after 3 attempt(s)" in line and "any-bucket" in line


def test_s3_bad_credentials(tmp_path, s3_server):
    bucket = s3_server.make_bucket()
    reset = f"{s3_server.endpoint_url}/moto-api/reset-auth"
    assert httpx.post(reset, content=b"0").status_code == 200  # moto checks credentials from now on
    try:
        env = {**no_prefect_env(tmp_path), "AWS_ACCESS_KEY_ID": "AKIAWRONGWRONGWRONG1", "AWS_SECRET_ACCESS_KEY": "nope"}
        line = error_line(run_cli([*SMALL, "--store", f"{bucket}/runs"], env, tmp_path, timeout=60))
    finally:
        httpx.post(reset, content=b"inf")
    assert "access to bucket" in line and "denied" in line and "AWS_ACCESS_KEY_ID" in line


# ---- real file systems: a full and a read-only tmpfs in a private mount namespace ----


def in_tmpfs(prefix: list[str], mount: Path, opts: str, cmd: list[str]) -> list[str]:
    script = f'mount -t tmpfs -o {opts} tmpfs "{mount}" && exec "$@"'
    return [*prefix, "sh", "-c", script, "sh", *cmd]


def flow_run_state(api: str, name: str) -> dict:
    """The state of the latest flow run named ``name`` (runs are named after their collection)."""
    query = {"flow_runs": {"name": {"any_": [name]}}, "sort": "EXPECTED_START_TIME_DESC", "limit": 1}
    runs = httpx.post(f"{api}/flow_runs/filter", json=query).json()
    assert runs, f"no flow run named {name}"
    return runs[0]["state"]


def test_disk_full_mid_run_is_one_line_and_the_runs_state(tmp_path, prefect_env, prefect_server):
    prefix = private_mounts()
    if prefix is None:
        pytest.skip("no private mount namespace here (unshare -m / -rm)")
    disk = tmp_path / "disk"
    disk.mkdir()
    log = tmp_path / "focus.log"
    args = [*SMALL, "--collection-id", "full", "--store", str(disk), "--log-file", str(log)]
    args += [
        "--transitions",
        "40",
        "--set",
        "search.phases.1.wave_size=2",
        "--set",
        'model.options={"latency_s": 0.05}',
    ]
    # a small disk that fills up while the collection runs: once the evidence checkpoint
    # is written, another process takes every byte left
    evidence = disk / "checkpoints" / "full" / "n-evidence-w00000.manifest.json"
    filler = f'while [ ! -e "{evidence}" ]; do sleep 0.05; done; cat /dev/zero > "{disk}/filler" 2>/dev/null'
    script = f'mount -t tmpfs -o size=4m tmpfs "{disk}" || exit 97; ({filler}) & exec "$@"'
    cmd = [*prefix, "sh", "-c", script, "sh", sys.executable, "-m", "cli", "collect", *args]
    done = subprocess.run(cmd, env=prefect_env, cwd=tmp_path, capture_output=True, text=True, timeout=150)
    line = error_line(done)
    assert "no space left on the device" in line and f"traceback: {log}" in line
    assert "Traceback" in log.read_text(encoding="utf-8")  # the full story is in the log file
    state = flow_run_state(prefect_server, "full")
    cause = line.removeprefix("error: ").split(" (traceback:")[0]
    assert state["type"] == "FAILED" and cause in state["message"]


@pytest.mark.slow
def test_read_only_disk_is_refused_before_work(tmp_path):
    prefix = private_mounts()
    if prefix is None:
        pytest.skip("no private mount namespace here (unshare -m / -rm)")
    disk = tmp_path / "ro"
    disk.mkdir()
    cmd = in_tmpfs(prefix, disk, "ro,size=64k", [sys.executable, "-m", "cli", "collect", *SMALL, "--store", str(disk)])
    done = subprocess.run(cmd, env=no_prefect_env(tmp_path), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    line = error_line(done)
    assert str(disk) in line and "read-only file system" in line


def test_disk_made_read_only_mid_run_is_one_line_without_credentials(tmp_path):
    """A store whose disk turns read-only while the collection runs (remounted after an
    I/O error): the line said `access denied (read-only file system); check the
    credentials (for S3: AWS_ACCESS_KEY_ID ...)`, which no credential fixes. It says the
    file system is read-only and how to resume."""
    prefix = private_mounts()
    if prefix is None:
        pytest.skip("no private mount namespace here (unshare -m / -rm)")
    disk = tmp_path / "disk"
    disk.mkdir()
    args = [*SMALL, "--collection-id", "ro", "--store", str(disk), "--transitions", "40"]
    args += ["--set", "search.phases.1.wave_size=2", "--set", 'model.options={"latency_s": 0.05}']
    evidence = disk / "checkpoints" / "ro" / "n-evidence-w00000.manifest.json"
    # once the evidence is saved, the disk is remounted read-only (retried while a file is
    # open). `remount,bind,ro` makes the mount read-only, which a user namespace
    # (`unshare -rm`, a user other than root) may do; `remount,ro` (the file system's
    # superblock) failed there every time, and the loop, holding the command's output
    # open, hung the test until its timeout. The loop writes nothing to that output now.
    flip = f'while [ ! -e "{evidence}" ]; do sleep 0.05; done; until mount -o remount,bind,ro "{disk}"; do sleep 0.05; done'
    script = f'mount -t tmpfs -o size=16m tmpfs "{disk}" || exit 97; ({flip}) >/dev/null 2>&1 & exec "$@"'
    cmd = [*prefix, "sh", "-c", script, "sh", sys.executable, "-m", "cli", "collect", *args]
    env = base_env(tmp_path / "prefect")
    done = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode != 97, done.stderr
    line = error_line(done)
    assert "the file system is read-only" in line and "rerun with the same collection id" in line, line
    assert "AWS_ACCESS_KEY_ID" not in line and "credentials" not in line, line


# ---- damaged stored data ----


def test_corrupt_checkpoint_and_damaged_finished_batch(tmp_path, prefect_env, prefect_server):
    """A finished collection whose Parquet part was damaged is written again (the same
    bytes); a damaged checkpoint of an unfinished one stops the resume with one line."""
    store = tmp_path / "store"
    args = [*SMALL, "--collection-id", "dmg", "--store", str(store), "--json"]
    # the collection to damage, made without an orchestrator (no Prefect API: the same
    # store, without the flow run's start and report, 3-5 s on a loaded machine); the
    # runs that meet the damage are flow runs
    first = run_cli(args, base_env(tmp_path / "prefect"), tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    url = json.loads(first.stdout.splitlines()[-1])["batch_url"]
    part = Path(url.removeprefix("file://")) / "actor" / "part-00000.parquet"
    good = part.read_bytes()
    part.write_bytes(good[:-10] + b"0123456789")
    again = run_cli(args, prefect_env, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "checksum that differs from the manifest" in again.stderr and "writing the batch again" in again.stderr
    assert part.read_bytes() == good

    # an unfinished collection with a damaged wave checkpoint
    ck = store / "checkpoints" / "dmg"
    (ck / "n-export-w00000.manifest.json").unlink()
    (evidence,) = ck.glob("n-evidence-w00000.*.pkl")  # data files are named by their digest
    evidence.write_bytes(evidence.read_bytes()[:-1] + b"\x00")
    line = error_line(run_cli(args, prefect_env, tmp_path))
    assert str(evidence) in line and "checksum differs from the manifest" in line
    assert f"; remove file://{ck}/n-evidence-w00000.manifest.json and rerun to compute it again" in line
    state = flow_run_state(prefect_server, "dmg")
    assert state["type"] == "FAILED" and str(evidence) in state["message"]


# ---- failed rollouts: a warning per step, causes in the result and the stats artifact ----


def test_failed_rollouts_warn_and_show_their_causes(tmp_path, prefect_env, prefect_server):
    store = tmp_path / "store"
    args = [*SMALL, "--collection-id", "brittle", "--store", str(store), "--transitions", "30"]
    args += ["--set", "env.kind=factory", "--set", "env.factory=fixtures.failing:brittle_env", "--tasks", "4"]
    done = run_cli(args, prefect_env, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    cause = "env: RuntimeError: the env cannot move by 7"
    # one warning per step whose rollouts failed, naming how many, why, and the last one's
    # task and step (the library's line names them; the pipeline's did not)
    warnings = [ln for ln in done.stderr.splitlines() if ln.startswith("warning: ")]
    assert warnings, done.stderr[-3000:]
    c = re.escape(cause)
    for w in warnings:
        assert re.fullmatch(
            rf"warning: \d+\.\w+( wave \d+)?: \d+ of \d+ rollouts failed: {c} \(x\d+\); "
            rf"last cause \(task '[^']+', step \d+\): {c}",
            w,
        ), w
    shown = re.search(rf"failure cause \((\d+)x\): {re.escape(cause)}", done.stdout)
    assert shown, done.stdout
    query = {"flow_runs": {"name": {"any_": ["brittle"]}}}
    assert httpx.post(f"{prefect_server}/flow_runs/filter", json=query).json()[0]["state_type"] == "COMPLETED"
    arts = httpx.post(f"{prefect_server}/artifacts/filter", json={"artifacts": {"key": {"any_": ["brittle-stats"]}}})
    data = arts.json()[0]["data"]
    rows = {r["statistic"]: r["value"] for r in (json.loads(data) if isinstance(data, str) else data)}
    assert rows[f"failure cause: {cause}"] == int(shown.group(1)) == rows["failed_rollouts"] > 0


# ---- a Dask scheduler gone mid-run ----


def test_a_dask_scheduler_gone_is_one_line_and_no_dask_log_reaches_the_terminal(tmp_path):
    """distributed puts a stderr handler on 'distributed.client', 'tornado', 'bokeh' (not
    only on 'distributed'); a scheduler killed mid-run printed the client's traceback above
    ``error: FutureCancelledError: _run_shard-... cancelled for reason:
    scheduler-connection-lost. Client lost the connection ...``."""
    import io
    import logging

    from distributed.client import FutureCancelledError
    from rich.console import Console

    from flows.logs import setup

    lost = FutureCancelledError(
        "_run_shard-1", "scheduler-connection-lost", "Client lost the connection to the scheduler."
    )
    line = one_line(lost)
    assert line.startswith("the Dask scheduler is gone") and "rerun with the same collection id" in line
    assert exit_code(lost) == 1

    root = logging.getLogger()
    saved = (list(root.handlers), root.level, logging.raiseExceptions)
    # what distributed's import does to a process whose logging it configures (its
    # default old-style config; this test process may have imported it otherwise)
    for name in ("distributed", "distributed.client", "distributed.gc", "bokeh", "tornado", "tornado.application"):
        logging.getLogger(name).addHandler(logging.StreamHandler(sys.stderr))
    try:
        setup(Console(file=io.StringIO()), log_file=tmp_path / "focus.log")
        own = {
            name: lg.handlers
            for name, lg in logging.root.manager.loggerDict.items()
            if isinstance(lg, logging.Logger)
            and name.split(".")[0] in ("distributed", "tornado", "bokeh")
            and any(type(h) is logging.StreamHandler for h in lg.handlers)
        }
        assert not own, own
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
        logging.raiseExceptions = saved[2]


def test_too_many_open_files_is_one_line_naming_the_limit_and_the_concurrency():
    """``EMFILE`` under ``ulimit -n 64`` (64 rollouts in flight by default, a connection
    each): the line was ``OSError: [Errno 24] Too many open files: <a checkpoint file>``."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    line = one_line(OSError(errno.EMFILE, "Too many open files", "/runs/x.pkl"))
    assert line.startswith("too many open files (opening /runs/x.pkl): this process reached its limit on open")
    assert f", {soft} (`ulimit -n`; hard limit " in line and "execution.max_concurrency" in line
    assert line.endswith("then rerun to resume") and exit_code(OSError(errno.EMFILE, "x")) == 1
    system = one_line(OSError(errno.ENFILE, "Too many open files in system"))
    assert system.startswith("too many open files: the system's limit on open files is reached (ENFILE")
