"""Every environment variable mvdb reads, in one place (docs/configuration.md lists them).

Each is read when its function is called. The kernels' launch switches are read once, into module
constants, where their modules import them (tests and benchmarks set those constants directly).
"""

from __future__ import annotations

import os
from pathlib import Path


def progress() -> bool:
    """MVDB_PROGRESS: "0" turns off the progress lines on stderr (default on)."""
    return os.environ.get("MVDB_PROGRESS", "1") != "0"


def cache_dir() -> Path:
    """MVDB_CACHE: where cached text encodings go (default ~/.cache/mvdb)."""
    return Path(os.environ.get("MVDB_CACHE", Path.home() / ".cache" / "mvdb"))


def autotune() -> str:
    """MVDB_AUTOTUNE: "0" (fixed launch configs), "1" (the default: a winner stored on disk or
    shipped with mvdb, else autotune a short list of configs and store the winner) or "full"
    (autotune every config, read no stored winner; the winners are stored)."""
    return os.environ.get("MVDB_AUTOTUNE", "1")


def tune_cache() -> Path | None:
    """MVDB_TUNE_CACHE: the folder where autotune winners persist between processes (default
    ~/.cache/mvdb/tune, under MVDB_CACHE where that is set); "0" keeps them in memory only."""
    v = os.environ.get("MVDB_TUNE_CACHE")
    if v is None:
        return cache_dir() / "tune"
    return None if v in ("", "0") else Path(v)


def fast_launch() -> bool:
    """MVDB_FAST_LAUNCH: "0" sends every kernel call through triton's own dispatch (default on)."""
    return os.environ.get("MVDB_FAST_LAUNCH", "1") != "0"


def direct_launch() -> bool:
    """MVDB_DIRECT_LAUNCH: "0" keeps relaunches on triton's CompiledKernel runner (default on)."""
    return os.environ.get("MVDB_DIRECT_LAUNCH", "1") != "0"


def pdl() -> bool:
    """MVDB_PDL: "1" launches the int8 MaxSim kernel as a programmatic dependent of its query
    quantization (sm_90 and later; default off)."""
    return os.environ.get("MVDB_PDL", "0") not in ("", "0")


def triton_interpret() -> bool:
    """TRITON_INTERPRET (triton's own): "1" runs the Triton kernels on the CPU, in the interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
