"""Reversible monkey-patching shared by the PyLate and colpali-engine integrations."""

from __future__ import annotations

import sys


class Patches:
    """Attribute replacements that remember what they replaced, undone in reverse order."""

    def __init__(self) -> None:
        self._undo: list[tuple[object, str, object]] = []

    def __bool__(self) -> bool:
        return bool(self._undo)

    def set(self, owner, attr: str, value) -> None:
        self._undo.append((owner, attr, getattr(owner, attr)))
        setattr(owner, attr, value)

    def rebind(self, prefix: str, replacements: dict[str, tuple[object, object]], defaults: bool = False) -> None:
        """In every loaded module under ``prefix``, rebind names that hold an original function
        (``replacements[name] = (original, replacement)``: modules that imported it by name).
        ``defaults``: also swap originals bound as ``__init__`` default arguments of its classes."""
        by_id = {id(orig): new for orig, new in replacements.values()}
        for name, module in list(sys.modules.items()):
            if module is None or not (name == prefix or name.startswith(prefix + ".")):
                continue
            for attr, (orig, new) in replacements.items():
                if getattr(module, attr, None) is orig:
                    self.set(module, attr, new)
            if not defaults:
                continue
            for cls in [v for v in vars(module).values() if isinstance(v, type)]:
                init = vars(cls).get("__init__")
                old = getattr(init, "__defaults__", None)
                if old and any(id(d) in by_id for d in old):
                    self.set(init, "__defaults__", tuple(by_id.get(id(d), d) for d in old))

    def undo(self) -> None:
        while self._undo:
            owner, attr, old = self._undo.pop()
            setattr(owner, attr, old)
