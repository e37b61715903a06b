"""benchmarks/estimator_quality.py runs families and critics kept outside the project,
named by ``module:attr`` specs: a dict of families expands to one spec per family, an
external family or critic gives the same collection as the same object under its
built-in name, and a spec that names nothing usable is an error naming the flag."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from benchmarks.estimator_quality import parse_args, run_one

MODULE = """
from focus.synthetic_hard import HARD_FAMILIES, depth_critic
from focus.synthetic_unseen import UNSEEN_FAMILIES

FAMILIES = {"tail": HARD_FAMILIES["heavy_tail"], "gate": UNSEEN_FAMILIES["early_gate"]}
NOT_A_FAMILY = 3


def biased(mdps, gamma, seed, reach=None):
    return depth_critic("biased", mdps, gamma, seed, reach)
"""


@pytest.fixture
def outside(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module outside the project, importable as ``outside_mdps``."""
    (tmp_path / "outside_mdps.py").write_text(MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield "outside_mdps"
    sys.modules.pop("outside_mdps", None)


def test_a_dict_of_families_expands_to_one_spec_per_family(outside: str) -> None:
    args = parse_args(["--families", f"uniform,{outside}:FAMILIES", "--critics", f"noise_1,{outside}:biased"])
    assert args.families == ["uniform", f"{outside}:FAMILIES.tail", f"{outside}:FAMILIES.gate"]
    assert args.critics == ["noise_1", f"{outside}:biased"]


def test_an_external_family_and_critic_collect_as_the_built_in_ones(outside: str) -> None:
    for method in ("uniform", "selective"):
        inside = run_one(("heavy_tail", 3, 2, "biased", method, 1))
        out = run_one((f"{outside}:FAMILIES.tail", 3, 2, f"{outside}:biased", method, 1))
        for key in ("adv_mse", "target_mse", "transitions", "tokens"):
            assert out[key] == inside[key], key
    # the critic is the one named: another critic gives another batch
    assert run_one(("heavy_tail", 3, 2, "noise_3", "selective", 1))["adv_mse"] != inside["adv_mse"]


@pytest.mark.parametrize(
    ("flag", "spec", "says"),
    [
        ("--families", "no_such_module_h44m:FAMILIES", "ModuleNotFoundError"),
        ("--families", "outside_mdps:FAMILIES.nothing", "KeyError"),
        ("--families", "outside_mdps:NOT_A_FAMILY", "not a Family"),
        ("--critics", "outside_mdps:NOT_A_FAMILY", "not a callable"),
        ("--critics", "outside_mdps:missing", "AttributeError"),
    ],
)
def test_a_spec_that_names_nothing_usable_is_an_error_naming_the_flag(
    outside: str, flag: str, spec: str, says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_args([flag, spec])
    err = capsys.readouterr().err
    assert flag in err and says in err
