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
import json
import os
import pathlib
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from focus.policy import SamplingParams
from focus.priority import Phase, Priority, Selective, Uniform

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
    """The object named by ``package.module:attribute``; errors name the path."""
    _check_import_path(path)
    module_name, attr = path.split(":")
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
    ``options`` as keyword arguments), for services FOCUS has no backend for.
    """

    _section: ClassVar[str] = "model"
    kind: Literal["local", "openai", "sglang", "tinker", "factory"] = "local"
    url: str | None = None
    model: str | None = None
    weights: str | None = None
    policy_version: str | None = None

    @model_validator(mode="after")
    def _needs(self) -> ModelConfig:
        if self.kind in ("openai", "sglang") and not self.url:
            raise ValueError(f"model.url is required when model.kind is {self.kind!r}")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"model.url {self.url!r} must start with http:// or https://")
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

    ``kappa``, ``gamma`` and ``truncation`` left unset follow the estimator's (filled in
    by :class:`FocusConfig`): one γ and one truncation rule for search and batch.
    """

    kind: Literal["selective", "uniform"] = "selective"
    phases: list[Phase] = Field(default_factory=_default_phases)
    kappa: float | None = Field(None, ge=0.0)
    gamma: float | None = Field(None, gt=0.0, le=1.0)
    truncation: Literal["bootstrap", "terminal"] | None = None
    #: The estimator's settings for the fields left unset (filled by FocusConfig).
    _follow: dict[str, Any] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _check(self) -> SearchConfig:
        self.priority()  # the search's own rules: evidence first, unique names
        return self

    def priority(self) -> Priority:
        cls = Selective if self.kind == "selective" else Uniform
        fields = {k: getattr(self, k) for k in ("kappa", "gamma", "truncation")}
        fields = {k: v if v is not None else self._follow.get(k) for k, v in fields.items()}
        return cls(phases=tuple(self.phases), **fields)


class CriticConfig(_Pluggable):
    _section: ClassVar[str] = "critic"
    kind: Literal["constant", "http", "local", "factory"] = "constant"
    value: float = 0.5
    url: str | None = None

    @model_validator(mode="after")
    def _needs(self) -> CriticConfig:
        if self.kind == "http" and not self.url:
            raise ValueError("critic.url is required when critic.kind is 'http'")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"critic.url {self.url!r} must start with http:// or https://")
        return self


class EstimatorConfig(_Model):
    gamma: float = Field(1.0, gt=0.0, le=1.0)
    #: Fixed critic weight (pseudo-counts); unset: from the collection's residuals.
    kappa: float | None = Field(None, ge=0.0)
    #: A truncated leaf bootstraps from the critic or counts as terminal.
    truncation: Literal["bootstrap", "terminal"] = "bootstrap"


class ExecutionConfig(_Model):
    """Where rollouts run: in the task's process (``local``) or on Dask (``dask``).

    ``dask`` without an ``address`` starts a LocalCluster for the run.
    """

    kind: Literal["local", "dask"] = "dask"
    address: str | None = None
    n_workers: int = Field(2, gt=0)
    threads_per_worker: int = Field(1, gt=0)
    processes: bool = True
    max_concurrency: int = Field(64, gt=0)
    shard_size: int = Field(16, gt=0)


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


class TrainConfig(_Model):
    """The train loop: ``trainer`` is an import path of ``f(batch_url, context) -> TrainResult``."""

    iterations: int = Field(2, gt=0)
    trainer: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("trainer")
    @classmethod
    def _check_trainer(cls, v: str | None) -> str | None:
        return _check_import_path(v)


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

    @model_validator(mode="after")
    def _one_gamma(self) -> FocusConfig:
        """The search follows the estimator's γ, truncation rule and κ where unset; a
        different γ or truncation rule is refused (one of each per collection)."""
        est, search = self.estimator, self.search
        for name in ("gamma", "truncation"):
            mine = getattr(search, name)
            if mine is not None and mine != getattr(est, name):
                raise ValueError(
                    f"search.{name} ({mine!r}) differs from estimator.{name} ({getattr(est, name)!r}): "
                    f"set it once, under estimator"
                )
        follow = {k: getattr(est, k) for k in ("kappa", "gamma", "truncation")}
        if search._follow != follow:
            search = search.model_copy()  # a default instance may be shared between configs
            search._follow = follow
            object.__setattr__(self, "search", search)
        return self

    def with_updates(self, **updates: Any) -> FocusConfig:
        """A validated copy with dotted-key updates (``{"model.url": ...}``)."""
        data = self.model_dump()
        for key, value in updates.items():
            _set_dotted(data, key, value)
        return validate_config(data)

    # ---- building the runtime objects (lazy imports: config stays light) ----

    def build_policy(self, url: str | None = None) -> Policy:
        """The policy client; ``url`` overrides ``model.url`` (a server started for the run)."""
        m = self.model
        url = url or m.url
        if m.kind == "factory":
            policy = import_object(m.factory or "")(**m.options)
        elif m.kind in ("local", "openai"):
            from focus.backends import OpenAICompatPolicy

            if url is None:
                raise ConfigError("model.url is not set and no local model server was started")
            policy = OpenAICompatPolicy(url, **({"model": m.model} if m.model else {}), **m.options)
        elif m.kind == "sglang":
            from focus.backends import SGLangPolicy

            policy = SGLangPolicy(url, **m.options)
        else:
            from focus.backends import TinkerPolicy

            policy = TinkerPolicy(**({"model": m.model} if m.model else {}), **m.options)
        if m.policy_version is not None:
            policy.policy_version = m.policy_version
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
            return critics.HttpCritic(c.url or "", **c.options)
        if c.kind == "local":
            return critics.LocalCritic(**c.options)  # type: ignore[attr-defined]
        return import_object(c.factory or "")(**c.options)

    def build_collector(self, agent: Agent, execution: Any = None) -> Any:
        """The Collector for this config; ``execution`` defaults to in-process asyncio."""
        from focus.collector import Collector
        from focus.estimation import DirectBranchTd
        from focus.execution import Execution

        return Collector(
            agent,
            search=self.search.priority(),
            critic=self.build_critic(),
            estimator=DirectBranchTd(
                gamma=self.estimator.gamma, kappa=self.estimator.kappa, truncation=self.estimator.truncation
            ),
            execution=execution or Execution(max_concurrency=self.execution.max_concurrency),
            collection_id=self.collection_id or "adhoc",
            iteration=self.iteration,
            seed=self.seed,
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
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read config file {str(p)!r}: {e.strerror}") from e
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
    """Dotted-key overrides from ``FOCUS_A__B=value`` variables."""
    out: dict[str, Any] = {}
    for name, value in environ.items():
        if name.startswith(ENV_PREFIX) and len(name) > len(ENV_PREFIX):
            out[name[len(ENV_PREFIX) :].lower().replace("__", ".")] = _parse_scalar(value)
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


# ---- the trainer hook of the train loop ----


@dataclass(frozen=True)
class TrainContext:
    """What a trainer step is given besides the batch URL.

    ``weights`` is the weights file the batch was sampled with (``None``: the model's
    default); ``workdir`` is a local folder the trainer may write new weights into.
    """

    iteration: int
    config: FocusConfig
    weights: str | None
    policy_version: str | None
    workdir: str
    model_url: str | None = None


@dataclass(frozen=True)
class TrainResult:
    """What a trainer step returns: the new policy version and, for the embedded model,
    the weights file the flow reloads into the model server before the next collection."""

    policy_version: str
    weights: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
