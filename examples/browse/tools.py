"""Browser tools over the corpus, with each branch's navigation in its own workspace.

The navigation of a branch - the pages it visited and the searches it ran, the page
it has open, its notes - lives in the branch's :class:`focus.workspace.Workspace`
(files ``nav/history.jsonl``, ``nav/open``, ``nav/notes.md``), never in the tools or
the env. When search continues two branches from one checkpoint, each gets a fork of
the checkpoint's workspace, so one branch opening a page does not move the other.

Tools: ``search(query)``, ``open(doc_id)``, ``find(text)`` in the open page,
``note(text)``, and ``back()`` to the previous page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from examples.browse.corpus import Corpus
from examples.browse.search import BM25Index
from focus.tools import Tool, ToolContext
from focus.workspace import Workspace

HISTORY, OPEN, NOTES = "nav/history.jsonl", "nav/open", "nav/notes.md"


@dataclass(frozen=True)
class Navigation:
    """A read-only view of a workspace's navigation (for tests, reports and judges)."""

    history: tuple[dict[str, Any], ...]
    open_page: str | None
    notes: str

    @classmethod
    def of(cls, ws: Workspace) -> Navigation:
        history = tuple(json.loads(line) for line in _read(ws, HISTORY).splitlines() if line)
        return cls(history, _read(ws, OPEN) or None, _read(ws, NOTES))


def _read(ws: Workspace, path: str) -> str:
    try:
        return ws.read_text(path)
    except FileNotFoundError:
        return ""


def _need(ctx: ToolContext) -> Workspace:
    if ctx.workspace is None:
        raise RuntimeError("browser tools need a workspace: build the env with browse_env()")
    return ctx.workspace


def _log(ws: Workspace, entry: dict[str, Any]) -> None:
    ws.write_text(HISTORY, _read(ws, HISTORY) + json.dumps(entry, sort_keys=True) + "\n")


def browser_tools(corpus: Corpus, index: BM25Index | None = None, *, k: int = 5, page_chars: int = 1200) -> list[Tool]:
    """The five browser tools over ``corpus`` (a BM25 index is built if none is given)."""
    index = index or BM25Index(corpus.documents)
    by_id = {d.id: d for d in corpus.documents}

    def search(args: Mapping[str, Any], ctx: ToolContext) -> str:
        ws = _need(ctx)
        query = str(args["query"])
        hits = index.search(query, k)
        _log(ws, {"action": "search", "query": query, "results": [h.doc_id for h in hits]})
        if not hits:
            return f"No results for {query!r}."
        return "\n".join(f"{h.doc_id}: {h.title}" for h in hits)

    def open_(args: Mapping[str, Any], ctx: ToolContext) -> str:
        ws = _need(ctx)
        doc_id = str(args["doc_id"]).strip()
        doc = by_id.get(doc_id)
        if doc is None:
            return f"No document {doc_id!r}. Use an id from the search results (like d012)."
        ws.write_text(OPEN, doc_id)
        _log(ws, {"action": "open", "doc_id": doc_id})
        return f"[{doc.id}] {doc.title}\n{doc.text[:page_chars]}"

    def find(args: Mapping[str, Any], ctx: ToolContext) -> str:
        ws = _need(ctx)
        current = _read(ws, OPEN)
        if not current:
            return "No page is open. Open a document first."
        needle = str(args["text"]).lower()
        sentences = [s.strip() for s in by_id[current].text.split(".") if needle in s.lower()]
        _log(ws, {"action": "find", "doc_id": current, "text": needle, "matches": len(sentences)})
        return "\n".join(s + "." for s in sentences) if sentences else f"{args['text']!r} is not on page {current}."

    def note(args: Mapping[str, Any], ctx: ToolContext) -> str:
        ws = _need(ctx)
        ws.write_text(NOTES, _read(ws, NOTES) + str(args["text"]).strip() + "\n")
        return "Noted."

    def back(args: Mapping[str, Any], ctx: ToolContext) -> str:
        ws = _need(ctx)
        opened = [e["doc_id"] for e in Navigation.of(ws).history if e["action"] == "open"]
        if len(opened) < 2:
            return "There is no previous page."
        ws.write_text(OPEN, opened[-2])
        _log(ws, {"action": "open", "doc_id": opened[-2], "via": "back"})
        doc = by_id[opened[-2]]
        return f"[{doc.id}] {doc.title}\n{doc.text[:page_chars]}"

    def obj(**props: Any) -> dict[str, Any]:
        return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}

    return [
        Tool(
            "search", "BM25 search over the documents; returns ids and titles.", obj(query={"type": "string"}), search
        ),
        Tool("open", "Open a document by id; shows its text.", obj(doc_id={"type": "string"}), open_),
        Tool("find", "Sentences of the open page containing some text.", obj(text={"type": "string"}), find),
        Tool("note", "Write a note to keep in this branch's notes.", obj(text={"type": "string"}), note),
        Tool("back", "Go back to the previously opened page.", obj(), back),
    ]
