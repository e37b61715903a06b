"""benchmarks/learning.py: the verdict and interval arithmetic, the sweep's selection, and a smoke run."""

from __future__ import annotations

import json

import pytest

from benchmarks.learning import Sizes
from benchmarks.learning_sweep import (
    assemble,
    auc,
    best,
    check_pairing,
    label,
    parse_sizes,
    parse_sweep,
    settings_of,
    sized,
)
from benchmarks.learning_verdicts import METHODS, compare, gain, paired_bootstrap, reach, verdicts

pytestmark = pytest.mark.timeout(600)


def test_reach_interpolates_along_the_curve():
    curve = [(0.0, 0.1), (100.0, 0.2), (200.0, 0.4)]
    assert reach(curve, 0.1) == 0.0
    assert reach(curve, 0.3) == pytest.approx(150.0)
    assert reach(curve, 0.4) == 200.0
    assert reach(curve, 0.5) is None


def test_paired_bootstrap_is_centred_on_the_mean_and_shrinks_with_tasks():
    # every seed: b solves 30 of 100 tasks a fails, a solves 10 b fails -> +0.2
    a = "1" * 10 + "0" * 30 + "0" * 60
    b = "0" * 10 + "1" * 30 + "0" * 60
    mean, lo, hi = paired_bootstrap([(a, b)] * 5)
    assert mean == pytest.approx(0.2)
    # binomial-like spread of a paired difference over 500 draws: about 2 x 0.02
    assert lo < 0.2 < hi and 0.03 < hi - lo < 0.12
    small = paired_bootstrap([(a[::10], b[::10])] * 5)
    assert small[2] - small[1] > hi - lo  # fewer held-out tasks, a wider interval
    assert paired_bootstrap([(a, a)] * 3) == (0.0, 0.0, 0.0)  # identical outcomes: no doubt
    assert paired_bootstrap([(a, b)], seed=1) == paired_bootstrap([(a, b)], seed=1)  # seeded
    with pytest.raises(ValueError, match="equally long"):
        paired_bootstrap([("01", "011")])


def _run(method, seed, curve, first, last):
    points = [
        {"transitions": x, "wall_s": x / 10, "cpu_s": x / 5, "success": y, "approx_kl": 0.02, "tokens_trained": 50}
        for x, y in curve
    ]
    return {"task": "t", "method": method, "seed": seed, "points": points, "outcomes": {"first": first, "last": last}}


def _outcomes(rate, n=100, shift=0):
    k = round(rate * n)
    return "".join("1" if (i + shift) % n < k else "0" for i in range(n))


def test_verdicts_judge_only_against_a_baseline_that_learns():
    runs = []
    for seed in range(5):
        v0 = _outcomes(0.2)
        runs.append(_run("grpo", seed, [(0, 0.2), (100, 0.3), (200, 0.4)], v0, _outcomes(0.4)))
        runs.append(_run("focus", seed, [(0, 0.2), (100, 0.5), (200, 0.6)], v0, _outcomes(0.6)))
        runs.append(_run("uniform", seed, [(0, 0.2), (100, 0.2), (200, 0.3)], v0, _outcomes(0.3)))
    g = gain(runs, "t", "grpo")
    assert g["mean"] == pytest.approx(0.2) and g["learns"] and g["per_seed"][0] == pytest.approx(0.2)
    c = compare(runs, "t", "focus")
    # FOCUS reaches 0.4 halfway between 0.2@0 and 0.5@100: at 66.7 of GRPO's 200
    assert c["share_median"] == pytest.approx(1 / 3, abs=1e-4) and c["verdict"] == "better"
    assert c["difference"]["mean"] == pytest.approx(0.2) and c["difference"]["interval"][0] > 0
    assert compare(runs, "t", "uniform")["share_per_seed"][0] is None  # never reaches 0.4
    assert compare(runs, "t", "uniform")["verdict"] == "worse"
    v = verdicts(runs, ["t"])
    assert v["median_share"] == pytest.approx(1 / 3, abs=1e-4) and v["focus_better_on"] == ["t"]
    assert not v["goal_met"]  # better on one task, not three
    assert v["tasks"]["t"]["cost"]["focus"]["cpu_s"] == 40.0
    # a baseline whose gain is inside evaluation noise: nothing is judged against it
    flat = [
        r
        if r["method"] != "grpo"
        else _run("grpo", r["seed"], [(0, 0.2), (200, 0.21)], _outcomes(0.2), _outcomes(0.2, shift=3))
        for r in runs
    ]
    assert not gain(flat, "t", "grpo")["learns"]
    assert compare(flat, "t", "focus")["verdict"] == "not judged"
    assert verdicts(flat, ["t"])["judged_tasks"] == 0 and verdicts(flat, ["t"])["median_share"] is None


@pytest.mark.integration
def test_quick_run_writes_json_and_png(tmp_path):
    from benchmarks import learning

    result = learning.main(
        ["--quick", "--tasks", "toy", "bridge", "--methods", *METHODS, "--out", str(tmp_path), "--quiet"]
    )
    saved = json.loads((tmp_path / "learning.json").read_text(encoding="utf-8"))
    assert saved["verdicts"] == json.loads(json.dumps(result["verdicts"]))
    assert (tmp_path / "learning.png").stat().st_size > 10_000
    assert sorted(r["method"] for r in saved["runs"] if r["task"] == "toy") == sorted(METHODS)
    for run in saved["runs"]:
        first, last = run["points"][0], run["points"][-1]
        assert first["transitions"] == 0 and last["transitions"] == last["batch_transitions"] > 0
        assert 0.0 <= last["success"] <= 1.0 and last["wall_s"] > 0 and last["cpu_s"] > 0
        assert last["tokens_trained"] > 0 and last["approx_kl"] >= 0.0 and 0.0 <= last["invalid_rate"] <= 1.0
        assert len(run["outcomes"]["last"]) == 6
    by = {r["method"]: r["points"][-1] for r in saved["runs"] if r["task"] == "toy"}
    # the same transitions per iteration: FOCUS and uniform spend what GRPO's extra rollouts would
    assert 0.5 < by["focus"]["batch_transitions"] / by["grpo"]["batch_transitions"] < 2.0


def test_size_options_shrink_the_batches_and_are_recorded():
    from benchmarks.learning import DEFAULT_SIZES, QUICK_SIZES, _parser, size_options, sizes_of

    args = _parser().parse_args(["--tasks-per-iteration", "4"])
    assert sizes_of(args) == Sizes(DEFAULT_SIZES.iterations, 4, DEFAULT_SIZES.eval_tasks)
    assert size_options(args) == " --tasks-per-iteration 4"
    args = _parser().parse_args(["--quick", "--iterations", "2"])
    assert sizes_of(args) == Sizes(2, QUICK_SIZES.tasks, QUICK_SIZES.eval_tasks)
    assert size_options(args) == " --iterations 2"
    plain = _parser().parse_args([])
    assert sizes_of(plain) == DEFAULT_SIZES and size_options(plain) == ""
    with pytest.raises(ValueError, match="positive"):
        sizes_of(_parser().parse_args(["--tasks-per-iteration", "0"]))


def test_each_task_trains_at_its_own_step_and_the_command_line_wins():
    from benchmarks.learning import TASK_TRAINER, TRAINER, per_task_changes, task_trainer

    # the long reach's step differs from the rest (both methods were best at 0.1 there)
    assert (
        task_trainer("long-reach", TRAINER, {})["target_kl"]
        == TASK_TRAINER["long-reach"]["target_kl"]
        != (TRAINER["target_kl"])
    )
    assert task_trainer("toy", TRAINER, {}) == TRAINER
    # --set is over every task's own step, so a run at one setting is one setting everywhere
    given = {"target_kl": 0.05}
    options = {**TRAINER, **given}
    assert task_trainer("long-reach", options, given)["target_kl"] == 0.05
    assert per_task_changes(["toy", "long-reach"], options, given) == {}
    assert per_task_changes(["toy", "long-reach"], TRAINER, {}) == {"long-reach": TASK_TRAINER["long-reach"]}


def test_a_bad_trainer_option_stops_before_any_run(tmp_path):
    from benchmarks import learning

    with pytest.raises(SystemExit, match="target_kl: Input should be greater than 0"):
        learning.main(["--quick", "--tasks", "toy", "--set", "target_kl=-1", "--out", str(tmp_path), "--quiet"])
    with pytest.raises(SystemExit, match="'long-reach'.*sizes its step to target_kl"):
        learning.main(["--quick", "--tasks", "long-reach", "--set", "rule=natural", "--set", "target_kl=null",
                       "--out", str(tmp_path), "--quiet"])  # fmt: skip
    assert not (tmp_path / "runs.jsonl").exists()  # nothing ran


def test_assemble_keeps_the_seeds_every_method_finished(tmp_path):
    from benchmarks import learning

    runs = []
    for seed in range(3):
        runs.append(_run("grpo", seed, [(0, 0.2), (100, 0.4)], _outcomes(0.2), _outcomes(0.4)))
        if seed < 2:  # the run stopped before FOCUS's seed 2
            runs.append(_run("focus", seed, [(0, 0.2), (100, 0.6)], _outcomes(0.2), _outcomes(0.6)))
    for r in runs:
        r["task"] = "toy"
    jsonl = tmp_path / "runs.jsonl"
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in runs))
    out = tmp_path / "new" / "folder"  # made if missing, as a run's --out is
    args = ["--assemble", str(jsonl), "--tasks", "toy", "--out", str(out), "--json", str(tmp_path / "a.json")]
    result = learning.main(args)
    assert result["seeds_per_task"] == {"toy": [0, 1]} and len(result["runs"]) == 4
    assert (
        json.loads((tmp_path / "a.json").read_text(encoding="utf-8"))["verdicts"]["tasks"]["toy"]["vs_grpo"]["focus"][
            "verdict"
        ]
        == "better"
    )
    assert (out / "learning.png").stat().st_size > 5_000


def test_probe_weighs_the_decisive_step():
    """benchmarks/learning_probe.py's batch reading on corridor-early: the gate is the
    turn answering step 1 (also after a re-ask), a digit 1-3 is good there, and the
    signal is the scaled advantage times +1/-1 over every trained token."""
    from benchmarks.learning_probe import batch_stats, decisive_turn, good_action
    from focus.batch import ActorRow, Batch
    from focus.env import Message
    from focus.format import ByteCodec

    codec = ByteCodec()
    opening = [Message("user", "Corridor of 3. Step 1.")]
    reask = [*opening, Message("assistant", ""), Message("user", "Say one digit 1-9.")]
    step2 = [*reask, Message("assistant", "2"), Message("user", "Step 2.")]
    assert decisive_turn("corridor-early", codec.decode(codec.render(reask)))
    assert not decisive_turn("corridor-early", codec.decode(codec.render(step2)))
    assert decisive_turn("corridor-late", "Corridor of 3. Step 3.") and not decisive_turn("corridor-late", "Step 2.")
    assert good_action("corridor-early", 2) and not good_action("corridor-early", 7) and good_action("bridge", 7)

    def row(messages, digit, adv, edge):
        prompt, done = tuple(codec.render(messages)), (ord(digit), ByteCodec.EOT)
        return ActorRow("c", 0, "t", "t#0", 0, edge, 0, "v0", prompt, done, (-1.0, -0.1), (1, 1), adv, 0.0, "stop")

    rows = [row(reask, "2", 1.0, 1), row(reask, "8", -1.0, 2), row(step2, "5", 0.0, 3), row(step2, "6", 0.0, 4)]
    s = batch_stats("corridor-early", Batch("c", 0, rows))
    # 8 trained tokens, mean 0, std sqrt(4/8): scaled advantages +-sqrt(2) on the gate's 4 tokens
    assert s["tokens"] == 8 and s["decisive_tokens"] == 4 and s["decisive_token_share"] == 0.5
    assert s["signal"] == pytest.approx(4 * 2**0.5 / 8, abs=1e-4)
    assert s["decisive_good_mean"] == pytest.approx(2**0.5, abs=1e-4) == -s["decisive_bad_mean"]
    assert s["other_mean"] == 0 and s["invalid_turn_share"] == 0


def test_parse_sweep_zips_the_lists():
    settings = parse_sweep(["target_kl=0.05,0.1,0.2", "lr=3e-4,6e-4,1.2e-3"])
    assert settings == [
        {"target_kl": 0.05, "lr": 3e-4},
        {"target_kl": 0.1, "lr": 6e-4},
        {"target_kl": 0.2, "lr": 1.2e-3},
    ]
    assert label(settings[1]) == "target_kl=0.1,lr=0.0006"
    assert parse_sweep(["rule=adam,sgd"]) == [{"rule": "adam"}, {"rule": "sgd"}]  # not JSON: a string
    with pytest.raises(ValueError, match="zipped"):
        parse_sweep(["target_kl=0.05,0.1", "lr=3e-4"])
    with pytest.raises(ValueError, match="FIELD=V1"):
        parse_sweep(["target_kl"])
    with pytest.raises(ValueError, match="repeats"):
        parse_sweep(["target_kl=0.1,0.1"])
    with pytest.raises(ValueError, match="twice"):
        parse_sweep(["lr=1,2", "lr=3,4"])


def _setting(kl, grpo_last, focus_last):
    """One setting's runs on task ``t``, 5 seeds: v0 at 0.2 everywhere (the same model),
    finals as given, every update at KL ``kl``."""
    runs = []
    for seed in range(5):
        for method, last in (("grpo", grpo_last), ("focus", focus_last)):
            r = _run(method, seed, [(0, 0.2), (100, last)], _outcomes(0.2), _outcomes(last, shift=seed))
            r["points"][1]["approx_kl"] = kl
            runs.append(r)
    return runs


def test_each_method_is_read_at_its_own_best_setting():
    # GRPO peaks at the middle setting, FOCUS at the largest; the first and last tie for GRPO
    by_setting = [_setting(0.05, 0.3, 0.35), _setting(0.1, 0.5, 0.4), _setting(0.2, 0.3, 0.7)]
    settings = parse_sweep(["target_kl=0.05,0.1,0.2"])
    result = assemble(settings, by_setting, ["t"])
    cells = result["grid"]["t"]
    assert [c["final"] for c in cells["grpo"]] == pytest.approx([0.3, 0.5, 0.3])
    assert [c["gain"] for c in cells["focus"]] == pytest.approx([0.15, 0.2, 0.5])
    assert [c["kl_median"] for c in cells["focus"]] == [0.05, 0.1, 0.2] and cells["focus"][0]["updates"] == 5
    assert result["at_best"]["t"]["best"] == {"focus": 2, "grpo": 1}
    # at the best settings FOCUS 0.7 against GRPO 0.5; at the matched middle setting it loses
    at_best = result["at_best"]["t"]["verdicts"]["vs_grpo"]["focus"]
    assert at_best["difference"]["mean"] == pytest.approx(0.2) and at_best["verdict"] == "better"
    middle = result["at_setting"][1]["tasks"]["t"]["vs_grpo"]["focus"]
    assert middle["difference"]["mean"] == pytest.approx(-0.1) and middle["verdict"] == "worse"
    assert best([{"final": 0.3}, {"final": 0.3}]) == 0  # a tie goes to the earlier (smaller) setting
    json.dumps(result)  # the record is JSON


def test_a_sweep_whose_v0_differs_between_settings_is_not_paired():
    a, b = _setting(0.05, 0.3, 0.4), _setting(0.1, 0.3, 0.4)
    b[0]["outcomes"]["first"] = _outcomes(0.3)
    check_pairing([a, a])
    with pytest.raises(ValueError, match="not paired"):
        check_pairing([a, b])


@pytest.mark.integration
def test_quick_sweep_runs_every_method_at_every_setting(tmp_path):
    from benchmarks import learning

    args = ["--quick", "--tasks", "bridge", "--sweep", "target_kl=0.05,0.2", "--sweep", "lr=3e-4,1.2e-3"]
    result = learning.main([*args, "--tasks-per-iteration", "2", "--out", str(tmp_path), "--quiet"])
    saved = json.loads((tmp_path / "sweep.json").read_text(encoding="utf-8"))
    assert saved["sizes"] == {"iterations": 1, "tasks": 2, "eval_tasks": 6, "evidence": 4, "continuation": None}
    assert saved["command"].endswith("--tasks-per-iteration 2")  # the record names the smaller batches
    assert saved["labels"] == ["target_kl=0.05,lr=0.0003", "target_kl=0.2,lr=0.0012"]
    assert saved["at_best"] == json.loads(json.dumps(result["at_best"]))
    for options, name, runs in zip(saved["settings"], saved["labels"], saved["runs"], strict=True):
        assert sorted(r["method"] for r in runs) == ["focus", "grpo"]
        written = [json.loads(line) for line in (tmp_path / name / "runs.jsonl").open()]
        assert written == runs  # each setting's runs in its own folder as they finish
        assert all(len(r["points"]) == 2 for r in runs) and options["lr"] in (3e-4, 1.2e-3)
    # the same held-out tasks and v0 at both settings: the pairing the selection relies on
    assert {r["outcomes"]["first"] for runs in saved["runs"] for r in runs if r["method"] == "grpo"} == {
        saved["runs"][0][0]["outcomes"]["first"]
    }
    assert set(saved["at_best"]["bridge"]["best"]) == {"focus", "grpo"}


def test_a_sweep_stopped_early_keeps_the_seeds_finished_everywhere(tmp_path):
    from benchmarks import learning

    settings = parse_sweep(["target_kl=0.05,0.1"])
    for i, runs in enumerate((_setting(0.05, 0.3, 0.4), _setting(0.1, 0.5, 0.6))):
        if i == 1:  # stopped after seed 2's GRPO run: FOCUS's seed 2 and seeds 3-4 are missing
            runs = [r for r in runs if r["seed"] < 2 or (r["seed"] == 2 and r["method"] == "grpo")]
        for r in runs:
            r["task"] = "bridge"
        folder = tmp_path / label(settings[i])
        folder.mkdir()
        (folder / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    args = ["--tasks", "bridge", "--sweep", "target_kl=0.05,0.1", "--assemble", str(tmp_path)]
    result = learning.main(args)
    assert result["seeds_per_task"] == {"bridge": [0, 1]} and [len(runs) for runs in result["runs"]] == [4, 4]
    assert result["at_best"]["bridge"]["best"] == {"focus": 1, "grpo": 1}
    assert json.loads((tmp_path / "sweep-assembled.json").read_text(encoding="utf-8"))["labels"] == [
        label(s) for s in settings
    ]


def test_sweep_sizes_cross_the_step_settings_sizes_outer():
    settings = settings_of(["target_kl=0.1,0.2"], "8x3,2x12")
    assert [label(s) for s in settings] == [
        "8x3,target_kl=0.1",
        "8x3,target_kl=0.2",
        "2x12,target_kl=0.1",
        "2x12,target_kl=0.2",
    ]
    base = Sizes(iterations=3, tasks=8, eval_tasks=50)
    assert sized(base, settings[3]) == Sizes(iterations=12, tasks=2, eval_tasks=50)
    assert sized(base, {"target_kl": 0.1}) == base  # a setting without sizes keeps the run's
    assert settings_of([], "4x6") == [{"tasks_per_iteration": 4, "iterations": 6}]
    assert settings_of(["target_kl=0.1,0.2"], None) == parse_sweep(["target_kl=0.1,0.2"])
    for bad in ("8", "8x", "0x3", "ax3", "8x3,8x3"):
        with pytest.raises(ValueError, match="sweep-sizes"):
            parse_sizes(bad)


def test_a_size_sweep_gives_each_job_its_sizes_and_the_trainer_only_its_options(tmp_path, monkeypatch):
    from benchmarks import learning

    jobs = []

    def worker(job):
        name, sizes, seeds, methods, _, options, _ = job
        jobs.append((sizes, options))
        v0 = _outcomes(0.2)
        curve = [(i * 100 // sizes.iterations, 0.2) for i in range(sizes.iterations + 1)]
        return [{**_run(m, s, curve, v0, v0), "task": name} for s in seeds for m in methods]

    monkeypatch.setattr(learning, "_task_worker", worker)
    args = ["--tasks", "bridge", "--seeds", "0", "1", "--jobs", "1", "--set", "rule=sgd", "--quiet"]
    saved = learning.main([*args, "--sweep-sizes", "8x3,2x12", "--sweep", "target_kl=0.1,0.2", "--out", str(tmp_path)])
    assert [(s.tasks, s.iterations, o["target_kl"]) for s, o in jobs] == [
        (8, 3, 0.1),
        (8, 3, 0.2),
        (2, 12, 0.1),
        (2, 12, 0.2),
    ]
    assert all(o["rule"] == "sgd" and "iterations" not in o and "tasks_per_iteration" not in o for _, o in jobs)
    assert saved["command"].endswith("--sweep-sizes 8x3,2x12")
    assert [c["updates"] for c in saved["grid"]["bridge"]["grpo"]] == [6, 6, 24, 24]  # 2 seeds x iterations
    assert (tmp_path / "2x12,target_kl=0.2").is_dir()  # each setting its folder


def test_the_area_under_the_curve_picks_the_setting_that_gets_there_sooner():
    assert auc([{"transitions": 0, "success": 0.2}, {"transitions": 100, "success": 0.6}]) == pytest.approx(0.4)
    assert auc([{"transitions": 0, "success": 0.3}]) == 0.3  # v0 alone: its success
    # GRPO ends at 0.9 at both settings; at the second it gets there after 100 of 400 transitions
    by_setting = []
    for mid in (0.3, 0.9):
        runs = []
        for seed in range(5):
            for m in ("grpo", "focus"):
                curve = [(0, 0.2), (100, mid), (400, 0.9)]
                runs.append(_run(m, seed, curve, _outcomes(0.2), _outcomes(0.9, shift=seed)))
        by_setting.append(runs)
    result = assemble(parse_sweep(["target_kl=0.1,0.2"]), by_setting, ["t"])
    assert result["at_best"]["t"]["best"] == {"focus": 0, "grpo": 0}  # the finals tie: the earlier
    assert result["at_best_auc"]["t"]["best"] == {"focus": 1, "grpo": 1}
    assert [c["auc"] for c in result["grid"]["t"]["grpo"]] == pytest.approx([(25 + 180) / 400, (55 + 270) / 400])


def test_the_reach_ratio_reads_equal_methods_that_level_off_early_as_equal():
    runs = []
    for seed in range(5):
        v0, top = _outcomes(0.2), _outcomes(1.0)
        curve = [(0, 0.2), (100, 1.0), (200, 1.0), (400, 1.0)]  # both at the ceiling after a quarter
        runs.append(_run("grpo", seed, curve, v0, top))
        runs.append(_run("focus", seed, [(0, 0.2), (50, 1.0), (300, 1.0), (400, 1.0)] if seed < 3 else curve, v0, top))
    c = compare(runs, "t", "focus")
    assert c["share_median"] == pytest.approx(0.125)  # FOCUS reaches 1.0 at 50 of GRPO's 400 transitions
    assert c["reach_ratio_median"] == pytest.approx(0.5)  # GRPO itself got there at 100
    assert c["reach_ratio_per_seed"][4] == pytest.approx(1.0)
    flat = [_run(m, 0, [(0, 0.4), (100, 0.3)], _outcomes(0.4), _outcomes(0.3)) for m in ("grpo", "focus")]
    assert compare(flat, "t", "focus")["reach_ratio_median"] is None  # GRPO's final was its v0's


def test_the_long_bridge_is_opt_in_and_its_agent_can_cross_it():
    """bridge-long (rare successes at first) runs on request only: the record's tasks,
    the default of --tasks, stay the six it was made with."""
    from benchmarks import learning

    assert "bridge-long" in learning.DOMAINS and "bridge-long" not in learning.RECORD_TASKS
    assert learning._parser().parse_args([]).tasks == learning.RECORD_TASKS
    assert len(learning.RECORD_TASKS) == 6
    domain = learning.DOMAINS["bridge-long"]()
    lengths = {t.data["length"] for t in domain.tasks(40, 0)}
    assert lengths <= {10, 11, 12} and len(lengths) > 1
    assert domain.make_agent("http://127.0.0.1:9").max_steps >= max(lengths)


def test_the_record_runs_the_cued_tasks_and_the_constant_rule_ones_are_opt_in():
    """The record's corridors and bridge are the cued ones (the right digit depends on the
    observation); the constant-rule tasks they replaced still run by name, uncued."""
    from benchmarks import learning

    cued = ["cued-corridor-early", "cued-corridor-late", "cued-bridge"]
    assert all(t in learning.RECORD_TASKS for t in cued)
    for old in ("corridor-early", "corridor-late", "bridge"):
        assert old in learning.DOMAINS and old not in learning.RECORD_TASKS
        assert all("ranges" not in t.data for t in learning.DOMAINS[old]().tasks(10, 0))
    for name in cued:
        domain = learning.DOMAINS[name]()
        tasks = domain.tasks(40, 0)
        assert domain.name == name and tasks == domain.tasks(40, 0)
        assert all(len(t.data["ranges"]) == t.data["length"] for t in tasks)
        assert domain.make_agent("http://127.0.0.1:9").max_steps >= max(t.data["length"] for t in tasks) + 3
    gates = {t.data["gate"] for t in learning.DOMAINS["cued-corridor-early"]().tasks(20, 0)}
    assert gates == {1}
    late = learning.DOMAINS["cued-corridor-late"]().tasks(20, 0)
    assert all(t.data["gate"] == t.data["length"] for t in late)
