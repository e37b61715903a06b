"""BM25 over the corpus (bm25s), built once per env and shipped with it to workers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from examples.browse.corpus import Document


@dataclass(frozen=True)
class Hit:
    doc_id: str
    title: str
    score: float


class BM25Index:
    """Ranks documents (title and text) for a free-text query with bm25s."""

    def __init__(self, documents: tuple[Document, ...] | list[Document]) -> None:
        import bm25s

        if not documents:
            raise ValueError("BM25Index needs at least one document")
        self.documents = tuple(documents)
        self._retriever: Any = bm25s.BM25()
        corpus = [f"{d.title}. {d.text}" for d in self.documents]
        self._retriever.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str, k: int = 5) -> list[Hit]:
        import bm25s

        if not query.strip():
            return []
        tokens = bm25s.tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:  # only stopwords
            return []
        k = max(1, min(k, len(self.documents)))
        docs, scores = self._retriever.retrieve(tokens, k=k, show_progress=False, n_threads=1)
        hits = []
        for i, s in zip(docs[0], scores[0], strict=True):
            if float(s) > 0:
                d = self.documents[int(i)]
                hits.append(Hit(d.id, d.title, float(s)))
        return hits
