# The two commands a newcomer runs: `make demo` and `make test`. Both set everything up first,
# each only what it needs: the demo installs Ratchet with the extras its Claude and MCP agents need
# (`pip install -e '.[anthropic,mcp]'`), the tests every
# extra and the test tools (`.[dev]`). Each has its own stamp, so either may run first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
DEMO_STAMP := $(VENV)/.installed-demo-stamp

.PHONY: demo test test-fast lint typecheck bench bench-quick services clean

$(BIN)/python:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "Ratchet needs Python 3.11 or newer (set PYTHON=python3.11)")'
	@$(PYTHON) -m venv $(VENV) || { \
		echo "venv failed: installing python3-venv"; apt-get update -qq && apt-get install -y -qq python3-venv && $(PYTHON) -m venv $(VENV); }
	$(BIN)/python -m pip install -q --upgrade pip

# Ratchet was installed as `ratchet` before (an unrelated project's name on the public index): an
# editable install of this folder under that name would stay beside the new one, and so would its
# metadata in ratchet.egg-info/, found as a second distribution whenever this folder is on sys.path.
FORGET_OLD_NAME = if $(BIN)/python -m pip show ratchet 2>/dev/null | grep -qx "Editable project location: $(CURDIR)"; \
	then $(BIN)/python -m pip uninstall -q -y ratchet; fi; rm -rf ratchet.egg-info

$(STAMP): pyproject.toml | $(BIN)/python
	@$(FORGET_OLD_NAME)
	$(BIN)/python -m pip install -q -e '.[dev]'
	@touch $(STAMP)

$(DEMO_STAMP): pyproject.toml | $(BIN)/python
	@$(FORGET_OLD_NAME)
	$(BIN)/python -m pip install -q -e '.[anthropic,mcp]'
	@touch $(DEMO_STAMP)

## Run the seed scenarios, a team delegating to two members, a streamed run, a chat with session
## history, an extraction job with an output schema, an approval, a Claude agent and an agent using a
## local MCP server's tools, on the embedded default: SQLite,
## a broker that needs no server, an in-process worker, and the scripted model unless a provider key is set.
demo: $(DEMO_STAMP)
	$(BIN)/ratchet demo
	$(BIN)/ratchet demo team_research
	$(BIN)/ratchet demo streaming
	$(BIN)/ratchet demo chat
	$(BIN)/ratchet demo extraction
	$(BIN)/ratchet demo approval
	$(BIN)/ratchet demo claude_agent
	$(BIN)/ratchet demo mcp_agent

## Every test, against real Redis and PostgreSQL (started here if they are not running), in two
## phases of parallel pytest processes (pytest-xdist): most tests wait on servers and worker
## processes, so three processes keep two cores busy. The chaos tests (tests/chaos, all marked
## `chaos`: they kill, freeze and time out worker processes, and wait out leases of seconds) run
## after the rest, two at a time, so no other test's load stretches their timings. Each phase
## collects its own folders only: every one of its processes collects what it is given.
## The sources are compiled to bytecode first, once: the tests start hundreds of Python processes
## (workers, `ratchet` commands, servers), and where PYTHONDONTWRITEBYTECODE is set (as in many
## CI images) none of them writes what it compiled, so each compiled every module it imported
## again, a tenth of the CPU of a test that runs `ratchet` commands. A module changed since is
## compiled again as it is imported, as always.
TEST_JOBS  ?= 3
CHAOS_JOBS ?= 2
test: $(STAMP) services
	$(BIN)/ruff check orchestrator workers tests examples bench scripts
	$(BIN)/ruff format --check orchestrator workers tests examples bench scripts
	$(BIN)/mypy
	$(BIN)/python -m compileall -q -j 0 orchestrator workers tests examples bench
	$(BIN)/python -m pytest tests --ignore=tests/chaos -n $(TEST_JOBS) --dist worksteal --durations=25
	$(BIN)/python -m pytest tests/chaos -n $(CHAOS_JOBS) --dist worksteal --durations=15

services:
	@bash tests/services.sh

lint: $(STAMP)
	$(BIN)/ruff check orchestrator workers tests examples bench scripts
	$(BIN)/ruff format --check orchestrator workers tests examples bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

bench: $(STAMP) services
	$(BIN)/python -m bench

bench-quick: $(STAMP) services
	$(BIN)/python -m bench --quick

clean:
	rm -rf .ratchet tmp
