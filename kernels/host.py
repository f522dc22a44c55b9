"""Host-to-device copies that do not wait for the device.

``tensor.to("cuda")`` from ordinary (pageable) host memory waits until the stream has finished
everything queued before it; in a search that is a stall in the middle of the pipeline, with the
host idle instead of queueing the next kernels. From pinned memory, with ``non_blocking=True``,
the copy is queued like a kernel instead. A search's small host inputs (queries, offsets, token
numbering) go in one copy through a pinned staging buffer kept per thread (a pinned allocation
per call would cost tens of microseconds).
"""

from __future__ import annotations

import threading

import torch

_ALIGN = 16
_local = threading.local()


def upload(t: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``t`` on ``device``: queued without waiting where it goes from the host to a GPU (the
    caller must not write to ``t`` afterwards); else ``t.to(device)``."""
    device = torch.device(device)
    if device.type == "cuda" and t.device.type == "cpu":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def upload_all(tensors: list[torch.Tensor], device: torch.device | str) -> list[torch.Tensor]:
    """Host tensors on ``device`` in one copy queued without waiting (a GPU): packed into this
    thread's pinned staging buffer, copied as one block, returned as views of it. The buffer is
    reused only once the device has read it (an event per copy). Elsewhere: ``t.to(device)``."""
    device = torch.device(device)
    if device.type != "cuda" or not all(t.device.type == "cpu" for t in tensors):
        return [t.to(device) for t in tensors]
    sizes = [t.numel() * t.element_size() for t in tensors]
    starts, total = [], 0
    for n in sizes:
        starts.append(total)
        total += -(-n // _ALIGN) * _ALIGN
    buf, done = getattr(_local, "buf", None), getattr(_local, "done", None)
    if done is not None:
        done.synchronize()  # the last copy out of the buffer has run (it has, where the search waited for its answer)
    if buf is None or buf.numel() < total:
        buf = _local.buf = torch.empty(max(total, 1 << 16) * 2, dtype=torch.uint8, pin_memory=True)
    for t, a, n in zip(tensors, starts, sizes):
        if n:
            buf[a : a + n].view(t.dtype).view(t.shape).copy_(t)
    dev = buf[:total].to(device, non_blocking=True)
    with torch.cuda.device(device):  # the event on the stream of the device the copy went to
        _local.done = torch.cuda.Event()
        _local.done.record(torch.cuda.current_stream(device))
    return [dev[a : a + n].view(t.dtype).view(t.shape) for t, a, n in zip(tensors, starts, sizes)]
