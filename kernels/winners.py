"""Autotune winners that outlive the process.

A winner is the launch config autotuning picked for one kernel and one key (the kernel's shape
bucket, dims and dtypes). It is looked up, in order: in this process's memory (the launcher's
own dict); in a file under ``MVDB_TUNE_CACHE`` (default ``~/.cache/mvdb/tune``) written by an
earlier process in the same environment (GPU model, driver, torch / triton / mvdb versions and
the kernel's source: one file per environment, so an upgrade never reads stale winners); in the
table shipped with mvdb (``winners.json`` beside this file: per GPU model, measured on the GPUs
the project is measured on). Only where none has it does the process autotune, and it writes
what it found to its file. ``MVDB_TUNE_CACHE=0`` keeps winners in memory only;
``MVDB_AUTOTUNE=full`` reads no stored winner (it tunes every config and stores the result).

Writes replace the file atomically (a temporary file renamed over it) after merging what is on
disk, so concurrent processes never leave a torn file; two that tune at the same moment may
each keep only its own entry, and the other's key is tuned again later.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import threading
from pathlib import Path

import torch

from mvdb.kernels import settings

SHIPPED = Path(__file__).with_name("winners.json")
_LOCK = threading.Lock()
_FILES: dict[tuple, dict] = {}  # (folder or "", file name or environment hash) -> {kernel: {key: config}}


def key_of(values: dict) -> str:
    """A winner's key as text: ``name=value`` pairs in the given order (dtypes by name)."""
    return ",".join(f"{k}={str(v).replace('torch.', '')}" for k, v in values.items())


@functools.lru_cache(maxsize=None)
def _driver() -> str:
    try:
        with open("/proc/driver/nvidia/version") as f:
            words = f.readline().split()
        return next((w for w in words if w[:1].isdigit() and "." in w), "unknown")
    except OSError:
        return "unknown"


@functools.lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def gpu_name(device: torch.device) -> str:
    """The device's model as the shipped table names it ("NVIDIA H200"), "cpu" off CUDA."""
    if device.type != "cuda":
        return device.type
    return _device_name(device.index if device.index is not None else torch.cuda.current_device())


def environment(device: torch.device, source: str = "") -> dict:
    """What a stored winner is valid for: the GPU model, its driver, the torch / triton / mvdb
    versions, and ``source`` (a hash of the kernel's code)."""
    import triton

    return {"gpu": gpu_name(device), "driver": _driver() if device.type == "cuda" else "", "torch": torch.__version__,
            "triton": triton.__version__, "mvdb": _mvdb_version(), "source": source}


@functools.lru_cache(maxsize=None)
def _mvdb_version() -> str:
    """The installed mvdb's version (the kernels import nothing above them: read from its metadata)."""
    from importlib import metadata

    try:
        return metadata.version("mvdb")
    except metadata.PackageNotFoundError:
        return "unknown"


def _env_hash(env: dict) -> str:
    return hashlib.sha256(json.dumps(env, sort_keys=True).encode()).hexdigest()[:20]


def _path(env: dict) -> Path | None:
    folder = settings.tune_cache()
    return None if folder is None else folder / f"winners-{_env_hash(env)}.json"


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
        return data["winners"] if isinstance(data, dict) and isinstance(data.get("winners"), dict) else {}
    except (OSError, ValueError):
        return {}  # none yet, unreadable or torn by hand: tuned again, then written whole


@functools.lru_cache(maxsize=None)
def _shipped() -> dict:
    try:
        return json.loads(SHIPPED.read_text())
    except (OSError, ValueError):
        return {}


def _stored(env: dict) -> tuple[Path | None, dict]:
    """This environment's file (None: memory only) and its winners as this process knows them."""
    path = _path(env)
    tag = ("", _env_hash(env)) if path is None else (str(path.parent), path.name)
    table = _FILES.get(tag)
    if table is None:
        table = _FILES[tag] = {} if path is None else _read(path)
    return path, table


def get(kernel: str, key: str, env: dict) -> dict | None:
    """The stored winner of ``kernel`` for ``key`` in environment ``env``: this environment's
    file, else the shipped table's entry for its GPU model, else None (also under
    MVDB_AUTOTUNE=full)."""
    if settings.autotune() == "full":
        return None
    with _LOCK:
        _, table = _stored(env)
        hit = table.get(kernel, {}).get(key)
    if hit is None:
        hit = _shipped().get(env["gpu"], {}).get(kernel, {}).get(key)
    return dict(hit) if isinstance(hit, dict) else None


def put(kernel: str, key: str, env: dict, config: dict) -> None:
    """Store a winner: in memory, and in this environment's file (merged with what another
    process wrote meanwhile) unless MVDB_TUNE_CACHE is 0. A folder that cannot be written keeps
    the winner in memory only."""
    config = {k: v for k, v in config.items() if v is None or isinstance(v, (bool, int, float, str))}
    with _LOCK:
        path, table = _stored(env)
        table.setdefault(kernel, {})[key] = config
        if path is None:
            return
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            merged = _read(path)
            for k, entries in table.items():
                merged.setdefault(k, {}).update(entries)
            table.update(merged)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".winners-", suffix=".tmp")
        except OSError:
            return
        try:
            with os.fdopen(fd, "w") as f:
                json.dump({"environment": env, "winners": merged}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except OSError:
            Path(tmp).unlink(missing_ok=True)


def forget() -> None:
    """Drop what this process read from disk (tests; the next lookup reads the files again)."""
    with _LOCK:
        _FILES.clear()
    _shipped.cache_clear()
