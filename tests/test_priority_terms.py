"""benchmarks/priority_terms.py at a tiny size: Selective's predicted terms beside a
simulation of one more continuation (the tool docs/findings/estimator-issue31.md's diagnosis
is made with), on a synthetic family, no servers."""

from __future__ import annotations

import argparse
import math

from benchmarks import priority_terms


def test_predicted_and_simulated_terms_per_depth(capsys) -> None:  # type: ignore[no-untyped-def]
    args = argparse.Namespace(
        family="decisive", critic="noise_1", budget=2, seed=0, fraction=0.5, samples=2, per_depth=1, exact=False
    )
    rows = priority_terms.run(args)
    assert len(rows) >= 5, "checkpoints at several depths are probed"
    for depth, rs in rows.items():
        assert depth >= 0 and rs
        for r in rs:
            assert all(math.isfinite(v) for v in r.values()), r
            assert r["cost"] >= 1.0  # expected transitions of a continuation
            # squared errors: the new segments' own error is never negative
            assert r["a_new"] >= 0.0 and r["a_head"] >= 0.0
            assert r["p_new"] >= 0.0 and r["p_head_only"] >= 0.0
            assert r["a_new"] >= r["a_head"] - 1e-12  # the head is one of the new segments
    priority_terms.main(
        ["--family", "decisive", "--critic", "noise_1", "--budget", "2", "--samples", "1", "--per-depth", "1"]
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| depth | checkpoints |") and len(out) >= 2 + len(rows)


def test_bad_fraction_is_an_error_naming_the_flag(capsys) -> None:  # type: ignore[no-untyped-def]
    import pytest

    with pytest.raises(SystemExit) as e:
        priority_terms.main(["--fraction", "2"])
    assert e.value.code == 2 and "--fraction" in capsys.readouterr().err


def test_the_fit_against_the_mdps_own_model_per_depth(capsys) -> None:  # type: ignore[no-untyped-def]
    """--fit's table (the issue-31 reading of the noise fit under heavy tails): means and
    medians over seeds of the fitted parts beside the MDPs' own. On heavy_tail the
    exact model is what the diagnosis says: a payoff's variance (about 0.3 per step)
    is the env's, the actions' spread under a hundredth of it."""
    args = argparse.Namespace(family="heavy_tail", critic="noise_1", budget=2, fraction=1.0, fit=2, method="uniform")
    parts = priority_terms.fit_bias(args)
    assert set(parts) == {"s", "a", "nu", "t"}
    depths = len(parts["s"])
    assert depths == 10  # heavy_tail's ten steps
    for d in range(depths):
        (s_mean, s_med, s_exact), (a_mean, _, a_exact), (nu_mean, _, nu_exact) = (
            parts["s"][d],
            parts["a"][d],
            parts["nu"][d],
        )
        assert min(s_mean, s_med, a_mean, nu_mean, parts["t"][d][0]) >= 0.0
        # a = s − ν with 0 ≤ ν ≤ s in every fit, so their means add up
        assert abs(a_mean + nu_mean - s_mean) <= 1e-9 * max(s_mean, 1.0)
        assert abs(a_exact + nu_exact - s_exact) <= 1e-9
        assert 0.1 < s_exact < 1.0 and a_exact < 0.05 * s_exact, (d, s_exact, a_exact)
    priority_terms.main(["--family", "heavy_tail", "--budget", "2", "--method", "uniform", "--fit", "1"])
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("| part | 0 |") and len(out) == 2 + 4 * 3


def test_the_fit_at_each_tasks_own_decisive_depth() -> None:
    """--own-depth (the issue-31 reading of decisive/6H, h31n): a decisive task's own
    exact s(D) is all of its variance, nothing at its other depths, and the collection's
    exact s(D) pools it with the tasks that decide elsewhere, so it is smaller; the
    fitted values and the share are in their ranges."""
    args = argparse.Namespace(
        family="decisive", critic="noise_3", budget=2, fraction=0.5, own_depth=1, method="selective"
    )
    out = priority_terms.own_depth(args)
    assert set(out) == {"fit", "exact_pooled", "exact_own", "fit_other", "exact_own_other", "below_quarter"}
    assert out["exact_own"] > 2 * out["exact_pooled"] > 0.0  # six tasks, one decision each, mostly apart
    assert out["exact_own_other"] < 1e-3 * out["exact_own"]  # a decisive task is quiet elsewhere
    assert min(out["fit"], out["fit_other"]) >= 0.0 and 0.0 <= out["below_quarter"] <= 1.0
