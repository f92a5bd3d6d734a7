# Two commands: `make serve` and `make test`. Both install what they need.
#
# llama-cpp-python is compiled once into .wheelhouse/ with CPU flags detected
# from this machine (never AMX). For a GPU or a Mac, set LLAMA_CMAKE_ARGS,
# e.g. LLAMA_CMAKE_ARGS="-DGGML_CUDA=ON" make serve  (see README).

VENV ?= .venv
ARGS ?=
PYTEST_ARGS ?=

export VENV

.PHONY: install serve test lint bench bench-runtime bench-agents bench-load bench-replicas bench-remote clean e2e-agents

install:
	@scripts/install.sh

serve: install
	$(VENV)/bin/turbospark serve $(ARGS)

test: lint
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

# ruff (lint and format) and mypy, configured in pyproject.toml
lint:
	@FOR_TESTS=1 scripts/install.sh
	$(VENV)/bin/python -m ruff check src tests bench
	$(VENV)/bin/python -m ruff format --check src tests bench
	$(VENV)/bin/python -m mypy

bench: install
	$(VENV)/bin/python bench/overhead.py

# side by side with llama.cpp's llama-server (built once by bench/peer.sh)
bench-runtime:
	@FOR_TESTS=1 scripts/install.sh
	$(VENV)/bin/python bench/runtime.py $(ARGS)

# agent-load scenarios (a)-(e), side by side with llama-server (issue 13)
bench-agents:
	@FOR_TESTS=1 scripts/install.sh
	$(VENV)/bin/python bench/agents.py $(ARGS)

# replica routing: cache-aware vs round-robin over two local replicas (issue 17)
bench-replicas:
	@FOR_TESTS=1 scripts/install.sh
	$(VENV)/bin/python bench/replicas.py $(ARGS)

# the front's cost over a remote engine: straight to an upstream vs through the front
bench-remote:
	@FOR_TESTS=1 scripts/install.sh
	$(VENV)/bin/python bench/remote.py $(ARGS)

# many mixed-dialect clients at once, with faults; checks the event log (issue 16)
bench-load:
	@FOR_TESTS=1 scripts/install.sh
	$(VENV)/bin/python bench/load.py $(ARGS)

# opt-in, never in CI: the real Claude Code and Codex CLIs (from npm, into
# .agents/) against the server on Qwen2.5-Coder, headless, one tool round each
e2e-agents:
	@FOR_TESTS=1 scripts/install.sh
	@test -x .agents/node_modules/.bin/claude -a -x .agents/node_modules/.bin/codex || \
		npm install --no-save --prefix .agents @anthropic-ai/claude-code @openai/codex
	$(VENV)/bin/python scripts/agents.py e2e --bin .agents/node_modules/.bin $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
