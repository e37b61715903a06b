"""Configuration of a collection (and of a train loop) as pydantic models.

One :class:`FocusConfig` describes everything a collection needs: the model service,
the task set, the agent, the search, the critic, the estimator, where rollouts run and
where results go. It is plain data, so it pickles and travels as a Prefect flow
parameter; the objects it describes are built where they are used (a Dask worker
builds nothing: it receives a pickled agent).

Sources, later ones win: a TOML or YAML file, ``FOCUS_``-prefixed environment
variables (``FOCUS_MODEL__URL=http://...``, nested fields joined by ``__``, values
parsed as JSON when they parse), then explicit overrides (CLI flags, dotted keys such
as ``search.phases.1.transitions``). Validation happens once, before any work, and an
invalid value fails with a :class:`ConfigError` naming every bad field and why.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import pathlib
import re
import sys
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from focus.backends.retry import HttpConfig, RetryPolicy
from focus.backends.tinker_backend import TinkerUpdateConfig
from focus.policy import SamplingParams
from focus.priority import Phase, Priority, Selective, Uniform
from focus.train_local import UpdateConfig

if TYPE_CHECKING:
    from focus.agent import Agent
    from focus.env import Env, Task
    from focus.format import PolicyFormat
    from focus.policy import Policy

ENV_PREFIX = "FOCUS_"


class ConfigError(ValueError):
    """A configuration that cannot run; the message names each field and the reason."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_import_path(value: str | None) -> str | None:
    if value is not None and (value.count(":") != 1 or not all(value.split(":"))):
        raise ValueError(f"{value!r} is not an import path of the form 'package.module:name'")
    return value


def import_object(path: str) -> Any:
    """The object named by ``package.module:attribute``; errors name the path.

    The current directory is searched too (as ``python -m`` does), so a module in the
    folder a command runs from works with the installed ``focus`` command as well.
    """
    _check_import_path(path)
    module_name, attr = path.split(":")
    _cwd_on_path()
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ConfigError(f"cannot import module {module_name!r} of {path!r}: {e}") from e
    try:
        obj = module
        for part in attr.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None
    return obj


# ---- checks of option mappings and factories, before anything starts ----
#
# ``options`` are keyword arguments of a constructor or factory. A wrong name or shape
# (``model.options = {config = {...}}``, a mapping where the client wants an HttpConfig)
# used to pass validation and then fail every rollout; these checks name it up front.


def _keyword_params(fn: Any) -> dict[str, Any]:
    """Keyword parameters of ``fn`` (a class: its ``__init__``) with resolved annotations;
    an empty dict means "accepts anything" (``**kwargs`` or no signature)."""
    import inspect
    import typing

    target = getattr(fn, "__init__") if isinstance(fn, type) else fn  # noqa: B009 - the class's, not an instance's
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return {}
    if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
        return {}
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # noqa: BLE001 - unresolvable annotations: check names only
        hints = {}
    return {
        name: hints.get(name, Any)
        for name, p in sig.parameters.items()
        if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    }


def _option_target(section: _Pluggable) -> tuple[Any, dict[str, str | None]] | None:
    """What a built-in kind is constructed with, and the parameters set by other fields
    of the section (``None``: not settable from a configuration at all)."""
    kind = getattr(section, "kind", None)
    if isinstance(section, ModelConfig):
        if kind in ("local", "openai"):
            from focus.backends.openai_compat import OpenAICompatPolicy

            return OpenAICompatPolicy, {
                "base_url": "model.url",
                "model": "model.model",
                "config": "model.http",
                "transport": None,
            }
        if kind == "sglang":
            from focus.backends.sglang import SGLangPolicy

            return SGLangPolicy, {"base_url": "model.url", "config": "model.http", "transport": None}
        return None  # tinker: optional dependency; factory: checked by check_factories
    if isinstance(section, CriticConfig):
        from focus import critic as critics

        if kind == "http":
            return critics.HttpCritic, {"url": "critic.url"}
        if kind == "local":
            return critics.LocalCritic, {}  # type: ignore[attr-defined]
        if kind == "constant":
            return (lambda: None), {}  # the value is critic.value; no options
    return None


def check_options(section: _Pluggable) -> None:
    """``ValueError`` naming an option a built-in kind does not take, or of the wrong type."""
    if not section.options:
        return
    target = _option_target(section)
    if target is None:
        return
    fn, reserved = target
    from pydantic import TypeAdapter

    where = f"{section._section}.options"
    params = _keyword_params(fn)
    accepted = sorted(set(params) - set(reserved))
    for name, value in section.options.items():
        if name in reserved:
            other = reserved[name]
            raise ValueError(
                f"{where}.{name}: set {other} instead" if other else f"{where}.{name} cannot be set in a configuration"
            )
        if name not in params:
            takes = f"it takes {', '.join(accepted)}" if accepted else "it takes none"
            raise ValueError(f"{where}: kind {section.kind!r} has no option {name!r} ({takes})")  # type: ignore[attr-defined]
        try:
            TypeAdapter(params[name]).validate_python(value)
        except ValidationError as e:
            err = e.errors()[0]
            raise ValueError(f"{where}.{name}: {err['msg']} (got {value!r})") from None


def check_factories(config: FocusConfig) -> None:
    """Import every factory the configuration names and bind its options to it, so a
    missing module or a misspelt option fails before any server or cluster starts."""
    import inspect

    sections: list[tuple[_Pluggable, dict[str, Any]]] = [
        (config.model, {}),
        (config.env, {"n_tasks": config.env.n_tasks, "seed": config.env.task_seed}),
        (config.critic, {}),
    ]
    for section, fixed in sections:
        if getattr(section, "kind", None) != "factory" or not section.factory:
            continue
        fn = import_object(section.factory)
        name = f"{section._section}.factory {section.factory!r}"
        if not callable(fn):
            raise ConfigError(f"{name} is a {type(fn).__name__}, not a callable")
        try:
            inspect.signature(fn).bind(**fixed, **section.options)
        except TypeError as e:
            raise ConfigError(f"{name} cannot be called with {section._section}.options: {e}") from None
        except ValueError:
            pass  # no signature to check (a builtin)


def check_weights(config: FocusConfig) -> None:
    """A local weights file the embedded model server would start from must exist and be
    one: a missing or unreadable one fails here, before the server starts, not as the
    server's traceback. (Reading it takes milliseconds and no torch.)"""
    m = config.model
    if m.kind != "local" or m.url is not None or not m.weights:
        return
    path = m.weights.removeprefix("file://")
    if "://" in path:
        return  # a URL: the server says whether it can read it
    if not os.path.isfile(path):
        what = "a folder" if os.path.isdir(path) else "no such file"
        raise ConfigError(f"model.weights {m.weights!r}: {what}; give the path of a tinylm weights file")
    from focus.tinylm.arch import read_weights

    try:
        read_weights(path)
    except (ValueError, OSError) as e:
        raise ConfigError(f"model.weights {m.weights!r}: {str(e).removeprefix(f'{path} is ')}") from None


def check_torch(config: FocusConfig, *, training: bool) -> None:
    """What needs torch (the local trainer, the local critic) fails here when torch is not
    installed, with the extra that brings it; collecting with the embedded model does
    not need it."""
    needs = []
    if training and config.train.trainer == "local":
        needs.append("train.trainer 'local'")
    if config.critic.kind == "local":
        needs.append("critic.kind 'local'")
    if not needs:
        return
    try:
        missing = importlib.util.find_spec("torch") is None
    except ImportError:
        missing = True
    if missing:
        verb = "need" if len(needs) > 1 else "needs"
        raise ConfigError(f"{' and '.join(needs)} {verb} torch, which is not installed: pip install 'focus-rl[train]'")


def _cwd_on_path() -> None:
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


class _Pluggable(_Model):
    """A section whose ``kind="factory"`` names a callable by import path, given ``options``."""

    _section: ClassVar[str]
    factory: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("factory")
    @classmethod
    def _check_factory(cls, v: str | None) -> str | None:
        return _check_import_path(v)

    @model_validator(mode="after")
    def _needs_factory(self) -> _Pluggable:
        if getattr(self, "kind", None) == "factory" and not self.factory:
            raise ValueError(
                f"{self._section}.factory (an import path) is required when {self._section}.kind is 'factory'"
            )
        return self


class ModelConfig(_Pluggable):
    """The policy's model service.

    ``local`` with no ``url`` starts the embedded tiny model on loopback for the run;
    ``factory`` names a callable returning a :class:`focus.policy.Policy` (called with
    ``options`` as keyword arguments), for services FOCUS has no backend for. ``http``
    holds the HTTP client's timeouts and retries (:class:`focus.backends.HttpConfig`)
    for the ``local``, ``openai`` and ``sglang`` kinds; it says how patiently to talk to
    the service, not what it computes, so it may change when a collection is resumed.
    """

    _section: ClassVar[str] = "model"
    kind: Literal["local", "openai", "sglang", "tinker", "factory"] = "local"
    url: str | None = None
    #: Several replicas of the model instead of ``url`` (openai, sglang): each call goes
    #: where its prefix is cached, failing over when one is down (focus.backends.FleetPolicy).
    urls: list[str] = Field(default_factory=list)
    #: The served model's name (OpenAI-compatible ``model`` field); for ``tinker`` the base model.
    model: str | None = None
    #: ``local``: the weights file the embedded server starts from; ``tinker``: a
    #: ``tinker://`` sampler path to sample from instead of the base model.
    weights: str | None = None
    policy_version: str | None = None
    #: Token ids the model knows: a sampled id outside [0, vocab_size) fails its rollout.
    #: Unset, it is asked from the server (``local``) or taken from the env codec's
    #: tokenizer; required where neither knows it (see :func:`vocab_size_for`).
    vocab_size: int | None = Field(None, gt=0)
    #: Timeouts, retries, deadline and hedging of the HTTP client (local, openai, sglang).
    http: RetryPolicy = RetryPolicy()

    @model_validator(mode="after")
    def _one_place_for_http(self) -> ModelConfig:
        if "config" in self.options:
            raise ValueError("model.options.config is not accepted: set timeouts and retries in model.http")
        return self

    @model_validator(mode="after")
    def _needs(self) -> ModelConfig:
        if self.kind in ("openai", "sglang") and not (self.url or self.urls):
            raise ValueError(f"model.url is required when model.kind is {self.kind!r} (or model.urls: replicas)")
        if self.urls and (self.url or self.kind not in ("openai", "sglang")):
            raise ValueError("model.urls replaces model.url, for the openai and sglang kinds")
        for u in self.urls:
            if not u.startswith(("http://", "https://")):
                raise ValueError(f"model.urls: {u!r} must start with http:// or https://")
        if self.kind == "tinker" and not (self.model or self.weights):
            raise ValueError("model.model (a base model) or model.weights (a tinker:// path) is required for tinker")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"model.url {self.url!r} must start with http:// or https://")
        check_options(self)
        return self


class EnvConfig(_Pluggable):
    """The task set: the embedded toy task, or a factory returning ``(env, format, tasks)``."""

    _section: ClassVar[str] = "env"
    kind: Literal["reach_target", "factory"] = "reach_target"
    n_tasks: int = Field(8, gt=0)
    task_seed: int = 0


class AgentConfig(_Model):
    max_steps: int = Field(6, ge=1)
    context: Literal["segments", "append_only"] = "segments"
    branch_points: Literal["every", "sparse"] = "every"
    sparse_every: int = Field(2, ge=1)
    #: Sampling of one model response; the same model the library uses, so its fields are documented once.
    sampling: SamplingParams = SamplingParams(max_tokens=48)


def _default_phases() -> list[Phase]:
    return [Phase("evidence", rollouts_per_task=4), Phase("continue", transitions=200, wave_size=16, max_depth=8)]


class SearchConfig(_Model):
    """The search and its phases (:class:`focus.priority.Phase`, validated the same way).

    The search ranks with the estimator's γ, truncation rule and critic weight (one of
    each per collection): :meth:`FocusConfig.priority`.
    """

    kind: Literal["selective", "uniform"] = "selective"
    phases: list[Phase] = Field(default_factory=_default_phases)
    #: Waves planned and running at once (focus.priority.Priority.waves_in_flight): 2
    #: keeps the model service busy while a wave's last rollouts finish, is checkpointed,
    #: and the next one is planned (docs/pipeline.md, "Waves in flight").
    waves_in_flight: int = Field(2, ge=1)

    @model_validator(mode="after")
    def _check(self) -> SearchConfig:
        self.priority()  # the search's own rules: evidence first, unique names
        return self

    def priority(self) -> Priority:
        """The search alone; :meth:`FocusConfig.priority` adds the estimator's settings."""
        cls = Selective if self.kind == "selective" else Uniform
        return cls(phases=tuple(self.phases), waves_in_flight=self.waves_in_flight)


class CriticConfig(_Pluggable):
    _section: ClassVar[str] = "critic"
    kind: Literal["constant", "http", "local", "factory"] = "constant"
    value: float = 0.5
    url: str | None = None
    #: Timeouts, retries, deadline and hedging of the HTTP critic's client (kind http).
    http: RetryPolicy = RetryPolicy()

    @model_validator(mode="after")
    def _one_place_for_http(self) -> CriticConfig:
        if "config" in self.options:
            raise ValueError("critic.options.config is not accepted: set timeouts and retries in critic.http")
        return self

    #: ``local``: a saved ``LocalCritic`` (fsspec URL) to start from; the train loop
    #: sets it to the critic each iteration trained.
    weights: str | None = None

    @model_validator(mode="after")
    def _needs(self) -> CriticConfig:
        if self.kind == "http" and not self.url:
            raise ValueError("critic.url is required when critic.kind is 'http'")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"critic.url {self.url!r} must start with http:// or https://")
        check_options(self)
        return self


class EstimatorConfig(_Model):
    """DirectBranchTd's settings, which the search's ranking also uses (docs/algorithm.md)."""

    #: Discount per task transition.
    gamma: float = Field(1.0, gt=0.0, le=1.0)
    #: Fixed critic weight (pseudo-counts); unset: fitted from the collection's residuals.
    kappa: float | None = Field(None, ge=0.0)
    #: A truncated leaf (max_steps) bootstraps from the critic, or counts as terminal.
    truncation: Literal["bootstrap", "terminal"] = "bootstrap"


class ExecutionConfig(_Model):
    """Where rollouts run: in the task's process (``local``, the default) or on Dask (``dask``).

    ``dask`` without an ``address`` starts a LocalCluster for the run; an ``address``
    selects ``dask``. In-process is the default because the rollouts
    wait on the model service, not on this process's CPU: on the embedded default it
    finished the flow in 1.2-1.9 s against 2.3-3.0 s on a 2-worker LocalCluster, which
    also took 1.5-2.5 s to start (docs/pipeline.md, "Start-up and wall time").
    ``heartbeat_s`` is how often a running collection tells the Prefect server it is
    alive (see ``deployments/watchdog.py``); it says nothing about the result.
    """

    kind: Literal["local", "dask"] = "local"
    address: str | None = None
    n_workers: int = Field(2, gt=0)
    threads_per_worker: int = Field(1, gt=0)
    processes: bool = True
    max_concurrency: int = Field(64, gt=0)
    shard_size: int = Field(16, gt=0)
    heartbeat_s: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _address_means_dask(self) -> ExecutionConfig:
        """A scheduler address is only used by Dask: giving one selects it."""
        return self.model_copy(update={"kind": "dask"}) if self.address and self.kind != "dask" else self

    #: See focus.execution.Execution.max_outage_share.
    max_outage_share: float = Field(0.1, ge=0.0, le=1.0)


class StorageConfig(_Model):
    """Object storage root (any fsspec URL); a bare path means a local folder."""

    root: str = "runs"

    @field_validator("root")
    @classmethod
    def _root(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("storage.root must not be empty")
        if "://" not in v:
            if re.match(r"^[A-Za-z][A-Za-z0-9+.-]+:", v):  # "s3:/bucket": a URL missing a slash
                raise ValueError(f"{v!r} is not a valid URL: write the protocol as 'scheme://...'")
            return "file://" + str(pathlib.Path(v).expanduser().resolve())
        from fsspec import get_filesystem_class

        protocol = v.partition("://")[0]
        try:
            get_filesystem_class(protocol)
        except ValueError:
            raise ValueError(f"unknown storage protocol {protocol!r} in {v!r}") from None
        except ImportError as e:
            raise ValueError(f"storage protocol {protocol!r} needs a package that is missing: {e}") from None
        return v


# ==== the train loop: TrainConfig (train-loop work; keep edits here self-contained) ====

#: Trainers shipped with FOCUS, by the short name ``train.trainer`` accepts.
BUILTIN_TRAINERS = {"local": "tasks.trainers:local_trainer", "tinker": "tasks.trainers:tinker_trainer"}


class TrainConfig(_Model):
    """The train loop (``focus train``): collect -> train -> publish weights -> collect.

    ``trainer`` is ``local`` (the embedded model, :mod:`focus.train_local`, tuned by
    ``local``), ``tinker`` (LoRA on Tinker, tuned by ``tinker``; a dry run without
    ``TINKER_API_KEY``) or the import path ``package.module:function`` of your own
    ``f(batch_url, TrainContext, **options) -> TrainResult`` (the current directory is
    on the import path). Iteration ``i`` collects ``env.n_tasks`` fresh tasks: its seed
    and task seed are derived from ``seed``, ``env.task_seed`` and ``i``.
    """

    #: Collect/train rounds.
    iterations: int = Field(2, gt=0)
    #: ``local``, ``tinker`` or ``package.module:function``.
    trainer: str = "local"
    #: Keyword options of a trainer named by import path.
    options: dict[str, Any] = Field(default_factory=dict)
    #: Hyper-parameters of the local trainer (``focus.train_local.UpdateConfig``).
    local: UpdateConfig = UpdateConfig()
    #: Settings of the Tinker trainer (``focus.backends.tinker_backend.TinkerUpdateConfig``).
    tinker: TinkerUpdateConfig = TinkerUpdateConfig()
    #: Held-out tasks evaluated (one plain rollout each) before training and after each
    #: iteration; 0 turns evaluation off.
    eval_tasks: int = Field(0, ge=0)

    @field_validator("trainer")
    @classmethod
    def _check_trainer(cls, v: str) -> str:
        if v in BUILTIN_TRAINERS:
            return v
        if _check_import_path(v) is None:
            raise ValueError("train.trainer must be 'local', 'tinker' or an import path")
        return v

    def trainer_path(self) -> str:
        """The import path of the trainer step."""
        return BUILTIN_TRAINERS.get(self.trainer, self.trainer)


# ==== end of the train loop part ====


class FocusConfig(_Model):
    """Everything one collection (or train loop) needs; pickles and travels as a flow parameter.

    ``collection_id`` names the collection in storage: running again with the same id
    resumes it. Left empty, a flow derives it from its flow run id, so a retry of the
    same flow run resumes too.
    """

    collection_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    iteration: int = Field(0, ge=0)
    seed: int = 0
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    agent: AgentConfig = AgentConfig()
    search: SearchConfig = SearchConfig()
    critic: CriticConfig = CriticConfig()
    estimator: EstimatorConfig = EstimatorConfig()
    execution: ExecutionConfig = ExecutionConfig()
    storage: StorageConfig = Field(default_factory=StorageConfig)
    train: TrainConfig = TrainConfig()
    progress: bool = True

    def with_updates(self, **updates: Any) -> FocusConfig:
        """A validated copy with dotted-key updates (``{"model.url": ...}``)."""
        data = self.model_dump()
        for key, value in updates.items():
            _set_dotted(data, key, value)
        return validate_config(data)

    # ---- building the runtime objects (lazy imports: config stays light) ----

    def build_policy(self, url: str | None = None) -> Policy:
        """The policy client; ``url`` overrides ``model.url`` (a server started for the run)."""
        from focus.backends.fleet import one_or_fleet

        m = self.model
        url = url or m.url
        urls = m.urls or ([url] if url else [])
        # the client may keep as many calls in flight as the execution runs rollouts
        http = HttpConfig(**m.http.model_dump(), max_concurrency=self.execution.max_concurrency)
        if m.kind == "factory":
            policy = import_object(m.factory or "")(**m.options)
        elif m.kind in ("local", "openai"):
            from focus.backends import OpenAICompatPolicy

            if not urls:
                raise ConfigError("model.url is not set and no local model server was started")
            named = {"model": m.model} if m.model else {}
            policy = one_or_fleet(urls, lambda u: OpenAICompatPolicy(u, **named, config=http, **m.options))
        elif m.kind == "sglang":
            from focus.backends import SGLangPolicy

            policy = one_or_fleet(urls, lambda u: SGLangPolicy(u, config=http, **m.options))
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

    def build_env(self) -> tuple[Env, PolicyFormat, list[Task]]:
        """The env, its policy format and the tasks of this collection."""
        e = self.env
        if e.kind == "factory":
            made = import_object(e.factory or "")(n_tasks=e.n_tasks, seed=e.task_seed, **e.options)
            try:
                env, fmt, tasks = made
            except (TypeError, ValueError):
                raise ConfigError(f"env.factory {e.factory!r} must return (env, format, tasks)") from None
            return env, fmt, list(tasks)
        from focus.toy import ReachTarget, reach_target_tasks, toy_format

        return ReachTarget(**e.options), toy_format(), list(reach_target_tasks(e.n_tasks, seed=e.task_seed))

    def build_agent(self, policy: Policy) -> tuple[Agent, list[Task]]:
        from focus.agent import Agent
        from focus.branching import EveryDecision, SparseCheckpoints
        from focus.context import AppendOnly, Segments

        env, fmt, tasks = self.build_env()
        if policy.vocab_size is None:  # no foreign ids in a batch: the codec's tokenizer knows the vocabulary
            policy.vocab_size = vocab_size_for(fmt.codec, self.model.kind)
        a = self.agent
        agent = Agent(
            policy,
            env,
            fmt,
            context=Segments() if a.context == "segments" else AppendOnly(),
            branch_points=EveryDecision() if a.branch_points == "every" else SparseCheckpoints(every=a.sparse_every),
            max_steps=a.max_steps,
            sampling=a.sampling,
        )
        return agent, tasks

    def build_critic(self) -> Any:
        c = self.critic
        from focus import critic as critics

        if c.kind == "constant":
            return critics.ConstantCritic(c.value)
        if c.kind == "http":
            return critics.HttpCritic(c.url or "", config=HttpConfig(**c.http.model_dump()), **c.options)
        if c.kind == "local":
            if c.weights:
                return critics.LocalCritic.load(c.weights)
            return critics.LocalCritic(**c.options)
        return import_object(c.factory or "")(**c.options)

    def build_estimator(self) -> Any:
        from focus.estimation import DirectBranchTd

        e = self.estimator
        return DirectBranchTd(gamma=e.gamma, kappa=e.kappa, truncation=e.truncation)

    def priority(self) -> Priority:
        """The search as the collector runs it: the estimator's γ, truncation rule and
        critic weight filled in (what replaying stored waves must plan with, too)."""
        return self.search.priority().resolved(self.build_estimator())

    def build_collector(self, agent: Agent, execution: Any = None) -> Any:
        """The Collector for this config; ``execution`` defaults to in-process asyncio."""
        from focus.collector import Collector
        from focus.execution import Execution

        return Collector(
            agent,
            search=self.priority(),
            critic=self.build_critic(),
            estimator=self.build_estimator(),
            execution=execution
            or Execution(
                max_concurrency=self.execution.max_concurrency, max_outage_share=self.execution.max_outage_share
            ),
            collection_id=self.collection_id or "adhoc",
            iteration=self.iteration,
            seed=self.seed,
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


# ---- loading ----


def _set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, list):
            idx = _index(part, key)
            while len(node) <= idx:
                node.append({})
            node = node[idx]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if nxt.isdigit() else {}
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        idx = _index(last, key)
        while len(node) <= idx:
            node.append({})
        node[idx] = value
    else:
        node[last] = value


set_dotted = _set_dotted  # public: deployments build partial configurations with it


def _index(part: str, key: str) -> int:
    if not part.isdigit():
        raise ConfigError(f"invalid configuration key {key!r}: {part!r} must be a list index")
    return int(part)


def _parse_scalar(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The mapping in a TOML or YAML file; errors name the file."""
    p = pathlib.Path(path)
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {str(p)!r}: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise ConfigError(
            f"config file {str(p)!r} is not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}); "
            "save it as UTF-8"
        ) from None
    try:
        if p.suffix == ".toml":
            data: Any = tomllib.loads(text)
        elif p.suffix in (".yaml", ".yml"):
            import yaml

            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"config file {str(p)!r} must end in .toml, .yaml or .yml")
    except (tomllib.TOMLDecodeError, ValueError) as e:
        if isinstance(e, ConfigError):
            raise
        raise ConfigError(f"config file {str(p)!r} is not valid {p.suffix[1:].upper()}: {e}") from e
    except Exception as e:  # yaml.YAMLError without importing yaml at module level
        raise ConfigError(f"config file {str(p)!r} is not valid YAML: {e}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping at the top level")
    return data


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` over ``base``: mappings merge key by key, anything else (lists too) replaces."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, Mapping) and isinstance(out.get(k), dict) else v
    return out


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Dotted-key overrides from ``FOCUS_A__B=value`` variables.

    Only variables whose first part names a configuration section or field count:
    others with the prefix belong to other tools (``FOCUS_WORK_POOL`` and
    ``FOCUS_PROJECT_DIR`` of ``deployments/prefect.yaml``). Below that, a misspelt field
    is still an error naming the variable.
    """
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            key = name[len(ENV_PREFIX) :].lower().replace("__", ".")
            if key.split(".", 1)[0] in FocusConfig.model_fields:
                out[key] = _parse_scalar(value)
    return out


def validate_config(data: Mapping[str, Any], source: str = "") -> FocusConfig:
    """A :class:`FocusConfig`, or one :class:`ConfigError` naming every bad field."""
    try:
        return FocusConfig.model_validate(dict(data))
    except ValidationError as e:
        lines = []
        for err in e.errors():
            loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
            msg = err["msg"].removeprefix("Value error, ")
            if err["type"] == "extra_forbidden":
                msg = "unknown field"
            lines.append(f"  {loc}: {msg}")
        where = f" ({source})" if source else ""
        raise ConfigError("invalid configuration" + where + ":\n" + "\n".join(lines)) from None


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> FocusConfig:
    """File, then ``FOCUS_*`` environment variables, then ``overrides`` (dotted keys)."""
    data = _merge(FocusConfig.model_construct().model_dump(), read_file(path) if path is not None else {})
    sources = [str(path)] if path is not None else []
    env = env_overrides(os.environ if environ is None else environ)
    if env:
        sources.append("environment " + ", ".join(ENV_PREFIX + k.upper().replace(".", "__") for k in sorted(env)))
    for key, value in {**env, **dict(overrides or {})}.items():
        _set_dotted(data, key, value)
    if overrides:
        sources.append("flags")
    return validate_config(data, "from " + "; ".join(sources) if sources else "")


def config_at_runtime(config: FocusConfig | None, environ: Mapping[str, str] | None = None) -> FocusConfig:
    """The configuration a flow run uses: the defaults, then the ``FOCUS_*`` variables of
    the process running it, then the fields its ``config`` parameter sets.

    A deployment stores only the fields its configuration files name (pydantic remembers
    which fields a parameter set), so a worker's or a ``focus deploy`` process's
    ``FOCUS_*`` variables - where the model service and the store are, say - fill in the
    rest at run time, the same way on both paths; what a run's parameters say explicitly
    (a deployment's file, an edit in the UI's Custom run) wins. A config built by
    :func:`load_config` sets every field, so a CLI run is unchanged.
    """
    explicit = config.model_dump(mode="json", exclude_unset=True) if config is not None else {}
    env = env_overrides(os.environ if environ is None else environ)
    if not env:
        return config if config is not None else FocusConfig()
    data = FocusConfig.model_construct().model_dump()
    for key, value in env.items():
        _set_dotted(data, key, value)
    names = ", ".join(ENV_PREFIX + k.upper().replace(".", "__") for k in sorted(env))
    return validate_config(_merge(data, explicit), f"from environment {names}; the run's config parameter")


# ==== the trainer hook of the train loop (train-loop work) ====


@dataclass(frozen=True)
class TrainContext:
    """What a trainer step is given besides the batch URL.

    ``weights`` is the weights URL (or path) the batch was sampled with (``None``: the
    model's default), ``critic`` the critic weights it was scored with, ``state`` the
    previous step's :attr:`TrainResult.state` (``None`` on the first step). ``out`` is
    the folder URL under the store root where this step's version goes
    (``storage.WeightStore``: ``weights/<run>/v<iteration + 1>``); ``workdir`` a local
    scratch folder.
    """

    iteration: int
    config: FocusConfig
    weights: str | None
    policy_version: str | None
    workdir: str
    model_url: str | None = None
    out: str = ""
    critic: str | None = None
    state: str | None = None


@dataclass(frozen=True)
class TrainResult:
    """What a trainer step returns: the new policy version and where its weights are.

    For the embedded model ``weights`` is a weights file (URL or path) the flow loads
    into the model server before the next collection; for Tinker, the ``tinker://``
    sampler path the next collection samples from. ``critic`` is the critic to score
    the next collection with, ``state`` whatever the next step needs to continue
    (passed back as :attr:`TrainContext.state`). ``metrics`` are numbers to report.
    """

    policy_version: str
    weights: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    critic: str | None = None
    state: str | None = None


# ==== where each value of a configuration comes from (`focus config show`) ====


def field_paths(cls: type[BaseModel] = FocusConfig, prefix: str = "", *, into_lists: bool = False) -> list[str]:
    """Dotted names of every leaf field of ``cls``: nested models are walked, other
    values (lists, mappings, scalars) are leaves. With ``into_lists``, a list of models
    (``search.phases``) is walked too, as ``search.phases[].name``."""
    import typing

    out: list[str] = []
    for name, info in cls.model_fields.items():
        ann = info.annotation
        key = f"{prefix}{name}"
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            out += field_paths(ann, key + ".", into_lists=into_lists)
            continue
        args = typing.get_args(ann)
        if into_lists and typing.get_origin(ann) is list and args and issubclass(args[0], BaseModel):
            out += field_paths(args[0], key + "[].", into_lists=True)
            continue
        out.append(key)
    return out


def _set_keys(data: Mapping[str, Any], prefix: str = "") -> list[str]:
    out: list[str] = []
    for k, v in data.items():
        key = f"{prefix}{k}"
        out += _set_keys(v, key + ".") if isinstance(v, Mapping) and v else [key]
    return out


def explain_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[FocusConfig, list[tuple[str, Any, str]]]:
    """The effective configuration (as :func:`load_config` builds it) and, per leaf
    field, ``(dotted name, value, source)``: ``default``, the file, the environment
    variable or ``--set`` that set it last."""
    config = load_config(path, overrides, environ)
    layers: list[tuple[str, list[str]]] = []
    if path is not None:
        layers.append((str(path), _set_keys(read_file(path))))
    for key in env_overrides(os.environ if environ is None else environ):
        layers.append((ENV_PREFIX + key.upper().replace(".", "__"), [key]))
    for key in overrides or {}:
        layers.append((f"--set {key}", [key]))
    data = config.model_dump(mode="json")
    rows = []
    for leaf in field_paths():
        value: Any = data
        for part in leaf.split("."):
            value = value[part]
        source = "default"
        for name, keys in layers:
            if any(k == leaf or k.startswith(leaf + ".") or leaf.startswith(k + ".") for k in keys):
                source = name
        rows.append((leaf, value, source))
    return config, rows
