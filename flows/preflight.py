"""What ``focus collect`` decides before Prefect, Dask or a model server start.

A rerun of a finished collection, a collection id reused with another configuration, a
factory that does not import, a storage root that cannot be reached, read or written:
each is known from the configuration and a few small reads of the store, in well under
a second, and used to surface only after a Prefect server, a Dask cluster and the model
server had started (15-45 s, hundreds of lines). :func:`preflight` reads the checkpoint
store directly - the same checkpoints and the same comparison the flow's ``check-config``
step uses - and starts nothing.

The one thing it cannot know is the policy version of an embedded model it has not
started yet (the server reports it); when the configuration leaves it open, that field
is left out of the comparison here, and the flow's own check compares it once the server
is up.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import shutil
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tasks.config import ConfigError, FocusConfig, check_factories

#: Below this many free bytes a local store is treated as full before anything starts.
MIN_FREE_BYTES = 1 << 20


@dataclass(frozen=True)
class Preflight:
    """What the store says about a collection before it runs."""

    config: FocusConfig
    #: The stored result of a finished collection whose batch checks out (``None``: not finished).
    finished: dict[str, Any] | None = None
    #: Whether the collection exists (its configuration is stored) and will be resumed.
    resumed: bool = False
    #: Why a finished collection's batch must be written again (``None``: nothing to repair).
    damaged: str | None = None
    #: The stored configuration record read here, the collection's records checked with
    #: it (``None``: none is stored): the collection that follows in this process takes
    #: both from here instead of asking the store again (``CheckpointJournal.read_by_preflight``).
    fingerprint: dict[str, Any] | None = None


def new_collection_id(prefix: str = "collect", when: datetime | None = None, token: str | None = None) -> str:
    """A readable, unique collection id: ``<prefix>-<UTC yyyymmdd-HHMMSS>-<6 hex>``.

    The time sorts ids in the order runs were scheduled; the hex part is random (a fresh
    UUID's or the flow run id's random tail), so ids of runs scheduled in the same second
    differ. Flow run ids are time-ordered UUIDs whose first characters are the time:
    their prefixes collided for runs created together, which is why the tail is used.
    """
    when = when or datetime.now(UTC)
    token = (token or uuid.uuid4().hex).replace("-", "")[-6:]
    clean = "".join(c if c.isalnum() or c in "-_." else "-" for c in prefix).strip("-.") or "collect"
    return f"{clean[:80]}-{when.astimezone(UTC):%Y%m%d-%H%M%S}-{token}"


def _embedded_version_open(config: FocusConfig) -> bool:
    return config.model.kind == "local" and config.model.url is None and config.model.policy_version is None


def check_weights(config: FocusConfig) -> None:
    """A local weights file the embedded model server would start from must exist and be
    one: a missing or unreadable one fails here, before the server starts, not as the
    server's traceback. (Reading it takes milliseconds and no torch.)"""
    m = config.model
    if m.kind != "local" or m.url is not None or not m.weights:
        return
    path = m.weights.removeprefix("file://")
    if "://" in path:
        return  # a URL: the server says whether it can read it
    if not os.path.isfile(path):
        what = "a folder" if os.path.isdir(path) else "no such file"
        raise ConfigError(f"model.weights {m.weights!r}: {what}; give the path of a tinylm weights file")
    from focus.tinylm.arch import read_weights

    try:
        read_weights(path)
    except (ValueError, OSError) as e:
        raise ConfigError(f"model.weights {m.weights!r}: {str(e).removeprefix(f'{path} is ')}") from None


def check_torch(config: FocusConfig, *, training: bool) -> None:
    """What needs torch (the local trainer, the local critic) fails here when torch is not
    installed, with the extra that brings it; collecting with the embedded model does
    not need it."""
    needs = []
    if training and config.train.trainer == "local":
        needs.append("train.trainer 'local'")
    if config.critic.kind == "local":
        needs.append("critic.kind 'local'")
    if not needs:
        return
    try:
        missing = importlib.util.find_spec("torch") is None
    except ImportError:
        missing = True
    if missing:
        verb = "need" if len(needs) > 1 else "needs"
        raise ConfigError(f"{' and '.join(needs)} {verb} torch, which is not installed: pip install 'focus-rl[train]'")


#: The folders a store keeps under its root (``storage``): a file at one of those names
#: failed the run with the OS's error, for ``batches`` once every rollout had run.
STORE_FOLDERS = ("batches", "checkpoints", "leases", "_staging", "weights")


@dataclass(frozen=True)
class CommandNames:
    """How a ``focus`` command's lines name the settings :func:`unreachable` checks: as
    its user sets them (its flags). Set in :data:`COMMAND_NAMES` by the command."""

    model_url: str = "model.url"
    dask_address: str = "execution.address"
    #: How to run without a scheduler (rollouts in-process).
    dask_unset: str = "leave it out to run rollouts in-process"


#: The command's names (:class:`CommandNames`), or None in a flow run a deployment
#: started, whose user set the run's ``config`` parameter (or the worker's ``FOCUS_*``
#: variables), not a flag: its lines said ``check model.url (--model-url)``.
COMMAND_NAMES: ContextVar[CommandNames | None] = ContextVar("focus_command_names", default=None)


def run_setting(field: str, value: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """How a flow run's line names the setting ``field``: the ``FOCUS_*`` variable of the
    process running it when that is where ``value`` came from (``None``: any value),
    else the field of the run's ``config`` parameter (:func:`tasks.config.config_at_runtime`)."""
    env = os.environ if environ is None else environ
    var = "FOCUS_" + field.upper().replace(".", "__")
    if env.get(var) and (value is None or env[var].rstrip("/") == value.rstrip("/")):
        return f"{var} (where this flow run runs)"
    return f"the {field} field of the run's config parameter"


def unreachable(config: FocusConfig) -> str | None:
    """One line if no model service ``config`` names, or its HTTP critic, takes a connection
    within its ``http.first_contact_s`` (:func:`focus.backends.reach.first_contact`), or its
    Dask scheduler does not (:func:`~focus.backends.reach.scheduler_contact`); asked once a run has work to do
    (``focus collect`` after its finished check, a train loop when a step first needs the
    model). A wrong URL failed after ``model.http.outage_wait_s`` (300 s), as an outage,
    and a wrong scheduler port after Dask's connect timeout (30 s). The line names the
    setting as the command (:data:`COMMAND_NAMES`) or the flow run's user set it."""
    from focus.backends.reach import first_contact, scheduler_contact
    from tasks.config.schema import SERVED

    m, ex = config.model, config.execution
    urls = m.urls or ([m.url] if m.url else [])
    names = COMMAND_NAMES.get()
    if m.kind in SERVED and urls:
        if m.urls:
            field = "model.urls" if names is not None else run_setting("model.urls")
        else:
            field = names.model_url if names is not None else run_setting("model.url", str(m.url))
        if line := first_contact([str(u) for u in urls], grace_s=m.http.first_contact_s, field=field):
            return line
    critic = config.critic
    if critic.kind == "http" and critic.url:  # waited out as an outage, after the evidence, before
        field = "critic.url" if names is not None else run_setting("critic.url", str(critic.url))
        grace_s = critic.http.first_contact_s
        if line := first_contact([str(critic.url)], grace_s=grace_s, field=field, service="critic"):
            return line
    if not (ex.kind == "dask" and ex.address):
        return None
    if names is not None:
        return scheduler_contact(ex.address, field=names.dask_address, unset=names.dask_unset)
    return scheduler_contact(
        ex.address, field=run_setting("execution.address", ex.address), unset="leave it out to run rollouts in-process"
    )


class ChecksReach:
    """A journal mixin: a model URL or Dask scheduler nothing answers fails the collection
    in seconds, with :func:`unreachable`'s line, once it has work to do (after its
    finished check, whose answer it keeps: :attr:`finished_before`). A deployment's run, which no ``focus`` command checked, waited out
    ``model.http.outage_wait_s`` (300 s) as for an outage, its log silent, then failed
    as one (``tests/test_flow_run_page.py``)."""

    config: FocusConfig
    #: Whether the collection was finished before this run (its stored export reused).
    finished_before = False

    async def finished(self) -> dict[str, Any] | None:
        import asyncio

        from tasks.config import ConfigError

        result: dict[str, Any] | None = await super().finished()  # type: ignore[misc]
        self.finished_before = result is not None
        if result is None and (line := await asyncio.to_thread(unreachable, self.config)):
            raise ConfigError(line)
        return result

    @property
    def batch_said(self) -> str:
        """How the run's last line names its batch: the UI said ``batch at <url>`` of a rerun that ran nothing too."""
        return "finished before, nothing run again; its batch is at" if self.finished_before else "batch at"


#: What a line about a local root that cannot be written tells the reader to do.
GIVE_STORE = "give --store a folder you can write (or set storage.root in the config)"


def check_root(root: str, give: str = GIVE_STORE) -> None:
    """Fail with a storage error naming the cause if ``root`` cannot be used: a local
    folder that is not writable or whose disk is full, a bucket that does not exist or
    refuses the credentials, an endpoint that does not answer (after the store's retries).
    ``give``: what to do about a folder that cannot be written, named as the caller's user
    sets the root (the examples' ``--out``)."""
    from storage.errors import RootNotAFolder, RootNotFound, StorageAccessDenied, StorageFull
    from storage.urls import Location, Retry, retrying

    loc = Location(root)
    if loc.protocol == "file":
        path = loc.path(loc.root)
        probe = path
        while not os.path.exists(probe):
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
        if not os.path.isdir(probe):
            raise RootNotAFolder(f"storage root {root}: {probe} is a file, not a folder")
        # before the permission check: /proc is writable to root alone, and a user
        # other than root was told "permission denied", which no permission fixes
        if os.statvfs(probe).f_blocks == 0:  # procfs, sysfs: no storage to write to
            raise RootNotFound(
                f"storage root {root}: {probe} is on a virtual file system that stores nothing (no blocks)"
            )
        if not os.access(probe, os.W_OK | os.X_OK):
            ro = _read_only(probe)
            # the default root is ./runs: a command run in a folder it cannot write named
            # the folder, not how to keep the store elsewhere
            raise StorageAccessDenied(
                f"storage root {root}: {probe} is "
                + ("on a read-only file system" if ro else "not writable (permission denied)")
                + f"; {give}"
            )
        if shutil.disk_usage(probe).free < MIN_FREE_BYTES:
            raise StorageFull(f"storage root {root}: no space left on the device of {probe}")
        for folder in STORE_FOLDERS:
            if os.path.isfile(inside := os.path.join(path, folder)):
                raise RootNotAFolder(
                    f"storage root {root}: {inside} is a file, not a folder (the store keeps its {folder} there)"
                )
        return
    if loc.protocol in ("s3", "s3a", "gs", "gcs", "abfs", "az"):
        bucket = loc.root.partition("://")[2].split("/", 1)[0]
        try:
            # quick, unlike the steps' patient retries: an endpoint down or a typo at the
            # start is answered in about a second, before anything runs
            quick = Retry(attempts=3, backoff_s=0.2, max_backoff_s=2.0)
            retrying(lambda: loc.fs.info(bucket), f"open bucket {bucket!r} of {root}", quick)
        except FileNotFoundError:
            raise RootNotFound(
                f"storage root {root}: bucket {bucket!r} does not exist{_at(loc)}; create it or fix storage.root "
                "(or the endpoint: AWS_ENDPOINT_URL)"
            ) from None
        except StorageAccessDenied as e:
            if not isinstance(e.__cause__, PermissionError):  # no credentials; a 400 without a reason
                raise StorageAccessDenied(f"storage root {root}: {e}") from e
            raise StorageAccessDenied(
                f"storage root {root}: access to bucket {bucket!r} denied ({e.__cause__ or e}); check the "
                "credentials (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY; AWS_SESSION_TOKEN, which expires) "
                "and the bucket's policy"
            ) from e


def _at(loc: Any) -> str:
    """' at <endpoint>' the S3 client asked, if known: a bucket 'missing' from another
    server than meant (an AWS_ENDPOINT_URL left over, a MinIO or R2 endpoint mistyped)."""
    try:
        url = loc.fs.s3.meta.endpoint_url
    except AttributeError:
        return ""
    return f" at {url}" if isinstance(url, str) and url else ""


def _read_only(path: str) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError as e:
        return e.errno == errno.EROFS


def preflight(config: FocusConfig, *, allow_policy_change: bool = False) -> Preflight:
    """Check ``config`` against its store before anything starts (see the module docs).

    Raises :class:`tasks.config.ConfigError` (a factory that does not import or take its
    options), a :class:`storage.StorageError` (a root that cannot be used, a damaged
    checkpoint) or :class:`tasks.fingerprint.ResumeMismatch`.
    """
    from tasks.fingerprint import fingerprint, resume_mismatch, without
    from tasks.gaps import check_records
    from tasks.journal import CheckpointJournal

    check_factories(config)
    check_weights(config)
    check_torch(config, training=False)
    check_root(config.storage.root)
    if not config.collection_id:
        return Preflight(config)
    journal = CheckpointJournal(config, allow_policy_change=allow_policy_change)
    check_records(journal)
    stored = journal.stored_fingerprint()
    if stored is None:
        return Preflight(config)
    mine, compared = fingerprint(config), stored
    if _embedded_version_open(config):
        # the server started later reports the version; the flow compares it then
        compared, mine = (without(f, ("model.policy_version",)) for f in (stored, mine))
    error = resume_mismatch(config, compared, mine, allow_policy_change=allow_policy_change)
    if error is not None:
        raise error
    finished = journal.finished_export()
    return Preflight(config, finished=finished, resumed=True, damaged=journal.damaged, fingerprint=stored)


def collection_id_for_run(config: FocusConfig) -> FocusConfig:
    """Give the config a collection id: its own, or one derived from the flow run (its
    deployment's name, scheduled start and id), so a retry of the same flow run resumes
    the same collection and runs scheduled together get different ones."""
    if config.collection_id:
        return config
    return config.with_updates(collection_id=_run_collection_id())


def _run_collection_id() -> str:
    """The collection id of a flow run whose config names none (the same for its retries)."""
    from prefect.runtime import deployment, flow_run

    run_id = str(flow_run.id or "")
    prefix = str(deployment.name or flow_run.name or "collect")
    when = flow_run.scheduled_start_time if run_id else None
    return new_collection_id(prefix, when, run_id or None)


def flow_run_name() -> str:
    """Name a flow run after its collection: the one its config names, else the one
    :func:`collection_id_for_run` derives for it. A scheduled or Quick run kept Prefect's
    random name (``sepia-chachalaca``) while it collected ``scheduled-20261206-234100-
    3f9a2c``: nothing in the UI's list of runs tied a run to its collection and batch.
    Evaluated when the run starts, from what the id is derived from (its deployment's
    name, scheduled start and run id), so it is the same id."""
    from prefect.runtime import deployment, flow_run

    cfg = flow_run.parameters.get("config")
    cid = getattr(cfg, "collection_id", None) or (cfg.get("collection_id") if isinstance(cfg, dict) else None)
    cid = cid or os.environ.get("FOCUS_COLLECTION_ID")  # the worker's variable, as config_at_runtime reads it
    # a run of no deployment derives its id from its own name: it keeps that name
    return str(cid or (_run_collection_id() if deployment.name else flow_run.name))


# One log line when a run's ``config`` leaves out fields its deployment stores.
#
# Prefect merges a run's parameters into its deployment's at the top level only (the
# server's ``dict.update``; ``prefect deployment run --param``/``--params`` and the API
# alike), so a run that passes ``config`` replaces the deployment's stored ``config``
# whole: ``{"seed": 5}`` against a deployment that stores ``model.kind = "openai"`` and
# its URL samples from the embedded model. That is Prefect's rule for every parameter,
# and the UI's Custom run relies on it (its form starts from the stored values, so a field
# the operator clears is one the run does not set), so FOCUS keeps it rather than merging
# ``config`` key by key, where a cleared field would come back from the deployment. What it
# adds is that the run says so: the stored fields the run's ``config`` does not name, in
# one WARNING line of the run's log (docs/pipeline.md, "Run-time configuration"). The same
# read of the deployment tells whether its parameter schema is open (deployments/pool.py).


def left_out(stored: Mapping[str, Any], given: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted names of the fields ``stored`` sets and ``given`` does not (a list is one field)."""
    out: list[str] = []
    for key, value in stored.items():
        name = f"{prefix}{key}"
        if key not in given:
            out.append(name)
        elif isinstance(value, Mapping) and value and isinstance(given[key], Mapping):
            out += left_out(value, given[key], name + ".")
    return out


async def note_deployment(config: Any, log: Any) -> list[str]:
    """Log which fields of the deployment's stored ``config`` this run's ``config`` (as the
    API sent it) leaves out, and whether the deployment's parameter schema is open; the
    names left out. Nothing for a run of no deployment; no names for a run that passed no
    ``config`` (it got the stored one) or a ``config`` that is no mapping (the
    configuration's own check names that). A failed read of the deployment is not the
    run's failure: it is skipped."""
    deployment_id = getattr(_context_run(), "deployment_id", None)
    if deployment_id is None:
        return []
    from prefect.client.orchestration import get_client

    try:
        async with get_client() as client:
            deployment = await client.read_deployment(deployment_id)
    except Exception:  # noqa: BLE001 - a note, never a reason to fail the run
        return []
    if (deployment.parameter_openapi_schema or {}).get("additionalProperties") is not False:
        # `prefect deploy` stores it so (deployments/pool.py): a run naming a parameter the
        # flow lacks is accepted, and crashes before the flow begins, the cause only on the worker
        log.warning(
            "deployment %r takes runs with parameters its flow does not take (its parameter schema is open, as "
            "prefect deploy stores it); run 'focus deploy --work-pool' against this server to close it",
            deployment.name,
        )
    from tasks.config.form import from_form

    stored, given = from_form((deployment.parameters or {}).get("config")), from_form(config)
    names = left_out(stored, given) if isinstance(stored, Mapping) and isinstance(given, Mapping) else []
    if names:
        log.warning(
            "config: this run's config replaces the one deployment %r stores, whole (Prefect merges a "
            "run's parameters at the top level only); not applied from the deployment: %s. Send them in "
            "the run's config to keep them",
            deployment.name,
            ", ".join(names),
        )
    return names


def _context_run() -> Any:
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    return context.flow_run if context is not None else None
