"""Every part a user can give ``Collector`` can be named in a configuration: the search,
the estimator (its baselines built in), the agent's context manager and branch-point
rule, and the execution service (``kind = "factory"``, ``factory``, ``options``, as
``env``/``model``/``critic``). The batch is the one ``Collector`` makes with those parts;
a factory that fails is one line naming its setting; a resume with another factory or
other options is refused; a collection stored before these settings still resumes.

These run in process (no server); the ``focus collect`` command and the Prefect flow
with the same parts are in tests/test_config_parts_run.py."""

from __future__ import annotations

import asyncio
import collections
import json
from typing import Any

import pytest
from typer.testing import CliRunner

from cli.app import app
from focus.agent import Agent
from focus.branching import SparseCheckpoints
from focus.collector import Collector
from focus.context import Segments, Summarize
from focus.critic import ConstantCritic
from focus.estimation import GroupNormalized, NodeMonteCarlo
from focus.execution import Execution
from focus.priority import Selective
from tasks.config import ConfigError, FocusConfig, check_factories, load_config
from tasks.config.build import make_execution
from tasks.fingerprint import fingerprint, resume_mismatch

PHASES = [
    {"name": "evidence", "rollouts_per_task": 2},
    {"name": "continue", "transitions": 24, "wave_size": 4, "max_depth": 6},
]
#: The custom search and context manager of tests/fixtures/parts.py, as a file names them.
CUSTOM = {
    "search.kind": "factory",
    "search.factory": "fixtures.parts:AtDepth",
    "search.options": {"depth": 4},
    "agent.context.kind": "factory",
    "agent.context.factory": "fixtures.parts:tagged",
    "agent.context.options": {"tag": "%"},
}


def small(root: str = "memory://parts", **updates: Any) -> FocusConfig:
    """The digit policy on three toy tasks: a collection of a second or two."""
    return load_config(
        overrides={
            "collection_id": "parts",
            "seed": 7,
            "model.kind": "factory",
            "model.factory": "fixtures.digits:digit_policy",
            "env.n_tasks": 3,
            "search.phases": PHASES,
            "storage.root": root,
            "progress": False,
            **updates,
        },
        environ={},
    )


def collected(config: FocusConfig, **parts: Any) -> Any:
    """The batch of ``config``'s collector, or of a ``Collector`` given ``parts`` by hand
    (``context``: the agent's; the others: the collector's) on the same agent and tasks."""
    policy = config.build_policy()
    agent, tasks = config.build_agent(policy)
    if not parts:
        return asyncio.run(config.build_collector(agent).collect(tasks))
    if "context" in parts:
        agent = Agent(agent.policy, agent.env, agent.format, context=parts.pop("context"),
                      branch_points=agent.branch_points, max_steps=agent.max_steps, sampling=agent.sampling)  # fmt: skip
    search = parts.pop("search", None) or Selective(phases=tuple(config.search.phases), waves_in_flight=2)
    parts.setdefault("critic", ConstantCritic(0.5))  # the configuration's default critic
    collector = Collector(agent, search=search, collection_id="parts", seed=config.seed, **parts)
    return asyncio.run(collector.collect(tasks))


def rows(batch: Any) -> list[tuple[Any, ...]]:
    return [
        (r.tree_id, r.node_id, r.edge_id, r.prompt_ids, r.completion_ids, round(r.advantage, 9)) for r in batch.actor
    ]


def root_fan_out(batch: Any) -> dict[str, int]:
    """Segments started from each tree's root (node 0): the evidence's, plus the continuations search chose there."""
    edges: dict[str, set[int]] = collections.defaultdict(set)
    for r in batch.actor:
        if r.node_id == 0:
            edges[r.tree_id].add(r.edge_id)
    return {tree: len(ids) for tree, ids in sorted(edges.items())}


def test_a_custom_search_and_context_manager_from_the_config_make_the_collectors_batch():
    from fixtures.parts import AtDepth, Tagged

    config = small(**CUSTOM)
    check_factories(config)  # imported, bound and built once before anything starts
    batch = collected(config)
    by_hand = collected(
        config, search=AtDepth(depth=4, phases=tuple(config.search.phases), waves_in_flight=2), context=Tagged("%")
    )
    assert rows(batch) == rows(by_hand) and batch.actor
    # the priority's choice: deep checkpoints first, so no root is continued past the
    # evidence's 2 rollouts; the built-in search continues some roots
    assert set(root_fan_out(batch).values()) == {2}
    assert max(root_fan_out(collected(small())).values()) > 2
    assert set(root_fan_out(collected(small(**{**CUSTOM, "search.options": {"depth": 0}}))).values()) == {4}
    # the context manager's: its tag after each observation, in every later turn's prompt
    later = [r for r in batch.actor if len(r.prompt_ids) > len(batch.actor[0].prompt_ids)]
    assert later and all(ord("%") in r.prompt_ids for r in later)
    assert not any(ord("%") in r.prompt_ids for r in collected(small()).actor)


@pytest.mark.parametrize(
    ("settings", "estimator"),
    [
        ({"estimator.kind": "group_normalized"}, GroupNormalized()),
        ({"estimator.kind": "group_normalized", "estimator.scale": False}, GroupNormalized(scale=False)),
        ({"estimator.kind": "node_monte_carlo", "estimator.gamma": 0.9}, NodeMonteCarlo(gamma=0.9)),
    ],
)
def test_the_baseline_estimators_from_the_config_make_the_collectors_batch(settings, estimator):
    """verl/slime users select the GRPO-style baseline by name: the batch is the one
    ``Collector(..., estimator=GroupNormalized())`` makes on the same seed."""
    config = small(**settings)
    assert config.build_estimator() == estimator
    batch = collected(config)
    assert rows(batch) == rows(collected(config, estimator=estimator))
    assert rows(batch) != rows(collected(small())), "the estimator made no difference to the advantages"


def test_an_estimator_subclass_is_its_own_factory():
    config = small(**{"estimator.kind": "factory", "estimator.factory": "focus.estimation:GroupNormalized",
                      "estimator.options": {"eps": 0.0}, "estimator.gamma": 0.9})  # fmt: skip
    check_factories(config)
    assert config.build_estimator() == GroupNormalized(gamma=0.9, eps=0.0)
    assert config.build_search().gamma == 0.9  # the search ranks with the estimator's


def test_the_builtin_parts_take_their_own_options_and_a_kind_alone_names_the_table(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text('[agent]\ncontext = "append_only"\nbranch_points = "sparse"\nsparse_every = 3\n')
    config = load_config(file, {"agent.branch_points.options.offset": 1}, environ={})
    assert (config.agent.context.kind, config.agent.branch_points.kind) == ("append_only", "sparse")
    rule = config.build_agent(config.build_policy("http://127.0.0.1:9"))[0].branch_points
    assert isinstance(rule, SparseCheckpoints) and (rule.every, rule.offset) == (3, 1)
    # --set and FOCUS_* go into a table a file named by its kind alone
    config = load_config(file, {"agent.context.kind": "factory", "agent.context.factory": "fixtures.parts:tagged"},
                         environ={"FOCUS_AGENT__CONTEXT__OPTIONS": '{"tag": "!"}'})  # fmt: skip
    assert config.agent.context.options == {"tag": "!"}
    summarize = small(**{"agent.context": {"kind": "summarize", "options": {"max_prompt_tokens": 64}}})
    assert isinstance(summarize.build_agent(summarize.build_policy())[0].context, Summarize)
    assert isinstance(small().build_agent(small().build_policy())[0].context, Segments)


@pytest.mark.parametrize(
    ("settings", "why"),
    [
        ({"agent.context": "summarize"}, "agent.context.options.max_prompt_tokens (the prompt length that starts a "
         "summary) is required when agent.context.kind is 'summarize'"),
        ({"agent.context": {"kind": "summarize", "options": {"max_prompt_tokens": 0}}}, "must be positive"),
        ({"agent.branch_points": {"kind": "sparse", "options": {"every": 3}}},
         "agent.branch_points.options.every: set agent.sparse_every instead"),
        ({"search.options": {"depth": 4}}, "search.options: kind 'selective' has no option 'depth' (it takes none)"),
        ({"search.factory": "fixtures.parts:AtDepth"}, "search.factory 'fixtures.parts:AtDepth' is set but "
         "search.kind is 'selective', which does not use it"),
        ({"search.kind": "factory"}, "search.factory (an import path) is required when search.kind is 'factory'"),
        ({"estimator.scale": False}, "estimator.scale is set but estimator.kind is 'direct_branch_td'"),
        ({"estimator.kind": "factory", "estimator.factory": "fixtures.parts"},
         "'fixtures.parts' is not an import path of the form 'package.module:name'"),
        ({"execution.options": {"x": 1}}, "execution.options: kind 'local' has no option 'x' (it takes none)"),
        ({"agent.context": "summarise"}, "agent.context.kind: Input should be 'segments', 'append_only', "),
    ],
)  # fmt: skip
def test_a_part_misconfigured_is_refused_naming_its_field(settings, why):
    with pytest.raises(ConfigError) as e:
        small(**settings)
    assert why in str(e.value), str(e.value)


SECTIONS = ["search", "estimator", "agent.context", "agent.branch_points", "execution"]


def _built(section: str, factory: str) -> Exception:
    """The error of building ``section`` from ``factory``, as a collection would."""
    config = small(**{f"{section}.kind": "factory", f"{section}.factory": factory})
    with pytest.raises(ConfigError) as e:
        check_factories(config)
        make_execution(config.execution)  # the one part built where it runs, not by the check
    return e.value


@pytest.mark.parametrize("section", SECTIONS)
def test_a_factory_that_fails_is_one_line_naming_its_setting(section):
    """A factory that raises, returns a kind's name instead of the part, or is not there:
    one line naming the setting (an AttributeError from deep in the collector named none)."""
    want = {"search": "focus.priority.Priority", "estimator": "focus.estimation.Estimator",
            "agent.context": "focus.context.ContextManager", "agent.branch_points": "focus.branching.BranchPoints",
            "execution": "focus.execution.Execution"}[section]  # fmt: skip
    err = _built(section, "fixtures.parts:raising")
    assert str(err) == f"{section}.factory 'fixtures.parts:raising' raised RuntimeError: the rule's table is not there"
    err = _built(section, "fixtures.parts:text")
    assert str(err) == f"{section}.factory 'fixtures.parts:text' returned a value of type str, not a {want}"
    err = _built(section, "fixtures.no_such_module:make")
    assert str(err).startswith("cannot import module 'fixtures.no_such_module' of 'fixtures.no_such_module:make'")


def test_a_factory_must_keep_the_settings_it_is_given():
    """The pipeline names checkpoints and reports progress by ``search.phases``, and a
    resume compares ``estimator.gamma``: a factory that dropped them would run another
    search, or rank with another γ, than the configuration records."""
    with pytest.raises(ConfigError, match=r"^search.factory 'fixtures.parts:phases_dropped' returned a search whose "
                       r"phases is .*, not the .* of search.phases: pass on the phases, waves_in_flight it is called"):  # fmt: skip
        small(**{"search.kind": "factory", "search.factory": "fixtures.parts:phases_dropped"}).build_search()
    with pytest.raises(ConfigError, match=r"^estimator.factory 'fixtures.parts:gamma_dropped' returned an estimator "
                       r"whose gamma is 0.5, not the 1.0 of estimator.gamma"):  # fmt: skip
        small(**{"estimator.kind": "factory", "estimator.factory": "fixtures.parts:gamma_dropped"}).build_estimator()


@pytest.mark.parametrize(
    ("factory", "line"),
    [
        ("fixtures.parts:raising", "error: search.factory 'fixtures.parts:raising' raised RuntimeError: the rule's "
         "table is not there"),
        ("fixtures.parts:text", "error: search.factory 'fixtures.parts:text' returned a value of type str, not a "
         "focus.priority.Priority"),
        ("fixtures.parts:Nowhere", "error: module 'fixtures.parts' has no attribute 'Nowhere' (from "
         "'fixtures.parts:Nowhere')"),
    ],
)  # fmt: skip
def test_focus_collect_refuses_a_bad_factory_in_one_line_before_anything_starts(factory, line, tmp_path):
    store = tmp_path / "runs"
    args = ["collect", "--store", str(store), "--set", "model.kind=factory",
            "--set", "model.factory=fixtures.digits:digit_policy", "--set", "search.kind=factory",
            "--set", f"search.factory={factory}", "--set", "search.options.depth=4"]  # fmt: skip
    out = CliRunner().invoke(app, args, env={})
    assert (out.exit_code, out.output.strip().splitlines()) == (2, [line]), out.output
    assert not store.exists()


def test_a_resume_with_another_factory_or_other_options_is_refused():
    stored = fingerprint(small(**CUSTOM))
    for change, named in [
        ({"search.options": {"depth": 3}}, "search.options.depth 4 → 3"),
        ({"agent.context.options": {}}, "agent.context.options.tag %"),
        ({"agent.context.factory": "fixtures.parts:Tagged"}, "agent.context.factory fixtures.parts:tagged → "),
        ({"estimator.kind": "group_normalized"}, "estimator.kind direct_branch_td → group_normalized"),
    ]:
        config = small(**{**CUSTOM, **change})
        err = resume_mismatch(config, stored, fingerprint(config))
        assert err is not None and named in str(err), (change, err)
    assert resume_mismatch(small(**CUSTOM), stored, fingerprint(small(**CUSTOM))) is None
    # a collection recorded with the group-normalized estimator's default scale is
    # refused once that default moves, as a search knob's is
    grpo = fingerprint(small(**{"estimator.kind": "group_normalized"}))
    assert grpo["estimator"]["scale"] is True
    config = small(**{"estimator.kind": "group_normalized", "estimator.scale": False})
    assert "estimator.scale true → false" in str(resume_mismatch(config, grpo, fingerprint(config)))


def test_a_collection_stored_before_the_parts_had_factories_resumes():
    """Its record names the agent's parts by kind and has no factory, options or
    estimator kind: it ran with what those default to now, so it resumes; a changed
    part is still named."""
    config = small()
    old = json.loads(json.dumps(fingerprint(config)))
    old["agent"]["context"], old["agent"]["branch_points"] = "segments", "every"
    for section in ("search", "estimator"):
        del old[section]["factory"], old[section]["options"]
    del old["estimator"]["kind"], old["estimator"]["scale"], old["estimator"]["eps"]
    assert resume_mismatch(config, old, fingerprint(config)) is None
    other = small(**{"agent.context": "append_only"})
    assert "agent.context.kind segments → append_only" in str(resume_mismatch(other, old, fingerprint(other)))


def test_the_custom_parts_travel_to_dask_workers_by_reference():
    """A Dask worker receives the agent pickled, the factory's context manager inside
    it by reference to its module (which the worker imports, as an env factory's)."""
    from fixtures.parts import Tagged

    from focus.dask_payload import EnvCache, load, pickled_agent

    config = small(**CUSTOM)
    agent, _ = config.build_agent(config.build_policy())
    data, env_data, _ = pickled_agent(agent, EnvCache())
    assert b"fixtures.parts" in data
    back = load(data, {"env": load(env_data)})
    assert isinstance(back.context, Tagged) and back.context.tag == "%"


def test_an_execution_factory_makes_the_execution_service():
    config = small(**{"execution.kind": "factory", "execution.factory": "focus.execution:Execution",
                      "execution.options": {"graft_fraction": 0.5}, "execution.max_concurrency": 3})  # fmt: skip
    check_factories(config)
    assert make_execution(config.execution) == Execution(max_concurrency=3, max_outage_share=0.1, graft_fraction=0.5)
    assert rows(collected(config)) == rows(collected(small()))  # where rollouts run, not what they make


def test_the_resume_line_counts_every_factory_as_the_users_code():
    """``focus collect``'s resume line starts with the ``PYTHONPATH`` a factory was found
    through; it looked at the env, model and critic factories alone."""
    from cli.common import user_code

    assert set(user_code(small(**CUSTOM))) >= {"fixtures.parts:AtDepth", "fixtures.parts:tagged"}


def test_config_show_gives_an_unset_estimator_knob_the_librarys_value():
    from tasks.config import explain_config

    _, rows = explain_config(overrides={"estimator.kind": "group_normalized"}, environ={})
    shown = {key: (value, source) for key, value, source in rows}
    assert shown["estimator.scale"] == (True, "library default") and shown["estimator.eps"][1] == "library default"
    _, rows = explain_config(environ={})
    assert {key: value for key, value, _ in rows}["estimator.scale"] is None  # a kind without the knob: unset
