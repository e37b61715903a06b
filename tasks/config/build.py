"""The objects a configuration describes: the policy client, the env and its tasks, the
agent and its context manager and branch-point rule, the critic, the search, the
estimator, the execution service, the collector.

This is the one part of :mod:`tasks.config` with effects: it imports the factories a
configuration names (``package.module:callable``) and may ask the model server for its
vocabulary. A configuration is plain data and travels as it is; these are called where
the objects are used (a Dask worker builds nothing: it receives a pickled agent).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from typing import TYPE_CHECKING, Any

from focus.backends.retry import HttpConfig
from tasks.config.errors import ConfigError, check_import_path

if TYPE_CHECKING:
    from focus.agent import Agent
    from focus.branching import BranchPoints
    from focus.context import ContextManager
    from focus.env import Env, Task
    from focus.estimation import Estimator
    from focus.execution import Execution
    from focus.format import PolicyFormat
    from focus.policy import Policy
    from focus.priority import Priority
    from tasks.config.schema import ExecutionConfig, FocusConfig
    from tasks.config.search import SearchConfig


def _cwd_on_path() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def import_object(path: str) -> Any:
    """The object named by ``package.module:attribute``; errors name the path.

    The current directory is searched too (as ``python -m`` does), so a module in the
    folder a command runs from works with the installed ``focus`` command as well.
    """
    check_import_path(path)
    module_name, attr = path.split(":")
    _cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import module {module_name!r} of {path!r}: {e}") from e
    except Exception as e:  # noqa: BLE001 - the user's module raised as it ran: a factory that does not import
        # was `RuntimeError: ...`, exit 1, naming neither the module nor the setting
        raise ConfigError(
            f"cannot import module {module_name!r} of {path!r}: it raised {type(e).__name__}: {e}{_raised_at(e)}"
        ) from e
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


def _raised_at(exc: BaseException) -> str:
    """`` (at <file>:<line>)``: where the user's module raised ``exc`` (the last frame of
    its traceback), as the one line has no traceback beside it."""
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return f" (at {frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def factory_sections(config: FocusConfig) -> list[tuple[Any, dict[str, Any]]]:
    """Each pluggable section of ``config``, and what its factory is given besides its
    ``options``: the section's settings that the interface's base class takes (a
    ``Priority`` its phases, an ``Estimator`` its γ, κ and truncation rule), so that a
    subclass of the interface is a factory itself."""
    s, e, ex = config.search, config.estimator, config.execution
    return [
        (config.model, {}),
        (config.env, {"n_tasks": config.env.n_tasks, "seed": config.env.task_seed}),
        (config.critic, {}),
        (config.agent.context, {}),
        (config.agent.branch_points, {}),
        (s, {"phases": tuple(s.phases), "waves_in_flight": s.waves_in_flight}),
        (e, {"gamma": e.gamma, "kappa": e.kappa, "truncation": e.truncation}),
        (ex, {"max_concurrency": ex.max_concurrency, "max_outage_share": ex.max_outage_share}),
    ]


#: Sections whose factory makes a plain object (no service, no file): built by
#: :func:`check_factories`, so one that raises or returns another type fails before
#: anything starts.
PLAIN = ("agent.context", "agent.branch_points", "search", "estimator")


def check_factories(config: FocusConfig) -> None:
    """Import every factory the configuration names and bind its options to it, so a
    missing module or a misspelt option fails before any server or cluster starts; the
    plain parts (:data:`PLAIN`) a factory makes are built, and checked, too."""
    plain = False
    for section, fixed in factory_sections(config):
        if getattr(section, "kind", None) != "factory" or not section.factory:
            continue
        fn = import_object(section.factory)
        name = f"{section._section}.factory {section.factory!r}"
        if not callable(fn):
            raise ConfigError(f"{name} is a {type(fn).__name__}, not a callable")
        try:
            inspect.signature(fn).bind(**fixed, **section.options)
        except TypeError as e:
            given = f" (it is given {', '.join(fixed)} too)" if fixed else ""
            raise ConfigError(f"{name} cannot be called with {section._section}.options{given}: {e}") from None
        except ValueError:
            pass  # no signature to check (a builtin)
        plain = plain or section._section in PLAIN
    if plain:
        config.build_search()  # the estimator too
        agent_parts(config)


def api_key(variable: str | None, field: str = "model.api_key_env") -> str | None:
    """The key in environment variable ``variable`` (``field``: ``model.api_key_env`` or
    ``critic.api_key_env``); ``None`` if unset."""
    if variable is None:
        return None
    key = os.environ.get(variable, "").strip()
    if not key:
        service = field.split(".")[0]
        raise ConfigError(
            f"{field} names {variable}, which is not set (or empty) in this process's environment; "
            f"export {variable}=<the {service} service's key> where the collection runs, or unset {field}"
        )
    return key


def build_policy(config: FocusConfig, url: str | None = None) -> Policy:
    """The policy client; ``url`` overrides ``model.url`` (a server started for the run)."""
    from focus.backends.fleet import one_or_fleet

    m = config.model
    url = url or m.url
    urls = m.urls or ([url] if url else [])
    # the client may keep as many calls in flight as the execution runs rollouts
    http = HttpConfig(
        **m.http.model_dump(),
        max_concurrency=config.execution.max_concurrency,
        group_siblings=m.group_siblings,
        api_key=api_key(m.api_key_env),
    )
    if m.kind == "factory":
        from focus.policy import Policy

        policy = _made("model", m.factory or "", m.options, Policy)
    elif m.kind in ("local", "openai"):
        from focus.backends import OpenAICompatPolicy

        if not urls:
            raise ConfigError("model.url is not set and no local model server was started")
        named = {"model": m.model} if m.model else {}
        try:
            policy = one_or_fleet(urls, lambda u: OpenAICompatPolicy(u, **named, config=http, **m.options))
        except ValueError as e:  # model.options.extra_body setting a field FOCUS owns (NOT_EXTRA)
            raise ConfigError(str(e)) from None
    elif m.kind == "sglang":
        from focus.backends import SGLangPolicy

        policy = one_or_fleet(urls, lambda u: SGLangPolicy(u, config=http, **m.options))
    elif m.kind == "llamacpp":
        from focus.backends import LlamaCppPolicy

        policy = one_or_fleet(urls, lambda u: LlamaCppPolicy(u, config=http, **m.options))
    else:
        from focus.backends import TinkerPolicy

        # the sampling client is created on first use, where the policy samples
        policy = TinkerPolicy(base_model=m.model, model_path=m.weights, **m.options)
    if m.policy_version is not None:
        policy.policy_version = m.policy_version
    vocab = m.vocab_size or (served_vocab_size(url) if m.kind == "local" and url else None)
    if vocab is not None:
        policy.vocab_size = vocab
    return policy


def build_env(config: FocusConfig) -> tuple[Env, PolicyFormat, list[Task]]:
    """The env, its policy format and the tasks of this collection."""
    e = config.env
    if e.kind == "factory":
        return _env_from_factory(e.factory or "", n_tasks=e.n_tasks, seed=e.task_seed, **e.options)
    from focus.toy import ReachTarget, reach_target_tasks, toy_format

    return ReachTarget(**e.options), toy_format(), list(reach_target_tasks(e.n_tasks, seed=e.task_seed))


def _env_from_factory(path: str, /, **kwargs: Any) -> tuple[Env, PolicyFormat, list[Task]]:
    """What ``env.factory`` returns, checked: a factory that raises, or returns its parts
    in another order or of other types, fails in one line naming the factory (not as an
    ``AttributeError`` of the agent's, later). So does one that returns fewer tasks than
    ``n_tasks``: 3 where 64 were asked for is almost surely a mistake in the factory or
    its data file, and a collection on them looks like a finished one of 64."""
    from focus.env import Env, EnvError, Task
    from focus.format import PolicyFormat

    fn = import_object(path)
    try:
        made = fn(**kwargs)
    except Exception as e:
        raise EnvError(f"env.factory {path!r} raised {type(e).__name__}: {e}") from e
    try:
        env, fmt, tasks = made
        tasks = list(tasks)
    except (TypeError, ValueError):
        raise ConfigError(f"env.factory {path!r} must return (env, format, tasks)") from None
    wrong = [
        f"{what} is a {type(got).__name__}, not a {want.__module__}.{want.__name__}"
        for what, got, want in (("env", env, Env), ("format", fmt, PolicyFormat))
        if not isinstance(got, want)
    ]
    bad = next(((i, t) for i, t in enumerate(tasks) if not isinstance(t, Task)), None)
    if bad is not None:
        wrong.append(f"task {bad[0]} is a {type(bad[1]).__name__}, not a focus.env.Task")
    if wrong:
        raise ConfigError(f"env.factory {path!r} must return (env, format, tasks): its {'; its '.join(wrong)}")
    if not tasks:  # it stopped the collection with 'ValueError: Collector needs at least one task'
        raise ConfigError(f"env.factory {path!r} returned no tasks (with {_given(kwargs)}): nothing to collect on")
    if len(tasks) < kwargs["n_tasks"]:  # it collected on 3 tasks of the 64 asked for without a word
        raise ConfigError(
            f"env.factory {path!r} returned {len(tasks)} tasks where {kwargs['n_tasks']} were asked for "
            f"(with {_given(kwargs)}): its code or its data falls short; to collect on those {len(tasks)}, "
            f"ask for {len(tasks)} (--tasks {len(tasks)}, env.n_tasks; a train loop's held-out evaluation: train.eval_tasks)"
        )
    return env, fmt, tasks


def _given(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) or "no arguments"


def build_agent(config: FocusConfig, policy: Policy) -> tuple[Agent, list[Task]]:
    """The agent sampling from ``policy``, and the tasks of this collection."""
    from focus.agent import Agent

    env, fmt, tasks = build_env(config)
    if policy.vocab_size is None:  # no foreign ids in a batch: the codec's tokenizer knows the vocabulary
        policy.vocab_size = vocab_size_for(fmt.codec, config.model.kind)
    a = config.agent
    context, branch_points = agent_parts(config)
    agent = Agent(
        policy,
        env,
        fmt,
        context=context,
        branch_points=branch_points,
        max_steps=a.max_steps,
        sampling=a.sampling,
    )
    return agent, tasks


def agent_parts(config: FocusConfig) -> tuple[ContextManager, BranchPoints]:
    """The agent's context manager and branch-point rule. They travel inside the agent
    to every Dask worker, pickled: a factory's are pickled by reference to their module,
    which the workers import (``focus.dask_payload``)."""
    from focus.branching import BranchPoints, EveryDecision, SparseCheckpoints
    from focus.context import AppendOnly, ContextManager, Segments, Summarize

    c, b = config.agent.context, config.agent.branch_points
    context: ContextManager
    if c.kind == "factory":
        context = _made("agent.context", c.factory or "", c.options, ContextManager, raised=ConfigError)
    else:
        context = {"segments": Segments, "append_only": AppendOnly, "summarize": Summarize}[c.kind](**c.options)
    rule: BranchPoints
    if b.kind == "factory":
        rule = _made("agent.branch_points", b.factory or "", b.options, BranchPoints, raised=ConfigError)
    elif b.kind == "sparse":
        rule = SparseCheckpoints(every=config.agent.sparse_every, **b.options)
    else:
        rule = EveryDecision()
    return context, rule


def build_critic(config: FocusConfig) -> Any:
    """The critic that scores checkpoints (a saved local critic is loaded from its URL)."""
    c = config.critic
    from focus import critic as critics

    if c.kind == "constant":
        return critics.ConstantCritic(c.value)
    if c.kind == "http":
        http = HttpConfig(**c.http.model_dump(), api_key=api_key(c.api_key_env, "critic.api_key_env"))
        return critics.HttpCritic(c.url or "", config=http, **c.options)
    if c.kind == "local":
        if c.weights:
            return critics.LocalCritic.load(c.weights)
        return critics.LocalCritic(**c.options)
    return _made("critic", c.factory or "", c.options, critics.Critic)


def _made(
    section: str,
    path: str,
    options: dict[str, Any],
    want: type,
    fixed: dict[str, Any] | None = None,
    raised: type[Exception] | None = None,
) -> Any:
    """What ``<section>.factory`` makes, if it is a ``want``: a model factory that returned
    something else failed later as ``AttributeError: 'str' object has no attribute 'aclose'``,
    a critic factory's as ``TypeError: Collector's critic must be an instance of Critic``.
    A factory that takes any options (``**options``) and passes them on cannot be checked
    beforehand (:func:`check_factories`): a ``TypeError`` it raises is a
    :class:`ConfigError` naming the factory and the options, where it named neither
    (``TypeError: DigitPolicy.__init__() got an unexpected keyword argument 'nope'``).
    With ``raised``, anything else it raises is one of those, naming the factory (the
    plain parts', whose factory has no service or file to fail on: its code or its
    options are wrong)."""
    try:
        made = import_object(path)(**(fixed or {}), **options)
    except TypeError as e:
        raise ConfigError(
            f"{section}.factory {path!r} raised TypeError: {e} (called with {section}.options {_given(options)})"
        ) from e
    except Exception as e:
        if raised is None or isinstance(e, ConfigError):
            raise
        raise raised(f"{section}.factory {path!r} raised {type(e).__name__}: {e}") from e
    if not isinstance(made, want):
        raise ConfigError(
            f"{section}.factory {path!r} returned a value of type {type(made).__name__}, not a {want.__module__}.{want.__name__}"
        )
    return made


def build_estimator(config: FocusConfig) -> Estimator:
    """The estimator: a built-in kind with its settings, or a factory's, called with
    ``gamma``, ``kappa`` and ``truncation``, which it must keep (the search ranks with
    them, and a resume compares them)."""
    import focus.estimation
    from tasks.config.parts import ESTIMATORS

    e = config.estimator
    common = {"gamma": e.gamma, "kappa": e.kappa, "truncation": e.truncation}
    if e.kind != "factory":
        return getattr(focus.estimation, ESTIMATORS[e.kind])(**common, **e.knobs_set())
    made = _made("estimator", e.factory or "", e.options, focus.estimation.Estimator, common, ConfigError)
    _kept("estimator", e.factory, made, common, "an estimator")
    return made


def _kept(section: str, path: str | None, made: Any, given: dict[str, Any], what: str) -> None:
    """A factory's ``made`` holds the settings it was ``given``, or :class:`ConfigError`."""
    for name, value in given.items():
        got = getattr(made, name, None)
        if got != value:
            raise ConfigError(
                f"{section}.factory {path!r} returned {what} whose {name} is {_short(got)}, not the "
                f"{_short(value)} of {section}.{name}: pass on the {', '.join(given)} it is called with"
            )


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def search_from_factory(search: SearchConfig) -> Priority:
    """``search.factory``'s search, called with the phases and ``waves_in_flight``, which
    it must keep: the pipeline names its checkpoints and reports its progress by them."""
    from focus.priority import Priority

    given = {"phases": tuple(search.phases), "waves_in_flight": search.waves_in_flight}
    made = _made("search", search.factory or "", search.options, Priority, given, ConfigError)
    _kept("search", search.factory, made, given, "a search")
    return made


def build_search(config: FocusConfig) -> Priority:
    """The search as the collector runs it, with the estimator's γ, truncation rule and
    critic weight filled in; a factory's search that sets another γ or rule is refused
    in one line."""
    search = config.search.build_search()
    try:
        return search.resolved(build_estimator(config))
    except ValueError as e:
        if config.search.kind != "factory" or isinstance(e, ConfigError):
            raise
        raise ConfigError(f"search.factory {config.search.factory!r}: {e}") from None


def make_execution(ex: ExecutionConfig) -> Execution:
    """The execution service the rollouts run on, with the library's defaults but where
    the config says otherwise (the search state is kept out of cyclic GC while the
    collection runs: ``Execution.freeze_gc``, on by default), or ``execution.factory``'s,
    called with ``max_concurrency``, ``max_outage_share`` and the options."""
    from focus.execution import Execution

    common: dict[str, Any] = {"max_concurrency": ex.max_concurrency, "max_outage_share": ex.max_outage_share}
    if ex.kind == "factory":
        return _made("execution", ex.factory or "", ex.options, Execution, common, ConfigError)
    if ex.kind != "dask":
        return Execution(**common)
    from focus.dask_execution import DaskExecution

    where = ex.model_dump(include=set(DaskExecution.model_fields) - set(common))  # where and how it runs
    return DaskExecution(**common, **where)


def build_collector(config: FocusConfig, agent: Agent, execution: Any = None) -> Any:
    """The Collector for this config; ``execution`` defaults to in-process asyncio."""
    from focus.collector import Collector
    from focus.execution import Execution

    return Collector(
        agent,
        search=config.build_search(),
        critic=build_critic(config),
        estimator=build_estimator(config),
        execution=execution
        or Execution(
            max_concurrency=config.execution.max_concurrency, max_outage_share=config.execution.max_outage_share
        ),
        collection_id=config.collection_id or "adhoc",
        iteration=config.iteration,
        seed=config.seed,
    )


def served_vocab_size(url: str) -> int | None:
    """The ``vocab_size`` a model server reports on ``/v1/models`` (the embedded server
    does), or ``None`` if it reports none or cannot be asked now."""
    import httpx

    root = url.rstrip("/").removesuffix("/v1")
    try:
        card = httpx.get(f"{root}/v1/models", timeout=5.0).json()["data"][0]
    except (httpx.HTTPError, ValueError, KeyError, IndexError, TypeError):
        return None
    value = card.get("vocab_size") if isinstance(card, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def vocab_size_for(codec: Any, kind: str) -> int:
    """The vocabulary size of ``codec``'s tokenizer; :class:`ConfigError` if it has none."""
    value = getattr(codec, "vocab_size", None)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    raise ConfigError(
        f"model.vocab_size is required: the {kind!r} model service does not report its vocabulary and the "
        f"env's codec {type(codec).__name__} has no vocab_size, so sampled ids could not be checked"
    )
