"""A deterministic sequence of store operations, shared by the crash-test writer and its checker."""

from __future__ import annotations

import numpy as np

DIM = 16


def docs_for(seed: int, lengths: list[int]) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((n, DIM)).astype(np.float32) for n in lengths]


def plan(seed: int, live: list[int], next_id: int, n_ops: int = 400) -> list[tuple]:
    """Operations from a starting state (live ids, next auto id): adds, deletes, compactions."""
    rng = np.random.default_rng(seed)
    live = sorted(live)
    ops = []
    for i in range(n_ops):
        r = rng.random()
        if r < 0.6 or not live:
            n = int(rng.integers(1, 9))
            lengths = [int(x) for x in rng.integers(1, 31, n)]
            if rng.random() < 0.3:
                ids = sorted(set(int(x) for x in rng.integers(10**9, 2 * 10**9, n)) - set(live))[:n]
                lengths = lengths[: len(ids)]
            else:
                ids = list(range(next_id, next_id + n))
            next_id = max([next_id] + [x + 1 for x in ids])
            meta = [{"op": i, "k": k} for k in range(len(ids))] if rng.random() < 0.5 else None
            ops.append(("add", seed * 100_000 + i, lengths, ids, meta))
            live = sorted(set(live) | set(ids))
        elif r < 0.9:
            k = int(rng.integers(1, min(4, len(live)) + 1))
            gone = sorted(int(x) for x in rng.choice(live, size=k, replace=False))
            ops.append(("delete", gone))
            live = sorted(set(live) - set(gone))
        else:
            ops.append(("compact",))
    return ops


def run(store, op) -> None:
    """Apply one operation to a Store (the writer's side)."""
    if op[0] == "add":
        _, doc_seed, lengths, ids, meta = op
        manifest = store.store.manifest if hasattr(store, "store") else store.manifest  # Database or Store
        auto = ids == list(range(manifest["next_id"], manifest["next_id"] + len(ids)))
        got = store.add(docs_for(doc_seed, lengths), ids=None if auto else ids, metadata=meta)
        assert got == ids, (got, ids)
    elif op[0] == "delete":
        store.delete(op[1])
    elif hasattr(store, "store"):
        store.compact()
    else:
        store.compact(min_segment_tokens=200)


def apply(model: dict, op) -> None:
    """Apply one operation to the model {id: (float16 bytes, metadata)} (the checker's side)."""
    if op[0] == "add":
        _, doc_seed, lengths, ids, meta = op
        for k, (i, d) in enumerate(zip(ids, docs_for(doc_seed, lengths))):
            model[i] = (d.astype(np.float16).tobytes(), meta[k] if meta else None)
    elif op[0] == "delete":
        for i in op[1]:
            del model[i]
