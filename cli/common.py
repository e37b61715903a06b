"""What every ``focus`` command shares: its options, its console and log file, its
one-line errors, loading the configuration, and starting the services it needs."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from cli.interrupts import Interrupts
from flows.errors import exit_code, one_line
from tasks.config import ConfigError, FocusConfig, load_config

#: When the command started (``cli_wall_s`` counts from here).
T0 = time.perf_counter()
#: The defaults, for help texts.
DEFAULTS = FocusConfig()


def help_default(text: str, default: Any) -> str:
    """Help text with the default the configuration gives when the option is not used
    (the bracket escaped: help text is rich markup)."""
    return f"{text} \\[default: {default}]"


ConfigOpt = Annotated[
    Path | None, typer.Option("--config", "-c", help="TOML or YAML configuration file.", metavar="PATH")
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option("--set", metavar="KEY=VALUE", help="Override a field, e.g. --set search.phases.1.transitions=400"),
]
VerboseOpt = Annotated[
    int, typer.Option("--verbose", "-v", count=True, help="Show Prefect's and Dask's log on the console (-vv: debug).")
]
DebugOpt = Annotated[bool, typer.Option("--debug", help="Print the full traceback of an error.")]
LogFileOpt = Annotated[
    Path | None,
    typer.Option(
        "--log-file",
        help=help_default("Where the full log goes.", "~/.local/state/focus/logs/<command>-<time>-<pid>.log"),
        metavar="PATH",
    ),
]
SeedOpt = Annotated[int | None, typer.Option(help=help_default("Collection seed.", DEFAULTS.seed), metavar="N")]
StoreOpt = Annotated[
    str | None,
    typer.Option(help=help_default("Storage root: a folder or an fsspec URL (s3://...).", "./runs"), metavar="URL"),
]
TasksOpt = Annotated[
    int | None, typer.Option(help=help_default("Tasks per collection.", DEFAULTS.env.n_tasks), metavar="N")
]
TransitionsOpt = Annotated[
    int | None,
    typer.Option(
        help=help_default("Transition budget of the last continuation phase.", DEFAULTS.search.phases[-1].transitions),
        metavar="N",
    ),
]


def writable_log_file(path: Path, *, chosen: bool = False) -> Path:
    """``path``, or the same name under the temporary folder when ``path``'s folder
    cannot be made (a read-only or full home: the log is no reason to stop a command),
    with one warning line; ``os.devnull`` when neither can. A path the user ``chosen``
    (``--log-file``) is not moved: a log somewhere else would be missed where they look
    for it, so it is one line and exit 2, as for any wrong option.

    Everything downstream (the embedded model server's and a temporary Prefect
    server's output, Dask workers' logging, the traceback of an error) writes to the
    file this returns, so it is decided once, before any of them starts."""
    from storage.temp import user_temp_folder

    for i in range(2):
        candidate = Path(tempfile.gettempdir()) / f"focus-logs-{os.getuid()}" / path.name if i else path
        try:
            if i:  # per user and private: /tmp is shared
                candidate = user_temp_folder("focus-logs") / path.name
            candidate.parent.mkdir(parents=True, exist_ok=True)
            with open(candidate, "a", encoding="utf-8"):
                pass
        except OSError as e:
            why = not_a_folder(candidate) or e.strerror or type(e).__name__
            if chosen and not i:
                fail(f"--log-file {path}: cannot write it ({why})")
            typer.secho(f"warning: cannot write the log file {candidate} ({why})", fg=typer.colors.YELLOW, err=True)
            continue
        if i:
            typer.secho(f"warning: logging to {candidate} instead", fg=typer.colors.YELLOW, err=True)
        return candidate
    return Path(os.devnull)


def not_a_folder(path: Path) -> str | None:
    """``<folder> is a file, not a folder`` when the nearest existing folder above
    ``path`` is a file: the OS says "File exists" or "Not a directory", naming neither."""
    for above in path.parents:
        if os.path.lexists(above):
            return f"{above} is a file, not a folder" if above.exists() and not above.is_dir() else None
    return None


def writable_prefect_home(env: Any = None) -> None:
    """Point ``PREFECT_HOME`` at the temporary folder when it is unset and
    ``~/.prefect`` cannot be made (a read-only home): Prefect keeps its settings and a
    temporary server its database there, and fails to start without it (exit status 3).
    A ``PREFECT_HOME`` the user set is left alone."""
    env = os.environ if env is None else env
    if env.get("PREFECT_HOME"):
        return
    home = Path.home() / ".prefect"
    try:
        home.mkdir(parents=True, exist_ok=True)
        if os.access(home, os.W_OK):
            return
    except OSError:
        pass
    from storage.temp import user_temp_folder

    try:  # per user and private: /tmp is shared
        env["PREFECT_HOME"] = str(user_temp_folder("focus-prefect"))
    except OSError:  # no temporary folder either: Prefect says so
        env["PREFECT_HOME"] = str(Path(tempfile.gettempdir()) / f"focus-prefect-{os.getuid()}")


class Console:
    """The command's console and log file, and its one-line errors."""

    def __init__(self, verbosity: int, debug: bool, log_file: Path | None, kind: str) -> None:
        from flows.logs import default_log_file
        from flows.progress import console

        self.verbosity, self.debug = verbosity, debug
        self.log_file = writable_log_file(log_file or default_log_file(kind), chosen=log_file is not None)
        self.console = console()
        self.logging_ready = False

    def setup_logging(self) -> None:
        from flows.logs import setup

        if not self.logging_ready:
            self.log_file = setup(self.console, verbosity=self.verbosity, log_file=self.log_file) or self.log_file
            self.logging_ready = True

    def interrupted(
        self, interrupts: Interrupts, resume: str, finished: Callable[[], str | None] | None = None
    ) -> NoReturn:
        """The one line of a command stopped by a signal, and its status (130, 143).
        ``finished``: what the command's work left finished (a batch whose write had
        begun completes), or ``None``: then the line is what it says."""
        said = None
        if finished is not None:
            with contextlib.suppress(Exception):  # a store that cannot be read now: the usual line
                said = finished()
        line = interrupts.line(resume, said)
        with contextlib.suppress(OSError):
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_file, "a", encoding="utf-8", errors="surrogateescape") as f:
                f.write(f"{line}\n")
        typer.secho(line, fg=typer.colors.YELLOW, err=True)
        raise typer.Exit(interrupts.code)

    def fail(self, exc: BaseException) -> NoReturn:
        """One line naming the cause and a non-zero exit; the traceback to the log or the terminal."""
        line = one_line(exc)
        code = exit_code(exc)
        where = ""
        if self.debug:
            traceback.print_exception(exc, file=sys.stderr)
        elif code != 2:  # a configuration error needs no traceback
            try:
                self.log_file.parent.mkdir(parents=True, exist_ok=True)
                with open(self.log_file, "a", encoding="utf-8", errors="surrogateescape") as f:
                    f.write(f"error: {line}\n{''.join(traceback.format_exception(exc))}")
                where = f" (traceback: {self.log_file})" if str(self.log_file) != os.devnull else ""
            except OSError:
                pass
        typer.secho(f"error: {line}{where}", fg=typer.colors.RED, err=True)
        raise typer.Exit(code)


def warn_if_forgotten(root: str) -> None:
    """One warning line when the store is this process's memory (``memory://``): the
    command printed a batch URL and a ``rerun or resume`` line for a batch that was gone
    once it exited (a rerun started over), and said nothing of it."""
    if str(root).startswith("memory://"):
        typer.secho(
            f"warning: storage root {root} is this process's memory: what this command saves is gone when it "
            "exits (a rerun starts over); give --store a folder or an object store to keep it",
            fg=typer.colors.YELLOW,
            err=True,
        )


def pasteable(url: str) -> str:
    """``url`` as a shell word, quoted when it needs it (a folder with a space), as the
    ``rerun or resume`` line quotes its words: a printed batch URL is pasted into ``focus
    inspect``, which reads it as given, so it is quoted rather than percent-encoded."""
    return shlex.quote(url)


def summary(command: Callable[..., Any]) -> str:
    """A command's docstring's first paragraph on one line: its entry in the list of
    commands (``focus --help``, ``focus config --help``). Typer kept the docstring's line
    breaks there, so a two-line summary broke mid-sentence (``every phase),`` / ``the
    iterations of ...``)."""
    return " ".join((command.__doc__ or "").split("\n\n")[0].split())


def reflowed(command: Callable[..., Any]) -> str:
    """A command's docstring with each paragraph on one line: its ``--help`` text, which
    the terminal wraps. Typer kept the docstring's line breaks (``focus deploy -h`` broke
    after ``FOCUS_*``, wrapped to the source's width whatever the terminal's)."""
    return "\n\n".join(" ".join(p.split()) for p in (command.__doc__ or "").split("\n\n") if p.strip())


def fail(message: str, code: int = 2) -> NoReturn:
    typer.secho(f"error: {message}", fg=typer.colors.RED, err=True)
    raise typer.Exit(code)


def overrides(sets: list[str] | None, **flags: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--set {item!r}: expected KEY=VALUE, e.g. --set seed=3")
        out[key.strip()] = set_value(item, value)
    out.update({k: v for k, v in flags.items() if v is not None})
    return out


def set_value(item: str, value: str) -> Any:
    """A ``--set`` value: JSON (``3``, ``true``, ``[1, 2]``), else for a list or table a
    TOML inline value, as a config file writes it (``[{name = "e", ...}]``), else the text.

    A list or table in TOML's syntax was taken for text, and the field's check said only
    ``search.phases: Input should be a valid list``; one that neither reads is refused
    naming both readings."""
    try:
        return json.loads(value)
    except json.JSONDecodeError as e:
        if not value.lstrip().startswith(("[", "{")):
            return value
        import tomllib

        try:
            return tomllib.loads(f"v = {value}")["v"]
        except tomllib.TOMLDecodeError as t:
            fail(f"--set {item!r}: the value is neither JSON ({e}) nor a TOML inline value ({t})")


#: The command-line flags that set a configuration field, as an error names its source.
FLAGS = {
    "collection_id": "--collection-id",
    "seed": "--seed",
    "iteration": "--iteration",
    "storage.root": "--store",
    "env.n_tasks": "--tasks",
    "search.phases": "--transitions",
    "model.url": "--model-url",
    "model.kind": "--model-url",
    "model.http.timeout_s": "--model-timeout",
    "model.http.max_retries": "--model-retries",
    "execution.address": "--dask-address",
    "execution.kind": "--dask or --local",
    "train.iterations": "--iterations",
    "train.trainer": "--trainer",
}


def load(config: Path | None, overrides: dict[str, Any], flagged: Iterable[str] = ()) -> FocusConfig:
    """The configuration; ``flagged``: the fields of ``overrides`` that a command's own
    flag set (an error names the flag, :data:`FLAGS`, not ``--set``)."""
    try:
        return load_config(config, overrides, labels={k: FLAGS[k] for k in flagged if k in FLAGS})
    except ConfigError as e:
        fail(one_line(e))


@contextmanager
def started(
    out: Console,
    cfg: FocusConfig,
    *,
    prefect: bool,
    model: bool = True,
    warm: Any = None,
    interrupts: Interrupts | None = None,
) -> Iterator[FocusConfig]:
    """The services ``cfg`` needs (:class:`flows.services.Services`): the Prefect API
    (the configured one, or a temporary server; none unless ``prefect``) and, with
    ``model``, the embedded model server, started side by side while this process
    imports the flows and sets up its logging; then the Dask cluster, if one is needed.
    ``warm``: the model server process the console entry already started
    (:mod:`cli.entry`). Yields the config naming what was started; stops it all on exit
    (kills it at once on a second signal, with ``interrupts``)."""
    from flows.services import ON_MODEL_GONE, Services

    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    if prefect:
        writable_prefect_home()
    services = Services(cfg, prefect=prefect, model=model, warm=warm, log_file=out.log_file)
    gone = None
    if interrupts is not None:
        interrupts.on_exit_now.append(services.kill)
        # an embedded model server gone for good stops the run at once, with its line
        gone = ON_MODEL_GONE.set(interrupts.stop)
    try:
        services.start()
        if cfg.execution.kind == "dask":
            import distributed  # noqa: F401 - it installs its log handlers on import; setup replaces them
        if prefect:
            import flows.collect  # noqa: F401 - Prefect's import, overlapping with the servers' start
        else:
            import flows.direct  # noqa: F401 - the library's import, overlapping with the model server's start
        out.setup_logging()
        if out.verbosity == 0:
            from flows.logs import dask_workers_log_to

            out.log_file.parent.mkdir(parents=True, exist_ok=True)
            dask_workers_log_to(out.log_file)  # worker processes inherit it
        what = services.starting
        with out.console.status(f"starting the {' and the '.join(what)}", spinner="dots") if what else nullcontext():
            ready = services.wait()
        yield ready
    finally:
        services.stop()
        if gone is not None:
            ON_MODEL_GONE.reset(gone)


@contextmanager
def one_line_ending(
    out: Console, resume: str, finished: Callable[[], str | None] | None = None
) -> Iterator[Interrupts]:
    """The command's :class:`~cli.interrupts.Interrupts`, and how its body ends when it
    does not finish: the line of an interrupt (with ``resume``, the command that resumes
    it; ``finished``: what the work left finished, :meth:`Console.interrupted`) or the
    one line of an error, each with its exit status."""
    with Interrupts() as interrupts:
        interrupts.resume, interrupts.log_file = resume, str(out.log_file)
        interrupts.console = out.console
        try:
            yield interrupts
        except BaseException as e:
            if interrupts.signals:
                out.interrupted(interrupts, resume, finished)
            if isinstance(e, Exception | KeyboardInterrupt):
                out.fail(e)
            raise


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, dict)):
        return json.dumps(v, default=str)
    return str(v)


def pairs_table(title: str, items: list[tuple[str, Any]], width: int | None = None) -> Any:
    """Statistics in two column pairs when they fit ``width`` (default: the terminal's),
    else in one; a long value folds onto more lines, nothing is cut."""
    from rich.console import Console as RichConsole
    from rich.table import Table

    width = width if width is not None else RichConsole().width
    cells = [(k, fmt(v)) for k, v in items]
    one = max((len(k) for k, _ in cells), default=0) + max((len(v) for _, v in cells), default=0) + 7
    pairs = 2 if 2 * one - 1 <= width else 1
    table = Table(title=title, title_justify="left")
    for _ in range(pairs):
        table.add_column("statistic", overflow="fold")
        table.add_column("value", justify="right", overflow="fold")
    half = (len(cells) + pairs - 1) // pairs
    for i in range(half):
        row = list(cells[i])
        if pairs == 2:
            row += list(cells[i + half]) if i + half < len(cells) else ["", ""]
        table.add_row(*row)
    return table


def load_with_budget(
    path: Path | None, flags: dict[str, Any], sets: list[str] | None, transitions: int | None
) -> FocusConfig:
    """:func:`load` of ``--set`` and a command's ``flags`` (field -> value, None where
    the flag was not given; the flags win), with ``--transitions`` as the budget of the
    last phase (the continuation phase of the default shape)."""
    over = overrides(sets, **flags)
    flagged = [k for k, v in flags.items() if v is not None]
    cfg = load(path, over, flagged)
    if transitions is None:
        return cfg
    phases = [p.model_dump() for p in cfg.search.phases]
    phases[-1]["transitions"] = transitions
    return load(path, {**over, "search.phases": phases}, [*flagged, "search.phases"])


#: The flags of :data:`FLAGS` that give their field's value as it is (a resume line
#: repeats them); the others stand for a derived value (``--transitions``, ``--dask``)
#: or are the line's own (``--collection-id``).
FLAG_OF = {
    field: flag
    for field, flag in FLAGS.items()
    if field not in ("collection_id", "search.phases", "model.kind", "execution.kind")
}


def user_code(cfg: FocusConfig) -> list[str]:
    """The import paths of the user's code the configuration names (factories, a trainer)."""
    from tasks.config.build import factory_sections

    paths = [
        section.factory
        for section, _ in factory_sections(cfg)
        if getattr(section, "kind", None) == "factory" and section.factory
    ]
    return [*paths, *([cfg.train.trainer] if ":" in cfg.train.trainer else [])]


def resume_command(
    command: str,
    config: Path | None,
    flags: dict[str, Any],
    sets: list[str] | None,
    transitions: int | None,
    cid: str,
    cfg: FocusConfig | None = None,
) -> str:
    """The command line that resumes this run: its file, flags and ``--set``s with its
    collection id, ready to copy. A bare ``focus collect --collection-id c`` ran under
    the default store (``./runs``) and with the default configuration when the run had
    ``--store`` or ``--tasks``: a new collection, not the resume it promised.

    Its paths work from any folder (:func:`anywhere`): ``-c configs/x.toml --store st``
    repeated as typed resumed only from the folder the run started in; pasted elsewhere
    it stopped with ``cannot read config file`` or, worse, began a new collection in
    another ``./st``. A local store given relative anywhere else (the default
    ``./runs``, a config file's or ``FOCUS_STORAGE__ROOT``'s) is named as ``--store``
    with its absolute path; URLs and absolute paths are left as they are, so the line
    grows only where it has to.

    When ``cfg`` names code of the user's (an env, model or critic factory, a trainer)
    and the command ran with ``PYTHONPATH`` set, the line starts with that
    ``PYTHONPATH=...`` (its entries absolute): the factory may be found only through it
    (``PYTHONPATH=examples/math focus collect --set env.kind=factory ...``), and the
    line pasted into another shell stopped with ``cannot import module``."""
    pythonpath = os.environ.get("PYTHONPATH")
    if pythonpath and cfg is not None and user_code(cfg):
        entries = os.pathsep.join(anywhere(p) if p else p for p in pythonpath.split(os.pathsep))
        prefix = f"PYTHONPATH={shlex.quote(entries)} "
    else:
        prefix = ""
    words = ["focus", command, *(["-c", anywhere(str(config))] if config else [])]
    words += [
        w
        for field, value in flags.items()
        if value is not None and field in FLAG_OF
        for w in (FLAG_OF[field], anywhere(str(value)) if field == "storage.root" else str(value))
    ]
    if flags.get("execution.kind") == "dask" and not flags.get("execution.address"):
        words.append("--dask")
    words += ["--transitions", str(transitions)] if transitions is not None else []
    # an id given as ``--set collection_id=...`` is said once, by the ``--collection-id`` below
    kept = [_set_anywhere(s) for s in sets or [] if s.partition("=")[0].strip() != "collection_id"]
    words += [w for s in kept for w in ("--set", s)]
    named = flags.get("storage.root") is not None or any(s.partition("=")[0].strip() == "storage.root" for s in kept)
    typed = _store_typed(config) if cfg is not None and not named else None
    if typed is not None and "://" not in typed and not os.path.isabs(typed):
        words += ["--store", anywhere(typed)]
    return prefix + shlex.join([*words, "--collection-id", cid])


def anywhere(path: str) -> str:
    """``path`` as a resume line names it so that it works from any folder: a local
    path absolute (``~`` expanded), a URL (``s3://...``, ``file://...``) as it is."""
    return path if "://" in path else os.path.abspath(os.path.expanduser(path))


def _set_anywhere(item: str) -> str:
    """A ``--set`` as the resume line repeats it: ``storage.root`` with a local path
    made absolute (:func:`anywhere`), any other as typed."""
    key, _, value = item.partition("=")
    root = set_value(item, value) if key.strip() == "storage.root" else None
    return f"storage.root={anywhere(root)}" if isinstance(root, str) else item


def _store_typed(config: Path | None) -> str:
    """The storage root as the config file and ``FOCUS_*`` variables give it, before
    it is made absolute (``runs``, the default, when neither does): relative, it named
    a folder under the one the command ran in."""
    from tasks.config.sources import env_layers, file_layers

    data: dict[str, Any] = {}
    for layer in file_layers(config) + env_layers(os.environ)[0]:
        data = layer.apply(data)
    root = (data.get("storage") or {}).get("root")
    return root if isinstance(root, str) else DEFAULTS.storage.root


def name_settings(names: Any) -> None:
    """Have the lines of :func:`flows.preflight.unreachable` name the settings as this
    command does (``names``: a :class:`flows.preflight.CommandNames`) until it ends; then
    as a flow run does again (tests call commands in one process, then run flows)."""
    import click

    from flows.preflight import COMMAND_NAMES

    token = COMMAND_NAMES.set(names)
    ctx = click.get_current_context(silent=True)
    if ctx is not None:

        def reset() -> None:
            with contextlib.suppress(ValueError):  # set in another context: nothing to undo here
                COMMAND_NAMES.reset(token)

        ctx.call_on_close(reset)
