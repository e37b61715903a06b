"""``focus collect``: one iteration, end to end, resumable by its collection id.

With no options it runs the embedded default: the tiny local model on loopback, the
toy task, rollouts in-process, ``./runs`` as the store. Options, a ``--config`` file
(TOML/YAML) and ``FOCUS_*`` environment variables override it. What can be decided
without starting anything is decided first (:mod:`flows.preflight`): the
configuration, the storage root, a collection id reused with another configuration, a
collection that is already finished. Then the services start (:func:`cli.common.started`)
and the collection runs - as the ``collect`` flow when a Prefect server is configured
(or ``--prefect``), else directly (:mod:`flows.direct`): same loop, same store, same
resume. The console shows progress and the result; any error is one line and a
non-zero status (:mod:`flows.errors`).

How a collection runs, in order (docs/architecture.md has the picture):

1. :func:`flows.preflight.preflight`: the store's records checked (one listing), the
   stored configuration record compared, a finished collection answered from its
   export record and batch manifest. Nothing else runs for a finished one.
2. :func:`cli.common.started`: the services; then :func:`flows.direct.collect_direct`
   (handed what the preflight read, not read again) or the ``collect`` flow.
3. :func:`tasks.collect.collect` under the collection's write lease (whose sweep lists
   the checkpoints once): the configuration check (``check-config``), the export
   record read again (a run may have finished it meanwhile), then
   :func:`tasks.gaps.repairing` (a gap mended, the replay read ahead) around the
   collector's loop, whose every step :class:`tasks.journal.CheckpointJournal` replays
   or saves; last, the batch written and the export record saved.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import (
    DEFAULTS,
    T0,
    ConfigOpt,
    Console,
    DebugOpt,
    LogFileOpt,
    SeedOpt,
    SetOpt,
    StoreOpt,
    TasksOpt,
    TransitionsOpt,
    VerboseOpt,
    fail,
    help_default,
    load_with_budget,
    name_settings,
    one_line_ending,
    pairs_table,
    pasteable,
    resume_command,
    started,
    warn_if_forgotten,
)
from tasks.config import FocusConfig
from tasks.config.schema import REMOTE, SERVED

if TYPE_CHECKING:
    from focus.backends.local import WarmServer

#: The statistics ``focus collect`` shows, in order; each is defined in docs/pipeline.md
#: ("What a run shows"); tests/test_cli.py checks that every one is.
SHOWN = (
    "actor_rows",
    "critic_rows",
    "tasks",
    "trees",
    "failed_trees",
    "refused_tasks",
    "rollouts",
    "failed_rollouts",
    "parse_errors",
    "tool_errors",
    "transitions",
    "tokens",
    "model_calls",
    "checkpoints",
    "excluded_segments",
    "steps",
    "steps_reused",
    "wall_s",
    "flow_wall_s",
    "cli_wall_s",
)


def print_result(result: dict[str, Any], note: str = "") -> None:
    from rich.console import Console as RichConsole

    stats = result["stats"]
    items = [(k, stats[k]) for k in SHOWN if k in stats]
    console = RichConsole()  # standard output: the result, apart from the bars and log on standard error
    console.print(pairs_table(f"collection {result['collection_id']}{note}", items))
    for cause, n in (result.get("failure_causes") or {}).items():
        console.print(f"failure cause ({n}x): {cause}", markup=False, highlight=False)
    console.print(f"batch: {pasteable(result['batch_url'])}", markup=False, highlight=False, soft_wrap=True)


_D = DEFAULTS
CollectionIdOpt = Annotated[
    str | None,
    typer.Option(
        help=help_default("Name of the collection; the same id resumes it.", "collect-<time>-<hex>"), metavar="ID"
    ),
]
IterationOpt = Annotated[
    int | None, typer.Option(help=help_default("Training iteration recorded in the batch.", _D.iteration), metavar="N")
]
ModelUrlOpt = Annotated[
    str | None,
    typer.Option(
        help=help_default(
            "Model server (OpenAI-compatible, or the model.kind the configuration names: sglang, llamacpp).",
            "start the embedded model",
        ),
        metavar="URL",
    ),
]
ModelTimeoutOpt = Annotated[
    float | None,
    typer.Option(
        help=help_default("Seconds to wait for one model answer.", _D.model.http.timeout_s), metavar="SECONDS"
    ),
]
ModelRetriesOpt = Annotated[
    int | None,
    typer.Option(help=help_default("Retries of a failed model call.", _D.model.http.max_retries), metavar="N"),
]
DaskOpt = Annotated[bool, typer.Option("--dask", help="Run rollouts on a Dask LocalCluster started for the run.")]
DaskAddressOpt = Annotated[
    str | None,
    typer.Option(help=help_default("Run rollouts on this Dask scheduler.", "in-process"), metavar="ADDRESS"),
]
LocalOpt = Annotated[bool, typer.Option("--local", help="Run rollouts in-process (the default).")]
PrefectOpt = Annotated[
    bool,
    typer.Option(
        "--prefect",
        help="Run as a Prefect flow even when no Prefect server is configured (starts a temporary one). "
        "With PREFECT_API_URL set, collections always run as flows on that server.",
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as one JSON line.")]
AllowPolicyChangeOpt = Annotated[
    bool,
    typer.Option(
        "--allow-policy-change",
        help="Resume even if the model service now serves other weights than those that sampled the collection, "
        "or the critic now predicts other values than the one that scored it (the batch then mixes two policies "
        "or two critics; its policy_version column says which row came from which policy).",
    ),
]


def collect(
    ctx: typer.Context,
    config: ConfigOpt = None,
    collection_id: CollectionIdOpt = None,
    seed: SeedOpt = None,
    iteration: IterationOpt = None,
    store: StoreOpt = None,
    model_url: ModelUrlOpt = None,
    model_timeout: ModelTimeoutOpt = None,
    model_retries: ModelRetriesOpt = None,
    tasks: TasksOpt = None,
    transitions: TransitionsOpt = None,
    dask: DaskOpt = False,
    dask_address: DaskAddressOpt = None,
    local: LocalOpt = False,
    prefect: PrefectOpt = False,
    sets: SetOpt = None,
    as_json: JsonOpt = False,
    allow_policy_change: AllowPolicyChangeOpt = False,
    verbose: VerboseOpt = 0,
    debug: DebugOpt = False,
    log_file: LogFileOpt = None,
) -> None:
    """Collect one iteration and write its batch; prints the batch URL and statistics."""
    from flows.preflight import CommandNames

    name_settings(CommandNames(*FLAG_NAMES))  # an unreachable model: its flag (a flow run names its parameter)
    flags: dict[str, Any] = {
        "collection_id": collection_id,
        "seed": seed,
        "iteration": iteration,
        "storage.root": store,
        "env.n_tasks": tasks,
        "execution.address": dask_address,
        "execution.kind": "local" if local else "dask" if (dask or dask_address) else None,
        "model.http.timeout_s": model_timeout,
        "model.http.max_retries": model_retries,
    }
    if model_url:
        flags["model.url"] = model_url
        # an OpenAI-compatible server, unless the configuration names another served kind
        if load_with_budget(config, flags, sets, transitions).model.kind not in REMOTE:
            flags["model.kind"] = "openai"
    cfg = _config(config, flags, sets, transitions)
    resume = resume_command("collect", config, flags, sets, transitions, str(cfg.collection_id), cfg)
    out = Console(verbose, debug, log_file, "collect")
    warn_if_forgotten(cfg.storage.root)
    warm = (ctx.obj or {}).get("warm_model")
    result = _run(out, cfg, resume, prefect=prefect, warm=warm, as_json=as_json, allow=allow_policy_change)
    if result is None:
        return
    result["stats"]["cli_wall_s"] = round(time.perf_counter() - T0, 3)
    if as_json:
        typer.echo(json.dumps(result, default=str))
    else:
        print_result(result)
        typer.echo(f"rerun or resume: {resume}")
    _fail_if_all_failed(result)


#: How this command's lines name the model URL, the Dask scheduler and how to run without one.
FLAG_NAMES = (
    "model.url (--model-url)",
    "execution.address (--dask-address)",
    "leave it out to run rollouts in-process (--dask: a cluster started for the run)",
)


def _fail_if_all_failed(result: dict[str, Any]) -> None:
    """Exit 1 with one line when every rollout failed: such a batch holds nothing a
    trainer can use, whatever the cause (a model service that refuses every request - a
    wrong path, key or model name -, an env that always raises), and a status of 0
    would let a script or scheduler go on to train on it. The batch is written and the
    collection finished, as for any run; the line says to collect under a new id."""
    stats = result.get("stats") or {}
    n = stats.get("rollouts") or 0
    if not n or stats.get("failed_rollouts") != n:
        return
    causes = sorted((result.get("failure_causes") or {}).items(), key=lambda kv: -kv[1])
    top = f"; most often ({causes[0][1]}x): {causes[0][0]}" if causes else ""
    fail(
        f"every rollout failed ({n} of {n}): the batch has nothing to train on; fix the cause, then "
        f"collect under a new collection id{top}",
        code=1,
    )


def _config(path: Path | None, flags: dict[str, Any], sets: list[str] | None, transitions: int | None) -> FocusConfig:
    """The configuration, with a collection id (a new one unless named)."""
    from flows.preflight import new_collection_id

    cfg = load_with_budget(path, flags, sets, transitions)
    return cfg if cfg.collection_id else cfg.with_updates(collection_id=new_collection_id())


def _run(
    out: Console,
    cfg: FocusConfig,
    resume: str,
    *,
    prefect: bool,
    warm: WarmServer | None,
    as_json: bool,
    allow: bool = False,
) -> dict[str, Any] | None:
    """Preflight, services and the collection; its result (``None``: it was finished
    already, and that was printed). ``resume``: the command line that resumes it."""
    from flows.preflight import preflight
    from flows.server import configured_api_url

    # Every check before the work, inside the one-line boundary: a check that raised
    # instead of returning its line (httpx's IDNAError for a host name no lookup takes)
    # showed a rich traceback. An error nobody described is still one line, exit 1, its
    # traceback in the log file (--debug: on the terminal), as for a bug anywhere else.
    try:
        pre = preflight(cfg, allow_policy_change=allow)
        unserved = None if pre.finished is not None else _unanswered(cfg)
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        out.fail(e)
    if pre.finished is not None:
        _print_finished(cfg, pre.finished, as_json)
        _fail_if_all_failed({"stats": pre.finished.get("summary", {}), **pre.finished})
        return None
    if unserved:
        fail(unserved)
    if pre.damaged:
        typer.secho(f"warning: {pre.damaged}; writing the batch again", fg=typer.colors.YELLOW, err=True)
    # With no Prefect server to keep the run, a temporary one would record it only to
    # forget it: run the collection directly (flows/direct.py; same store, same resume).
    orchestrated = prefect or bool(configured_api_url())
    with one_line_ending(out, resume, lambda: _finished_line(cfg)) as interrupts:
        with started(out, cfg, prefect=orchestrated, warm=warm, interrupts=interrupts) as ready:
            if orchestrated:
                from flows.collect import collect as collect_flow

                return dict(interrupts.run(collect_flow(ready, allow)))
            from flows.direct import collect_direct

            return interrupts.run(collect_direct(ready, allow, pre.fingerprint))  # not read again


def _unanswered(cfg: FocusConfig) -> str | None:
    """One line if a service ``cfg`` names cannot serve the collection: nothing takes a
    connection (:func:`flows.preflight.unreachable`), the server does not serve
    ``model.model``, or it is no model server; ``None`` when all can."""
    from flows.preflight import unreachable

    return unreachable(cfg) or _unserved_model(cfg) or _no_endpoint(cfg)


def _finished_line(cfg: FocusConfig) -> str | None:
    """What an interrupted collection finished all the same: a signal that comes while
    the batch is written lets the write (and the export's record) complete, and the line
    said "interrupted ... resume with" of a collection whose rerun said it was finished.

    Asked with the quick retries of the store check and the lease (3 attempts, S3's read
    timeout 5 s), not a step's patient ones: a Ctrl-C while the store was unreachable
    printed its line only after 8 more attempts, 14 s of silence (27 s from the Ctrl-C
    with the save under way). A store that does not answer now gives the usual line,
    which holds either way: a rerun finds the batch, or resumes."""
    from storage import BatchStore, CheckpointStore, Retry
    from storage.lease_object import quick_reads
    from tasks.journal import CheckpointJournal

    root = cfg.storage.root
    quick, options = Retry(attempts=3, backoff_s=0.2, max_backoff_s=2.0), quick_reads(root, None)
    stores = (
        CheckpointStore(root, storage_options=options, retry=quick),
        BatchStore(root, storage_options=options, retry=quick),
    )
    done = CheckpointJournal(cfg, *stores).finished_export()
    if done is None:
        return None
    return (
        f"the batch's write had begun and was completed first: the collection is finished, its batch is "
        f"{done['batch_url']} (a rerun prints its statistics)"
    )


def _unserved_model(cfg: FocusConfig) -> str | None:
    """Whether an OpenAI-compatible server the configuration names serves ``model.model``
    (:func:`focus.backends.openai_compat.unserved_model`): one line if one does not."""
    m = cfg.model
    urls = m.urls or ([m.url] if m.url else [])
    if m.kind not in ("openai", "local") or not urls:
        return None
    from focus.backends.openai_compat import DEFAULT_MODEL, unserved_model

    model = m.model or m.options.get("model") or DEFAULT_MODEL
    # a server that wants a key answers 401 here, which says nothing: its first call will
    return next((line for u in urls if (line := unserved_model(u, str(model)))), None)


def _no_endpoint(cfg: FocusConfig) -> str | None:
    """Whether a server ``model.url`` (``model.urls``) names answers HTTP without the
    generation endpoint its client posts to (:func:`focus.backends.reach.no_generation_endpoint`):
    a plain web server or another API on the port failed every rollout of the first
    wave, a progress line each, before its one line."""
    m = cfg.model
    urls = m.urls or ([m.url] if m.url else [])
    if m.kind not in SERVED or not urls:
        return None
    from focus.backends import LlamaCppPolicy, OpenAICompatPolicy, SGLangPolicy
    from focus.backends.reach import no_generation_endpoint
    from tasks.config import ConfigError
    from tasks.config.build import api_key

    path = {"sglang": SGLangPolicy.path, "llamacpp": LlamaCppPolicy.path}.get(m.kind, OpenAICompatPolicy.path)
    try:
        key = api_key(m.api_key_env)
    except ConfigError:
        key = None  # the client's construction says so
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    field = "model.urls" if m.urls else FLAG_NAMES[0]
    for url in urls:
        root = str(url).rstrip("/")
        root = root[: -len("/v1")] if root.endswith("/v1") else root
        if line := no_generation_endpoint(root, path, headers=headers, field=field, kind=m.kind):
            return line
    return None


def _print_finished(cfg: FocusConfig, finished: dict[str, Any], as_json: bool) -> None:
    stats = {**finished.get("summary", {}), "cli_wall_s": round(time.perf_counter() - T0, 3)}
    result = {
        "collection_id": cfg.collection_id,
        "batch_url": finished["batch_url"],
        "stats": stats,
        "failure_causes": finished.get("failure_causes", {}),
        "already_finished": True,
    }
    if as_json:
        typer.echo(json.dumps(result, default=str))
    else:
        print_result(result, " (already finished: nothing to do)")
