"""Configuration of a collection (and of a train loop): data, loaded in layers, built
where it is used.

- :mod:`tasks.config.schema`: :class:`FocusConfig`, its sections and their rules
  (``search`` in :mod:`tasks.config.search`, ``train`` in :mod:`tasks.config.train`)
  (:mod:`tasks.config.options` checks a section's ``options`` against its backend).
- :mod:`tasks.config.sources`: the defaults, a TOML/YAML file, ``FOCUS_*`` variables and
  ``--set``, in that order; which source set each value (``focus config show``).
- :mod:`tasks.config.build`: the objects a configuration describes (the one place that
  imports factories and asks a server).
- :mod:`tasks.config.form`: the flow parameter a Prefect form edits.
- :mod:`tasks.config.reference`: what each field means, rendered into docs/pipeline.md
  and the comments of configs/*.toml.

The names below are the ones the pipeline imports from ``tasks.config``.
"""

from tasks.config.build import (
    build_agent,
    build_collector,
    build_critic,
    build_env,
    build_estimator,
    build_policy,
    check_factories,
    import_object,
    served_vocab_size,
    vocab_size_for,
)
from tasks.config.schema import (
    BUILTIN_TRAINERS,
    AgentConfig,
    ConfigError,
    CriticConfig,
    EnvConfig,
    EstimatorConfig,
    ExecutionConfig,
    FocusConfig,
    ModelConfig,
    SearchConfig,
    StorageConfig,
    TrainConfig,
    field_paths,
    set_dotted,
    validate_config,
)
from tasks.config.sources import (
    ENV_PREFIX,
    config_at_runtime,
    env_name,
    explain_config,
    load_config,
    read_file,
)
from tasks.trainers import TrainContext, TrainResult

__all__ = [
    "BUILTIN_TRAINERS",
    "ENV_PREFIX",
    "AgentConfig",
    "ConfigError",
    "CriticConfig",
    "EnvConfig",
    "EstimatorConfig",
    "ExecutionConfig",
    "FocusConfig",
    "ModelConfig",
    "SearchConfig",
    "StorageConfig",
    "TrainConfig",
    "TrainContext",
    "TrainResult",
    "build_agent",
    "build_collector",
    "build_critic",
    "build_env",
    "build_estimator",
    "build_policy",
    "check_factories",
    "config_at_runtime",
    "env_name",
    "explain_config",
    "field_paths",
    "import_object",
    "load_config",
    "read_file",
    "served_vocab_size",
    "set_dotted",
    "validate_config",
    "vocab_size_for",
]
