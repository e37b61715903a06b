"""docs/python-api.md, the page of the names ``focus`` exports, is rendered from the code:
each name of ``focus.__all__`` under its role, with its module and the first sentence of
its docstring. The page is compared with what :func:`render` gives, so a name added,
removed or redescribed without it fails here; ``python tests/test_docs_python_api.py``
writes it again."""

from __future__ import annotations

import importlib
import inspect
import re
from pathlib import Path

import focus
import focus.backends as backends

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "python-api.md"

#: The roles the page groups ``focus.__all__`` by, in the order a run is assembled.
ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("Tasks and environments", ("Task", "Env", "Reset", "StepResult", "Action", "Message", "Tool", "ToolEnv", "tool")),
    ("Workspaces", ("Workspace", "MemoryWorkspace", "DirectoryWorkspace")),
    ("The model", ("Policy", "SamplingParams", "Completion")),
    (
        "Formats: codecs and parsers",
        ("PolicyFormat", "ByteCodec", "FinalAnswerParser", "JsonToolCallParser", "XmlToolCallParser"),
    ),
    ("Contexts and checkpoints", ("AppendOnly", "Segments", "Summarize", "EveryDecision", "SparseCheckpoints")),
    ("Running a collection", ("Agent", "BranchState", "Collector", "Execution", "Usage")),
    ("The search", ("Phase", "Selective", "Uniform")),
    ("Critics", ("ConstantCritic", "HttpCritic", "LocalCritic")),
    ("Estimators", ("DirectBranchTd", "GroupNormalized", "NodeMonteCarlo")),
    ("Results", ("Tree", "Batch")),
    ("Errors that stop a collection", ("ModelServiceOutage", "BadResponses", "RequestsRefused", "BrokenEnv")),
)

HEAD = """# The Python API

The names `import focus` exports (`focus.__all__`), by role, each with its module and the
first sentence of its docstring; `help(focus.Name)` has the rest. Model clients (vLLM,
SGLang, llama.cpp, Tinker, the embedded server) are in `focus.backends` ("Model
clients" below); the interfaces a custom part subclasses are re-exported by
`focus.extend` (README.md, "Where your code fits"; docs/architecture.md, "Roles"). This
page is generated from the code by `tests/test_docs_python_api.py`, which fails when the
two differ.

What a critic sees: `Critic.predict(contexts)` is given, for each checkpoint (and each
truncated leaf it bootstraps), only that state's prompt ids, the exact ids of the next
model call there (`focus.tree.Node.context_ids`), and nothing else: no task, env state, depth,
reward or position in the tree. A critic that needs one of those must read it from the ids.
"""


#: Configurable parts a run uses that ``import focus`` does not export (README.md's
#: "Layout"): the user's guide sends a reader to this page for "execution services,
#: checkpoint storage and batch export" and their options, which it did not list.
OUTSIDE: tuple[str, ...] = (
    "focus.dask_execution:DaskExecution",
    "storage:BatchStore",
    "storage:CheckpointStore",
    "focus.exporters:to_tinker_datums",
    "focus.exporters:to_slime_samples",
    "focus.exporters:to_verl_batch",
    "focus.exporters:to_verl_batches",
)

#: The model clients, ``focus.backends.__all__``, in the order a reader picks one: the
#: user's guide sends a reader to ``focus.backends`` for them ("choose an existing policy
#: backend"), and this page named the package but none of its clients or their options.
BACKENDS: tuple[str, ...] = (
    "OpenAICompatPolicy",
    "SGLangPolicy",
    "LlamaCppPolicy",
    "TinkerPolicy",
    "FleetPolicy",
    "LocalModelServer",
    "HttpConfig",
    "RetryPolicy",
    "HttpClient",
)

BACKENDS_HEAD = """## Model clients (`focus.backends`)

Each with its signature, whose keywords are its options; `config` takes a
`focus.backends.HttpConfig` (timeouts, retries, hedging, concurrency, headers, `api_key`).
`OpenAICompatPolicy`'s `model` is the name the server serves (vLLM's
`--served-model-name`, else the model path it was started with); the default names the
embedded model, so a vLLM server refuses it (404, `RequestsRefused`).
docs/model-services.md has what each sends and reads, and a server's failures.
"""

OUTSIDE_HEAD = """## Execution, storage and export (outside `import focus`)

Each with its signature, whose keywords are its options (`Execution`'s are above, under
"Running a collection"); `storage` comes with the pipeline's extra
(`pip install 'focus-rl[pipeline]'`), `to_tinker_datums` needs the `[tinker]` one;
docs/batch-schema.md has what a batch and each export hold.
"""


#: Names of ``focus`` shown with their signature: the parts a run is assembled from,
#: whose keywords are its options and budgets (``Agent(max_steps=...)``, ``Phase``'s
#: transitions, ``SamplingParams.max_tokens``, ``Execution``'s concurrency).
SIGNED: tuple[str, ...] = ("SamplingParams", "Agent", "Collector", "Execution", "Phase")


def signature(obj: object) -> str:
    """``obj``'s parameters without annotations: the options a reader passes."""
    sig = inspect.signature(obj)
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return str(sig.replace(parameters=params, return_annotation=sig.empty))


def summary(obj: object) -> str:
    """The first sentence of ``obj``'s docstring, its reST roles and literals as Markdown code."""
    doc = inspect.getdoc(obj) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.split(r"(?<=[a-z0-9)\"'`][.])\s+(?=[A-Z(`])", text)[0]
    text = re.sub(r":[a-z]+:`~?(?:[\w.]*\.)?([\w]+)`", r"`\1`", text)
    return text.replace("``", "`")


def render() -> str:
    lines = [HEAD]
    for role, names in ROLES:
        lines.append(f"## {role}\n")
        for name in names:
            module = getattr(focus, name).__module__
            shown = f"{name}{signature(getattr(focus, name))}" if name in SIGNED else name
            lines.append(f"- `{shown}` (`{module}`): {summary(getattr(focus, name))}")
        lines.append("")
    lines.append(BACKENDS_HEAD)
    for name in BACKENDS:
        obj = getattr(backends, name)
        lines.append(f"- `focus.backends.{name}{signature(obj)}`: {summary(obj)}")
    lines.append("")
    lines.append(OUTSIDE_HEAD)
    for path in OUTSIDE:
        module, name = path.split(":")
        obj = getattr(importlib.import_module(module), name)
        lines.append(f"- `{module}.{name}{signature(obj)}`: {summary(obj)}")
    lines.append("")
    return "\n".join(lines)


def test_the_roles_hold_each_name_of_focus_exactly_once():
    listed = [name for _, names in ROLES for name in names]
    assert sorted(listed) == sorted(focus.__all__), sorted(set(listed) ^ set(focus.__all__))
    assert len(listed) == len(set(listed))


def test_the_parts_a_run_is_assembled_from_show_their_options():
    """The page said of the execution services "`Execution`'s are above", where above was
    one sentence and no option; `Agent`, `Collector`, `Phase` and `SamplingParams` - the
    budgets the user's guide names (`Agent(max_steps=...)`, a phase's transitions,
    `SamplingParams.max_tokens`) - showed none of theirs either."""
    page = PAGE.read_text(encoding="utf-8")
    running = page[page.index("## Running a collection") : page.index("## The search")]
    assert "`Execution(*, max_concurrency=64" in running
    for name in SIGNED:
        assert f"- `{name}{signature(getattr(focus, name))}` (`" in page, name
    assert {"Agent", "Collector", "Execution", "Phase", "SamplingParams"} <= set(SIGNED)


def test_the_page_lists_every_model_client_of_focus_backends():
    """The page said the model clients are in ``focus.backends`` and listed none of them:
    no name to import for vLLM, SGLang or llama.cpp and no options (``model``, ``config``,
    ``vocab_size``), where it gave the signatures of the execution, storage and export parts."""
    assert sorted(BACKENDS) == sorted(backends.__all__)
    page = PAGE.read_text(encoding="utf-8")
    assert [n for n in backends.__all__ if f"`focus.backends.{n}(" not in page] == []


def test_the_python_api_page_is_the_rendered_one():
    assert PAGE.read_text(encoding="utf-8") == render(), "run: python tests/test_docs_python_api.py"


def test_the_page_is_linked_from_the_readme_and_the_architecture():
    for doc in ("README.md", "docs/architecture.md"):
        assert "docs/python-api.md" in (ROOT / doc).read_text(encoding="utf-8"), doc


if __name__ == "__main__":
    PAGE.write_text(render(), encoding="utf-8")


def test_the_policy_docstring_names_every_policy_focus_backends_exports():
    """``help(focus.Policy)`` is where a user looks for the clients there are; it named
    four kinds and left out llama.cpp's and the fleet of replicas."""
    import focus.backends
    from focus.policy import Policy

    policies = [
        n for n in focus.backends.__all__ if isinstance(c := getattr(focus.backends, n), type) and issubclass(c, Policy)
    ]
    assert {"OpenAICompatPolicy", "LlamaCppPolicy", "FleetPolicy"} <= set(policies)
    doc = " ".join((Policy.__doc__ or "").split())
    assert [n for n in policies if f"``{n}``" not in doc] == []


def test_the_phase_docstring_describes_every_field():
    """``help(focus.Phase)`` listed each budget but ``max_waves``."""
    from focus.priority import Phase

    doc = Phase.__doc__ or ""
    assert [f for f in Phase.model_fields if f != "name" and f"``{f}``" not in doc] == []


def test_the_execution_docstring_describes_every_field():
    """The user's guide sends a reader to ``Phase`` and ``Execution`` for the budget
    controls; ``help(focus.Execution)`` said "bounded concurrency" and named none of its
    options (their comments are in the source, which ``help`` does not show)."""
    from focus.execution import Execution

    doc = Execution.__doc__ or ""
    assert [f for f in Execution.model_fields if f"``{f}``" not in doc] == []


def test_each_extension_interface_that_is_a_pydantic_model_says_how_a_subclass_takes_parameters():
    """``Priority``, ``Estimator`` and ``Execution`` are frozen pydantic models. A user's
    subclass written as plain Python - ``self.weight = weight`` in ``__init__``, or
    ``scale = 0.5`` in the class body - is refused by pydantic ("Instance is frozen",
    "A non-annotated attribute was detected"), and ``help()`` of none of them said so."""
    from pydantic import BaseModel

    import focus.extend

    models = [n for n in focus.extend.__all__ if issubclass(getattr(focus.extend, n), BaseModel)]
    assert {"Priority", "Estimator", "Execution"} <= set(models)
    for name in models:
        doc = " ".join((getattr(focus.extend, name).__doc__ or "").split())
        assert "pydantic" in doc and "annotated field" in doc and "frozen" in doc, name


def test_a_subclass_declared_as_the_interfaces_say_runs():
    """The pattern the docstrings give: an annotated field, set by keyword."""
    import asyncio

    from focus import Agent, Collector, Phase
    from focus.estimation import Estimator
    from focus.priority import Priority
    from focus.testing import ScriptedPolicy
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    class Deep(Priority):
        weight: float = 1.0

        def __call__(self, node):
            return self.weight * node.depth

    class Flat(Estimator):
        scale: float = 0.5

        def advantages(self, edges, values):
            return {e.id: self.scale for e in edges}

    agent = Agent(ScriptedPolicy(["3", "4", "9"]), ReachTarget(), toy_format(), max_steps=4)
    phases = (Phase("evidence", rollouts_per_task=2), Phase("continue", transitions=8, wave_size=4))
    search = Deep(weight=2.0, phases=phases)
    batch = asyncio.run(Collector(agent, search=search, estimator=Flat(scale=0.25)).collect(reach_target_tasks(2)))
    assert search.weight == 2.0 and {r.advantage for r in batch.actor} == {0.25}
