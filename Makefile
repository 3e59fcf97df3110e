# The two commands of the README: `make demo` and `make test`. Both install what they need into .venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-prerequisites tools install-tools venv deploy-lint-venv deploy-tools lint bench clean alerts \
	kafka jaeger build-jaeger

# What the first run sets up for the whole machine or the checkout (the venvs, the apt packages) is set up once:
# each step runs under a lock, and a make that waited on it finds the work done. `installed` is true when the
# stamp $(1) is newer than what it was made from, $(2).
installed = [ $(1) -nt $(2) ]
# A lock of the whole machine lives in the system's lock directory (/run/lock on Debian).
MACHINE_LOCKS := $(firstword $(wildcard /run/lock /var/lock) /tmp)

# Tools the tests run from Debian packages: promtool (package prometheus) for the alert rule tests, chromium for
# the web console's browser tests. `make tools` installs them with apt when one is missing and it runs as root
# (CI: a fresh Debian machine); anyone else needs them on PATH already.
TEST_TOOLS := promtool chromium
TEST_PACKAGES := prometheus chromium
APT_GET := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300
# Only promtool is wanted from the package. Where its server got started (systemd, or an init script on a machine
# without policy-rc.d), stop it and keep it from starting at boot: nothing of it stays on port 9090.
STOP_PACKAGED_PROMETHEUS := if [ -d /run/systemd/system ]; then systemctl disable --now prometheus.service; \
	elif [ -x /etc/init.d/prometheus ]; then /etc/init.d/prometheus stop; fi >/dev/null 2>&1 || true
# A PostgreSQL 15-17 beside the embedded 18 (tests/support/older_postgres.py: pg_dump 15-17 reads sequences
# otherwise): Debian's `postgresql`, 15 on bookworm, 17 on trixie. Only its programs are wanted: the tests start
# servers of their own, so the cluster the package creates is stopped and kept from starting at boot.
OLDER_POSTGRES := /usr/lib/postgresql/1[5-7]/bin/pg_dump
OLDER_POSTGRES_PACKAGE := postgresql
STOP_PACKAGED_POSTGRES := if [ -d /run/systemd/system ]; then systemctl disable --now postgresql.service; fi \
	>/dev/null 2>&1; pg_lsclusters -h 2>/dev/null | while read version cluster rest; do \
	pg_ctlcluster $$version $$cluster stop; done >/dev/null 2>&1 || true

# Two makes at once in one checkout (`make demo` beside `make test`) install once: each takes the venv's lock,
# and the one that waited finds it made (`installed`). `mkdir -p` first: the deploy linters' venv inside it is
# made at the same time, and `python -m venv` fails with "File exists" when the directory appears between its
# check and its mkdir.
$(STAMP): pyproject.toml
	@mkdir -p $(VENV)
	@flock $(VENV)/.lock $(MAKE) --no-print-directory venv

venv:
	@$(call installed,$(STAMP),pyproject.toml) || { set -x; \
		$(PYTHON) -m venv $(VENV) && $(BIN)/pip install --quiet --upgrade pip && \
		$(BIN)/pip install --quiet -e ".[embedded,dev]" && touch $(STAMP); }

# The embedded Apache Kafka's release, fetched once with Maven into ~/.cache/pin-identity (needs Java 17+ and
# Maven; without them one line says so: set PIN_IDENTITY_KAFKA_BOOTSTRAP_SERVERS to a cluster of one's own).
kafka: $(STAMP)
	@$(BIN)/pin-identity embedded fetch

# Jaeger, the trace backend tests/acceptance/test_tracing.py sends spans to and reads back: built with Go from
# the Go module proxy (tools/jaeger/go.mod holds it as a tool, at the version below) into the user's cache,
# beside the Kafka release. Built once per user, under a lock, however many makes start together; a make that
# waited finds it built. From an empty Go cache the build downloads about 1.3 GB of modules and compiles for
# minutes (docs/developers.md, "Jaeger"), so .ci/run keeps Go's caches.
JAEGER_VERSION := 1.75.0
JAEGER_DIR := $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/pin-identity/jaeger-$(JAEGER_VERSION)
JAEGER := $(JAEGER_DIR)/jaeger

jaeger:
	@mkdir -p $(JAEGER_DIR)
	@flock $(JAEGER_DIR)/.lock $(MAKE) --no-print-directory build-jaeger

build-jaeger:
	@[ -x $(JAEGER) ] || { command -v go >/dev/null 2>&1 || { \
		echo "error: go is missing: the tracing test needs Jaeger, built with Go 1.24+ (https://go.dev/dl/)" >&2; \
		exit 1; }; set -x; cd tools/jaeger && GOFLAGS=-buildvcs=false GOTOOLCHAIN=local \
		go build -trimpath -o $(JAEGER).tmp github.com/jaegertracing/jaeger/cmd/jaeger && mv $(JAEGER).tmp $(JAEGER); }

demo: $(STAMP) kafka
	$(BIN)/pin-identity demo

lint: $(STAMP)
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	$(BIN)/mypy
	$(BIN)/lint-imports

# apt is the machine's: two makes at once (in two checkouts too) install one after the other, the second finding
# nothing missing.
tools:
	@flock $(MACHINE_LOCKS)/pin-identity-test-tools.lock $(MAKE) --no-print-directory install-tools

install-tools:
	@missing=""; for tool in $(TEST_TOOLS); do command -v $$tool >/dev/null 2>&1 || missing="$$missing $$tool"; done; \
	packages=""; if [ -n "$$missing" ]; then packages="$(TEST_PACKAGES)"; fi; \
	if ! ls $(OLDER_POSTGRES) >/dev/null 2>&1; then \
		missing="$$missing pg_dump-15-17"; packages="$${packages:+$$packages }$(OLDER_POSTGRES_PACKAGE)"; fi; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then \
		echo "error: missing test tool(s):$$missing. Install the Debian packages '$$packages'" \
			"(as root: apt-get install --no-install-recommends $$packages) or put the tools on PATH." >&2; \
		exit 1; \
	fi; \
	echo "installing$$missing with apt ($$packages)"; \
	$(APT_GET) update -qq && $(APT_GET) install -y -qq --no-install-recommends $$packages >/dev/null || exit 1; \
	case " $$packages " in *" prometheus "*) $(STOP_PACKAGED_PROMETHEUS);; esac; \
	case " $$packages " in *" $(OLDER_POSTGRES_PACKAGE) "*) $(STOP_PACKAGED_POSTGRES);; esac; \
	for tool in $$missing; do case $$tool in pg_dump-15-17) ls $(OLDER_POSTGRES) >/dev/null 2>&1;; \
		*) command -v $$tool >/dev/null;; esac || { echo "error: $$tool still missing" >&2; exit 1; }; done

# The linters of deploy/ (hadolint, kubernetes-validate, checkov; tests/unit/test_deploy.py runs them), from PyPI
# into a venv of their own (deploy/lint-requirements.txt says why).
DEPLOY_LINT := $(VENV)/deploy-lint
DEPLOY_LINT_STAMP := $(DEPLOY_LINT)/.installed

# Without bytecode: each linter runs once a suite, and the venv took 46 s with it (checkov's dozens of packages
# compiled) against 25 s without, while checkov's one run starts 4-5 s slower from source (BENCHMARKS.md, "Test
# suite"). Independent of the project's venv, so `make test` installs both at once.
$(DEPLOY_LINT_STAMP): deploy/lint-requirements.txt
	@mkdir -p $(DEPLOY_LINT)
	@flock $(DEPLOY_LINT)/.lock $(MAKE) --no-print-directory deploy-lint-venv

deploy-lint-venv:
	@$(call installed,$(DEPLOY_LINT_STAMP),deploy/lint-requirements.txt) || { set -x; \
		$(PYTHON) -m venv $(DEPLOY_LINT) && \
		$(DEPLOY_LINT)/bin/pip install --quiet --no-compile -r deploy/lint-requirements.txt && \
		touch $(DEPLOY_LINT_STAMP); }

deploy-tools: $(DEPLOY_LINT_STAMP)

# The alert rules for one installation, their runbook links made absolute (deploy/README.md, "Runbook links"):
#   make alerts RUNBOOK_BASE_URL=https://git.example.com/pin/identity/-/blob/main/docs/runbooks.md
RUNBOOK_BASE_URL ?=
alerts:
	@mkdir -p build/prometheus
	deploy/prometheus/render-alerts.sh "$(RUNBOOK_BASE_URL)" > build/prometheus/alerts.yml.tmp
	@mv build/prometheus/alerts.yml.tmp build/prometheus/alerts.yml
	@echo "wrote build/prometheus/alerts.yml"

# Three processes (pytest-xdist) on two cores, each with its own PostgreSQL and broker: since the suite's brokers
# compile with C1 alone, two processes leave a quarter of the CPU idle while tests wait on brokers, timers and
# subprocesses, and a third took the suite from 968 s to 830 s (BENCHMARKS.md, "Test suite"). The long fault
# tests go first, the heaviest of them one after another in one process (tests/conftest.py).
# The package's bytecode is written first: where PYTHONDONTWRITEBYTECODE is set, every `pin-identity` process
# the tests start would compile the package again, 0.2-0.3 s of CPU each (BENCHMARKS.md, "Test suite").
# What the suite needs is prepared side by side (two pips, apt, then mypy beside the rest): most of it waits on
# one core or on the disk, and it took about two minutes one after another.
test:
	@$(MAKE) --no-print-directory --jobs=3 --output-sync=target test-prerequisites
	$(BIN)/python -m compileall -q src
	$(BIN)/pytest -p no:cacheprovider -n 3 --dist loadgroup --durations=15

test-prerequisites: $(STAMP) tools kafka jaeger deploy-tools lint

bench: $(STAMP) kafka
	$(BIN)/python bench/outbox_relay.py
	$(BIN)/python bench/access_fanout.py
	$(BIN)/python bench/point_change.py
	$(BIN)/python bench/talent_apply.py
	$(BIN)/python bench/talent_import.py
	$(BIN)/python bench/access_show.py
	$(BIN)/python bench/publishing_held.py

clean:
	rm -rf $(VENV) .pin-identity
