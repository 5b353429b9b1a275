# nvlfabric — every set-up step is a target here; a fresh clone needs only `make demo` / `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export GOTOOLCHAIN := local

.PHONY: all venv tools nvml generate test check lint typecheck imports demo demo-down sim-up sim-down bench clean

all: tools venv

# The virtualenv is rebuilt when pyproject.toml changes.
$(STAMP): pyproject.toml
	@echo "[venv] creating $(VENV) and installing nvlfabric with its dev dependencies"
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	@$(VPY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(VPY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

venv: $(STAMP)

# Go-built tools (Pulumi CLI + language host, Kubernetes provider plugin, etcd, kube-*),
# cached outside the checkout by pinned version; seconds when cached.
tools:
	@$(PY) tools/build.py

# The C stand-ins for NVIDIA's closed parts (NVML library, IMEX daemon and ctl); seconds to build.
nvml:
	@$(MAKE) --no-print-directory -C nvlfabric/sim/nvml OUT=$(abspath build/nvml)
	@$(MAKE) --no-print-directory -C nvlfabric/sim/imex OUT=$(abspath build/imex)

test: tools venv nvml
	@$(VPY) -m pytest $(PYTEST_ARGS)

generate: venv
	@$(VPY) nvlfabric/api/kubelet/generate.py

lint: venv
	@$(VPY) -m ruff check .

typecheck: venv
	@$(VPY) -m mypy

# The rooms' import contracts (pyproject.toml [tool.importlinter]).
imports: venv
	@$(VENV)/bin/lint-imports --no-cache

check: lint typecheck imports

sim-up: tools venv
	@$(VENV)/bin/nvlfabric-sim up

sim-down: venv
	@$(VENV)/bin/nvlfabric-sim down

demo: tools venv nvml
	@$(VPY) stacks/demo.py up

demo-down: venv
	@$(VPY) stacks/demo.py down

bench: tools venv nvml
	@mkdir -p bench/results
	@set -e; for b in bench/[!_]*.py; do echo "[bench] $$b"; $(VPY) $$b; done

clean:
	rm -rf build $(VENV)
