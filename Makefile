# Set-up and entry points. `make run` and `make test` are the whole quick start.
SHELL := /bin/bash
PY := /usr/bin/python3
VENV := .venv
BIN := $(VENV)/bin
# microsocks and stunnel4: the SOCKS5 egress proxies (plain and TLS) the tests stand up.
APT_PACKAGES := python3-venv python3-dev qemu-system-x86 qemu-utils busybox-static debootstrap \
	iptables iproute2 e2fsprogs cpio kmod zstd util-linux procps tmux ca-certificates docker-registry apache2-utils libfuse3-dev fuse3 pkg-config gcc libc6-dev \
	postgresql docker.io docker-compose systemd nfs-ganesha nfs-ganesha-vfs rpcbind \
	microsocks stunnel4
STAMP := $(VENV)/.installed
# What only the tests need: a browser for the console's tests (Playwright drives it).
TEST_APT_PACKAGES := chromium
# The console's page and assets, built from console/ with npm's packages.
CONSOLE := agentenv/console/assets/index.html
CONSOLE_SOURCES := $(wildcard console/src/*.ts console/src/*.tsx console/src/*.css console/src/*.html console/src/pages/*.tsx) \
	console/package.json console/package-lock.json console/build.mjs console/tsconfig.json

.PHONY: run test quick-test bench lint typecheck format system-deps test-deps venv kit console clean

system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v npm >/dev/null || missing="$$missing nodejs npm"; \
	command -v kubectl >/dev/null || missing="$$missing kubernetes-client"; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi
	@# Clones map a snapshot's RAM privately; QEMU before 8.2 punches holes into such a file
	@# when a guest frees memory (docs/snapshots.md). Debian 12 gets a newer one from backports.
	@if dpkg --compare-versions "$$(dpkg-query -W -f='$${Version}' qemu-system-x86)" lt 1:8.2; then \
	  . /etc/os-release; echo "installing QEMU from $$VERSION_CODENAME-backports"; \
	  echo "deb http://deb.debian.org/debian $$VERSION_CODENAME-backports main" \
	    > /etc/apt/sources.list.d/aenv-backports.list; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	    --no-install-recommends -t $$VERSION_CODENAME-backports qemu-system-x86 qemu-utils; fi

test-deps: system-deps
	@missing=""; for p in $(TEST_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; fi

$(STAMP): pyproject.toml | system-deps
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

venv: system-deps $(STAMP)

kit: venv
	$(BIN)/aenv kit build

console/node_modules/.package-lock.json: console/package-lock.json | system-deps
	cd console && npm ci --no-audit --no-fund --loglevel=error

$(CONSOLE): $(CONSOLE_SOURCES) console/node_modules/.package-lock.json
	cd console && node build.mjs

console: $(CONSOLE)

run: kit console
	$(BIN)/aenv server

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: venv console
	$(BIN)/mypy
	cd console && npx tsc --noEmit -p .

format: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# Two workers, a test module each at a time: most of a VM test is waiting on a guest, so
# two at once take about half the time on two cores (docs/testing.md).
test: test-deps kit console lint typecheck
	$(BIN)/pytest -q -n 2 --dist loadgroup

quick-test: venv
	$(BIN)/pytest -q -m 'not vm and not slow'

bench: kit
	@for b in benchmarks/bench_*.py; do $(BIN)/python -m benchmarks.$$(basename $$b .py) || exit 1; done
