"""The ``focus`` console command's entry: start the slow part first, then parse.

Most of the start-up of ``focus collect`` on the embedded model is the model server
importing torch (about a second), and that import does not depend on the
configuration. So this entry starts a :class:`focus.backends.local.WarmServer` for a new
collection before it imports the command line (typer, pydantic and the configuration),
and ``focus collect`` hands it its command line once the configuration is known. When no
embedded model is needed (another model service, an error) it is stopped unused: what
it cost is a fraction of a second of the other core. A collection the command line
names may be finished already, which costs no server at all: its server starts once the
preflight has found it unfinished (:func:`names_collection`).
"""

from __future__ import annotations

import os
import sys
from typing import Any


def wants_embedded_model(argv: list[str], env: Any = None) -> bool:
    """Whether a command line may start the embedded model server: ``collect`` without
    ``--model-url`` or help, of a new collection (:func:`names_collection`). The
    configuration decides in the end."""
    if not argv or argv[0] != "collect":
        return False
    if any(a in ("-h", "--help") or a.startswith("--model-url") for a in argv[1:]):
        return False
    return not names_collection(argv[1:], os.environ if env is None else env)


def names_collection(args: list[str], env: Any) -> bool:
    """Whether ``focus collect``'s ``args`` (or a ``FOCUS_*`` variable) may name its
    collection: ``--collection-id``, ``--set collection_id=...``, ``FOCUS_COLLECTION_ID``
    or a config file (``-c``) with ``collection_id`` outside a comment. Only a named collection
    can be finished already, which its preflight answers from the store without any
    service; so a named one's model server starts after that check (:func:`cli.common.started`,
    beside the library's import), and a new one's here, before the configuration is read.
    A finished collection's rerun started it here and stopped it unused: 0.26 s of CPU
    for nothing to do. A file is read as text, not parsed (``configs/collect.toml``'s
    commented ``# collection_id = "demo"`` names nothing)."""
    if any(k.upper() == "FOCUS_COLLECTION_ID" for k in env):
        return True
    for i, a in enumerate(args):
        value = a.partition("=")[2] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
        if a.startswith("--collection-id") or (a.startswith("--set") and value.strip().startswith("collection_id")):
            return True
        if a in ("-c", "--config") or a.startswith("--config="):
            try:
                with open(value, encoding="utf-8", errors="replace") as f:  # TOML and YAML: '#' comments
                    if any("collection_id" in line.partition("#")[0] for line in f):
                        return True
            except OSError:
                pass  # the configuration's own check names it
    return False


#: The environment variables that name a proxy, for httpx and Prefect's client.
PROXY_VARIABLES = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def loopback_without_proxy(env: Any = None) -> None:
    """Add the loopback names to ``NO_PROXY`` and ``no_proxy`` when a proxy is set.

    Everything this command starts listens on 127.0.0.1 (the embedded model server, a
    temporary Prefect server, a Dask cluster) and is asked over httpx, which sends
    requests through ``HTTP_PROXY`` unless ``NO_PROXY`` names the host: on a machine
    with a proxy set and no ``NO_PROXY`` (many clusters), ``focus collect`` stopped with
    ``the embedded model server on port N never answered /health``. Subprocesses
    inherit the variables. Hosts already listed are kept."""
    env = os.environ if env is None else env
    if not any(env.get(k) for k in PROXY_VARIABLES):
        return
    for key in ("NO_PROXY", "no_proxy"):
        have = [h.strip() for h in env.get(key, "").split(",") if h.strip()]
        env[key] = ",".join(have + [h for h in LOOPBACK if h not in have])


def home_or_temporary(env: Any = None) -> None:
    """Set ``HOME`` to the temporary folder when no home can be found: ``HOME`` unset
    and a user id without a password entry (a container run under an arbitrary id,
    OpenShift's way). ``Path.home()`` raises ``RuntimeError: Could not determine home
    directory`` there, and the default log file, Prefect's profile lookup and Prefect
    itself all call it, so the command stopped with a traceback before anything ran."""
    env = os.environ if env is None else env
    if env.get("HOME"):
        return
    try:
        import pwd

        pwd.getpwuid(os.getuid())
        return
    except (ImportError, KeyError):
        pass
    import tempfile

    env["HOME"] = tempfile.gettempdir()


#: The most open files :func:`more_open_files` asks for: many times what a collection
#: needs (one connection per rollout in flight), under what macOS allows (OPEN_MAX, 10240).
OPEN_FILES = 10240


def more_open_files() -> None:
    """Raise this process's soft limit on open files (``ulimit -Sn``) towards its hard
    limit, up to :data:`OPEN_FILES`; the embedded model server inherits it. Each rollout
    in flight holds a connection to the model service, so the default
    ``execution.max_concurrency`` (64) needs about 80 files, and a soft limit of 64 (or a
    laptop's 256 with more rollouts in flight) stopped a collection with ``Too many open
    files`` though the hard limit allowed thousands. A hard limit is left as it is."""
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, OPEN_FILES)
        if soft != resource.RLIM_INFINITY and soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    except (ImportError, OSError, ValueError):  # no resource module, or a limit the system refuses
        pass


#: What the command started before its own handling of signals: killed by :func:`_stop_now`.
_STARTED: list[Any] = []


#: What the line of :func:`_stop_now` adds (a collection or loop: that no work was running).
_NOTE: list[str] = [""]


def _stop_now(signum: int, frame: Any) -> None:
    """A signal before the command's work began (imports, the configuration, the
    preflight) or after it ended: nothing runs that a resume would need, so one line and
    the signal's exit status. A Ctrl-C there printed a KeyboardInterrupt traceback (20-40
    lines, one a `RuntimeError: Error calling __set_name__` from the import it cut), and
    so did one of `focus inspect`, `focus config show` or the start of `focus deploy`
    and `focus serve-model` (18-51 lines). The work of `collect` and `train` installs its
    own handling (:mod:`cli.interrupts`), then puts this back; `serve-model` and `deploy`
    put Python's back once they serve (:func:`cli.interrupts.serving`), as they stop on Ctrl-C."""
    import signal

    for proc in _STARTED:
        if proc is not None and proc.poll() is None:
            proc.kill()
    try:  # a closed terminal (SIGHUP) or pipe takes no line
        os.write(2, f"interrupted ({signal.Signals(signum).name}){_NOTE[0]}\n".encode())
    except OSError:
        pass
    os._exit(128 + signum)


def main() -> None:  # pragma: no cover - console entry point (tested through the installed command)
    import signal

    from cli.streams import install

    install()  # a console that goes away (a closed pipe or terminal) does not stop the command
    from cli.interrupts import REPLACED, handled

    if sys.argv[1:2] in (["collect"], ["train"]):
        _NOTE[0] = ": nothing was running"
    for s in handled():
        REPLACED[s] = signal.signal(s, _stop_now)
    loopback_without_proxy()
    home_or_temporary()
    more_open_files()
    from focus.extras import MissingExtra, missing, require

    try:
        require("pipeline", "the focus command")
    except MissingExtra as e:
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(1) from None
    warm: Any = None
    if wants_embedded_model(sys.argv[1:]) and not missing("local"):  # else the cold start says what to install
        from focus.backends.local import WarmServer

        try:
            warm = WarmServer()
        except OSError:
            warm = None  # a cold start later says what is wrong, if anything is
        _STARTED.append(getattr(warm, "proc", None))
    from cli.app import main as cli_main

    cli_main(warm_model=warm)
