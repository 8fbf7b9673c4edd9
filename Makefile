# Two commands set everything up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PYTHON ?= python3
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# torch and torchvision are pinned as a pair: PyPI's torchvision only imports beside its own torch.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
PYTEST_ARGS ?=

.PHONY: install demo test clean

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q $(TORCH_SPEC)
	$(PY) -m pip install -q -e '.[cluster,test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	RAY_USAGE_STATS_ENABLED=0 $(PY) sweeps/base2novel.py

test: $(STAMP)
	RAY_USAGE_STATS_ENABLED=0 $(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf demo_data runs .pytest_cache

# The checks that need a GPU (benchmarks/gpu_check.sh); without CUDA it says so and exits 0.
.PHONY: gpu-check
gpu-check:
	PY=$(PY) bash benchmarks/gpu_check.sh
