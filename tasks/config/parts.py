"""The pluggable sections: a part chosen by ``kind``, built in (with its settings) or
``kind = "factory"``, a callable named by import path and given ``options``.

:class:`Pluggable` is what ``model``, ``env``, ``critic``, ``search``, ``estimator``,
``execution``, ``agent.context`` and ``agent.branch_points`` share: the ``factory`` and
``options`` fields and their rules, one message for each wherever it is broken. The
sections of the agent and of the estimator live here too (the schema module is kept
under the structure test's line limit); what each field means is in
:mod:`tasks.config.reference`, what a factory is called with and what it must return in
:mod:`tasks.config.build`.

``agent.context`` and ``agent.branch_points`` were a kind's name before they could
name a factory; a name alone still stands for the table (``context = "append_only"``
is ``[agent.context] kind = "append_only"``), and a collection stored with a name
resumes (:data:`BEFORE_PARTS`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from focus.policy import SamplingParams
from tasks.config.errors import check_import_path
from tasks.config.options import check_options


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Pluggable(_Model):
    """A section whose ``kind="factory"`` names a callable by import path, given ``options``."""

    _section: ClassVar[str]
    factory: str | None = None
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("factory")
    @classmethod
    def _check_factory(cls, v: str | None) -> str | None:
        return check_import_path(v)

    @model_validator(mode="after")
    def _needs_factory(self) -> Pluggable:
        kind, where = getattr(self, "kind", None), self._section
        if kind == "factory" and not self.factory:
            raise ValueError(f"{where}.factory (an import path) is required when {where}.kind is 'factory'")
        if self.factory and kind not in (None, "factory"):  # `--set env.factory=...` alone ran the toy task
            why = f"{where}.kind is {kind!r}, which does not use it; set {where}.kind = 'factory' to use it"
            raise ValueError(f"{where}.factory {self.factory!r} is set but {why}, or remove {where}.factory")
        return self

    @model_validator(mode="after")
    def _one_place_for_http(self) -> Pluggable:
        """A section with an ``http`` client policy takes its timeouts there, not in ``options``."""
        if "http" in type(self).model_fields and "config" in self.options:
            where = self._section
            raise ValueError(f"{where}.options.config is not accepted: set timeouts and retries in {where}.http")
        return self


class _NamedByKind(Pluggable):
    """A section that was a kind's name before it could name a factory: the name alone
    (a file's ``context = "append_only"``, ``--set agent.context=append_only``) is the
    table with that kind."""

    @model_validator(mode="before")
    @classmethod
    def _kind_alone(cls, data: Any) -> Any:
        return {"kind": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _options_fit(self) -> _NamedByKind:
        check_options(self)
        return self


class ContextConfig(_NamedByKind):
    """How a rollout's context grows (:class:`focus.context.ContextManager`)."""

    _section: ClassVar[str] = "agent.context"
    kind: Literal["segments", "append_only", "summarize", "factory"] = "segments"

    @model_validator(mode="after")
    def _summarize_needs_a_limit(self) -> ContextConfig:
        if self.kind == "summarize":
            if "max_prompt_tokens" not in self.options:
                raise ValueError(
                    "agent.context.options.max_prompt_tokens (the prompt length that starts a summary) is required "
                    "when agent.context.kind is 'summarize'"
                )
            from focus.context import Summarize

            Summarize(**self.options)  # its own rules (a positive limit), named by its message
        return self


class BranchPointsConfig(_NamedByKind):
    """Which decision points become checkpoints (:class:`focus.branching.BranchPoints`)."""

    _section: ClassVar[str] = "agent.branch_points"
    kind: Literal["every", "sparse", "factory"] = "every"


class AgentConfig(_Model):
    max_steps: int = Field(6, ge=1)
    context: ContextConfig = ContextConfig()
    branch_points: BranchPointsConfig = BranchPointsConfig()
    sparse_every: int = Field(2, ge=1)
    #: Sampling of one model response; the same model the library uses, so its fields are documented once.
    sampling: SamplingParams = SamplingParams(max_tokens=48)


#: Fields of :class:`focus.estimation.GroupNormalized` the configuration may set (only
#: with ``estimator.kind = "group_normalized"``); unset, the library's default holds, and
#: a collection's fingerprint records the value the estimator got, as for the search's
#: knobs (:mod:`tasks.config.search`).
ESTIMATOR_KNOBS = {"group_normalized": ("scale", "eps")}

#: The estimator kinds built in, and the class each one builds (:mod:`focus.estimation`).
ESTIMATORS = {"direct_branch_td": "DirectBranchTd", "group_normalized": "GroupNormalized",
              "node_monte_carlo": "NodeMonteCarlo"}  # fmt: skip


class EstimatorConfig(Pluggable):
    """The estimator's settings, which the search's ranking also uses (docs/algorithm.md):
    DirectBranchTd (the default), the baselines GroupNormalized (GRPO-style) and
    NodeMonteCarlo, or a factory's, called with ``gamma``, ``kappa`` and ``truncation``."""

    _section: ClassVar[str] = "estimator"
    kind: Literal["direct_branch_td", "group_normalized", "node_monte_carlo", "factory"] = "direct_branch_td"
    #: Discount per task transition.
    gamma: float = Field(1.0, gt=0.0, le=1.0)
    #: Fixed critic weight (pseudo-counts, finite); unset: fitted from the collection's residuals.
    kappa: float | None = Field(None, ge=0.0, allow_inf_nan=False)
    #: A truncated leaf (max_steps) bootstraps from the critic, or counts as terminal.
    truncation: Literal["bootstrap", "terminal"] = "bootstrap"
    #: focus.estimation.GroupNormalized.scale; unset: the library's default.
    scale: bool | None = None
    #: focus.estimation.GroupNormalized.eps; unset: the library's default.
    eps: float | None = Field(None, ge=0.0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _check(self) -> EstimatorConfig:
        wrong = [n for n in ("scale", "eps") if getattr(self, n) is not None and n not in self.knob_names()]
        if wrong:
            names = " and ".join(f"estimator.{n}" for n in wrong)
            one = len(wrong) == 1
            raise ValueError(
                f"{names} {'is' if one else 'are'} set but estimator.kind is {self.kind!r}, which does not use "
                f"{'it' if one else 'them'}; set estimator.kind = 'group_normalized', or remove {names}"
            )
        check_options(self)
        return self

    def knob_names(self) -> tuple[str, ...]:
        return ESTIMATOR_KNOBS.get(self.kind, ())

    def knobs_set(self) -> dict[str, Any]:
        """The knobs this configuration sets (the others are the library's defaults)."""
        return {n: value for n in self.knob_names() if (value := getattr(self, n)) is not None}

    def knob_values(self) -> dict[str, Any]:
        """Every knob's value in the estimator this configuration builds (unset: the
        library's default); none for a kind without knobs. What a fingerprint records."""
        if not self.knob_names():
            return {}
        import focus.estimation

        cls = getattr(focus.estimation, ESTIMATORS[self.kind])
        return {n: self.knobs_set().get(n, cls.model_fields[n].default) for n in self.knob_names()}


#: What a collection stored before these sections could name a factory ran with: no
#: factory, no options, DirectBranchTd. A stored fingerprint without them is read with
#: these (:func:`tasks.fingerprint.with_old_parts`), so it resumes.
BEFORE_PARTS: dict[str, dict[str, Any]] = {
    "search": {"factory": None, "options": {}},
    "estimator": {"kind": "direct_branch_td", "factory": None, "options": {}},
    "agent.context": {"factory": None, "options": {}},
    "agent.branch_points": {"factory": None, "options": {}},
}
