"""``search``: the search's kind, its phases and its knobs (:mod:`focus.priority`).

A section of its own module, as ``storage.read_ahead`` is (:mod:`tasks.config.read_ahead`):
the schema module is kept under the structure test's line limit. What each field means
is in :mod:`tasks.config.reference`; what a knob does, in the library field it sets.

A knob (:data:`SELECTIVE_KNOBS`) left unset is not passed to the library, so the search
gets the library's default, whatever it is when the collection runs; its constraints are
the library field's too. A collection's fingerprint records the value the search got
(:meth:`SearchConfig.knob_values`), so a resume after the library's default changed is
refused like any other change of the search (:mod:`tasks.fingerprint`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, model_validator

from focus.priority import Phase, Priority, Selective, Uniform
from tasks.config.options import check_options
from tasks.config.parts import Pluggable

#: Fields of :class:`focus.priority.Selective` a configuration may set (only with
#: ``kind = "selective"``); unset, the library's default holds.
SELECTIVE_KNOBS = ("explore", "depth_share")

#: The public fields of the library's searches the configuration does not expose, and why
#: (tests/test_config_search.py holds every public field to one list or the other).
LEFT_OUT = {
    "kappa": "the estimator's (estimator.kappa): one critic weight holds for search and batch",
    "gamma": "the estimator's (estimator.gamma): one discount holds for search and batch",
    "truncation": "the estimator's (estimator.truncation): one rule holds for search and batch",
    "use_influence": "an ablation of Selective's score (docs/algorithm.md, 'Priorities'), not a setting",
    "targets": "an ablation of Selective's score (the critic targets' term), measured worse; not a setting",
    "per_transition": "an ablation of Selective's score (no division by the expected cost); not a setting",
}

#: What a collection made before the configuration had the knobs ran with: the library's
#: defaults of that time (explore 0.25 since b0d2244, depth_share 0 since 8d646b1). A
#: stored fingerprint without a knob is read with these (:func:`tasks.fingerprint.with_old_knobs`),
#: so it resumes while the library keeps them and is refused once a default moves.
BEFORE_KNOBS: dict[str, Any] = {"explore": 0.25, "depth_share": 0.0}


def _library(name: str) -> tuple[Any, ...]:
    """The constraints of the library field ``Selective.<name>`` (bounds, finiteness)."""
    return tuple(Selective.model_fields[name].metadata)


def _default_phases() -> list[Phase]:
    return [Phase("evidence", rollouts_per_task=4), Phase("continue", transitions=200, wave_size=16, max_depth=8)]


#: What a phase's name may hold: a part of its checkpoints' names in the store.
_PHASE_NAME = re.compile(r"[A-Za-z0-9_.=-]{0,150}")


class SearchConfig(Pluggable):
    """The search and its phases (:class:`focus.priority.Phase`, validated the same way).

    It ranks with the estimator's γ, truncation rule and critic weight (one of each per
    collection): :meth:`FocusConfig.build_search`. ``kind = "factory"`` names a callable
    returning a :class:`focus.priority.Priority`, called with ``phases``,
    ``waves_in_flight`` and ``options`` (a ``Priority`` subclass itself is one)."""

    _section: ClassVar[str] = "search"
    kind: Literal["selective", "uniform", "factory"] = "selective"
    phases: list[Phase] = Field(default_factory=_default_phases)
    #: Waves planned and running at once (focus.priority.Priority.waves_in_flight): 2
    #: keeps the model service busy while a wave's last rollouts finish, is checkpointed,
    #: and the next one is planned (docs/pipeline.md, "Waves in flight").
    waves_in_flight: int = Field(2, ge=1)
    #: focus.priority.Selective.explore; unset: the library's default.
    explore: Annotated[float | None, *_library("explore")] = None
    #: focus.priority.Selective.depth_share; unset: the library's default.
    depth_share: Annotated[float | None, *_library("depth_share")] = None

    @model_validator(mode="after")
    def _check(self) -> SearchConfig:
        if self.kind != "selective" and (knobs := self.knobs_set()):
            names = " and ".join(f"search.{name}" for name in knobs)
            raise ValueError(
                f"{names} {'is' if len(knobs) == 1 else 'are'} set but search.kind is {self.kind!r}, which does not "
                f"use {'it' if len(knobs) == 1 else 'them'}; set search.kind = 'selective', or remove {names}"
            )
        for i, phase in enumerate(self.phases):
            # a phase's checkpoints are named "<index>.<name>[.score|.end]" in the store
            # (storage.urls.check_id): a name it cannot hold passed here and failed at
            # the first wave's save, after the evidence phase had run
            if not _PHASE_NAME.fullmatch(phase.name):
                raise ValueError(
                    f"search.phases.{i}.name {phase.name!r} names the phase's checkpoints in the store: use "
                    "letters, digits, '_', '-', '.' and '=', at most 150"
                )
        check_options(self)
        # the search's own rules: evidence first, unique names (a factory's search is
        # built where factories are imported; its phases are held to these rules there too)
        Uniform(phases=tuple(self.phases), waves_in_flight=self.waves_in_flight)
        return self

    def knobs_set(self) -> dict[str, Any]:
        """The knobs this configuration sets (the others are the library's defaults)."""
        return {name: value for name in SELECTIVE_KNOBS if (value := getattr(self, name)) is not None}

    def build_search(self) -> Priority:
        """The search alone (a factory's: :func:`tasks.config.build.build_search`);
        :meth:`FocusConfig.build_search` adds the estimator's settings."""
        if self.kind == "factory":
            from tasks.config.build import search_from_factory

            return search_from_factory(self)
        if self.kind == "uniform":
            return Uniform(phases=tuple(self.phases), waves_in_flight=self.waves_in_flight)
        return Selective(phases=tuple(self.phases), waves_in_flight=self.waves_in_flight, **self.knobs_set())

    def knob_values(self) -> dict[str, Any]:
        """Every knob's value in the search this configuration builds (unset: the
        library's default); none for a kind that has no knobs. What a fingerprint records."""
        if self.kind != "selective":
            return {}
        search = self.build_search()
        return {name: getattr(search, name) for name in SELECTIVE_KNOBS}
