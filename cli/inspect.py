"""``focus inspect``: the summary of a stored batch, or the iterations of a collection."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import fail, fmt, pairs_table, pasteable
from flows.errors import one_line

if TYPE_CHECKING:
    from focus.batch import Batch
    from storage import BatchStore


def _split_batch_url(url: str) -> tuple[str, str, str | None]:
    """(store root, collection id, iteration folder or ``None``) of a batch or collection URL."""
    root, sep, rest = url.rstrip("/").rpartition("/batches/")
    if not sep or not rest:
        if (line := _store_root(url)) is not None:
            fail(line)
        if "://" not in url and not os.path.exists(url):
            fail(
                f"{url!r} does not exist: give a batch URL (<root>/batches/<collection>/iter-<n>) or a collection folder"
            )
        fail(
            f"{url!r} is neither a batch URL (<root>/batches/<collection>/iter-<n>) "
            "nor a collection folder (<root>/batches/<collection>)"
        )
    cid, _, it = rest.partition("/")
    return root, cid, it or None


#: The folders of a store root that ``focus inspect`` reads one entry of: (folder, what
#: its entries are, what that folder is).
STORE_FOLDERS = (
    ("batches", "collection", "a folder of batches per collection"),
    ("weights", "train loop", "the weights each train loop published and its metrics, a folder per loop"),
)


def _store_root(url: str, most: int = 8) -> str | None:
    """The line for ``url`` that is a store root (or its ``batches``/``weights`` folder)
    rather than one batch, collection or train loop: what it is, what it holds and how to
    inspect each (the first ``most`` names of each kind); ``None`` when the store holds
    neither (or cannot be listed), and the generic line stands. The ``weights`` folder
    was said to 'hold' the store's collections (and the ``batches`` folder its loops):
    each folder now names what it keeps, and the rest of the store comes after it."""
    from storage.urls import Location

    top = url.rstrip("/")
    head, _, last = top.rpartition("/")
    kinds = {folder: (what, keeps) for folder, what, keeps in STORE_FOLDERS}
    root = head if head and last in kinds else top
    held = {}
    try:
        loc = Location(root)
        for folder, (what, _) in kinds.items():
            try:
                entries = loc.fs.ls(loc.path(loc.url(folder)), detail=True)
            except (FileNotFoundError, NotADirectoryError):
                continue
            names = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
            if names:
                more = f" and {len(names) - most} more" if len(names) > most else ""
                held[folder] = (
                    f"{len(names)} {what}(s): {', '.join(names[:most])}{more} "
                    f"(focus inspect {pasteable(root)}/{folder}/<id>)"
                )
    except Exception:  # noqa: BLE001 - a root that cannot be listed: the generic line
        return None
    if not held:
        return _unfinished(loc, url, most) if root == top else None
    if root == top:
        return (
            f"{url} is a store root, not a batch, a collection or a train loop; it holds {' and '.join(held.values())}"
        )
    what, keeps = kinds[last]
    line = f"{url} is the {last} folder of the store {root} ({keeps}), not a {what} itself; "
    rest = " and ".join(v for k, v in held.items() if k != last)
    if last not in held:
        return line + f"it holds no {what}; the store holds {rest}"
    return line + f"it holds {held[last]}" + (f"; the store also holds {rest}" if rest else "")


def _unfinished(loc: Any, url: str, most: int) -> str | None:
    """The line for a store root that holds saved steps and no batch or train loop yet (a
    first collection running, or stopped before its batch); it was called 'neither a batch
    URL nor a collection folder'. ``None`` when it holds none."""
    try:
        entries = loc.fs.ls(loc.path(loc.url("checkpoints")), detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return None
    names = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    if not names:
        return None
    more = f" and {len(names) - most} more" if len(names) > most else ""
    return (
        f"{url} is a store root with no finished batch yet; it holds the saved steps of {len(names)} "
        f"collection(s): {', '.join(names[:most])}{more} (running, or stopped before its batch: rerun its "
        "focus collect with the same collection id to finish it)"
    )


def inspect(
    url: Annotated[
        str,
        typer.Argument(
            help="A batch URL printed by 'focus collect', a collection folder, or a train loop's "
            "weights folder (<root>/weights/<id>).",
            metavar="URL",
        ),
    ],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Summary of a stored batch (rows, tokens, advantages, critic targets, every phase),
    the iterations of a collection folder, or a train loop's metrics per iteration."""
    from rich.console import Console

    from storage import BatchStore

    if "/weights/" in url.rstrip("/") and "/batches/" not in url:
        _loop(url, as_json)
        return
    root, cid, it = _split_batch_url(url)
    _known_protocol(root)
    console = Console()
    try:
        store = BatchStore(root)
        if it is None:
            listing = collection_summary(store, cid)
            if not listing["iterations"]:
                if (why := _bucket_error(root)) is not None:
                    fail(f"cannot read batches: {one_line(why)}", 1)
                fail(f"no finished batch in {url} (a batch exists once its _manifest.json is written)", 1)
            if as_json:
                typer.echo(json.dumps(listing, default=str))
            else:
                console.print(_iterations_table(listing), markup=False, highlight=False)
                # the folder once, on a line of its own: a URL folded in a table cell is unreadable
                console.print(
                    f"batches in {pasteable(url.rstrip('/') + '/')}", markup=False, highlight=False, soft_wrap=True
                )
            return
        summary = stored_summary(store, url)
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        fail(f"cannot read batch: {one_line(_bucket_error(root) or e)}", 1)
    if as_json:
        typer.echo(json.dumps(summary, default=str))
        return
    phases = summary.pop("phases", [])
    causes = summary.pop("failure_causes", {})
    console.print(pairs_table(f"batch {url}", list(summary.items())))
    if phases:
        console.print(_phases_table(phases))
    for cause, n in causes.items():
        console.print(f"failure cause ({n}x): {cause}", markup=False, highlight=False)


def batch_summary(batch: Batch) -> dict[str, Any]:
    """Plain figures of a batch (what ``focus inspect`` shows), from its Arrow columns:
    the typed rows it read before took 1.6 s and 280 MB more for 120k actor rows (a
    100k-transition collection), five times the read itself."""
    return _figures(batch.summary(), batch.actor_table, batch.critic_table, batch.stats)


def _figures(summary: dict[str, Any], actor: Any, critic: Any, stats: dict[str, Any]) -> dict[str, Any]:
    """``summary`` (a batch's :meth:`~focus.batch.Batch.summary`) with the policy
    versions and the means of the advantages and critic targets of its tables."""
    import pyarrow.compute as pc

    from focus.batch_schema import numpy_of  # to_numpy() imports pandas (0.2-0.3 CPU-s)

    adv = numpy_of(actor.column("advantage")).astype(float)
    tgt = numpy_of(critic.column("target")).astype(float)
    out = dict(summary)
    out["policy_versions"] = sorted(pc.unique(actor.column("policy_version")).to_pylist())
    out["advantage_mean"] = float(adv.mean()) if adv.size else None
    out["advantage_std"] = float(adv.std()) if adv.size else None
    out["critic_target_mean"] = float(tgt.mean()) if tgt.size else None
    out["phases"] = stats.get("phases", [])
    out["failure_causes"] = stats.get("failure_causes", {})
    return out


#: The columns :func:`batch_summary` reads beside what the manifest records.
SUMMARY_COLUMNS = {"actor": ["policy_version", "advantage"], "critic": ["target"]}


def stored_summary(store: BatchStore, url: str) -> dict[str, Any]:
    """:func:`batch_summary` of the batch at ``url``, reading three columns, not the batch.

    Its rows, tokens and tasks are in the manifest (``info.summary``, the batch's
    :meth:`~focus.batch.Batch.summary` when written); the means need the advantages and
    targets, not the token-id lists that are most of a batch. Reading all of it for 120k
    actor rows took 140 MB more than the imports, and a batch ten times that size ten
    times more. Every file's checksum and schema are still checked. A manifest without
    its summary (written elsewhere) gets the whole read."""
    recorded = store.manifest(url).info.get("summary")
    if not isinstance(recorded, dict) or not {"actor_rows", "critic_rows", "tokens", "tasks"} <= recorded.keys():
        return batch_summary(store.read(url))
    t = store.read_tables(url, SUMMARY_COLUMNS)
    # in the order of Batch.summary(): its counts, then the statistics' figures
    head = {k: recorded.get(k) for k in ("collection_id", "iteration", "actor_rows", "critic_rows", "tokens", "tasks")}
    figures = {k: v for k, v in t.stats.items() if not isinstance(v, (dict, list))}
    return _figures({**head, **figures}, t.actor, t.critic, t.stats)


def collection_summary(store: BatchStore, cid: str) -> dict[str, Any]:
    """The finished iterations of collection ``cid``: URL, time written and figures, from the manifests."""
    rows = []
    for batch_url in store.list(cid):
        m = store.manifest(batch_url)
        summary = m.info.get("summary", {})
        rows.append(
            {
                "iteration": m.info.get("iteration"),
                "url": batch_url,
                "written": m.created_at,
                **{
                    k: summary.get(k) for k in ("actor_rows", "critic_rows", "tokens", "transitions", "failed_rollouts")
                },
            }
        )
    return {"collection_id": cid, "iterations": sorted(rows, key=lambda r: r["iteration"] or 0)}


#: The listing's columns: (key, header), 80 columns wide; the batch by its folder name
#: (the folder is printed once below the table), the time to the minute.
LISTING = (
    ("iteration", "it"),
    ("actor_rows", "actor"),
    ("critic_rows", "critic"),
    ("tokens", "tokens"),
    ("transitions", "transitions"),
    ("failed_rollouts", "failed"),
    ("written", "written (UTC)"),
    ("url", "batch"),
)


def _iterations_table(listing: dict[str, Any]) -> str:
    """The listing as plain aligned columns, each as wide as its widest value or header."""
    rows = listing["iterations"]
    cells = [
        [fmt(_when(r[k]) if k == "written" else str(r[k]).rstrip("/").rsplit("/", 1)[-1] if k == "url" else r[k])]
        for r in rows
        for k, _ in LISTING
    ]
    table = [[h for _, h in LISTING]] + [
        [c[0] for c in cells[i * len(LISTING) : (i + 1) * len(LISTING)]] for i in range(len(rows))
    ]
    widths = [max(len(line[j]) for line in table) for j in range(len(LISTING))]
    left = {j for j, (k, _) in enumerate(LISTING) if k in ("written", "url")}
    out = [f"collection {listing['collection_id']}: {len(rows)} finished iteration(s); actor and critic rows"]
    for line in table:
        out.append(
            "  ".join(
                c.ljust(w) if j in left else c.rjust(w) for j, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    return "\n".join(x.rstrip() for x in out)


#: A train loop's columns: (metrics.jsonl key, header).
LOOP_COLUMNS = (
    ("iteration", "iteration"),
    ("return_mean", "return"),
    ("transitions", "transitions"),
    ("train_loss", "loss"),
    ("train_final_kl", "kl"),
    ("train_clip_fraction", "clip"),
    ("train_grad_norm", "grad norm"),
    ("collect_wall_s", "collect s"),
    ("train_wall_s", "train s"),
    ("eval_success_rate", "held-out"),
)


def _measured(row: dict[str, Any], key: str) -> bool:
    """Whether ``row`` has a figure for ``key``: the one-step rules (``sgd``, the default,
    and ``natural``) measure no gradient norm and record 0, which the table showed as a
    zero gradient; the live line leaves it out (``flows.loop_progress``), and so does this."""
    return row.get(key) is not None and (key != "train_grad_norm" or row[key] > 0)


def _loop(url: str, as_json: bool) -> None:
    """A train loop's ``metrics.jsonl`` (``<root>/weights/<id>``): its lines as they are
    (``--json``), or a table of the figures an RL run is judged by."""
    from flows.loop_progress import METRICS
    from storage.weights import WeightStore

    root, _, rest = url.rstrip("/").rpartition("/weights/")
    run_id = rest.split("/", 1)[0]
    _known_protocol(root)
    try:
        weights = WeightStore(root)
        data = weights.loc.cat(weights.run_file(run_id, METRICS), weights.retry)
    except FileNotFoundError:
        fail(_no_metrics(root, run_id, weights.run_file(run_id, METRICS)), 1)
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        fail(f"cannot read the metrics of train loop {run_id!r} under {root}: {one_line(e)}", 1)
    rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row))
        return
    table = [[h for _, h in LOOP_COLUMNS]]
    table += [[fmt(r[k]) if _measured(r, k) else "-" for k, _ in LOOP_COLUMNS] for r in rows]
    widths = [max(len(line[j]) for line in table) for j in range(len(LOOP_COLUMNS))]
    typer.echo(f"train loop {run_id}: {sum('train_loss' in r for r in rows)} trained iteration(s)")
    for line in table:
        typer.echo("  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)))


def _no_metrics(root: str, run_id: str, metrics: str) -> str:
    """The line for a loop without ``metrics``: one in its first iteration (its records
    are there, the file is written as each iteration ends), or no loop at all."""
    from storage import CheckpointStore

    try:
        begun = bool(CheckpointStore(root).saved(run_id))
    except Exception:  # noqa: BLE001 - an id that cannot be one, a store that does not answer: no loop found
        begun = False
    if begun:
        return f"train loop {run_id!r} under {root} has no finished iteration yet: its metrics are written as each iteration ends"
    return f"no train loop {run_id!r} under {root} (no records of it, no {metrics})"


def _when(stamp: Any) -> str:
    """An ISO time as ``YYYY-MM-DD HH:MM`` (UTC, as the manifests write it; ``--json``
    has it to the microsecond)."""
    text = str(stamp or "")
    return text[:16].replace("T", " ") if len(text) >= 16 else text


def _phases_table(phases: list[dict[str, Any]]) -> Any:
    """Every figure the batch records per phase (nothing cut): one row per figure, one
    column per phase, so many figures stay readable on a narrow terminal."""
    from rich.table import Table

    figures: list[str] = []
    for p in phases:
        figures += [k for k in p if k not in figures and k != "name"]
    table = Table(title="phases", title_justify="left")
    table.add_column("figure")
    for p in phases:
        table.add_column(str(p.get("name", "")), justify="right", overflow="fold")
    for k in figures:
        table.add_row(k, *[fmt(p.get(k, "")) for p in phases])
    return table


def _known_protocol(root: str) -> None:
    """One line and exit 2 when ``root`` names no storage protocol fsspec has (a URL typed
    wrong): the store's ``ValueError`` came back out of the error's own handler
    (:func:`_bucket_error` read the root again) as a rich traceback, exit 1."""
    from storage.urls import Location

    try:
        Location(root)
    except ValueError as e:
        fail(str(e))


def _bucket_error(root: str) -> Exception | None:
    """Why the bucket of ``root`` cannot be read (it does not exist, the credentials are
    refused or missing), or a local root that does not exist, if that is why a batch was
    not found; ``None`` for a folder or a bucket that is there. Asked only after a failed
    read: a missing bucket read as 'no batch at ...: _manifest.json is missing'."""
    from flows.preflight import check_root
    from storage.errors import RootNotFound
    from storage.urls import Location

    loc = Location(root)
    if loc.protocol == "file":  # a root typed wrong read as 'no finished batch in <root>/batches/c'
        gone = not os.path.isdir(path := loc.path(loc.root))
        return RootNotFound(f"no store at {root}: the folder {path} does not exist") if gone else None
    try:
        check_root(root)
    except Exception as e:  # noqa: BLE001 - the cause to show instead
        return e
    return None
