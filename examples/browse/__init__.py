"""BrowseComp-Plus style example: BM25 browser tools over a generated multi-hop corpus."""

from examples.browse.corpus import Corpus, Document, Question, generate_corpus
from examples.browse.env import browse_env, browse_tasks, judge_answer
from examples.browse.search import BM25Index
from examples.browse.tools import Navigation, browser_tools

__all__ = [
    "BM25Index",
    "Corpus",
    "Document",
    "Navigation",
    "Question",
    "browse_env",
    "browse_tasks",
    "browser_tools",
    "generate_corpus",
    "judge_answer",
]
