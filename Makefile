# The two set-up commands of the README. Each creates .venv (once), installs, then runs.
# TORCH is pinned because a bare `torch` requirement pulls a multi-GB CUDA build; on a GPU
# box pass your CUDA build, e.g. `make demo TORCH=torch==2.11.0`.
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH ?= torch==2.13.0
EXTRAS ?= embedded,production,export,dev

# LOCK pins every other distribution (a constraints file: -c pins, adds nothing); torch and its
# CUDA libraries are left out of it, so TORCH still chooses the build. `make lock` refreshes it.
LOCK ?= requirements/lock.txt

.PHONY: install demo test lint lock

$(VENV)/.installed-$(EXTRAS): pyproject.toml $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c $(LOCK) "$(TORCH)" -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed-$(EXTRAS)

# The SLURM executor plugins (extra 'slurm'): the tests run profiles/slurm on a real SLURM.
$(VENV)/.installed-slurm: $(VENV)/.installed-$(EXTRAS)
	$(PY) -m pip install -q -c $(LOCK) -e ".[slurm]"
	touch $@

# Command 1: install and run the main job on the embedded default (CPU, offline).
demo: install
	$(VENV)/bin/snakemake --profile profiles/local
	$(VENV)/bin/bestofn verify results

# Command 2: install and run the tests (what .ci/run calls), plus the linters.
test: install $(VENV)/.installed-slurm
	bash .ci/chromium-up.sh >/dev/null  # headless Chromium for the listening-page test
	bash .ci/slurm-up.sh || echo "no SLURM: tests/workflow/test_slurm.py will fail and say why"  # one-node SLURM
	$(PY) -m pytest -n 2 --dist loadfile --durations=15  # two workers, a test file stays on one; most of the wall is waiting (SLURM jobs, workers)
	$(MAKE) lint

lint:
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/snakefmt --check Snakefile workflow/rules
	$(VENV)/bin/lint-imports --no-cache  # the layers and no-cycles contracts in pyproject.toml
	$(VENV)/bin/deptry .  # every import declared, every dependency used ([tool.deptry])

# Refresh $(LOCK) after changing pyproject.toml's dependencies (pip-tools: the dev extra).
lock:
	$(PY) requirements/refresh_lock.py
