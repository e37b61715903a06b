"""The configuration's schema: what a collection (or train loop) may be told, and the
rules a value must follow.

:class:`FocusConfig` and its sections are frozen pydantic models: plain data that
pickles and travels as a Prefect flow parameter. Nothing here reads a file, the
environment or the network (:mod:`tasks.config.sources` loads, :mod:`tasks.config.build`
builds the objects a configuration describes). Validation happens once, before any
work: :func:`validate_config` turns pydantic's errors into one :class:`ConfigError`
naming every bad field and why, with a "did you mean" for a misspelt one.

Sections with a module of their own: ``search`` (:mod:`tasks.config.search`), ``agent``
and ``estimator`` with the pluggable sections' base (:mod:`tasks.config.parts`), ``train``
(:mod:`tasks.config.train`), ``storage.read_ahead`` (:mod:`tasks.config.read_ahead`);
the marks of the fields a resume may change are in :mod:`tasks.config.marks`. Each is
importable from here too.
"""

from __future__ import annotations

import difflib
import pathlib
import re
import typing
from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from focus.backends.foreign import endpoint_in_url, listed_twice, url_problem, urls_as_one_string
from focus.backends.retry import RetryPolicy
from focus.env import VALUE_LIMIT
from focus.priority import Priority
from tasks.config.errors import ConfigError, check_env_name
from tasks.config.marks import LOOP_EXTENT, LOOP_ONLY, RUNTIME, Resumable  # noqa: F401 (re-exported: moved there)
from tasks.config.options import check_options
from tasks.config.parts import AgentConfig, EstimatorConfig, Pluggable
from tasks.config.read_ahead import ReadAheadConfig
from tasks.config.search import SearchConfig
from tasks.config.train import BUILTIN_TRAINERS, TrainConfig  # noqa: F401 (re-exported: moved there)

if TYPE_CHECKING:
    from focus.agent import Agent
    from focus.env import Env, Task
    from focus.format import PolicyFormat
    from focus.policy import Policy


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_http_url(name: str, url: str | None) -> None:
    if url is not None and (why := url_problem(url, name) or _host_problem(url, name)):
        raise ValueError(why)


def _host_problem(url: str, name: str) -> str | None:
    """Why no HTTP client can ask ``url``'s host, or None: a host name no lookup takes
    (a label over 63 characters, an empty one, an invalid ``xn--`` label, a character in
    the path that httpx refuses). ``focus collect`` stopped with a rich traceback
    (``IDNAError: Invalid A-label``, ``UnicodeError: ... label empty or too long``) from
    its first contact with the server."""
    import httpx

    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as e:
        return f"{name} {url!r} is not a URL an HTTP client takes ({e})"
    try:
        parsed.host  # noqa: B018 - decodes an xn-- label, which raises when it is invalid
        host = parsed.raw_host.decode("ascii")
        if not host.startswith("[") and ":" not in host:  # an IPv6 address is no name
            host.encode("idna")  # what socket.getaddrinfo does with a name
    except (httpx.InvalidURL, UnicodeError, ValueError) as e:  # idna's IDNAError is a UnicodeError
        return f"{name} {url!r} names a host no lookup takes ({e})"
    return None


#: Model kinds served by a model server at ``model.url`` (or ``model.urls``).
REMOTE = ("openai", "sglang", "llamacpp")
#: Kinds whose client posts to a server root (``local`` too, when it names one).
SERVED = ("local", *REMOTE)


class ModelConfig(Pluggable):
    """The policy's model service.

    ``local`` with no ``url`` starts the embedded tiny model on loopback for the run;
    ``factory`` names a callable returning a :class:`focus.policy.Policy` (called with
    ``options`` as keyword arguments), for services FOCUS has no backend for. ``http``
    holds the HTTP client's timeouts and retries (:class:`focus.backends.HttpConfig`) for the
    served kinds; it says how patiently to talk to the service, not what it computes, so it
    may change when a collection is resumed.
    """

    _section: ClassVar[str] = "model"
    kind: Literal["local", "openai", "sglang", "llamacpp", "tinker", "factory"] = "local"
    url: Annotated[str | None, RUNTIME] = None
    #: Several replicas of the model instead of ``url`` (openai, sglang, llamacpp): each call goes
    #: where its prefix is cached, failing over when one is down (focus.backends.FleetPolicy).
    urls: Annotated[list[str], RUNTIME] = Field(default_factory=list)
    #: The served model's name (OpenAI-compatible ``model`` field); for ``tinker`` the base model.
    model: str | None = None
    #: ``local``: the weights file the embedded server starts from; ``tinker``: a
    #: ``tinker://`` sampler path to sample from instead of the base model.
    weights: str | None = None
    policy_version: str | None = None
    #: Token ids the model knows: a sampled id outside [0, vocab_size) fails its rollout.
    #: Unset, it is asked from the server (``local``) or taken from the env codec's
    #: tokenizer; required where neither knows it (see :func:`tasks.config.build.vocab_size_for`).
    vocab_size: int | None = Field(None, gt=0)
    #: Timeouts, retries, deadline and hedging of the HTTP client (local, openai, sglang, llamacpp).
    http: Annotated[RetryPolicy, RUNTIME] = RetryPolicy()
    #: Name of the environment variable that holds the model service's API key (a server
    #: started with ``--api-key``, a hosted endpoint): sent as ``Authorization: Bearer``,
    #: read where the client is built (a deployment's worker), never written to the
    #: configuration, its record or a log. Unset: no key is sent.
    api_key_env: Annotated[str | None, RUNTIME] = None
    #: Send the first calls of sibling rollouts as one request with ``n`` samples
    #: (local, openai: vLLM's rule, checked once; docs/model-services.md, "Siblings in one
    #: request"). The answers, and so the batch, are the same either way.
    group_siblings: Annotated[bool, RUNTIME] = True

    @field_validator("kind", mode="before")
    @classmethod
    def _server_named(cls, v: Any) -> Any:
        """A server's name where its kind belongs (``vllm``, ``llama.cpp``, ``SGLang``) names
        the kind that speaks to it; it was refused with the list of kinds alone."""
        kind = _KIND_OF_SERVER.get(re.sub(r"[^a-z]", "", v.lower())) if isinstance(v, str) else None
        if kind is not None and kind != v:
            raise ValueError(f"{v!r} is not a model.kind; for that server write model.kind = {kind!r}")
        return v

    @field_validator("urls", mode="before")
    @classmethod
    def _urls_listed(cls, v: Any) -> Any:
        """One string where the list belongs (``--set model.urls=http://a,http://b``) was
        refused as ``Input should be a valid list``, which did not say how to write one."""
        if isinstance(v, str):
            raise ValueError(urls_as_one_string(v))
        return v

    @model_validator(mode="after")
    def _needs(self) -> ModelConfig:
        if self.kind in REMOTE and not (self.url or self.urls):
            raise ValueError(f"model.url is required when model.kind is {self.kind!r} (or model.urls: replicas)")
        if self.urls and (self.url or self.kind not in REMOTE):
            raise ValueError("model.urls replaces model.url, for the openai, sglang and llamacpp kinds")
        for u in self.urls:
            _check_http_url("model.urls", u)
        if why := listed_twice(self.urls, strip_v1=self.kind in ("openai", "local")):
            raise ValueError(why)
        if self.kind == "tinker" and not (self.model or self.weights):
            raise ValueError("model.model (a base model) or model.weights (a tinker:// path) is required for tinker")
        _check_http_url("model.url", self.url)
        check_env_name("model.api_key_env", self.api_key_env)
        if self.kind in SERVED:
            for name, url in [("model.url", self.url), *(("model.urls", u) for u in self.urls)]:
                if why := endpoint_in_url(url, name):
                    raise ValueError(why)
        check_options(self)
        return self


class EnvConfig(Pluggable):
    """The task set: the embedded toy task, or a factory returning ``(env, format, tasks)``."""

    _section: ClassVar[str] = "env"
    kind: Literal["reach_target", "factory"] = "reach_target"
    n_tasks: int = Field(8, gt=0)
    task_seed: int = 0


class CriticConfig(Pluggable):
    _section: ClassVar[str] = "critic"
    kind: Literal["constant", "http", "local", "factory"] = "constant"
    #: What ConstantCritic takes (finite, within focus.env.VALUE_LIMIT): refused here, with
    #: its name; ``inf`` (TOML and JSON both write it) failed when the critic was built, as
    #: ``ValueError: ConstantCritic value must be finite ...``, naming no field.
    value: float = 0.5
    #: Where the scoring service runs; what it predicts is checked on resume by the
    #: critic's identity (tasks.fingerprint.CriticIdentity), as the policy's is by its version.
    url: Annotated[str | None, RUNTIME] = None
    #: Timeouts, retries, deadline and hedging of the HTTP critic's client (kind http).
    http: Annotated[RetryPolicy, RUNTIME] = RetryPolicy()
    #: Name of the environment variable holding the critic service's API key (kind http),
    #: as ``model.api_key_env``: read where the client is built, never stored.
    api_key_env: Annotated[str | None, RUNTIME] = None
    #: ``local``: a saved ``LocalCritic`` (fsspec URL) to start from; the train loop
    #: sets it to the critic each iteration trained.
    weights: str | None = None

    @field_validator("value")
    @classmethod
    def _finite(cls, value: float) -> float:
        """What ConstantCritic takes, refused here with the field's name: ``inf`` (TOML
        and JSON both write it) failed once the critic was built, naming no field."""
        if not -VALUE_LIMIT <= value <= VALUE_LIMIT:  # NaN fails both
            raise ValueError(f"must be finite and within ±{VALUE_LIMIT:g}, got {value!r}")
        return value

    @model_validator(mode="after")
    def _needs(self) -> CriticConfig:
        if self.kind == "http" and not self.url:
            raise ValueError("critic.url is required when critic.kind is 'http'")
        _check_http_url("critic.url", self.url)
        check_env_name("critic.api_key_env", self.api_key_env)
        check_options(self)
        return self


#: ``model.kind`` of a server named as people write it (letters only, lower case).
_KIND_OF_SERVER = {"vllm": "openai", "openaicompatible": "openai", "openai": "openai", "sglang": "sglang",
                   "llamacpp": "llamacpp", "llamaserver": "llamacpp"}  # fmt: skip
#: A Dask scheduler address: ``[scheme://]host[:port][/...]`` (the port is checked per scheme).
_DASK_ADDRESS = re.compile(
    r"(?:(?P<scheme>[a-z][a-z0-9+.-]*)://)?(?P<host>\[[0-9A-Fa-f:.]+\]|[^\s/:\[\]]+)(?::(?P<port>\d{1,5}))?(?:/\S*)?"
)


class ExecutionConfig(Pluggable):
    """Where rollouts run: in the task's process (``local``, the default), on Dask
    (``dask``), or on a factory's :class:`focus.execution.Execution` (``factory``, called
    with ``max_concurrency``, ``max_outage_share`` and ``options``).

    ``dask`` without an ``address`` starts a LocalCluster for the run; an ``address``
    selects ``dask``. In-process is the default because the rollouts
    wait on the model service, not on this process's CPU: on the embedded default it
    finished the flow in 1.2-1.9 s against 2.3-3.0 s on a 2-worker LocalCluster, which
    also took 1.5-2.5 s to start (docs/pipeline.md, "Start-up and wall time").
    ``heartbeat_s`` is how often a running collection tells the Prefect server it is
    alive (see ``deployments/watchdog.py``); it says nothing about the result.
    ``prefect_grace_s`` is how long a flow run goes on while its Prefect server does not
    answer before it fails (``flows/watch.py``): long enough to ride out a restart (16-23 s
    measured on a loaded 2-core machine, where the 10 s default before failed the run),
    short enough that an operator learns of a dead server within a minute.
    """

    _section: ClassVar[str] = "execution"
    kind: Literal["local", "dask", "factory"] = "local"
    address: str | None = None
    n_workers: int = Field(2, gt=0)
    threads_per_worker: int = Field(1, gt=0)
    processes: bool = True
    max_concurrency: int = Field(64, gt=0)
    shard_size: int = Field(16, gt=0)
    heartbeat_s: float = Field(10.0, gt=0)
    prefect_grace_s: float = Field(30.0, gt=0)
    #: See focus.execution.Execution.max_outage_share.
    max_outage_share: float = Field(0.1, ge=0.0, le=1.0)
    #: Dask only: how long a wave waits while the scheduler has no workers (all died, or
    #: none joined yet) before the collection fails with one line; workers that join in
    #: time pick the wave up (focus.dask_execution.workerless_since).
    no_workers_timeout_s: float = Field(300.0, gt=0)

    @field_validator("address")
    @classmethod
    def _address_has_a_port(cls, v: str | None) -> str | None:
        """A TCP scheduler address without its port (``--dask-address 127.0.0.1``) is named
        here, before anything starts: distributed's ``ValueError: missing port number in
        address`` came once the services had started, exit 1 with a traceback."""
        if v is None or not v.strip():
            return None
        m = _DASK_ADDRESS.fullmatch(v.strip())
        if m is None or (m["scheme"] in (None, "tcp", "tls", "ws", "wss") and m["port"] is None):
            raise ValueError(
                f"{v!r} is not a Dask scheduler address: write host:port or tcp://host:port "
                "(a scheduler listens on 8786 unless told otherwise: tcp://127.0.0.1:8786)"
            )
        return v.strip()

    @model_validator(mode="before")
    @classmethod
    def _address_means_dask(cls, data: Any) -> Any:
        """A scheduler address is only used by Dask: giving one selects it. (Before the
        fields are validated: a value an "after" validator returns in place of the model
        is dropped when the model is built by its ``__init__``, so
        ``ExecutionConfig(address=...)`` stayed ``local``.)"""
        if isinstance(data, dict) and data.get("address") and data.get("kind") not in ("dask", "factory"):
            return {**data, "kind": "dask"}
        return data

    @model_validator(mode="after")
    def _options_fit(self) -> ExecutionConfig:
        check_options(self)
        return self


class StorageConfig(_Model):
    """Object storage root (any fsspec URL); a bare path means a local folder."""

    root: str = "runs"
    read_ahead: ReadAheadConfig = Field(default_factory=ReadAheadConfig)

    @field_validator("root")
    @classmethod
    def _root(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("storage.root must not be empty")
        from storage.urls import typo_in_root

        if (typo := typo_in_root(v)) is not None:
            raise ValueError(typo)
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
            from focus.extras import protocol_hint

            raise ValueError(
                f"storage protocol {protocol!r} needs a package that is missing: {e}{protocol_hint(protocol)}"
            ) from None
        return v


class FocusConfig(_Model):
    """Everything one collection (or train loop) needs; pickles and travels as a flow parameter.

    ``collection_id`` names the collection in storage: running again with the same id
    resumes it. Left empty, a flow derives it from its flow run id, so a retry of the
    same flow run resumes too.

    The ``build_*`` methods make the objects the configuration describes; they live in
    :mod:`tasks.config.build` (the one place that imports factories and asks a server).
    """

    collection_id: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
    #: A train loop sets it for each iteration itself.
    iteration: Annotated[int, Resumable("loop", "set by the train loop per iteration")] = Field(0, ge=0)
    seed: int = 0
    model: ModelConfig = ModelConfig()
    env: EnvConfig = EnvConfig()
    agent: AgentConfig = AgentConfig()
    search: SearchConfig = SearchConfig()
    critic: CriticConfig = CriticConfig()
    estimator: EstimatorConfig = EstimatorConfig()
    execution: Annotated[ExecutionConfig, RUNTIME] = ExecutionConfig()
    storage: Annotated[StorageConfig, RUNTIME] = Field(default_factory=StorageConfig)
    train: Annotated[TrainConfig, LOOP_ONLY] = TrainConfig()
    progress: Annotated[bool, RUNTIME] = True

    def with_updates(self, **updates: Any) -> FocusConfig:
        """A validated copy with dotted-key updates (``{"model.url": ...}``)."""
        data = self.model_dump()
        for key, value in updates.items():
            set_dotted(data, key, value)
        return validate_config(data)

    def build_policy(self, url: str | None = None) -> Policy:
        """The policy client; ``url`` overrides ``model.url`` (a server started for the run)."""
        from tasks.config.build import build_policy

        return build_policy(self, url)

    def build_env(self) -> tuple[Env, PolicyFormat, list[Task]]:
        """The env, its policy format and the tasks of this collection."""
        from tasks.config.build import build_env

        return build_env(self)

    def build_agent(self, policy: Policy) -> tuple[Agent, list[Task]]:
        """The agent sampling from ``policy``, and the tasks of this collection."""
        from tasks.config.build import build_agent

        return build_agent(self, policy)

    def build_critic(self) -> Any:
        from tasks.config.build import build_critic

        return build_critic(self)

    def build_estimator(self) -> Any:
        from tasks.config.build import build_estimator

        return build_estimator(self)

    def build_collector(self, agent: Agent, execution: Any = None) -> Any:
        """The Collector for this config; ``execution`` defaults to in-process asyncio."""
        from tasks.config.build import build_collector

        return build_collector(self, agent, execution)

    def build_search(self) -> Priority:
        """The search as the collector runs it: the estimator's γ, truncation rule and
        critic weight filled in (what replaying stored waves must plan with, too)."""
        from tasks.config.build import build_search

        return build_search(self)


def resumable_fields(scope: Literal["collection", "loop"], cls: type[BaseModel] = FocusConfig) -> tuple[str, ...]:
    """Dotted names of the fields (or whole sections) a resume of a ``scope`` ignores:
    those marked :class:`Resumable` for it or for ``any``, read off the schema, so a
    new field is compared on resume unless its declaration says otherwise."""
    out: list[str] = []
    for name, info in cls.model_fields.items():
        marks = [m for m in info.metadata if isinstance(m, Resumable)]
        if any(m.scope in ("any", scope) for m in marks):
            out.append(name)
        elif (sub := _model_of(info.annotation)) is not None:
            out += [f"{name}.{key}" for key in resumable_fields(scope, sub)]
    return tuple(out)


# ---- dotted names: how files, variables, --set and the docs address a field ----


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set ``data[a][b]...`` for ``key = "a.b..."``; a digit part indexes a list
    (``search.phases.1.transitions``), one past its end adds an entry. An index further
    out is refused: the entries between were added empty, and the error named their
    missing fields (``search.phases.2.name: Field required; ...``), not the key."""
    parts = key.split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        nxt = parts[i + 1]
        if isinstance(node, list):
            node = node[_index(part, key, node, parts[:i])]
            continue
        if part not in node or node[part] is None:
            node[part] = [] if nxt.isdigit() else {}
        elif isinstance(node[part], str) and not nxt.isdigit():
            node[part] = {"kind": node[part]}  # a kind's name alone stands for its table (tasks.config.parts)
        node = node[part]
    last = parts[-1]
    if isinstance(node, list):
        node[_index(last, key, node, parts[:-1])] = value
    else:
        node[last] = value


def _index(part: str, key: str, node: list[Any], at: list[str]) -> int:
    """``part`` as an index of ``node``, which grows by one entry where it is its length."""
    if not part.isdigit():
        raise ConfigError(f"invalid configuration key {key!r}: {part!r} must be a list index")
    idx = int(part)
    if idx > len(node):
        raise ConfigError(
            f"invalid configuration key {key!r}: {'.'.join(at)} has {len(node)} entr{'y' if len(node) == 1 else 'ies'}, "
            f"so its next one is {len(node)}, not {idx}"
        )
    if idx == len(node):
        node.append({})
    return idx


def _model_of(annotation: Any) -> type[BaseModel] | None:
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None


def _list_item_model(annotation: Any) -> type[BaseModel] | None:
    args = typing.get_args(annotation)
    return _model_of(args[0]) if typing.get_origin(annotation) is list and args else None


def field_paths(cls: type[BaseModel] = FocusConfig, prefix: str = "", *, into_lists: bool = False) -> list[str]:
    """Dotted names of every leaf field of ``cls``: nested models are walked, other
    values (lists, mappings, scalars) are leaves. With ``into_lists``, a list of models
    (``search.phases``) is walked too, as ``search.phases[].name``."""
    out: list[str] = []
    for name, info in cls.model_fields.items():
        key = f"{prefix}{name}"
        if (sub := _model_of(info.annotation)) is not None:
            out += field_paths(sub, key + ".", into_lists=into_lists)
        elif into_lists and (item := _list_item_model(info.annotation)) is not None:
            out += field_paths(item, key + "[].", into_lists=True)
        else:
            out.append(key)
    return out


def field_annotation(key: str, cls: type[BaseModel] = FocusConfig) -> Any:
    """The type annotation of the field a dotted ``key`` names (list indices step into a
    list of models), or ``None`` when no field has that name."""
    node: type[BaseModel] | None = cls
    annotation: Any = None
    parts = key.split(".")
    for i, part in enumerate(parts):
        if node is None:
            return None
        if part.isdigit() and i > 0 and (item := _list_item_model(annotation)) is not None:
            node, annotation = item, item
            continue
        info = node.model_fields.get(part)
        if info is None:
            return None
        annotation = info.annotation
        node = _model_of(annotation) or (None if _list_item_model(annotation) is None else node)
    return annotation


def _siblings(parent: str, cls: type[BaseModel]) -> list[str]:
    """Field names inside the dotted ``parent`` ("" for the top)."""
    if not parent:
        return list(cls.model_fields)
    annotation = field_annotation(parent, cls)
    sub = _model_of(annotation) or _list_item_model(annotation)
    return list(sub.model_fields) if sub is not None else []


def suggest_field(key: str, cls: type[BaseModel] = FocusConfig) -> str | None:
    """The field a misspelt dotted ``key`` most likely meant: a close name beside it
    (after correcting a misspelt section: ``modle.url`` is ``model.url``), else a field
    elsewhere with the same last name (``url`` at the top: ``model.url``)."""
    parent, _, name = key.rpartition(".")
    if parent and field_annotation(parent, cls) is None:
        fixed = suggest_field(parent, cls)
        parent = fixed if fixed is not None and field_annotation(fixed, cls) is not None else parent
    if name.isdigit() and _list_item_model(field_annotation(parent, cls)) is not None:
        return f"{parent}.{name}"  # an index into a list of tables
    siblings = _siblings(parent, cls)
    close = [name] if name in siblings else difflib.get_close_matches(name, siblings, n=1, cutoff=0.6)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    leaves = [p.replace("[]", "") for p in field_paths(cls, into_lists=True)]
    paths = sorted({".".join(p.split(".")[:n]) for p in leaves for n in range(1, p.count(".") + 2)})
    same = [p for p in paths if p.rsplit(".", 1)[-1] == name]
    if same:
        return " or ".join(same[:3])
    # Not a section the key lies in ("storage.xyz" is not "storage", which it names
    # already), nor a field beside it (weighed by its name above; a whole path's likeness
    # counts the shared section: "agent.sampling.bogus" is not "agent.sampling.stop").
    inside = (f"{key}.", f"{parent}.") if parent else (f"{key}.",)
    others = [p for p in paths if not any(k.startswith(f"{p}.") for k in inside) and not p.startswith(inside[-1])]
    close = difflib.get_close_matches(key, others, n=1, cutoff=0.75)
    return close[0] if close else None


#: What a collection id may hold (its ``pattern``: a folder name in every store).
ID_RULE = "use letters, digits, '_', '.' and '-', at most 128, the first a letter or digit"


def problems_of(error: ValidationError) -> list[tuple[str, str, str | None]]:
    """``(dotted location, reason, field it likely meant)`` per error of a validation;
    the last is set for an unknown field only."""
    out = []
    for err in error.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(top level)"
        if err["type"] == "extra_forbidden":
            out.append((loc, "unknown field", suggest_field(loc)))
        elif err["type"] in ("string_pattern_mismatch", "string_unicode") and loc == "collection_id":
            # the regex told little; a non-UTF-8 locale's undecoded bytes (its surrogates), nothing
            # ("unable to parse raw data as a unicode string"): shown as the terminal showed them
            shown = str(err["input"]).encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            out.append((loc, f"{shown!r} is not a collection id: {ID_RULE}", None))
        else:
            out.append((loc, err["msg"].removeprefix("Value error, "), None))
    return out


def config_error(lines: list[str], source: str = "") -> ConfigError:
    """One :class:`ConfigError` for every bad field (a line each, two-space indented):
    on one line when there is one."""
    where = f" ({source})" if source else ""
    if len(lines) == 1:
        return ConfigError(f"invalid configuration{where}: {lines[0].strip()}")
    return ConfigError(f"invalid configuration{where}:\n" + "\n".join(lines))


def validate_config(data: Mapping[str, Any], source: str = "") -> FocusConfig:
    """A :class:`FocusConfig`, or one :class:`ConfigError` naming every bad field
    (``source``: where the values came from)."""
    try:
        return FocusConfig.model_validate(dict(data))
    except ValidationError as e:
        lines = [f"  {loc}: {why}" + (f" (did you mean {hint}?)" if hint else "") for loc, why, hint in problems_of(e)]
        raise config_error(lines, source) from None
