"""The browse environment: browser tools, a per-branch workspace and an answer judge."""

from __future__ import annotations

import re
import string

from examples.browse.corpus import Corpus, generate_corpus
from examples.browse.search import BM25Index
from examples.browse.tools import browser_tools
from focus.env import Task
from focus.tools import ToolEnv
from focus.workspace import MemoryWorkspace

INSTRUCTIONS = (
    "Answer the question by searching and reading the documents. "
    'Call a tool with <tool_call>{"name": ..., "arguments": {...}}</tool_call>; '
    "give the final answer as <answer>...</answer>, a name only."
)


def normalize(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces (SQuAD-style)."""
    text = text.lower().translate(str.maketrans("", "", string.punctuation))
    text = re.sub(r"\b(a|an|the|town|region|of)\b", " ", text)
    return " ".join(text.split())


def judge_answer(predicted: str, gold: str) -> float:
    """1.0 when the normalized answer is the gold name, or a short answer containing it
    ("the town of Tuvengar"); 0.0 otherwise, including long answers that list many names."""
    p, g = normalize(predicted), normalize(gold)
    if not g:
        raise ValueError(f"gold answer {gold!r} is empty after normalization")
    if p == g:
        return 1.0
    words = p.split()
    return 1.0 if g in words and len(words) <= len(g.split()) + 3 else 0.0


def browse_tasks(corpus: Corpus) -> list[Task]:
    return [Task(q.id, {"question": q.question, "answer": q.answer, "hops": list(q.hops)}) for q in corpus.questions]


def browse_env(corpus: Corpus | None = None, *, max_tool_calls: int = 8) -> ToolEnv:
    """A ToolEnv over ``corpus`` (default: the generated corpus of seed 0).

    Each episode starts with an empty in-memory workspace; the Agent forks it with the
    branch state, so siblings continue from the same navigation and then diverge.
    """
    corpus = corpus or generate_corpus()
    tools = browser_tools(corpus, BM25Index(corpus.documents))
    return ToolEnv(
        tools,
        lambda task, answer: judge_answer(answer, str(task.data["answer"])),
        instructions=INSTRUCTIONS,
        prompt_key="question",
        max_tool_calls=max_tool_calls,
        workspace_factory=lambda task: MemoryWorkspace(),
    )
