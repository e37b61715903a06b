# Entry points: `make run` (the main job on the embedded default), `make test`, `make bench`.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# torch's CPU build: PyPI's torch==2.13.0 for Linux x86-64 is the CUDA build, which pulls
# several GB of nvidia-* wheels. Tried first from PyTorch's CPU index, without retries (a
# machine that reaches only PyPI fails at once, where an extra index cost five retries per
# package); then as pip is configured (a wheel folder or mirror with the CPU build, or PyPI)
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

export DO_NOT_TRACK := 1
export PREFECT_SERVER_ANALYTICS_ENABLED := false

.PHONY: install run test test-fast test-lowest lint bench clean

# a checkout this user cannot write (mounted read-only in CI, another user's): ruff and mypy
# keep their caches in the temporary folder instead of .ruff_cache/.mypy_cache, where both
# stopped `make lint` (so `make test`) at once with "Read-only file system" or an INTERNAL
# ERROR. A RUFF_CACHE_DIR or MYPY_CACHE_DIR already set is kept.
ifeq ($(shell test -w . && echo yes),)
LINT_CACHE := $(or $(TMPDIR),/tmp)/focus-lint-cache-$(shell id -u)
export RUFF_CACHE_DIR ?= $(LINT_CACHE)/ruff
export MYPY_CACHE_DIR ?= $(LINT_CACHE)/mypy
endif

# pyproject.toml's requires-python, checked before anything is installed: pip refused an older
# Python (Ubuntu 22.04's python3 is 3.10.12) only after torch was in, and the venv made from it stayed
# and was reused by `make PY=python3.12` (the python that makes a venv, and a venv already there)
PY_MIN := 3.11
# $(PY) quoted: a Python under a folder with a space (a checkout's own venv there, as the tests
# give it) was cut at the space: "make: /tmp/a: No such file or directory"
py_ok = "$(1)" -c 'import sys; v = sys.version_info[:3]; sys.exit(0 if v >= (3, 11) else \
	"$(2) is Python %d.%d.%d; FOCUS needs $(PY_MIN) or later: $(3)" % v)'

# a venv whose Python no longer runs (the Python it was made from was removed or replaced:
# `pyenv uninstall`, `brew upgrade python`, a venv copied from another machine) is named, with
# what to do: `python -m venv` over it stopped with "Error: [Errno 2] No such file or
# directory: '.venv/bin/python3'", and with its stamp in place `make install` did nothing and
# `make test` stopped at mypy's "bad interpreter"
VENV_DEAD := $(if $(wildcard $(VENV)/pyvenv.cfg),$(shell $(BIN)/python -c '' >/dev/null 2>&1 || echo yes))
ifneq ($(VENV_DEAD),)
.PHONY: $(STAMP)
endif

$(STAMP): pyproject.toml
	@test -z "$(VENV_DEAD)" || { echo "$(VENV)'s Python does not run (made from $$(sed -n 's/^executable = //p' \
		$(VENV)/pyvenv.cfg), gone or replaced since): remove it (make clean) and run make again" >&2; exit 1; }
	@$(call py_ok,$(PY),$(PY),make PY=python3.12 (or another Python $(PY_MIN)+) $(MAKECMDGOALS))
	test -x $(BIN)/python || "$(PY)" -m venv $(VENV)
	@$(call py_ok,$(BIN)/python,$(VENV),remove it (make clean) and run make again)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q --retries 0 --index-url $(TORCH_CPU_INDEX) torch==2.13.0 2>/dev/null \
		|| $(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[all]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/focus collect

lint: $(STAMP)
	$(BIN)/ruff check focus tasks flows storage deployments cli tests benchmarks examples
	$(BIN)/ruff format --check focus tasks flows storage deployments cli tests benchmarks examples
	$(BIN)/mypy focus tasks flows storage deployments cli

# --dist worksteal: a worker out of tests takes half of the other's queue, so the last
# long tests (a minute each) do not run on one worker while the other waits.
# -n 3 on 2 cores: about a third of a worker's time is spent waiting on servers and
# processes, which a third worker fills. A fresh clone, 2 cores: -n 2 took 14:02 on a
# quiet machine (2026-12-07); -n 3 9:41 quiet (2026-12-08), and 10:53 against -n 4's
# 10:34 with another session's benchmark running; about 1,120 CPU-s in each run.
test: $(STAMP) lint
	$(BIN)/python -m pytest -q -n 3 --dist worksteal tests

# the edit-test loop: library and unit tests, no servers, nothing slow (under a minute on 2 cores)
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 -m "not integration and not slow" tests

# the fast suite against the LOWEST version of every dependency pyproject.toml allows (uv's
# lowest-direct resolution, in .venv-lowest; needs PyPI): the lower bounds are claims, and this
# checks them (docs/operations.md, "Dependency versions"). Not part of `make test`. torch is the
# pinned 2.13.0, from a wheel folder where there is one (uv does not read pip's configuration).
test-lowest:
	@$(call py_ok,$(PY),$(PY),make PY=python3.12 (or another Python $(PY_MIN)+) test-lowest)
	test -x .venv-lowest/bin/python || "$(PY)" -m venv .venv-lowest
	.venv-lowest/bin/pip install -q uv
	.venv-lowest/bin/uv pip install -q -p .venv-lowest/bin/python --resolution lowest-direct \
		$(if $(wildcard /opt/wheels),--find-links /opt/wheels) -e '.[pipeline,local,s3,tinker,examples,dev]' torch==2.13.0
	.venv-lowest/bin/python -m pytest -q -n 2 -m "not integration and not slow" tests

# every benchmark benchmarks/README.md and QUALITY.md cite, one process each, a record per benchmark in
# benchmarks/results/, then both pages' tables rendered from the records (about 45 min on 2 cores)
bench: $(STAMP)
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
