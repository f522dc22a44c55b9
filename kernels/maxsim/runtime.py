"""Host-side launch machinery shared by every kernel family: whether Triton interprets, the
launchers' integer helpers, the current device and stream without torch's wrappers, the guard
that serialises interpreted launches, and :func:`launch_kernel`, which relaunches a compiled
specialization without Triton's per-call dispatch."""

from __future__ import annotations

import contextlib
import inspect
import threading

import torch
from mvdb.kernels import settings

try:
    from triton import knobs
except ImportError:  # older triton: launch hooks live elsewhere; relaunches go through the runner
    knobs = None


# Read once, at import: triton.jit decides at decoration (this package's import) whether a kernel
# is interpreted, so a later change of the variable could not switch the kernels anyway, and a
# read per call would cost an os.environ lookup on every launch.
_INTERPRET = getattr(getattr(knobs, "runtime", None), "interpret", None)  # triton's own reading of the variable
if _INTERPRET is None:
    _INTERPRET = settings.triton_interpret()
_INTERPRET = bool(_INTERPRET)


def interpreting() -> bool:
    return _INTERPRET


# Host-side integer helpers for the launchers: triton.cdiv / next_power_of_2 are constexpr
# functions in triton 3.x, about 2-3 us per host call; these are plain int arithmetic.
def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int) -> int:
    """The smallest power of two >= n (0 for 0, as triton.next_power_of_2)."""
    return 1 << (n - 1).bit_length() if n > 0 else 0


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # the current stream's handle, no Stream object


_GET_DEVICE = getattr(torch._C, "_cuda_getDevice", None)  # the current device's index, without torch.cuda's wrapper


def _current_device() -> int:
    """torch.cuda.current_device() for launches (CUDA is initialised: their tensors live there)."""
    return _GET_DEVICE() if _GET_DEVICE is not None else torch.cuda.current_device()


def _stream_handle(dev: int) -> int:
    return _RAW_STREAM(dev) if _RAW_STREAM is not None else torch.cuda.current_stream(dev).cuda_stream


def _keep_plan(cache: dict, key, cap: int, consts: dict) -> tuple[dict, tuple]:
    """A launch's plan, ``(consts, tuple(consts.items()))``, stored in ``cache`` under ``key`` (the
    cache emptied first when it holds ``cap`` plans): merged and listed once, not per call (host time)."""
    if len(cache) >= cap:
        cache.clear()
    plan = cache[key] = (consts, tuple(consts.items()))
    return plan


# Relaunching a compiled kernel. triton's JITFunction.run re-derives the specialization of every
# argument, builds its cache key (a string of the compile options) and looks the binary up on every
# call: tens of microseconds of host time, which is what a small call (1 query x 10k documents,
# about 0.1 ms of device time) waits on. The first launch of a specialization goes through
# triton; later ones with the same specialization (what triton keys on: each tensor's dtype and
# 16-byte alignment, each integer's 32/64-bit type and whether it is 1 or divisible by 16, None-ness,
# the constexprs and launch options, the device) call that binary's launcher directly.
# MVDB_FAST_LAUNCH=0 turns it off.
FAST_LAUNCH = settings.fast_launch()
# Relaunches straight through the launcher (below, launch_kernel); MVDB_DIRECT_LAUNCH=0 keeps them on
# CompiledKernel's runner. Calling the launcher directly skips the runner's re-reading of the
# device and stream and its launch metadata: a few microseconds of host time per launch.
DIRECT_LAUNCH = settings.direct_launch()
_REPLAY: dict[tuple, list] = {}  # key -> [compiled kernel, constexpr tail, (launcher, function, metadata) or None, fn]
_REPLAY_MAX = 256  # specializations kept (a launch beyond them is a cache miss, never a wrong kernel)
_INT32 = (-(2**31), 2**31)


def _arg_sig(a):
    if isinstance(a, torch.Tensor):
        return a.dtype, a.data_ptr() % 16 == 0
    if a is None:
        return None
    if isinstance(a, int) and not isinstance(a, bool):
        return _INT32[0] <= a < _INT32[1], a == 1, a % 16 == 0
    return type(a), a


_TENSOR = torch.Tensor


def _arg_sigs(args: tuple) -> tuple:
    """``tuple(map(_arg_sig, args))``, with plain tensors, None and plain ints inline (host time:
    about half of the map's)."""
    return tuple([None if a is None else (a.dtype, not a.data_ptr() & 15) if type(a) is _TENSOR else
                  (-2147483648 <= a < 2147483648, a == 1, not a & 15) if type(a) is int else _arg_sig(a)
                  for a in args])


def _const_tail(fn, n_args: int, consts: dict) -> tuple:
    """The values of ``fn``'s parameters after its first ``n_args``: from ``consts``, else the
    parameter's default (KeyError where it has none)."""
    defaults = {p.name: p.default for p in getattr(fn, "params", ()) if p.default is not inspect.Parameter.empty}
    return tuple(consts[name] if name in consts else defaults[name] for name in fn.arg_names[n_args:])


def launch_kernel(fn, grid: tuple, args: tuple, consts: dict, consts_key: tuple | None = None) -> None:
    """``fn[grid](*args, **consts)`` (``args``: the kernel's leading non-constexpr parameters in order;
    ``consts``: its constexprs and launch options by name; ``consts_key``: ``tuple(consts.items())``
    where the caller keeps it). An already seen specialization is
    relaunched without JITFunction's per-call dispatch: straight through its compiled binary's
    launcher on the current stream while no launch hook is installed (the call CompiledKernel's
    runner makes, without re-reading the device and stream through triton's driver or building
    launch metadata nobody reads), else through that runner (see FAST_LAUNCH)."""
    if not FAST_LAUNCH or interpreting():
        fn[grid](*args, **consts)
        return
    dev = _current_device()
    # id(fn): a JITFunction hashes by its cache_key, a property that takes a lock (host time); the
    # entry holds fn, so the id is not reused while the entry lives
    key = (id(fn), dev, _arg_sigs(args), tuple(consts.items()) if consts_key is None else consts_key)
    hit = _REPLAY.get(key)
    if hit is None:
        kernel = fn[grid](*args, **consts)
        try:  # a triton whose compiled kernels launch otherwise keeps launching through JITFunction
            tail = _const_tail(fn, len(args), consts)
            kernel[(1, 1, 1)]  # noqa: B018 - the launcher exists (loads the binary's handles)
        except (AttributeError, KeyError, TypeError):
            return
        direct = tuple(getattr(kernel, name, None) for name in ("run", "function", "packed_metadata"))
        if len(_REPLAY) >= _REPLAY_MAX:
            _REPLAY.clear()
        _REPLAY[key] = [kernel, tail, direct if None not in direct and _known_launcher(type(kernel)) else None, fn]
        return
    kernel, tail, direct, _ = hit
    grid3 = (*grid, 1, 1)[:3]
    if direct is not None and DIRECT_LAUNCH and _hooks_idle():
        run, function, packed = direct
        try:
            run(*grid3, _stream_handle(dev), function, packed, None, None, None, *args, *tail)
            return
        except TypeError:  # a launcher of another signature: argument parsing fails before any launch
            hit[2] = None
    kernel[grid3](*args, *tail)


# The call CompiledKernel's runner makes (triton 3.4-3.9), read from its source once: grid x, y,
# z, the stream, the function handle, the packed metadata, the launch metadata, the enter / exit
# hooks (from triton.knobs), the arguments. Another layout keeps relaunches on the runner.
_RUNNER_CALL = "self.run(grid[0],grid[1],grid[2],stream,self.function,self.packed_metadata,launch_metadata,"
_KNOWN_RUNNERS: dict[type, bool] = {}


def _known_launcher(cls: type) -> bool:
    """Whether the runner of compiled kernels of class ``cls`` (CompiledKernel.__getitem__) calls
    their launcher as above."""
    known = _KNOWN_RUNNERS.get(cls)
    if known is None:
        try:
            src = "".join(inspect.getsource(cls.__getitem__).split())
        except (OSError, TypeError, AttributeError):
            src = ""
        known = _KNOWN_RUNNERS[cls] = _RUNNER_CALL in src and "knobs.runtime.launch_enter_hook" in src
    return known


def _hook_set(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))  # triton 3.9 keeps an empty HookChain


def _hooks_idle() -> bool:
    """No launch hook is installed (a profiler such as proton installs them; then every launch goes
    through CompiledKernel's runner, which builds the launch metadata the hooks read)."""
    runtime = getattr(knobs, "runtime", None)
    return runtime is not None and not (_hook_set(getattr(runtime, "launch_enter_hook", None))
                                        or _hook_set(getattr(runtime, "launch_exit_hook", None)))


_INTERPRETER_LOCK = threading.Lock()  # Triton's CPU interpreter patches module globals per launch


_NO_GUARD = contextlib.nullcontext()  # stateless: one instance serves every with-statement (host time)


def launch_guard():
    """Held around a kernel launch: serialises launches under TRITON_INTERPRET=1, which is not
    thread-safe; compiled launches run concurrently."""
    return _INTERPRETER_LOCK if interpreting() else _NO_GUARD
