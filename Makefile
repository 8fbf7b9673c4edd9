# Two commands set everything up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch and torchvision are pinned as a pair: PyPI's torchvision only imports beside its own torch.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=
# pytest-xdist workers for make test: the Ray-marked tests run in two lanes, one test after
# another in each, a lane on each worker (tests/conftest.py); 0 runs everything in this process
PYTEST_WORKERS ?= 2
# the oldest Ray minor pyproject.toml allows ("ray[...]>=2.57,<3" -> 2.57), tested in a venv of its own
RAY_OLDEST := $(shell sed -n 's/.*"ray\[default,tune,train\]>=\([0-9.]*\),.*/\1/p' pyproject.toml)
OLDEST_VENV ?= .venv-ray-oldest
OLDEST_PY := $(OLDEST_VENV)/bin/python
# what test-ray-oldest runs: every test that starts Ray or builds Ray's objects, one after another
RAY_OLDEST_TESTS ?= -m "ray or ray_api"

.PHONY: install demo lint test test-ray-oldest clean

# pip byte-compiles the installed files one at a time (half of a fresh install's time on 2 cores);
# compileall does it on every core. Files this Python cannot compile (torch ships helpers for
# newer Pythons) are skipped, as pip skips them.
COMPILE = $(1) -m compileall -qq -j 0 "$$($(1) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" || true

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --no-compile --upgrade pip
	$(PY) -m pip install -q --no-compile $(TORCH_SPEC) -e '.[cluster,test]'
	$(call COMPILE,$(PY))
	touch $(STAMP)

install: $(STAMP)

# vacsr's own modules as .pyc too (an editable install leaves them out): every process of a
# sweep or a test imports about a hundred of them, 0.3 CPU-s to compile each time where Python
# writes no bytecode itself (PYTHONDONTWRITEBYTECODE); files already up to date are skipped
OWN_COMPILE = $(1) -m compileall -qq -j 0 vacsr sweeps

demo: $(STAMP)
	$(call OWN_COMPILE,$(PY))
	RAY_USAGE_STATS_ENABLED=0 $(PY) sweeps/base2novel.py

# ruff (pyproject.toml's [tool.ruff]) before pytest: a lint finding fails make test and CI
lint: $(STAMP)
	$(VENV)/bin/ruff check vacsr sweeps benchmarks tests

test: $(STAMP) lint
	$(call OWN_COMPILE,$(PY))
	RAY_USAGE_STATS_ENABLED=0 $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

# The Ray tests on the newest patch of the oldest supported Ray minor (CI runs this after
# `make test`): the Ray Train layer, the sweeps, the `ray job submit` run, signals, a full disk.
test-ray-oldest:
	test -n "$(RAY_OLDEST)" || { echo "Makefile: no ray lower bound found in pyproject.toml" >&2; exit 1; }
	test -x $(OLDEST_PY) || $(PYTHON) -m venv $(OLDEST_VENV)
	$(OLDEST_PY) -m pip install -q --no-compile --upgrade pip
	$(OLDEST_PY) -m pip install -q --no-compile $(TORCH_SPEC) -e '.[cluster,test]' \
	  'ray[default,tune,train]==$(RAY_OLDEST).*'
	$(call COMPILE,$(OLDEST_PY))
	$(OLDEST_PY) -c "import ray, sys; v = ray.__version__; print('ray', v); \
	  sys.exit(0 if v.startswith('$(RAY_OLDEST).') else f'expected ray $(RAY_OLDEST).x, got {v}')"
	$(call OWN_COMPILE,$(OLDEST_PY))
	RAY_USAGE_STATS_ENABLED=0 $(OLDEST_PY) -m pytest -q $(RAY_OLDEST_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf demo_data runs .pytest_cache

# The checks that need a GPU (benchmarks/gpu_check.sh); without CUDA it says so and exits 0.
.PHONY: gpu-check
gpu-check:
	PY=$(PY) bash benchmarks/gpu_check.sh
