"""The library in a real Jupyter kernel (nbclient + ipykernel), as a notebook user runs it:
top-level ``await`` of a collection, an interrupt in the middle of one and the rerun that
resumes it from a ``MemoryJournal``, what the records print as, and no leaked tasks or
"Unclosed client session" warnings. Skipped where nbclient or ipykernel is not installed
(both are in the ``dev`` extra)."""

from __future__ import annotations

import pathlib
import re
import time

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = pathlib.Path(__file__).resolve().parents[1]
#: docs/operations.md's progress journal, as the page shows it.
PROGRESS = re.search(
    r"## Notebooks, asyncio programs and threads.*?```python\n(.*?)```",
    (ROOT / "docs/operations.md").read_text(encoding="utf-8"),
    re.S,
)[1]

SETUP = """
import asyncio, gc, os, signal, threading, warnings
warnings.simplefilter("default")  # what a notebook would hide: ResourceWarnings, never-awaited coroutines
from focus import Agent, Collector, DirectBranchTd, EveryDecision, Execution, Phase, SamplingParams, Segments, Selective
from focus.backends import LocalModelServer, OpenAICompatPolicy
from focus.critic import ConstantCritic
from focus.journal import MemoryJournal
from focus.toy import ReachTarget, reach_target_tasks, toy_format

server = LocalModelServer().start()
policy = OpenAICompatPolicy(server.url)

def collector():
    agent = Agent(policy, ReachTarget(), toy_format(), context=Segments(), branch_points=EveryDecision(),
                  max_steps=8, sampling=SamplingParams(max_tokens=4, temperature=1.0))
    phases = [Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=160, wave_size=8, max_branches=4)]
    return Collector(agent, search=Selective(phases=phases), critic=ConstantCritic(0.5),
                     estimator=DirectBranchTd(gamma=1.0), execution=Execution(max_concurrency=8), collection_id="nb")

tasks = reach_target_tasks(4, seed=0)
journal = Progress()

def interrupt_after(steps):  # the kernel's interrupt (SIGINT) once the journal holds `steps` steps
    def watch():
        while len(journal.steps) < steps:
            threading.Event().wait(0.005)
        os.kill(os.getpid(), signal.SIGINT)
    threading.Thread(target=watch, daemon=True).start()

interrupt_after(3)
"""

CELLS = [
    PROGRESS + SETUP,
    "state = await collector().search(tasks, journal)",  # interrupted
    "at_interrupt = len(journal.steps)\n"
    "[t.get_coro().__qualname__ for t in asyncio.all_tasks() if '/focus/' in t.get_coro().cr_code.co_filename]",
    "state = await collector().search(tasks, journal)\nbatch = collector().prepare(state)\nbatch",  # resumes
    "state",
    "state.trees[0]",
    "reference = await collector().collect(tasks)\n"
    "(at_interrupt < len(journal.steps), reference.actor == batch.actor, reference.critic == batch.critic)",
    "asyncio.run(collector().collect(tasks))",
    "await policy.aclose()\nserver.stop()\ngc.collect()",
]


def _outputs(cell) -> tuple[list[str], list[str], list[str]]:
    """(results, stream texts, error names) of an executed cell."""
    results = [o["data"]["text/plain"] for o in cell.outputs if o.output_type == "execute_result"]
    streams = [o["text"] for o in cell.outputs if o.output_type == "stream"]
    errors = [f"{o['ename']}: {o['evalue']}" for o in cell.outputs if o.output_type == "error"]
    return results, streams, errors


@pytest.mark.integration  # starts a kernel and the embedded model server
def test_a_notebook_awaits_interrupts_and_resumes_a_collection():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in CELLS])
    client = nbclient.NotebookClient(
        nb, timeout=120, kernel_name="python3", allow_errors=True, resources={"metadata": {"path": str(ROOT)}}
    )
    t0 = time.monotonic()
    client.execute()
    out = [_outputs(c) for c in nb.cells]
    streams = "".join(s for _, ss, _ in out for s in ss)
    for bad in ("Unclosed", "never awaited", "Task was destroyed", "ResourceWarning"):
        assert bad not in streams, streams[-3000:]
    assert out[0] == ([], [], [])
    [interrupted] = out[1][2]
    assert interrupted.split(":")[0] in ("CancelledError", "KeyboardInterrupt")  # ipykernel 7, 6
    assert out[2][0] == ["[]"]  # no task of the library left running after the interrupt
    assert out[3][0][0].startswith("Batch('nb', iteration=0, actor_rows=")
    lines = "".join(out[3][1]).splitlines()  # the docs' progress journal: a line per wave run after the resume
    assert lines and all(re.fullmatch(r"phase 1 wave \d+: \d+ rollouts in \d+\.\d s", line) for line in lines), lines
    assert out[4][0][0].startswith("SearchState('nb', seed=0, trees=4, ")
    assert out[5][0][0].startswith("Tree('reach-0-0', nodes=") and len(out[5][0][0]) < 200
    assert out[6][0] == ["(True, True, True)"]  # resumed, and the batch an uninterrupted run makes
    assert out[7][2] == ["RuntimeError: asyncio.run() cannot be called from a running event loop"]
    assert out[8][2] == []
    assert time.monotonic() - t0 < 60  # about 10 s on 2 busy cores
