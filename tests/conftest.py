"""Test setup: without CUDA, Triton kernels run under the CPU interpreter (set before import)."""

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords and not HAS_CUDA:
            item.add_marker(skip_gpu)


# Where the Triton kernels run: the CPU interpreter in CI, the GPU where there is one.
TRITON_DEVICES = [
    pytest.param("cpu", id="interp", marks=pytest.mark.skipif(not INTERPRET, reason="TRITON_INTERPRET is off")),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]


@pytest.fixture
def engine_over():
    """White-box engine tests: an Engine (mvdb.engine.state) built over a read-only view of a
    database directory, as ``Database`` builds its own; ``engine_over(path, residency="host")``."""
    from mvdb.storage import Store

    from mvdb.engine.args import device_arg
    from mvdb.engine.state import Engine, resolve_config

    stores = []

    def make(path, device="auto", residency="auto"):
        store = Store(path, read_only=True)
        stores.append(store)
        return Engine(store, device_arg(device), residency, resolve_config(store, None, None))

    yield make
    for s in stores:
        s.close()
