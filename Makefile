# nvlfabric — every set-up step is a target here; a fresh clone needs only `make demo` / `make test`.
SHELL := /bin/bash
PY ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export GOTOOLCHAIN := local

.PHONY: all venv bytecode tools sysdeps nvml keeper generate test check lint typecheck imports demo demo-down sim-up sim-down bench clean

all: tools venv

# The virtualenv is rebuilt when pyproject.toml or the version (nvlfabric/api/release.py) changes.
$(STAMP): pyproject.toml nvlfabric/api/release.py
	@echo "[venv] creating $(VENV) and installing nvlfabric with its dev dependencies"
	@test -x $(VPY) || $(PY) -m venv $(VENV)
	@$(VPY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	@$(VPY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

venv: $(STAMP)

# Byte-code of the checkout's own modules, written once rather than compiled in memory by every
# process that imports them: a machine that sets PYTHONDONTWRITEBYTECODE (this one does) never writes
# it, and the simulator starts hundreds of Python processes (8-rack bench: preview 7.9 -> 3.0 s,
# all Running 11 -> 6 s). An install from the wheel gets it from pip. Seconds; only changed files.
bytecode: $(STAMP)
	@$(VPY) -m compileall -q -j 0 nvlfabric stacks bench tests >/dev/null

# Go-built tools (Pulumi CLI + language host, Kubernetes provider plugin, etcd, kube-*),
# cached outside the checkout by pinned version; seconds when cached.
tools: sysdeps
	@$(PY) tools/build.py

# Debian packages the simulator needs: OpenSSL 3 headers (the IMEX stand-in's TLS, nvlfabric/sim/imex),
# libseccomp's (runc's seccomp, tools/build.py),
# iproute2 (`ip`: the pods' network namespaces, nvlfabric/sim/podnetwork.py), busybox-static (the
# workload image of containerd nodes), and for those nodes mmdebstrap and buildah (their images, built
# with no registry: nvlfabric/testbed/nodeimages.py) and iptables (the `kubernetes` Service's address).
APT_INSTALL = DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
SYSDEPS = libssl-dev libseccomp-dev iproute2 busybox-static mmdebstrap buildah iptables
sysdeps:
	@test -f /usr/include/openssl/ssl.h && test -f /usr/include/seccomp.h && command -v ip >/dev/null && test -x /bin/busybox \
		&& command -v mmdebstrap >/dev/null && command -v buildah >/dev/null && command -v iptables >/dev/null || { \
		echo "[sysdeps] installing $(SYSDEPS) (OpenSSL headers, ip, a static busybox, image builders, iptables)"; \
		$(APT_INSTALL) $(SYSDEPS) >/dev/null || \
		{ apt-get update -q >/dev/null && $(APT_INSTALL) $(SYSDEPS) >/dev/null; }; }

# The C stand-ins for NVIDIA's closed parts (NVML library, IMEX daemon and ctl); seconds to build.
nvml: sysdeps
	@$(MAKE) --no-print-directory -C nvlfabric/sim/nvml OUT=$(abspath build/nvml)
	@$(MAKE) --no-print-directory -C nvlfabric/sim/imex OUT=$(abspath build/imex)

# The node image's IMEX keeper (C, libc only; nvlfabric/nodeagent/keeper): the node agent's tests
# and every simulated node run it. Seconds; only on change. deploy/Dockerfile builds it the same way.
keeper:
	@$(MAKE) --no-print-directory -C nvlfabric/nodeagent/keeper OUT=$(abspath build/keeper)

test: tools venv bytecode nvml keeper
	@$(VPY) -m pytest $(PYTEST_ARGS)

generate: venv
	@$(VPY) nvlfabric/codegen/grpcstubs.py

lint: venv
	@$(VPY) -m ruff check .

typecheck: venv
	@$(VPY) -m mypy

# The rooms' import contracts (pyproject.toml [tool.importlinter]).
imports: venv
	@$(VENV)/bin/lint-imports --no-cache

check: lint typecheck imports

# ADDONS=jobset: the simulator also runs those controllers (nvlfabric/sim/addons.py), and
# stacks/dev then declares a JobSet-bound job too.
ADDONS ?=

sim-up: tools venv bytecode sysdeps keeper
	@$(VENV)/bin/nvlfabric-sim up $(if $(ADDONS),--addons $(ADDONS))

sim-down: venv
	@$(VENV)/bin/nvlfabric-sim down

demo: tools venv bytecode nvml keeper
	@$(VPY) stacks/demo.py up $(if $(ADDONS),--addons $(ADDONS))

demo-down: venv
	@$(VPY) stacks/demo.py down

bench: tools venv bytecode nvml keeper
	@mkdir -p bench/results
	@set -e; for b in bench/[!_]*.py; do echo "[bench] $$b"; $(VPY) $$b; done

clean:
	rm -rf build $(VENV)
