"""benchmarks/priority_terms.py at a tiny size: Selective's predicted terms beside a
simulation of one more continuation (the tool docs/algorithm.md's issue-31 diagnosis
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
