"""The embedded default model service: the tiny model on a loopback port.

:class:`LocalModelServer` starts ``python -m focus.tinylm.server`` as a subprocess on
127.0.0.1, waits until it answers ``/health``, and stops it by PID on exit (also at
interpreter exit). The server runs in a session of its own, outside the terminal's
process group: a terminal's Ctrl-C (SIGINT to the foreground group) reaches the command,
which decides what to stop and when, and not its model server, which would otherwise
die under the requests in flight. Nothing leaks when the owner dies instead: the server
exits by itself within a second of its parent (``--parent-pid``), removing its temporary
folder; a server killed with ``kill -9`` leaves its folder to the next start, which
removes it. Clients talk to it over HTTP exactly as they would to
vLLM or SGLang, so the whole pipeline is exercised with the same code paths it uses in
production. The server serves with numpy alone (no torch).

Most of the server's start-up (about half a second) is importing numpy, the web stack
and the protocol models. :class:`WarmServer` starts those imports before the command
knows its configuration (``focus collect`` does, first
thing); :class:`LocalModelServer` then hands the waiting process its command line
instead of starting a new one.
"""

from __future__ import annotations

import atexit
import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from focus.spawn import spawn

log = logging.getLogger(__name__)
#: ``extra=`` of a record the ``focus`` command shows on the console in quiet mode.
_CONSOLE = {"focus_console": True}

#: Seconds without an answer to ``/health`` after which a live embedded server is taken
#: for hung, killed and started again (:meth:`LocalModelServer.keep_alive`); also the
#: seconds its engine may spend in one step (``engine_step_s`` of ``/health``). It answers
#: ``/health`` from its event loop, beside the engine's thread, in milliseconds, and a step
#: (one token of each sequence) takes milliseconds; 30 s is far past both on a loaded
#: machine and far below the calls' 600 s deadline.
HANG_S = 30.0
#: Seconds a restart of the embedded server counts against the keeper's budget
#: (:meth:`LocalModelServer.keep_alive`'s ``restarts``). A restart costs a wait of a second
#: (an exit) to ``HANG_S`` plus a start-up (a hang), so the budget spent within 10 minutes
#: is a server that cannot stay up, and the run stops; crashes hours apart in a long
#: ``focus train`` loop are unrelated faults, each costing its wait, and spent it.
RESTART_WINDOW_S = 600.0

# httpx and focus.policy load where used: ``focus collect`` imports this module first
# thing to start a WarmServer, and every millisecond before that spawn is on its wall time


class ModelServerGone(RuntimeError):
    """The embedded model server stopped serving more often than its keeper starts it
    again (:meth:`LocalModelServer.keep_alive`); the message says how it ended."""


def stop_process(proc: subprocess.Popen[Any] | None, timeout_s: float = 5.0) -> None:
    """Terminate a server process we started, then kill it if it does not exit in time."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout_s)


def _cause(log: str) -> str:
    """The exception line a failed server's log ends with (``SomeError: message``)."""
    for line in reversed(log.strip().splitlines()):
        name, sep, _ = line.partition(":")
        if sep and name and " " not in name and name.rsplit(".", 1)[-1].endswith(("Error", "Exception", "Exit")):
            return line.strip()
    return ""


#: The server's temporary folder (port file, log, ``pid``) is ``<tmp>/focus-tinylm-*``.
_PREFIX = "focus-tinylm-"


def _record_pid(tmp: Path, proc: subprocess.Popen[Any]) -> None:
    """Name the folder's server, so that a later start can tell a dead one's folder; then
    remove the folders of dead servers."""
    (tmp / "pid").write_text(str(proc.pid))
    _remove_dead_folders()


def _remove_dead_folders() -> None:
    """The folders of servers that were killed with ``kill -9`` (which leaves nobody to
    clean up)."""
    for folder in Path(tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        try:
            pid = int((folder / "pid").read_text())
            os.kill(pid, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (OSError, ValueError):
            pass  # no pid yet (a server being started), not ours, or alive


class WarmServer:
    """A tiny-model server process started before its configuration is known.

    It imports the engine and the app, then waits for its command line on stdin
    (``--args-from-stdin``). Give it to :class:`LocalModelServer` (``warm=``), which sends
    the command line; or :meth:`discard` it. It also exits by itself when the process
    that started it is gone (end of its stdin, and ``--parent-pid``).
    """

    def __init__(self) -> None:
        self.tmp = Path(tempfile.mkdtemp(prefix=_PREFIX))
        self.log: Any = open(self.tmp / "server.log", "w+b")  # noqa: SIM115 - closed by the adopter or discard()
        cmd = [sys.executable, "-m", "focus.tinylm.server", "--args-from-stdin", "--parent-pid", str(os.getpid())]
        cmd += ["--owned-dir", str(self.tmp)]
        self.proc: subprocess.Popen[bytes] | None = spawn(
            cmd, stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.PIPE, start_new_session=True
        )
        atexit.register(self.discard)
        _record_pid(self.tmp, self.proc)

    def take(self, args: list[str]) -> tuple[subprocess.Popen[bytes], Path, Any] | None:
        """Send ``args`` (the server's command line) and give up ownership of the process,
        its folder and its log; ``None`` if the process is gone (start a new one)."""
        proc = self.proc
        if proc is None or proc.poll() is not None or proc.stdin is None:
            self.discard()
            return None
        try:
            proc.stdin.write((json.dumps(args) + "\n").encode())
            proc.stdin.close()
        except (BrokenPipeError, OSError):
            self.discard()
            return None
        self.proc = None
        atexit.unregister(self.discard)
        return proc, self.tmp, self.log

    def discard(self) -> None:
        """Stop the process if nobody took it, and remove its folder."""
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if self.log is not None:
                self.log.close()
            shutil.rmtree(self.tmp, ignore_errors=True)
        atexit.unregister(self.discard)


class LocalModelServer:
    """Context manager around the tiny model's HTTP server.

    ``weights``: a weights file (default: the committed initial weights).
    ``port``: 0 picks a free one. ``debug``: wrap the app in the test fault layer
    (:mod:`focus.tinylm.testing`: prompt recording and injected faults, ``/debug/...``).
    ``logprobs_mode``: which log-probs the server reports (vLLM's names, see
    :mod:`focus.tinylm.sampler`; the default is what :mod:`focus.train_local` assumes).
    ``extra_args``: more server flags (``--max-num-seqs``, ``--prefix-cache-tokens``...).
    ``threads``: BLAS threads of the engine's matrix products (default 1: the products are
    small, and more threads contend with each other and with whatever else shares the
    CPU; :func:`focus.tinylm.server.limit_threads`). ``workers`` and ``torch_threads`` are
    kept for compatibility: one engine thread serves all requests (batched).
    ``warm``: a :class:`WarmServer` to use instead of starting a process (a new one is
    started if it has exited).
    """

    def __init__(
        self,
        weights: str | os.PathLike[str] | None = None,
        port: int = 0,
        *,
        debug: bool = False,
        threads: int = 1,
        workers: int = 1,
        torch_threads: int = 1,
        startup_timeout_s: float = 60.0,
        logprobs_mode: str = "processed_logprobs",
        extra_args: list[str] | None = None,
        warm: WarmServer | None = None,
    ) -> None:
        self._warm = warm
        self.logprobs_mode = logprobs_mode
        self.extra_args = list(extra_args or [])
        self.weights = str(weights) if weights is not None else None
        self.port = port
        self.debug = debug
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        self.threads = threads
        self.workers = workers
        self.torch_threads = torch_threads
        self.startup_timeout_s = startup_timeout_s
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        self._tmp: Path | None = None
        #: Whether :meth:`start` used the ``warm`` process (False: it started one).
        self.warm_started = False
        #: Times :meth:`keep_alive` started the server again.
        self.restarts = 0
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        if self.proc is None:
            raise RuntimeError("LocalModelServer is not started")
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def start(self) -> LocalModelServer:
        if self.proc is not None:
            return self
        from focus.extras import require

        require("local", "the embedded model server (LocalModelServer)")
        warm, self._warm = self._warm, None
        taken = warm.take(self._args(warm.tmp / "port")) if warm is not None else None
        self.warm_started = taken is not None
        if taken is not None:
            self.proc, tmp, self._log = taken
        else:
            tmp = Path(tempfile.mkdtemp(prefix=_PREFIX))
            self._log = open(tmp / "server.log", "w+b")  # noqa: SIM115 - closed in stop()
        self._tmp = tmp
        port_file = tmp / "port"
        cmd = [sys.executable, "-m", "focus.tinylm.server", *self._args(port_file)]
        if self.proc is None:
            self.proc = spawn(
                cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
            _record_pid(tmp, self.proc)
        atexit.register(self.stop)
        try:
            self._wait_started(port_file, cmd)
        except BaseException:
            # interrupted (a notebook's interrupt, Ctrl-C) while it starts: nobody holds this
            # object yet, so the server would run until the kernel exits, one per try
            self.stop()
            raise
        return self

    def _wait_started(self, port_file: Path, cmd: list[str]) -> None:
        """Wait for the port file, then for ``/health``; stop the server and raise if it fails."""
        assert self.proc is not None
        deadline = time.monotonic() + self.startup_timeout_s
        while not port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                exited = self.proc.poll() is not None
                log = self._read_log()
                self.stop()
                cause = _cause(log) or ("it exited" if exited else f"no port after {self.startup_timeout_s:g} s")
                from focus.policy import PolicyError

                error = PolicyError(f"the embedded model server did not start: {cause}")
                error.add_note(f"command: {' '.join(cmd)}\nserver log:\n{log}")
                raise error
            time.sleep(0.01)
        self.port = int(port_file.read_text())
        self._wait_healthy(deadline)

    def _args(self, port_file: Path) -> list[str]:
        """The server's command line after ``python -m focus.tinylm.server``."""
        cmd = [
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--port-file",
            str(port_file),
            "--threads",
            str(self.threads),
            "--workers",
            str(self.workers),
            "--torch-threads",
            str(self.torch_threads),
            "--parent-pid",
            str(os.getpid()),
            "--owned-dir",
            str(port_file.parent),
        ]
        if self.weights:
            cmd += ["--weights", self.weights]
        cmd += ["--logprobs-mode", self.logprobs_mode, *self.extra_args]
        if self.debug:
            cmd.append("--debug")
        return cmd

    def _wait_healthy(self, deadline: float) -> None:
        import httpx

        while True:
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0, trust_env=False).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                from focus.policy import PolicyError

                raise PolicyError(f"the embedded model server on port {self.port} never answered /health")
            time.sleep(0.01)

    def _read_log(self) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        self._log.seek(0)
        return self._log.read().decode(errors="replace")[-4000:]

    def keep_alive(
        self,
        restarts: int = 3,
        hang_s: float = HANG_S,
        on_gone: Callable[[Exception], None] | None = None,
        window_s: float = RESTART_WINDOW_S,
    ) -> None:
        """Start the server again, on its port and with the weights it serves, whenever its
        process dies while nobody stopped it (``kill -9``, the OOM killer), up to
        ``restarts`` times; one warning line each. The clients' outage wait
        (``model.http.outage_wait_s``) then sees it come back as after any restart, and
        seeded sampling gives the same answers. Nothing but its owner could start it
        again on that port: a collection waited the whole outage wait (300 s) for it,
        then failed its wave.

        A server that is alive but does not serve is killed and started again the same
        way: one whose ``/health`` has gone unanswered for ``hang_s`` seconds (stopped,
        wedged; from the first unanswered try to the latest), and one whose ``/health``
        answers but says its engine has been inside one step for ``hang_s`` or more
        (``engine_step_s``; a step is one token of every running sequence, so a long
        generation is many short steps). ``/health`` is asked every sixth of ``hang_s``,
        each try waiting at most a third; a server started again is given
        ``startup_timeout_s`` first. The calls waited on such a server until their
        deadline (``model.http.deadline_s``, 600 s); one with a stuck engine answered
        ``/health`` all along.

        ``restarts`` is one budget for exits and hangs together: either way the server
        stopped serving and a restart costs the same (the requests in flight sent again);
        the line of the last one says how many of each there were. A restart counts for
        ``window_s`` seconds (:data:`RESTART_WINDOW_S`, 10 minutes), then no longer: the
        budget is ``restarts`` within any ``window_s``, not in the server's life.

        ``on_gone``: called (from the keeper's thread) with :class:`ModelServerGone` when
        the budget is spent, instead of the warning line: a command stops its run with it
        (``focus collect`` and ``focus train`` do), where the calls would otherwise wait
        ``model.http.outage_wait_s`` (300 s) for a server nobody starts again."""
        from focus.backends.outage import kept_by_owner

        kept_by_owner(self.url)  # the clients' outage lines go to the log file: the keeper says it
        threading.Thread(
            target=self._keeping,
            args=(restarts, hang_s, on_gone, window_s),
            name="focus-model-server-keeper",
            daemon=True,
        ).start()

    def _keeping(self, *args: Any) -> None:
        from focus.backends.outage import kept_by_owner

        url = self.url
        try:
            self._keep(*args)
        finally:
            kept_by_owner(url, False)  # stopped, or given up: an outage is the clients' to report again

    def _keep(self, restarts: int, hang_s: float, on_gone: Callable[[Exception], None] | None, window_s: float) -> None:
        """The keeper's loop (:meth:`keep_alive`)."""
        # failing: since when every probe went unanswered (None: the last one was answered);
        # counted from a failed probe, never from the last answer, so a keeper that was not
        # running (its command suspended with Ctrl-Z) does not take its own pause for a hang
        proc, failing, grace = self.proc, None, 0.0
        hung: dict[int, str] = {}  # pid -> why it was killed
        counted: collections.deque[tuple[float, str]] = collections.deque()  # (when, exited or hung) in the window
        while proc is not None:
            try:
                code = proc.wait(timeout=hang_s / 6)
            except subprocess.TimeoutExpired:
                now, step = time.monotonic(), self._engine_step(hang_s / 3)
                why = None
                if step is not None and step < hang_s:
                    failing = None
                elif now < grace:  # a server started again is still starting
                    pass
                elif step is not None:
                    why = f"killed: /health answers, but its engine has been in one step for {step:.0f} s"
                elif failing is None:
                    failing = now
                elif now - failing >= hang_s:
                    why = f"killed: alive, but /health unanswered for {now - failing:.0f} s"
                if why is not None:
                    with self._lock:
                        if self.proc is not proc:  # stopped by its owner
                            return
                        hung[proc.pid] = f"{why}, hang_s = {hang_s:g} s"
                        proc.kill()  # SIGKILL: a stopped process dies too; wait() sees it next
                continue
            dead, gone = proc.pid, None
            what = "hung" if dead in hung else "exited"
            how = hung.get(dead) or (f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}")
            with self._lock:
                if self.proc is not proc:  # stopped by its owner
                    return
                while counted and time.monotonic() - counted[0][0] >= window_s:
                    counted.popleft()
                if len(counted) < restarts:
                    self.restarts += 1
                    counted.append((time.monotonic(), what))
                    self.proc = proc = self._spawn()
                    failing, grace = None, time.monotonic() + self.startup_timeout_s
                else:
                    exited = sum(w == "exited" for _, w in counted)
                    gone = ModelServerGone(
                        f"the embedded model server (pid {dead}) {what} ({how}) again; it was started again "
                        f"{len(counted)} time(s) ({exited} after it exited, {len(counted) - exited} after it "
                        f"hung: restarts = {restarts} counts both) in the last {window_s:g} s and is not any "
                        "more; rerun with the same collection id to resume"
                    )
            if gone is not None:
                if on_gone is None:
                    log.warning("%s", gone, extra=_CONSOLE)
                else:
                    on_gone(gone)  # the command stops its run with it: the calls would wait outage_wait_s
                return
            log.warning(
                "the embedded model server (pid %s) %s (%s) while in use; started again on port %s "
                "with the same weights (restart %d of %d, exits and hangs counted together, in any %g s)",
                dead, what, how, self.port, len(counted), restarts, window_s, extra=_CONSOLE,
            )  # fmt: skip

    def _engine_step(self, timeout_s: float) -> float | None:
        """How long the server's engine has been in its current step, from ``/health``
        (200, or 503 once it is stalled); ``None`` if it does not answer within
        ``timeout_s``. A server without the figure counts as answering with 0, and so does
        one this process could not ask (an ``OSError`` of its own, or no socket for the
        probe: out of open files or local ports, :mod:`focus.local_limits`)."""
        import httpx

        from focus.local_limits import local_errno

        try:
            resp = httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=timeout_s, trust_env=False)
            if resp.status_code not in (200, 503):
                return None
            return float(resp.json().get("engine_step_s", 0.0))
        except (httpx.HTTPError, ValueError, AttributeError) as e:
            # no socket for the probe (out of files or ports here) says nothing of the server
            return 0.0 if local_errno(e) is not None else None
        except OSError:
            # this process could not make the probe (Too many open files: httpx's client
            # opens a file for its certificates): nothing is known of the server, so it is
            # not counted as unanswered; the keeper's thread died of it with a traceback
            return 0.0

    def _answers(self, timeout_s: float) -> bool:
        """Whether the server answers ``/health`` within ``timeout_s``, its engine not stalled."""
        import httpx

        try:
            return (
                httpx.get(f"http://127.0.0.1:{self.port}/health", timeout=timeout_s, trust_env=False).status_code == 200
            )
        except httpx.HTTPError:
            return False

    def _spawn(self) -> subprocess.Popen[bytes]:
        """A new server process on :attr:`port` (its own temporary folder)."""
        old, self._tmp = self._tmp, Path(tempfile.mkdtemp(prefix=_PREFIX))
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
        if self._log is not None:
            self._log.close()
        self._log = open(self._tmp / "server.log", "w+b")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "focus.tinylm.server", *self._args(self._tmp / "port")]
        proc = spawn(cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        _record_pid(self._tmp, proc)
        return proc

    def stop(self) -> None:
        with self._lock:
            proc, self.proc = self.proc, None
        stop_process(proc)
        if self._log is not None:
            self._log.close()
            self._log = None
        if self._tmp is not None:
            shutil.rmtree(self._tmp, ignore_errors=True)
            self._tmp = None
        atexit.unregister(self.stop)

    def __enter__(self) -> LocalModelServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- convenience --------------------------------------------------------------
    def info(self) -> dict[str, Any]:
        """The server's ``/v1/models`` card (includes ``policy_version``)."""
        import httpx

        data = httpx.get(f"{self.url}/v1/models", timeout=10.0, trust_env=False).json()
        return dict(data["data"][0])

    @property
    def policy_version(self) -> str:
        return str(self.info()["policy_version"])

    def reload(self, weights: str | os.PathLike[str]) -> str:
        """Load new weights into the running server; returns the new policy version.

        The weights are noted first, so that a server its keeper starts again from then
        on (:meth:`keep_alive`) starts with them; while it is down (killed, being started
        again), the load is tried again for up to ``startup_timeout_s``. A train loop
        whose server died as it published a version stopped with ``ConnectError:
        Connection refused``; one that died between the load and the note would have
        been started again with the old weights under the new version's name."""
        import httpx

        from focus.policy import PolicyError

        previous, self.weights = self.weights, str(weights)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            try:
                resp = httpx.post(
                    f"http://127.0.0.1:{self.port}/update_weights_from_disk",
                    json={"model_path": str(weights)},
                    timeout=60.0,
                    trust_env=False,
                )
                break
            except httpx.TransportError as e:
                if self.proc is None or time.monotonic() > deadline:
                    self.weights = previous
                    raise PolicyError(f"weight reload from {weights} failed: {type(e).__name__}: {e}") from e
                time.sleep(0.05)
        data = resp.json()
        if resp.status_code != 200 or not data.get("success"):
            self.weights = previous
            raise PolicyError(f"weight reload from {weights} failed: {data.get('message', resp.text)}")
        return str(data["policy_version"])

    def policy(self, **kwargs: Any) -> Any:
        """An :class:`OpenAICompatPolicy` for this server, with the codec's vocabulary."""
        from focus.backends.openai_compat import OpenAICompatPolicy
        from focus.format import ByteCodec

        kwargs.setdefault("vocab_size", ByteCodec.vocab_size)
        return OpenAICompatPolicy(self.url, **kwargs)
