"""``train``: the train loop's section (``focus train``).

A section of its own module, as ``storage.read_ahead`` is (:mod:`tasks.config.read_ahead`):
the schema module is kept under the structure test's line limit. What each field means
is in :mod:`tasks.config.reference`.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from focus.backends.tinker_backend import TinkerUpdateConfig
from focus.update_config import UpdateConfig
from tasks.config.errors import check_import_path
from tasks.config.marks import LOOP_EXTENT

#: Trainers shipped with FOCUS, by the short name ``train.trainer`` accepts.
BUILTIN_TRAINERS = {"local": "tasks.trainers:local_trainer", "tinker": "tasks.trainers:tinker_trainer"}


class TrainConfig(BaseModel):
    """The train loop (``focus train``): collect -> train -> publish weights -> collect.

    ``trainer`` is ``local`` (the embedded model, :mod:`focus.train_local`, tuned by
    ``local``), ``tinker`` (LoRA on Tinker, tuned by ``tinker``; a dry run without
    ``TINKER_API_KEY``) or the import path ``package.module:function`` of your own
    trainer step (:mod:`tasks.trainers` says what it is given and returns; the current
    directory is on the import path). Iteration ``i`` collects ``env.n_tasks`` fresh
    tasks: its seed and task seed are derived from ``seed``, ``env.task_seed`` and ``i``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    #: Collect/train rounds.
    iterations: Annotated[int, LOOP_EXTENT] = Field(2, gt=0)
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
    eval_tasks: Annotated[int, LOOP_EXTENT] = Field(0, ge=0)

    @field_validator("trainer")
    @classmethod
    def _check_trainer(cls, v: str) -> str:
        if v in BUILTIN_TRAINERS:
            return v
        try:  # its own line named the import path alone: a mistyped built-in ('Local', 'verl') read as one
            return str(check_import_path(v))
        except ValueError:
            raise ValueError(
                f"{v!r} is neither a trainer FOCUS ships ({', '.join(map(repr, BUILTIN_TRAINERS))}) nor an import "
                "path of the form 'package.module:name'"
            ) from None

    def trainer_path(self) -> str:
        """The import path of the trainer step."""
        return BUILTIN_TRAINERS.get(self.trainer, self.trainer)
