"""The engine behind :class:`mvdb.Database`, one module a job:

- ``resident``: the stored tokens where the exact rerank reads them, in pages that grow with adds;
- ``flat`` and ``ivf``: the token indexes (exact FAISS token search; centroid lists);
- ``state``: the immutable state a search reads, and how a writer moves it forward (appends,
  deletes, automatic retraining, rebuilds) and persists the IVF index;
- ``search``: the pipeline (candidates, exact rerank, top-k), ``filters`` and ``sparse`` beside it;
- ``rwlock`` and ``progress``: a readers-writer lock, progress lines for long steps.
"""

from mvdb.engine.ivf import gpu_available, index_backend

__all__ = ["gpu_available", "index_backend"]
