"""examples/browse: corpus, BM25 tools, per-branch navigation, judge, and a run."""

from __future__ import annotations

import asyncio
import json
import pickle

import pytest

from examples.browse import BM25Index, Navigation, browse_env, browse_tasks, generate_corpus, judge_answer
from examples.browse.corpus import Corpus
from examples.browse.run import main
from focus.agent import Agent
from focus.env import Action, Task
from focus.format import ByteCodec, PolicyFormat, XmlToolCallParser
from focus.testing import EnvConformance, ScriptedPolicy, run

CORPUS = generate_corpus()


def test_corpus_is_deterministic_and_questions_chain_through_documents(tmp_path):
    assert generate_corpus(0) == CORPUS != generate_corpus(1)
    assert 50 <= len(CORPUS.documents) <= 200 and len(CORPUS.questions) == 40
    for q in CORPUS.questions:
        docs = [CORPUS.doc(h) for h in q.hops]
        assert len(docs) >= 2
        # each hop's document names the next hop's title; the last one holds the answer
        for a, b in zip(docs, docs[1:], strict=False):
            assert b.title in a.text
        assert q.answer in docs[-1].text
    path = tmp_path / "corpus.jsonl"
    CORPUS.save(path)
    assert Corpus.load(path) == CORPUS


def test_bm25_finds_the_first_hop_and_pickles():
    index = BM25Index(CORPUS.documents)
    found = 0
    for q in CORPUS.questions:
        found += q.hops[0] in [h.doc_id for h in index.search(q.question, 3)]
    assert found >= 0.9 * len(CORPUS.questions)
    assert index.search("the of and") == [] and index.search("   ") == []
    again = pickle.loads(pickle.dumps(index))
    assert again.search("chalk dust") == index.search("chalk dust")


@pytest.mark.parametrize(
    ("pred", "gold", "score"),
    [
        ("Tuvengar", "Tuvengar", 1.0),
        ("the town of tuvengar.", "Tuvengar", 1.0),
        ("Tuven", "Tuvengar", 0.0),
        ("Faol Lobri Marmimi Miseltu Tuvengar Naragar", "Tuvengar", 0.0),
        ("", "Faol", 0.0),
    ],
)
def test_judge(pred, gold, score):
    assert judge_answer(pred, gold) == score


class TestBrowseEnvConformance(EnvConformance):
    def make_env(self):
        return browse_env(CORPUS)

    def make_task(self):
        return browse_tasks(CORPUS)[0]

    def make_action(self):
        return Action("tool", name="search", arguments={"query": "chalk dust"})


def call(name, **arguments):
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"


def test_tools_follow_a_chain_to_the_answer():
    env, q = browse_env(CORPUS), CORPUS.questions[0]
    company, founder = (CORPUS.doc(h) for h in q.hops)
    task = Task(q.id, {"question": q.question, "answer": q.answer})
    ws = env.make_workspace(task)
    state = run(env.reset(task, ws)).state
    r = run(env.step(state, Action("tool", name="find", arguments={"text": "born"}), ws))
    assert "No page is open" in r.observation
    r = run(env.step(r.state, Action("tool", name="search", arguments={"query": q.question}), ws))
    assert company.id in r.observation
    r = run(env.step(r.state, Action("tool", name="open", arguments={"doc_id": company.id}), ws))
    assert company.text in r.observation
    r = run(env.step(r.state, Action("tool", name="open", arguments={"doc_id": founder.id}), ws))
    r = run(env.step(r.state, Action("tool", name="find", arguments={"text": "born"}), ws))
    assert q.answer in r.observation
    r = run(env.step(r.state, Action("tool", name="back", arguments={}), ws))
    assert Navigation.of(ws).open_page == company.id
    bad = run(env.step(r.state, Action("tool", name="open", arguments={"doc_id": "d999"}), ws))
    assert "No document 'd999'" in bad.observation
    done = run(env.step(r.state, Action("answer", text=q.answer), ws))
    assert done.done and done.reward == 1.0


def test_two_branches_from_one_checkpoint_navigate_independently():
    """The Agent forks a checkpoint's workspace for each continuation: one branch
    opening pages never shows in its sibling nor in the checkpoint itself."""
    env, q = browse_env(CORPUS), CORPUS.questions[0]
    company, founder = (CORPUS.doc(h) for h in q.hops)
    other = next(d for d in CORPUS.documents if d.id not in q.hops)
    task = Task(q.id, {"question": q.question, "answer": q.answer})
    fmt = PolicyFormat(ByteCodec(), XmlToolCallParser())

    def agent(script, max_steps=3):
        return Agent(ScriptedPolicy(script), env, fmt, max_steps=max_steps)

    # run to a checkpoint after one search and one open
    first = agent([call("search", query="chalk dust"), call("open", doc_id=company.id), "<answer>x</answer>"])
    root = run(first.start(task))
    rollout = run(first.rollout(root, seed=0))
    checkpoint = [p.state for p in rollout.pieces if p.kind == "checkpoint"][-1]
    at_checkpoint = Navigation.of(checkpoint.workspace)
    assert at_checkpoint.open_page == company.id

    # two continuations from the same checkpoint, concurrently, going different ways
    # (the last checkpoint of each is after its three tool calls, before its answer)
    a = agent(
        [
            call("open", doc_id=founder.id),
            call("note", text="founder found"),
            call("find", text="born"),
            f"<answer>{q.answer}</answer>",
        ],
        max_steps=8,
    )
    b = agent(
        [
            call("open", doc_id=other.id),
            call("search", query="region winters"),
            call("back"),
            "<answer>nobody</answer>",
        ],
        max_steps=8,
    )

    async def both():
        return await asyncio.gather(a.rollout(checkpoint, seed=1), b.rollout(checkpoint, seed=2))

    ra, rb = run(both())
    end_a = [p.state for p in ra.pieces if p.kind == "checkpoint"][-1].workspace
    end_b = [p.state for p in rb.pieces if p.kind == "checkpoint"][-1].workspace
    nav_a, nav_b = Navigation.of(end_a), Navigation.of(end_b)
    assert nav_a.open_page == founder.id and nav_a.notes == "founder found\n"
    assert nav_b.open_page == company.id and nav_b.notes == ""  # opened `other`, then went back
    shared = at_checkpoint.history
    assert nav_a.history[: len(shared)] == shared == nav_b.history[: len(shared)]
    assert [e.get("doc_id") for e in nav_a.history[len(shared) :]] == [founder.id, founder.id]
    assert [e["action"] for e in nav_b.history[len(shared) :]] == ["open", "search", "open"]
    # the checkpoint itself is untouched and still continuable
    assert Navigation.of(checkpoint.workspace) == at_checkpoint
    assert end_a is not end_b is not checkpoint.workspace
    assert (ra.leaf.kind, rb.leaf.kind) == ("terminal", "terminal")
    assert [t.reward for t in ra.turns][-1] == 1.0 and [t.reward for t in rb.turns][-1] == 0.0


def test_run_on_embedded_model(local_model_server, tmp_path):
    from storage import BatchStore

    result = main(
        [
            "--model-url",
            local_model_server.url,
            "--questions",
            "2",
            "--rollouts-per-task",
            "2",
            "--transitions",
            "4",
            "--max-tool-calls",
            "2",
            "--max-tokens",
            "24",
            "--out",
            str(tmp_path),
        ]
    )
    assert result["documents"] == len(CORPUS.documents) and result["questions"] == 2
    batch = BatchStore(str(tmp_path)).read(result["batch"])
    assert len(batch.actor) == result["actor_rows"] > 0
    written = main(["--write-corpus", str(tmp_path / "c.jsonl")])
    assert Corpus.load(written["corpus"]) == CORPUS
