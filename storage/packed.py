"""Documents in CSR form, the unit every read and load of the store returns."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


def torch_ready(a) -> np.ndarray:
    """``a`` as a C-contiguous array torch may wrap: a read-only one (what Ray's object store hands
    out) is copied, since torch takes no read-only memory."""
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


@dataclass
class Packed:
    """Documents in CSR form: tokens [T, dim], offsets [n+1] int64, scales [T] (int8 only), ids [n]."""

    tokens: object
    offsets: object
    scales: object = None
    ids: list = field(default_factory=list)

    def to_torch(self, device=None, pin: bool = False) -> "Packed":
        """The arrays as torch tensors on ``device`` (pinned host memory when ``pin`` and no device)."""
        import torch

        def conv(a):
            if a is None:
                return None
            t = torch.from_numpy(torch_ready(a))
            if pin and torch.cuda.is_available() and (device is None or torch.device(device).type == "cpu"):
                return t.pin_memory()
            return t.to(device) if device is not None else t

        return Packed(conv(self.tokens), conv(self.offsets), conv(self.scales), self.ids)

    @classmethod
    def of(cls, tokens, lengths) -> "Packed":
        """Packed documents from tokens [T, dim] and lengths [n]."""
        return cls(tokens, np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))))

    def split(self) -> list:
        """Each document's tokens (views of ``tokens``)."""
        return [self.tokens[a:b] for a, b in zip(self.offsets[:-1].tolist(), self.offsets[1:].tolist())]
