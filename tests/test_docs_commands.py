"""Every command README.md, docs/ and the example READMEs show works as written.

A command is a line of a ```bash block, or a code span in the prose that starts with
a program (``.venv/bin/...``, ``make``, ``python``, ``pip``, or ``focus`` with options);
spans with placeholders (``<id>``, ``[--json]``, ``...``) are synopses, not commands.
:data:`COMMANDS` says how each one is checked, and a command the docs show but the list
does not (or the other way round) fails the first test, so a new command gets a check.

- ``run``: run as written in a copy of the checkout (every top-level entry linked into a
  temporary folder, so ``runs/`` and ``/tmp/`` paths land in the tests' own folders), with
  no Prefect server and no ``FOCUS_*`` settings, as on a fresh clone; ``make`` targets run
  with ``-o .venv/.installed`` (the install step is not rerun). Cheap ones only.
- ``parse``: too long to run in the suite (the reason is given): the command line is
  parsed by the program's own parser, in this process, stopping where the work would
  start, and rejected there if an option or value is wrong; a ``focus`` command's
  ``-c``/``--set`` also go through ``focus config show``; a ``make`` target through
  ``make -n``.
- ``external``: needs what this machine does not have (a key, a GPU server, slime);
  the part that is ours is parsed.

Every command must start from the checkout as it is after ``make install``
(``.venv/bin/...`` or ``make``), except those of other projects.
"""

from __future__ import annotations

import importlib
import json
import re
import shlex
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from fixtures.prefect import base_env

from examples.records import read

ROOT = Path(__file__).resolve().parents[1]

#: The first word of a line or span that runs something (after any VAR=value).
PROGRAM = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\.venv/bin/|make\s|python3?\s|pip\s|focus\s)")
FRESH = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=\S*\s+)*(?:\.venv/bin/|make\s)")
#: A fenced block, at the margin or indented inside a list item: (language, body).
FENCE = r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```"
FENCED = r"^[ \t]*```.*?^[ \t]*```"
INSTALL = "-o .venv/.installed"  # make: do not rerun the install step


@dataclass(frozen=True)
class Check:
    how: str  # "run", "parse" or "external"
    why: str = ""  # parse, external: why it is not run here
    #: run: shell commands run before it in the same folder (what it needs to exist)
    setup: tuple[str, ...] = ()
    #: run: text the output must contain
    expect: tuple[str, ...] = ()
    #: run: compare the printed JSON with this example's record (all but the batch's folder)
    record: str | None = None
    timeout_s: float = 300
    #: parse: our part of another project's command (a module whose object must import)
    imports: str | None = None
    extra: dict[str, str] = field(default_factory=dict)


LONG_TRAIN = "a train loop: minutes to tens of minutes; tests/test_pipeline_train.py runs a small one"
SERVER = "needs a model server at that URL (vLLM, SGLang); the tests run the same command against the embedded one"

SCALE_STUDY = "a study of the scale benchmark's rows: minutes on 2 cores (docs/findings/speed.md)"

COMMANDS: dict[str, Check] = {
    # README.md
    "make run": Check("run", expect=("batch:",)),
    "make test": Check("parse", "the whole suite: this test is part of it"),
    "make test-fast": Check("parse", "the fast suite: this test's file is part of `make test`"),
    "make bench": Check("parse", "every benchmark: about 45 minutes (benchmarks/README.md records each)"),
    "make install": Check("parse", "installs into .venv: the checkout these tests run in has it"),
    "make test-lowest": Check(
        "parse",
        "installs the lowest allowed versions from PyPI into .venv-lowest, then the fast suite: about 15 minutes",
    ),
    ".venv/bin/focus train -c configs/loop.toml": Check("parse", LONG_TRAIN),
    ".venv/bin/focus config show -c configs/loop.toml": Check("run", expect=("train.iterations",)),
    "pip install focus-rl": Check("external", "installs the published package from a package index"),
    "pip install 'focus-rl[pipeline]'": Check("external", "installs the published package from a package index"),
    # docs/operations.md
    ".venv/bin/focus collect --config configs/collect.toml --collection-id nightly-0412": Check(
        "run",
        setup=(".venv/bin/focus collect --config configs/collect.toml --collection-id nightly-0412",),
        expect=("already finished",),
    ),  # fmt: skip
    ".venv/bin/focus collect --set model.http.timeout_s=30": Check("run", expect=("batch:",)),
    ".venv/bin/python -m pytest -n 2 tests/test_faults_model.py tests/test_faults_env.py tests/test_faults_infra.py "
    "tests/test_bad_input.py tests/test_errors.py tests/test_load.py tests/test_batch_readers.py "
    "tests/test_relocate.py": Check("parse", "these tests are part of `make test`; here they are collected only"),
    ".venv/bin/python -m benchmarks.batch_write --repeats 5": Check("parse", "a benchmark of minutes"),
    ".venv/bin/python -m benchmarks.writer_race": Check("parse", "a benchmark of minutes (300 racing writers)"),
    ".venv/bin/python -m benchmarks.pipeline_scale --sizes 20000:200 50000:1000 100000:2000": Check(
        "parse", "three collections of 20k-120k transitions and their reruns: about 2 minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks.resume_s3 --size 20000:200 --delays-ms 0,20": Check(
        "parse", "a 20k-transition collection on S3, killed twice and resumed: 6-10 minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks --only load_2k,load_20k": Check("parse", "benchmarks of half an hour"),
    ".venv/bin/python -m benchmarks --only restart": Check("parse", "a benchmark of minutes (30 s and 90 s outages)"),
    ".venv/bin/python -m benchmarks --only learning": Check("parse", "the learning record: 20-35 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.train_local": Check(
        "parse", "a benchmark of a minute (one collection, 7 settings)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy long-reach math --methods focus --set "
    "'scale_advantages=\"task\"' --out runs/task-scale": Check("parse", "a study of five minutes on 2 cores"),
    # docs/findings/speed.md
    ".venv/bin/python -m benchmarks.scale --sizes 100000 --repeats 1 --depth-share 0": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.scale --sizes 10000 --tasks-per-1k 4 --repeats 1": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.replay --load /tmp/focus-replay-100k.pkl --repeats 3": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.replay --load /tmp/focus-replay-100k.pkl --repeats 1": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.replay --source scale --transitions 10000 --tasks 200 --save /tmp/focus-replay-10k.pkl": Check(
        "parse", SCALE_STUDY
    ),
    ".venv/bin/python -m benchmarks.replay --load /tmp/focus-replay-10k.pkl --repeats 3": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.replay --source scale --transitions 40000 --tasks 800 --save /tmp/focus-replay-40k.pkl": Check(
        "parse", SCALE_STUDY
    ),
    ".venv/bin/python -m benchmarks.replay --source scale --transitions 100000 --tasks 2000 --wave-size 16 "
    "--save /tmp/focus-replay-100k-16.pkl": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.pipeline_scale --sizes 50000:1000": Check(
        "parse", "a 60k-transition collection over 1,000 tasks and its rerun: minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks.replay --source scale --transitions 100000 --tasks 2000 --save /tmp/focus-replay-100k.pkl": Check(
        "parse", SCALE_STUDY
    ),
    ".venv/bin/python -m benchmarks.scale --sizes 10000 --few-tasks 200 --repeats 3": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.scale --sizes 2000 10000 --repeats 1": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.scale --sizes 2000 10000 --repeats 3": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.scale --sizes 2000 100000 --repeats 1": Check("parse", SCALE_STUDY),
    ".venv/bin/python -m benchmarks.scale_inproc --arms focus --transitions 10000 --tasks 200 --repeats 1": Check(
        "parse", SCALE_STUDY
    ),
    ".venv/bin/python -m benchmarks.scale_inproc --arms focus,tuned --transitions 10000 --tasks 200": Check(
        "parse", SCALE_STUDY
    ),
    ".venv/bin/python -m benchmarks.scale_inproc --arms focus,tuned --transitions 10000 --tasks 40 --repeats 5": Check(
        "parse", SCALE_STUDY
    ),
    ".venv/bin/python -m benchmarks.scale_inproc --arms focus,tuned --transitions 2000 --tasks 40": Check(
        "parse", SCALE_STUDY
    ),
    # docs/findings/estimator-issue31.md
    ".venv/bin/python -m benchmarks.quality_diff benchmarks/results/estimator_quality_unseen.json after.json": Check(
        "parse", "compares a record with a run made after a change (tests/test_quality_diff.py runs it)"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families truncated --budgets 6 --critics biased "
    "--methods grpo,uniform,selective --seeds 8 --jobs 1": Check("parse", "one held-out cell, 22 seeds: about 10 s"),
    # docs/findings/critic-wrong-here.md
    ".venv/bin/python -m benchmarks.estimator_quality --families critical,slippery,forage,timing,decisive,early_gate "
    "--budgets 2,6 --critics wrong_state --methods uniform,selective --seeds 6": Check(
        "parse", "the wrong-state critic, 768 collections: about 1 minute on 2 quiet cores"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families uniform,long,decisive,heavy_tail,truncated "
    "--budgets 2,6 --critics exact,noise_1,constant,biased --methods uniform,selective --seeds 6": Check(
        "parse", "the standard critics beside it, 2,560 collections: about 3 minutes on 2 quiet cores"
    ),
    # docs/findings/estimator-allocation.md
    ".venv/bin/python -m benchmarks.estimator_quality --families uniform,critical,long,slippery,forage,project,timing,subtle "
    "--critics exact,noise_1,noise_3,constant --budgets 2,6 --methods uniform,selective,selective_explore50,"
    "selective_explore100,selective_unifirst,selective_unifirst_w8 --seeds 2 --jobs 1": Check(
        "parse", "the hedges on the project's families, reduced: about 15 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families uniform,critical,long,slippery,forage,project,timing,subtle "
    "--critics exact,noise_1,noise_3,constant --budgets 2,6 --methods uniform,selective,selective_depthshare3,"
    "selective_chainmid_depthshare3 --seeds 2 --jobs 1": Check(
        "parse", "the depth-share hedges on the project's families at 2H and 6H: about 2 minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families critical --budgets 6,16 "
    "--critics exact,noise_0.5,noise_1,constant --methods grpo,uniform,selective --seeds 16 --jobs 1": Check(
        "parse", "critical's composition-neutral cells, 531 collections: about 2 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.allocation_bound --seeds 8 --jobs 2 --json runs/allocation_bound.json": Check(
        "parse", "4,224 collections: 29 minutes on 2 loaded cores"
    ),
    # docs/findings/learning-steps.md
    ".venv/bin/python -m benchmarks.learning --seeds 10 11 12 13 14 15 16 17 18 19 --jobs 2 "
    "--out runs/learn-s10-19": Check("parse", "120 learning runs, about 15 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy --seeds 0 1 2 3 4 --set rule=sgd "
    "--sweep-sizes 8x3,4x6,2x12 --sweep target_kl=0.1,0.2 --out runs/bs/toy": Check(
        "parse", "60 learning runs (3 sizes x 2 steps x 2 methods x 5 seeds), about 16 minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks cued-corridor-early cued-corridor-late cued-bridge "
    "--iterations 6 --seeds 0 1 2 3 4 5 6 7 8 9 --out runs/cued-six": Check(
        "parse", "60 learning runs of the cued tasks at six updates, about 11 minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --seeds 1 2 --updates 10 --credit decisive "
    "--out runs/ceiling.jsonl": Check("parse", "20 oracle updates and evaluations, about 10 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.learning_ceiling --seeds 0 --updates 8 --credit decisive --shape 64x1 "
    "--out runs/ceiling.jsonl": Check("parse", "8 oracle updates and evaluations, about 5 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.learning_ceiling --seeds 0 --updates 8 --credit decisive --set target_kl=1.0 "
    "--out runs/ceiling.jsonl": Check("parse", "8 oracle updates and evaluations, about 5 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.learning_ceiling --seeds 0 --updates 6 --credit decisive --set rule=adam "
    "--set lr=1.2e-3 --out runs/ceiling.jsonl": Check("parse", "6 oracle updates of Adam epochs, about 10 minutes"),
    ".venv/bin/python -m benchmarks.learning_ceiling --seeds 0 --updates 6 --credit decisive trajectory "
    "--out runs/ceiling-p.jsonl": Check("parse", "12 oracle updates and evaluations, about 8 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-early --seeds 0 1 2 --updates 9 --credit decisive "
    "--out runs/h60c/early.jsonl": Check(
        "parse", "27 oracle updates and evaluations, about 15 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-late --seeds 0 1 2 --updates 9 --credit decisive "
    "--out runs/h60c/late.jsonl": Check(
        "parse", "27 oracle updates and evaluations, about 28 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-bridge --seeds 0 1 2 --updates 9 --credit decisive "
    "--out runs/h60c/bridge.jsonl": Check(
        "parse", "27 oracle updates and evaluations, about 13 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-bridge --seeds 0 1 2 --updates 9 --credit decisive --wrong 0.2 "
    "--out runs/h60c/bridge-w02.jsonl": Check(
        "parse", "27 oracle updates and evaluations, about 9 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-early --seeds 1 --updates 27 --credit decisive "
    "--out runs/h60c/long.jsonl": Check(
        "parse", "27 oracle updates and evaluations, about 9 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-early --seeds 0 --updates 6 --credit decisive --set rule=natural "
    "--out runs/h60c/natural.jsonl": Check(
        "parse", "6 natural-gradient oracle updates, about 15 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-early --seeds 0 --updates 9 --credit decisive --set rule=adam --set lr=1e-3 "
    "--set epochs=8 --set target_kl=null --out runs/h60c/adamfit.jsonl": Check(
        "parse", "9 oracle updates of Adam epochs, about 5 minutes"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-early --seeds 0 --updates 6 --credit decisive --set rule=adam --set lr=3e-3 "
    "--set epochs=32 --set target_kl=null --out runs/h60c/adam32.jsonl": Check(
        "parse", "6 oracle updates of 32 Adam epochs, about 9 minutes"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --supervised 600 --seeds 0 1 2 "
    "--out runs/h60c/supervised.jsonl": Check("parse", "1,800 supervised steps, about 25 minutes on 2 loaded cores"),
    ".venv/bin/python -m benchmarks.learning_ceiling --supervised 300 --supervised-lr 1e-3 --scratch --seeds 0 "
    "--out runs/h60c/scratch.jsonl": Check("parse", "300 supervised steps, about 4 minutes on 2 loaded cores"),
    ".venv/bin/python -m benchmarks.learning_ceiling --supervised 1500 --seeds 1 "
    "--out runs/h60c/supervised-1500.jsonl": Check(
        "parse", "1,500 supervised steps, about 12 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_start": Check(
        "parse", "500 supervised steps, about 6 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_start --init default --lr 3e-3 --steps 600 --steps-taught every "
    "--cache runs/h61c/start": Check("parse", "600 supervised steps on every step's prompt, about 10 minutes"),
    ".venv/bin/python -m benchmarks.learning_start --init default --lr 1e-2 --steps 2000 --steps-taught every "
    "--cache runs/h61c/start": Check("parse", "2,000 supervised steps, about 50 minutes on 2 loaded cores"),
    ".venv/bin/python -m benchmarks.learning_start --init scratch --lr 1e-3 --steps 400 --steps-taught every "
    "--cache runs/h61c/start": Check("parse", "400 supervised steps, about 13 minutes on 2 loaded cores"),
    ".venv/bin/python -m benchmarks.learning_start --init scratch --lr 1e-3 --steps 1000 --seed 1 --steps-taught every "
    "--cache runs/h61c/start": Check("parse", "1,000 supervised steps, about 20 minutes on 2 loaded cores"),
    ".venv/bin/python -m benchmarks.learning_start --init default --lr 3e-3 --steps 500 --cache runs/h61c/start": Check(
        "parse", "500 supervised steps, about 6 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-early --start pretrained --seeds 0 1 2 "
    "--updates 9 --credit decisive --out runs/h61c/ceil/cued-corridor-early.jsonl": Check(
        "parse", "27 oracle updates and 30 evaluations, about 30 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-corridor-late --start pretrained --seeds 0 1 2 "
    "--updates 9 --credit decisive --out runs/h61c/ceil/cued-corridor-late.jsonl": Check(
        "parse", "27 oracle updates and 30 evaluations, about 30 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_ceiling --task cued-bridge --start pretrained --seeds 0 1 2 "
    "--updates 9 --credit decisive --out runs/h61c/ceil/cued-bridge.jsonl": Check(
        "parse", "27 oracle updates and 30 evaluations, about 30 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks cued-corridor-early --start pretrained --methods focus grpo uniform "
    "--seeds 0 1 2 3 4 --jobs 3 --out runs/h61c/learn-early": Check(
        "parse", "15 learning runs from the start with the cue lookup, about 25 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning_cues --seeds 0 1 2 --jobs 1 --out runs/cues.jsonl": Check(
        "parse", "18 learning runs of the cued tasks, about 25 minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks toy cued-corridor-early cued-corridor-late cued-bridge "
    "--seeds 0 1 2 3 4 --set steps=2 --jobs 3 --out runs/steps2": Check(
        "parse", "40 learning runs at two steps per update, about 30 minutes on 2 cores"
    ),
    ".venv/bin/python -m benchmarks.learning_cues --versus benchmarks/results/learning.json "
    "runs/steps2/learning.json": Check("parse", "reads a learning run that takes about 30 minutes to make"),
    ".venv/bin/python -m benchmarks.learning --tasks bridge-long --seeds 0 1 2 3 4 5 6 7 8 9 --jobs 2 "
    "--out runs/learning-bridge-long": Check("parse", "20 learning runs of the long bridge, about 15 minutes"),
    ".venv/bin/python -m benchmarks.learning --jobs 1 --tasks toy corridor-late --seeds 5 6 7 8 9 --set rule=sgd "
    "--set target_kl=0.2 --sweep-sizes 2x12,8x3 --out runs/s5-9": Check(
        "parse", "40 learning runs (2 tasks x 2 sizes x 2 methods x 5 seeds), about 30 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning --assemble runs/s5-19 --tasks toy corridor-late --sweep-sizes 2x12,8x3 "
    "--set rule=sgd --set target_kl=0.2": Check("parse", "reads the joined runs of two sweeps (learning-steps.md)"),
    ".venv/bin/python -m benchmarks.learning --jobs 1 --methods focus --evidence 6 --tasks toy --seeds 5 6 7 8 9 "
    "--set rule=sgd --set target_kl=0.2 --sweep-sizes 2x12 --out runs/ev6-toy": Check(
        "parse", "5 learning runs of 12 updates, about 3 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 1 --tasks toy --seeds 5 6 7 8 9 10 11 12 13 14 --set rule=sgd "
    "--set target_kl=0.1 --sweep-sizes 2x12 --out runs/kl01-toy": Check(
        "parse", "20 learning runs of 12 updates, about 15 minutes on 2 loaded cores"
    ),
    ".venv/bin/python -m benchmarks.learning --assemble runs/learn-s0-19.jsonl --out runs/learn-s0-19": Check(
        "parse",
        "reads the runs of two learning runs joined into one file (docs/findings/learning-steps.md, 'Twenty seeds')",
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families decisive,heavy_tail,truncated --budgets 2,6 "
    "--critics noise_1,noise_3,constant,biased,early_late --methods grpo,uniform,selective --seeds 2": Check(
        "parse", "a benchmark of about 15 minutes (three families of the issue-31 record)"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families decisive,heavy_tail,truncated --budgets 2,6 "
    "--critics exact,noise_1,noise_3,constant,biased,early_late,wrong_state --methods uniform,selective --seeds 2": Check(
        "parse", "a benchmark of 5-10 minutes on 2 loaded cores (h58j's quick set for the joint t(d) fit)"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families uniform,critical,long,slippery,forage,project,timing,"
    "subtle --budgets 2,6 --critics exact,noise_1,noise_3,constant --methods uniform,selective --seeds 1": Check(
        "parse", "a benchmark of about 4 minutes on 2 loaded cores (the project's eight, h58j's joint t(d) fit)"
    ),
    ".venv/bin/python -m benchmarks.noise_variant excess --families decisive,heavy_tail,truncated --budgets 2,6 "
    "--critics exact,noise_1,noise_3,constant,biased,early_late,wrong_state --methods uniform,selective --seeds 2 "
    "--jobs 1": Check("parse", "a benchmark of about 12 minutes on 2 loaded cores (h60b's excess t(d) test)"),
    ".venv/bin/python -m benchmarks.noise_variant excess --families uniform,critical,long,slippery,forage,project,"
    "timing,subtle --budgets 2,6 --critics exact,noise_1,noise_3,constant --methods uniform,selective --seeds 1 "
    "--jobs 1": Check(
        "parse", "a benchmark of 4-7 minutes on 2 loaded cores (the project's eight, h60b's excess test)"
    ),
    ".venv/bin/python -m benchmarks.reward_units": Check(
        "parse", "960 collections against 320 unscaled ones: 21 minutes with the machine loaded"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family early_gate --critic noise_1": Check(
        "parse", "a simulation of about a minute (64 continuations from about 330 checkpoints)"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family early_gate --critic noise_1 --fit 6": Check(
        "parse", "6 collections and their fits, about 15 s"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family critical --critic exact --budget 16 --fraction 1 "
    "--fit 8": Check("parse", "8 collections at 16H and their fits, about a minute"),
    ".venv/bin/python -m benchmarks.priority_terms --family heavy_tail --critic noise_1 --exact": Check(
        "parse", "a simulation of a few minutes (64 continuations from each of about 130 checkpoints)"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family heavy_tail --critic noise_1 --method uniform "
    "--fraction 1 --fit 22": Check("parse", "22 collections and their fits, about 20 s on a loaded machine"),
    ".venv/bin/python -m benchmarks.priority_terms --family heavy_tail --critic noise_1 --method selective "
    "--fraction 1 --fit 22": Check("parse", "22 collections and their fits, about 20 s on a loaded machine"),
    ".venv/bin/python -m benchmarks.estimator_quality --families heavy_tail --budgets 6 "
    "--critics noise_1,noise_3,constant,biased,early_late --methods grpo,uniform,selective --seeds 8": Check(
        "parse", "a benchmark of a minute or two (heavy_tail at 6H, 22 seeds per cell)"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families decisive,heavy_tail,truncated --budgets 2,6 "
    "--critics noise_1,noise_3,constant,biased,early_late --methods grpo,uniform,selective --seeds 8": Check(
        "parse", "a benchmark of about 20 minutes (the issue-31 subset at 22 seeds at 6H, 64 at 2H)"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family decisive --critic noise_3 --budget 6": Check(
        "parse", "a simulation of about 15 minutes on a loaded machine (64 continuations from about 700 checkpoints)"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family truncated --critic noise_1 --budget 2": Check(
        "parse", "a simulation of about 20 s (64 continuations from about 50 checkpoints)"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family decisive --critic noise_3 --budget 6 --exact "
    "--per-depth 2 --samples 32": Check(
        "parse", "a simulation of about 4 minutes (32 continuations from 370 checkpoints)"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families decisive,truncated --budgets 2,6 "
    "--critics noise_1,noise_3 --methods uniform,selective --seeds 8": Check(
        "parse", "a benchmark of about 5 minutes (the two families' noisy cells, 22 seeds at 6H, 64 at 2H)"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families decisive,truncated --budgets 2,6 "
    "--critics noise_1,noise_3 --methods uniform,selective,selective_advonly --seeds 8 --ablation-seeds 8": Check(
        "parse", "a benchmark of about 6 minutes (the same cells and the ablation without the target term)"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family decisive --critic noise_3 --budget 6 --own-depth 8": Check(
        "parse", "8 collections and their fits, about 20 s on a loaded machine"
    ),
    ".venv/bin/python -m benchmarks.priority_terms --family decisive --critic noise_3 --budget 6 --own-depth 8 "
    "--method uniform": Check("parse", "8 collections and their fits, about 20 s on a loaded machine"),
    ".venv/bin/python -m benchmarks.estimator_quality --families decisive --budgets 6 --critics noise_3,noise_1 "
    "--methods uniform,selective --seeds 8": Check(
        "parse", "a benchmark of two to three minutes (decisive's noisy cells at 6H, 22 seeds each)"
    ),
    ".venv/bin/python -m benchmarks.estimator_quality --families uniform,critical,long,slippery,forage,project,"
    "timing,subtle --budgets 6 --critics noise_1,constant --methods grpo,uniform,selective --seeds 2": Check(
        "parse", "a benchmark of several minutes (the eight project families at 6H, 6 seeds per cell)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks toy math --seeds 0 1 2 3 4 5 6 7 8 9 --set rule=sgd "
    "--set target_kl=0.2 --out runs/learn-sgd10": Check("parse", "40 learning runs, about 6 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.learning --tasks long-reach --seeds 0 1 2 3 4 5 6 7 8 9 --set rule=sgd "
    "--set target_kl=0.1 --out runs/learn-sgd10-lr": Check("parse", "20 learning runs, about 7 minutes on 2 cores"),
    ".venv/bin/python -m benchmarks.learning --jobs 1 --tasks toy --methods focus "
    "--set segment_weights='\"siblings\"' --out runs/w-sib": Check("parse", "10 learning runs, about 4 minutes"),
    ".venv/bin/python -m benchmarks.learning --jobs 1 --tasks toy --methods focus "
    "--set segment_weights='\"reach\"' --out runs/w-reach": Check("parse", "10 learning runs, about 4 minutes"),
    ".venv/bin/python -m benchmarks.learning --jobs 1 --tasks long-reach --methods focus "
    "--set segment_weights='\"siblings\"' --out runs/w-sib-lr": Check("parse", "10 learning runs, about 9 minutes"),
    ".venv/bin/python -m benchmarks.estimator_quality --families timing,slippery --budgets 2,6 "
    "--critics exact,noise_1,noise_3 --methods uniform,selective --seeds 16": Check(
        "parse", "a benchmark of about a minute on 2 cores (timing and slippery, 128 seeds at 2H, 43 at 6H)"
    ),
    ".venv/bin/python -m benchmarks.gradient_quality --jobs 2 --tasks corridor-early corridor-late bridge "
    "--seeds 0 1 2 3 --reference 128 --batches 2": Check(
        "parse", "a measurement of about 11 minutes (the issue-32 gradient-quality table)"
    ),
    ".venv/bin/python -m benchmarks.gradient_quality --tasks toy --seeds 0 1 2 3 --reference 128 --batches 2": Check(
        "parse", "a measurement of about 3 minutes (the issue-32 gradient-quality table's toy rows)"
    ),
    ".venv/bin/python -m benchmarks.gradient_quality --jobs 2 --tasks corridor-early corridor-late "
    "--seeds 0 1 2 3 --reference 128 --batches 2 --methods grpo-centred": Check(
        "parse", "a measurement of about 8 minutes (GRPO with centred returns, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.gradient_quality --jobs 2 --tasks corridor-early corridor-late bridge "
    "--seeds 0 1 2 3 --reference 128 --batches 1 --update": Check(
        "parse", "a measurement of about 25 minutes (the updates' gains, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.gradient_quality --jobs 3 --tasks corridor-early corridor-late bridge --seeds 0 1 2 3 "
    "--reference 128 --batches 1 --budgets 8 --update --trainers adam adam-fullbatch adam-1epoch sgd natural "
    "--out runs/gq-trainers.json": Check(
        "parse", "a measurement of about an hour on a loaded machine (five update rules' gains, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks corridor-late --seeds 0 1 --set rule=natural "
    "--out runs/learn-natural-cl": Check("parse", "a learning run of about 25 minutes (the natural rule, issue 32)"),
    ".venv/bin/python -m benchmarks.learning --tasks corridor-late --seeds 2 3 4 --set rule=natural "
    "--out runs/learn-natural-cl2": Check("parse", "a learning run of about 20 minutes (the natural rule, issue 32)"),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks corridor-early corridor-late bridge --seeds 0 1 2 3 4 "
    "--set rule=sgd --out runs/learn-sgd": Check(
        "parse", "a learning run of about 15 minutes (the sgd rule, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks bridge --seeds 0 1 2 3 4 --set rule=natural "
    "--out runs/learn-natural-bridge": Check(
        "parse", "a learning run of about 20 minutes (the natural rule, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks bridge --seeds 0 1 2 3 4 --out runs/learn-adam-bridge": Check(
        "parse", "a learning run of about 20 minutes (the default rule beside the natural one, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks corridor-early corridor-late bridge --seeds 0 1 2 3 4 "
    "--sweep target_kl=0.05,0.1,0.2 --sweep lr=3e-4,6e-4,1.2e-3 --out runs/learn-sweep": Check(
        "parse", "a learning sweep of about an hour on a loaded machine (each method at its best step, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks toy --seeds 0 1 2 3 4 --sweep target_kl=0.05,0.1,0.2 "
    "--sweep lr=3e-4,6e-4,1.2e-3 --out runs/learn-sweep-toy": Check(
        "parse", "a learning sweep of the toy (its first setting took about 50 minutes at low priority, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy --seeds 0 1 2 3 4 --sweep target_kl=0.1,0.2 "
    "--sweep lr=6e-4,1.2e-3 --out runs/learn-sweep-toy": Check(
        "parse", "the toy sweep's larger settings, about 15 minutes (issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks toy --sweep target_kl=0.05,0.1,0.2 --sweep lr=3e-4,6e-4,1.2e-3 "
    "--assemble runs/learn-sweep-toy": Check("parse", "reads the two toy runs' folders (needs them)"),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks corridor-early corridor-late bridge --seeds 0 1 2 3 4 "
    "--set rule=sgd --sweep target_kl=0.1,0.2 --out runs/learn-sweep-sgd": Check(
        "parse", "a learning sweep of about 40 minutes on a loaded machine (the sgd rule's larger steps, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks corridor-early corridor-late bridge --set rule=sgd "
    "--sweep target_kl=0.05,0.1,0.2 --assemble runs/learn-sweep-sgd": Check(
        "parse", "reads the sgd sweep's folder and the sgd run's runs.jsonl copied into it (needs them)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks corridor-late --seeds 0 1 2 3 4 --set rule=sgd "
    "--sweep target_kl=0.4 --out runs/learn-sweep-sgd-cl04": Check(
        "parse", "a learning run of about 10 minutes on a loaded machine (the sgd rule at target 0.4, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy --seeds 0 1 2 3 4 --set rule=sgd "
    "--sweep target_kl=0.05,0.1,0.2 --out runs/learn-sweep-sgd-toy": Check(
        "parse", "a learning sweep of the toy of about 15 minutes on a loaded machine (the sgd rule, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy corridor-early corridor-late bridge --seeds 0 1 2 3 4 "
    "--set rule=sgd --set target_kl=0.2 --tasks-per-iteration 4 --out runs/learn-sgd-t4": Check(
        "parse", "a learning run of about 15 minutes on a loaded machine (half the data per update, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy corridor-early corridor-late bridge --seeds 0 1 2 3 4 "
    "--set rule=sgd --set target_kl=0.2 --tasks-per-iteration 2 --out runs/learn-sgd-t2": Check(
        "parse", "a learning run of about 8 minutes on a loaded machine (a quarter of the data per update, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy corridor-early corridor-late bridge --seeds 0 1 2 3 4 "
    "--set rule=sgd --set target_kl=0.2 --tasks-per-iteration 4 --iterations 1 --out runs/learn-sgd-t4-it1": Check(
        "parse", "a learning run of about 3 minutes on a loaded machine (the first update only, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks toy corridor-early corridor-late bridge --seeds 0 1 2 3 4 "
    "--set rule=sgd --set target_kl=0.2 --tasks-per-iteration 4 --methods uniform --out runs/learn-sgd-t4-uniform": Check(
        "parse", "a learning run of about 6 minutes on a loaded machine (uniform beside the half-data run, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks toy corridor-early corridor-late bridge --methods focus grpo uniform "
    "--set rule=sgd --set target_kl=0.2 --tasks-per-iteration 4 --assemble runs/learn-sgd-t4-all/runs.jsonl "
    "--out runs/learn-sgd-t4-all": Check(
        "parse", "reads the half-data run's and the uniform run's runs.jsonl, concatenated (needs them)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks long-reach math --seeds 0 1 2 3 4 --set rule=sgd "
    "--set target_kl=0.2 --out runs/learn-sgd-lr-math": Check(
        "parse", "a learning run of about 11 minutes on a loaded machine (the long reach and MATH under sgd, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --jobs 2 --tasks long-reach math --seeds 0 1 2 3 4 --set rule=sgd "
    "--sweep target_kl=0.05,0.1 --out runs/learn-sweep-sgd-lr-math": Check(
        "parse", "a learning sweep of about 16 minutes on a loaded machine (the long reach and MATH, issue 32)"
    ),
    ".venv/bin/python -m benchmarks.learning --tasks long-reach math --set rule=sgd --sweep target_kl=0.05,0.1,0.2 "
    "--assemble runs/learn-sweep-sgd-lr-math": Check(
        "parse", "reads the sweep's folder and the 0.2 run's runs.jsonl copied into it (needs them)"
    ),
    # docs/pipeline.md
    ".venv/bin/python -m tasks.config.reference": Check(
        "parse", "rewrites docs and configs in place; tests/test_configs.py runs its --check"
    ),
    ".venv/bin/focus collect": Check("run", expect=("batch:",)),
    ".venv/bin/focus collect --collection-id c1": Check(
        "run", setup=(".venv/bin/focus collect --collection-id c1",), expect=("already finished",)
    ),
    ".venv/bin/focus collect -c configs/collect.toml --set search.phases.1.transitions=400": Check(
        "run", expect=("batch:",)
    ),
    ".venv/bin/focus collect --model-url http://gpu:8000/v1 --model-timeout 300 --model-retries 8": Check(
        "external", SERVER
    ),
    ".venv/bin/focus collect -v": Check("run", expect=("batch:",)),
    ".venv/bin/focus inspect runs/batches/c1/iter-000000 --json": Check(
        "run", setup=(".venv/bin/focus collect --collection-id c1",), expect=('"actor_rows"',)
    ),
    ".venv/bin/focus inspect runs/batches/c1": Check(
        "run", setup=(".venv/bin/focus collect --collection-id c1",), expect=("finished iteration",)
    ),
    ".venv/bin/focus serve-model --port 8000": Check(
        "parse", "serves until stopped, on a fixed port; the tests start the same server on free ports"
    ),
    '.venv/bin/focus deploy -c configs/collect.toml --cron "0 * * * *" --limit 1': Check(
        "external", "needs a Prefect server (PREFECT_API_URL) and serves until stopped; tests/test_deploy.py runs it"
    ),
    ".venv/bin/focus train -c configs/loop.toml --collection-id loop": Check("parse", LONG_TRAIN),
    ".venv/bin/focus train --store /tmp/s --iterations 3 --collection-id d2 -v": Check("parse", LONG_TRAIN),
    ".venv/bin/focus train -c configs/loop.toml --trainer mytrainer:train": Check(
        "external", "names your own trainer module (mytrainer.py), which this checkout does not have"
    ),
    ".venv/bin/python -m benchmarks.cli_start": Check("parse", "a benchmark of minutes"),
    ".venv/bin/focus deploy --work-pool --crash-after 30": Check(
        "external",
        "changes a Prefect server's deployments and automations; tests/test_deploy_workpool.py runs it",
    ),
    ".venv/bin/python -m cli collect": Check("run", expect=("batch:",)),
    # examples
    ".venv/bin/python -m examples.math.run --problems 5 --out /tmp/focus-math-x": Check("run", record="math"),
    ".venv/bin/python -m examples.math.run --model-url http://127.0.0.1:8000 --model Qwen/Qwen3-4B --tokenizer "
    "/models/qwen3-4b/tokenizer.json --out s3://bucket/focus": Check("external", SERVER + ", and its tokenizer"),
    ".venv/bin/python -m examples.browse.run --questions 4 --out /tmp/focus-browse": Check(
        "parse",
        "minutes on the tiny model (its record has the time); tests/test_examples_browse.py runs it small",
    ),
    ".venv/bin/python -m examples.browse.run --model-url http://127.0.0.1:8000 --tokenizer /models/qwen/tokenizer.json": Check(
        "external", SERVER + ", and its tokenizer"
    ),
    ".venv/bin/python -m examples.browse.run --write-corpus /tmp/corpus.jsonl": Check(
        "run", expect=('"documents": 100',)
    ),
    ".venv/bin/python -m examples.train_local.run --seeds 0 1 2 --out runs/train_local": Check(
        "parse", "three train loops (its record has the time); tests/test_pipeline_train.py runs a small loop"
    ),
    ".venv/bin/python -m examples.train_tinker.run --collect-toy --out /tmp/focus-tinker": Check(
        "run", record="train_tinker"
    ),
    "TINKER_API_KEY=... .venv/bin/python -m examples.train_tinker.run --store s3://bucket/focus --batch-url "
    "s3://bucket/focus/batches/math/iter-000000 --base-model Qwen/Qwen3-4B-Instruct-2507 --loss-fn "
    "importance_sampling --lr 1e-5": Check("external", "needs a Tinker key and a batch of the base model's tokens"),
    ".venv/bin/focus train -c configs/loop.toml --trainer tinker --set train.tinker.base_model=Qwen/Qwen3-4B-Instruct-2507 "
    "--set train.iterations=1 --set train.eval_tasks=0": Check(
        "parse", "a train-loop iteration (minutes); tests/test_pipeline_train.py runs this dry run smaller"
    ),
    "TINKER_API_KEY=... .venv/bin/focus train -c configs/loop.toml --trainer tinker --set model.kind=tinker --set "
    "model.model=Qwen/Qwen3-4B-Instruct-2507 --set env.kind=factory --set env.factory=mypkg.envs:make": Check(
        "external", "needs a Tinker key and your env package (mypkg)"
    ),
    "python train.py ... --rollout-function-path examples.train_slime.rollout.generate_rollout --rollout-batch-size 32 "
    "--n-samples-per-prompt 4 --advantage-estimator grpo --disable-rewards-normalization --use-rollout-logprobs "
    "--eps-clip 0.2": Check(
        "external",
        "slime's own training command (slime and GPUs); tests/test_examples_slime.py calls the rollout function",
        imports="examples.train_slime.rollout:generate_rollout",
    ),
    # examples/README.md: an env factory for focus collect
    ".venv/bin/focus collect --set env.kind=factory --set env.factory=examples.math.env:env_factory --set "
    "env.options.difficulty=digit_sum --tasks 4 --transitions 20": Check("run", expect=("batch:",)),
    # the records runner, in examples/train_local/README.md
    ".venv/bin/python -m examples.records --only train_local": Check(
        "parse", "runs the example's command (three train loops) and renders the READMEs"
    ),
}


# ---- finding the commands --------------------------------------------------------------


def doc_files() -> list[Path]:
    return [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("**/*.md")),
        *sorted((ROOT / "examples").glob("**/README.md")),
    ]


def block_commands(text: str) -> list[str]:
    """Lines of ```bash blocks, continuation lines joined, comments dropped."""
    out = []
    for lang, body in re.findall(FENCE, text, re.S | re.M):
        if lang not in ("bash", "sh"):
            continue
        for line in re.sub(r"\\\n\s*", " ", body).splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(re.sub(r"\s+", " ", line))
    return out


def unlabelled_command_lines(text: str) -> list[str]:
    """Lines that run something inside code blocks not labelled bash (they would be missed)."""
    out = []
    for lang, body in re.findall(FENCE, text, re.S | re.M):
        if lang in ("bash", "sh", "python", "toml", "json", "yaml", "text"):
            continue
        out += [line for line in body.splitlines() if PROGRAM.match(line.strip())]
    return out


def inline_commands(text: str) -> list[str]:
    """Code spans of the prose that are whole command lines (not a name, not a synopsis)."""
    prose = re.sub(FENCED, "", text, flags=re.S | re.M)
    out = []
    # a span opens and closes with backtick runs of one length (``a `b` c`` holds backticks):
    # pairing single backticks flipped after such a span, and hid every command after it
    spans = (m.group(2) for m in re.finditer(r"(?<!`)(`+)(?!`)(.+?)(?<!`)\1(?!`)", prose, re.S))
    for span in (" ".join(s.split()) for s in spans):
        if not PROGRAM.match(span) or re.search(r"\s\[|<\w|\.\.\.$|\.\.\. |\{", span):
            continue
        words = span.split()
        if words[0] == "focus" and not any(w.startswith("-") for w in words):
            continue  # `focus train`: the command's name
        out.append(re.sub(r"\s+", " ", span))
    return out


def documented() -> dict[str, list[str]]:
    """Each command the docs show, with the files that show it."""
    found: dict[str, list[str]] = {}
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        for cmd in [*block_commands(text), *inline_commands(text)]:
            found.setdefault(cmd, []).append(str(path.relative_to(ROOT)))
    return found


def test_every_documented_command_has_a_check_and_every_check_a_command():
    found = documented()
    missing = sorted(set(found) - set(COMMANDS))
    assert not missing, "commands in the docs with no check in COMMANDS: " + "; ".join(
        f"{c!r} ({', '.join(found[c])})" for c in missing
    )
    stale = sorted(set(COMMANDS) - set(found))
    assert not stale, f"COMMANDS lists commands no doc shows any more: {stale}"
    for cmd, check in COMMANDS.items():
        assert check.how in ("run", "parse", "external"), cmd
        assert check.how == "run" or check.why, f"{cmd!r}: say why it is not run here"


def test_command_blocks_are_labelled_so_none_is_missed():
    for path in doc_files():
        text = path.read_text(encoding="utf-8")
        lines = unlabelled_command_lines(text)
        assert not lines, f"{path.relative_to(ROOT)}: label these blocks ```bash: {lines}"
        prose = re.sub(FENCED, "", text, flags=re.S | re.M)
        wrapped = [s for s in re.findall(r"`([^`]+)`", prose) if "\n" in s and PROGRAM.match(" ".join(s.split()))]
        assert not wrapped, f"{path.relative_to(ROOT)}: keep each command on one line: {wrapped}"


def test_commands_work_from_a_fresh_clone_as_written():
    """From a fresh clone after `make install`, only the virtualenv's programs and make
    targets exist on no PATH of ours: bare `python -m examples...` lacks the packages."""
    for cmd, check in COMMANDS.items():
        if check.how == "external" and not cmd.startswith((".venv/", "TINKER_API_KEY")):
            continue  # another project's command (slime, pip)
        assert FRESH.match(cmd), f"{cmd!r} does not work from a fresh clone: write .venv/bin/... or a make target"


# ---- running and parsing ----------------------------------------------------------------


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(a copy of the checkout: its top-level entries linked into a fresh folder, with no
    runs/ of ours; the folder that stands for /tmp), shared by the commands run here as a
    person following the docs shares one checkout (a setup that is already done, such as
    collection c1, is not run again: :data:`SET_UP`)."""
    base = tmp_path_factory.mktemp("fresh-clone")
    clone = base / "clone"
    clone.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("runs", ".git", ".pytest_cache", ".mypy_cache", ".ruff_cache"):
            (clone / entry.name).symlink_to(entry)
    (base / "tmp").mkdir()
    return clone, base


def as_run(cmd: str, tmp_path: Path) -> str:
    """``cmd`` for the sandbox: its /tmp/ paths in the test's folder, make without reinstalling."""
    cmd = cmd.replace(" /tmp/", f" {shlex.quote(str(tmp_path / 'tmp'))}/")  # a TMPDIR may hold a space
    return re.sub(r"^make ", f"make {INSTALL} ", cmd)


def shell(cmd: str, cwd: Path, env: dict[str, str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)


#: Setup commands done in each sandbox: a setup is a collection whose finished store the
#: commands after it read (c1's, for a rerun and two inspects), made once per checkout as
#: a person following the docs makes it once.
SET_UP: dict[Path, set[str]] = defaultdict(set)

RUN = [c for c, k in COMMANDS.items() if k.how == "run"]
PARSED = [c for c, k in COMMANDS.items() if k.how != "run"]


@pytest.mark.integration
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cmd", RUN)
def test_cheap_commands_run_as_written(cmd, sandbox):
    check = COMMANDS[cmd]
    clone, base = sandbox
    env = {**base_env(base / "prefect"), "HOME": str(base / "home"), "PYTHONPATH": ""}
    for step in check.setup:
        if step in SET_UP[clone]:
            continue  # done in this checkout by an earlier command's setup (its store is there)
        done = shell(as_run(step, base), clone, env, check.timeout_s)
        assert done.returncode == 0, f"setup {step!r}: {done.stdout[-2000:]}{done.stderr[-3000:]}"
        SET_UP[clone].add(step)
    done = shell(as_run(cmd, base), clone, env, check.timeout_s)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"{cmd!r} exited {done.returncode}:\n{out[-4000:]}"
    for text in check.expect:
        assert text in out, f"{cmd!r} did not print {text!r}:\n{out[-3000:]}"
    if check.record:
        rec = read(check.record)
        assert rec is not None and rec["command"] == cmd
        got = json.loads(done.stdout)
        want = dict(rec["result"])
        # the batch lies in this test's folder, not the recorded one
        assert got.pop("batch").endswith(want.pop("batch").rsplit("/batches/", 1)[1])
        assert got == want, (
            f"{cmd!r} now prints other figures than its record: rerun `.venv/bin/python -m examples.records --only {check.record}`"
        )


class Parsed(BaseException):
    """Raised where a program would start its work, once its command line is parsed."""


def stop_after_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    """argparse's ``parse_args`` and a click command's ``invoke`` (click's, and the copy
    typer carries) raise :class:`Parsed` once the arguments are parsed; a bad option
    still fails in the parser, as it would for real."""
    import argparse
    import importlib

    real_parse = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        real_parse(self, args, namespace)
        raise Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)
    for name in ("click.core", "typer._click.core"):
        try:
            core = importlib.import_module(name)
        except ImportError:
            continue

        def invoke(self, ctx, real=core.Command.invoke):  # type: ignore[no-untyped-def]
            if hasattr(self, "commands"):  # a group: it goes on to its subcommand
                return real(self, ctx)
            raise Parsed

        monkeypatch.setattr(core.Command, "invoke", invoke)


def parse_command(cmd: str, config: bool, monkeypatch: pytest.MonkeyPatch) -> bool:
    """Parse ``cmd`` with its program's own parser, in this process (and, with
    ``config``, a focus command's ``-c``/``--set`` through ``focus config show``);
    whether anything of ours parsed it. Fails the test where the parser refuses it."""
    import runpy

    monkeypatch.chdir(ROOT)  # the docs' commands run in the checkout (-c configs/loop.toml), wherever pytest runs
    words = shlex.split(cmd)
    while words and re.match(r"^[A-Z_][A-Z0-9_]*=", words[0]):
        words.pop(0)
    if words[0] == "make":
        done = subprocess.run(["make", "-n", *INSTALL.split(), *words[1:]], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0 and done.stdout.strip(), f"{cmd!r}: {done.stderr[-2000:]}"
        return True
    if words[:3] == [".venv/bin/python", "-m", "pytest"]:
        files = [w for w in words[3:] if w.endswith(".py")]
        assert files and all((ROOT / f).is_file() for f in files), f"{cmd!r}: a test file is missing"
        return True
    if words[0] == ".venv/bin/focus":
        from typer.testing import CliRunner

        from cli.app import app

        if config:  # the file and the fields it names exist and hold valid values
            flags = [f for i, w in enumerate(words) if w in ("-c", "--config", "--set") for f in (w, words[i + 1])]
            shown = CliRunner().invoke(app, ["config", "show", *flags])
            assert shown.exit_code == 0, f"{cmd!r}: focus config show {' '.join(flags)}: {shown.output[-2000:]}"
        stop_after_parsing(monkeypatch)
        with pytest.raises(Parsed):
            app(words[1:], prog_name="focus", standalone_mode=False)
        return True
    if words[:2] == [".venv/bin/python", "-m"]:
        stop_after_parsing(monkeypatch)
        monkeypatch.setattr(sys, "argv", [words[2], *words[3:]])
        with pytest.raises(Parsed):
            runpy.run_module(words[2], run_name="__main__", alter_sys=True)
        return True
    if words[:2] == ["pip", "install"]:  # this project, with extras it defines
        import tomllib

        project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
        for spec in words[2:]:
            m = re.fullmatch(r"([\w-]+)(?:\[([\w,]+)\])?", spec)
            assert m and m.group(1) == project["name"], f"{cmd!r}: installs {spec!r}, not {project['name']}"
            extras = set(filter(None, (m.group(2) or "").split(",")))
            assert extras <= set(project["optional-dependencies"]), f"{cmd!r}: unknown extras {extras}"
        return True
    return False  # another project's program: nothing of ours to parse


@pytest.mark.filterwarnings("ignore:'examples.records' found in sys.modules:RuntimeWarning")
@pytest.mark.parametrize("cmd", PARSED)
def test_long_or_external_commands_parse(cmd, monkeypatch):
    check = COMMANDS[cmd]
    if check.imports:
        module, _, name = check.imports.partition(":")
        assert callable(getattr(importlib.import_module(module), name))
    parsed = parse_command(cmd, config=check.how == "parse", monkeypatch=monkeypatch)
    assert parsed or check.imports, f"{cmd!r}: nothing of ours checks it"
