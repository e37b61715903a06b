"""The search: a state and pure functions from a state to the next jobs and from
finished rollouts to the next state.

Five modules, one job each:

- :mod:`focus.search.state`: :class:`SearchState` (the trees of a collection and the
  waves that built them; saved by the pipeline whole after the evidence, then wave by
  wave as deltas) and the facts
  derived from each tree;
- :mod:`focus.search.planning`: :func:`plan_wave`, :func:`plan_ahead`,
  :func:`plan_next`, :func:`plan_refill` - which checkpoints the next wave continues
  (:func:`plan_begin` / :func:`plan_lead` / :func:`plan_choose` / :func:`plan_rank` /
  :func:`plan_chosen`:
  :func:`plan_next`'s wave handed over a slice of jobs at a time);
- :mod:`focus.search.heads`: the plan index a state hands to its successor - every
  tree's ranking head (sorted), budget spent and unscored nodes, brought up to date for
  the trees a wave changed, so a plan reads those and the trees it takes jobs from;
- :mod:`focus.search.work`: :func:`ranking_work` - what a plan's rankings will read,
  told from the caches alone (where :mod:`focus.placement` runs a call);
- :mod:`focus.search.grafting`: :func:`graft`, :func:`with_predictions`,
  :func:`replay` - a successor state with a wave's rollouts or the critic's scores,
  and the state rebuilt from stored waves; :func:`graft_tree` and :func:`score_tree`,
  one tree's share of a wave done while the wave still runs, which :func:`graft`
  takes over.

The collector and the execution service only carry plans out, so a wave planned twice
from the same state gives the same jobs and the same seeds. The names below are the
package's public surface; import them from ``focus.search``.
"""

from __future__ import annotations

from focus.search.grafting import (
    Predictions,
    TreeWave,
    WaveRecord,
    graft,
    graft_tree,
    replay,
    score_tree,
    with_predictions,
)
from focus.search.jobs import RolloutJob, WavePlan, rollout_seed
from focus.search.planning import (
    InFlight,
    WaveChoice,
    last_wave,
    plan_ahead,
    plan_begin,
    plan_choose,
    plan_chosen,
    plan_lead,
    plan_next,
    plan_rank,
    plan_refill,
    plan_wave,
    wave_choices,
    with_plan,
)
from focus.search.state import (
    CALIBRATION_SPREADS,
    LAG_SPREADS,
    REFIT_LAG,
    SearchState,
    copy_state,
    copy_tree,
    unscored,
)
from focus.search.work import RankingWork, ranking_work

__all__ = [
    "CALIBRATION_SPREADS",
    "LAG_SPREADS",
    "REFIT_LAG",
    "InFlight",
    "Predictions",
    "RankingWork",
    "RolloutJob",
    "SearchState",
    "TreeWave",
    "WaveChoice",
    "WavePlan",
    "WaveRecord",
    "copy_state",
    "copy_tree",
    "graft",
    "graft_tree",
    "last_wave",
    "plan_ahead",
    "plan_begin",
    "plan_choose",
    "plan_chosen",
    "plan_lead",
    "plan_next",
    "plan_rank",
    "plan_refill",
    "plan_wave",
    "ranking_work",
    "replay",
    "rollout_seed",
    "score_tree",
    "unscored",
    "wave_choices",
    "with_plan",
    "with_predictions",
]
