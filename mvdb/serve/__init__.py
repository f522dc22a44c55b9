"""``mvdb serve``: the database behind HTTP for many clients, and ``mvdb.connect``, a client with
the same API. Needs ``pip install 'mvdb[serve]'`` (FastAPI, uvicorn, msgpack, urllib3).

    mvdb serve my.mvdb --port 8000            # or: mvdb.serve.serve("my.mvdb", port=8000)
    db = mvdb.connect("http://127.0.0.1:8000")
    hits = db.search(q, k=10)

Layout: codec.py (the wire format), batcher.py (concurrent searches as one batch), app.py (the
FastAPI routes), server.py (running it: foreground or a background thread), client.py.
"""

from __future__ import annotations

import importlib

_LAZY = {"Client": "mvdb.serve.client", "connect": "mvdb.serve.client", "Server": "mvdb.serve.server",
         "serve": "mvdb.serve.server", "create_app": "mvdb.serve.app"}


def __getattr__(name: str):
    """The client needs urllib3 and msgpack only; the server FastAPI and uvicorn too."""
    if name not in _LAZY:
        raise AttributeError(f"module 'mvdb.serve' has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(_LAZY[name]), name)
    except ImportError as e:
        raise ImportError(f"mvdb.serve.{name} needs: pip install 'mvdb[serve]' ({e})") from None
    globals()[name] = value
    return value


__all__ = ["Client", "Server", "connect", "create_app", "serve"]
