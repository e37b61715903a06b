"""``focus inspect``: the summary of a stored batch, or the iterations of a collection."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.common import fail, fmt, pairs_table
from flows.errors import one_line

if TYPE_CHECKING:
    from focus.batch import Batch
    from storage import BatchStore


def _split_batch_url(url: str) -> tuple[str, str, str | None]:
    """(store root, collection id, iteration folder or ``None``) of a batch or collection URL."""
    root, sep, rest = url.rstrip("/").rpartition("/batches/")
    if not sep or not rest:
        fail(
            f"{url!r} is neither a batch URL (<root>/batches/<collection>/iter-<n>) "
            "nor a collection folder (<root>/batches/<collection>)"
        )
    cid, _, it = rest.partition("/")
    return root, cid, it or None


def inspect(
    url: Annotated[str, typer.Argument(help="A batch URL printed by 'focus collect', or a collection folder.")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
) -> None:
    """Summary of a stored batch (rows, tokens, advantages, critic targets, every phase),
    or the iterations of a collection folder."""
    from rich.console import Console

    from storage import BatchStore

    root, cid, it = _split_batch_url(url)
    console = Console()
    try:
        store = BatchStore(root)
        if it is None:
            listing = collection_summary(store, cid)
            if not listing["iterations"]:
                fail(f"no finished batch in {url} (a batch exists once its _manifest.json is written)", 1)
            if as_json:
                typer.echo(json.dumps(listing, default=str))
            else:
                console.print(_iterations_table(listing))
            return
        summary = batch_summary(store.read(url))
    except typer.Exit:
        raise
    except Exception as e:  # noqa: BLE001 - every error becomes one line
        fail(f"cannot read batch: {one_line(e)}", 1)
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
    """Plain figures of a batch (what ``focus inspect`` shows)."""
    import numpy as np

    adv = np.array([r.advantage for r in batch.actor], dtype=float)
    tgt = np.array([r.target for r in batch.critic], dtype=float)
    out = dict(batch.summary())
    out["policy_versions"] = sorted({r.policy_version for r in batch.actor})
    out["advantage_mean"] = float(adv.mean()) if adv.size else None
    out["advantage_std"] = float(adv.std()) if adv.size else None
    out["critic_target_mean"] = float(tgt.mean()) if tgt.size else None
    out["phases"] = batch.stats.get("phases", [])
    out["failure_causes"] = batch.stats.get("failure_causes", {})
    return out


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


def _iterations_table(listing: dict[str, Any]) -> Any:
    from rich.table import Table

    rows = listing["iterations"]
    table = Table(
        title=f"collection {listing['collection_id']}: {len(rows)} finished iteration(s)", title_justify="left"
    )
    cols = [c for c in rows[0] if c != "url"] + ["url"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("written", "url") else "right", overflow="fold")
    for r in rows:
        table.add_row(*[fmt(r[c]) for c in cols])
    return table


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
