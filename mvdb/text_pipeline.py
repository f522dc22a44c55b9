"""The batched text-encoding pipeline of :class:`mvdb.Encoder` over a Sentence Transformers or
PyLate model: what ``add_texts`` and ``search_text`` run through.

The model's generic encode loop spends its time outside the model: it synchronises with the
device for every padding position of every text and copies every text's output to the host on
its own. Here the texts go in chunks (``CHUNK_BATCHES`` batches); a chunk is sorted by length (as
the model's own ``encode`` sorts a call's texts, so batches pad little) and, for a Sentence
Transformers model, tokenized in one go by copies of its Rust tokenizer in ``TOKENIZE_THREADS``
threads (:class:`FastTokens`); each batch's kept positions are known on the host before the
forward, so the device is never waited for inside a chunk: the valid tokens are selected,
normalised and packed there, the chunk put back in text order, and the chunks copied to the
host in few transfers, each straight into its place. (Tokenizing the next chunk in a thread
while the device runs was slower: the tokenizer's Python side and the forward's launches
contend for the interpreter.)

The vectors are the model's own: the same tokenizer, prompts, truncation, forward, masks (for
PyLate its skiplist and query expansion) and normalisation as its ``encode`` with
``output_value="token_embeddings"``. A call of at most one chunk of texts makes the same batches
as that ``encode``; larger calls are sorted a chunk at a time, which changes only the padding of
the batches (differences of the order of the model dtype's rounding).
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

CHUNK_BATCHES = 64  # batches sorted by length together and copied to the host in one transfer
# batches padded to a multiple of this many positions: fewer distinct shapes for the device's
# kernels to meet for the first time (the padding is masked: the vectors do not change)
PAD_MULTIPLE = 8
# chunks of vectors kept on the device until they hold this many bytes, then copied to the host
# in one transfer into their place (no concatenation on the host)
DEVICE_BYTES = 4 << 30
TOKENIZE_THREADS = max(1, min(8, (os.cpu_count() or 1) // 2))  # threads of a chunk's tokenization
TEXTS_PER_THREAD = 256  # a call's tokenization takes another thread per this many texts (up to the above)


def supported(model, kind: str) -> bool:
    """Whether the pipeline can stand in for ``model``'s own encode (else the adapter calls it)."""
    if not all(hasattr(model, a) for a in ("tokenize", "forward", "device")):
        return False
    if kind == "pylate":
        return hasattr(model, "skiplist_mask")
    if kind == "sentence-transformers":  # a Router (per-task modules) routes inside the model's encode
        return not any(type(m).__name__ == "Router" for m in model.children())
    return False


def prompt(model, kind: str, is_query: bool) -> str | None:
    """The prompt the model's encode (``encode_query`` / ``encode_document`` where the model has
    them) puts before each text."""
    prompts = getattr(model, "prompts", None) or {}
    name = "query" if is_query else "document"
    if kind == "sentence-transformers" and hasattr(model, "encode_query") and name in prompts:
        return prompts[name] or None
    default = getattr(model, "default_prompt_name", None)
    return (prompts.get(default) or None) if default else None


def _to_device(features: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in features.items()}


class FastTokens:
    """A Sentence Transformers model's tokenization straight from its Rust tokenizer: a whole
    chunk of texts at once, split over up to ``TOKENIZE_THREADS`` copies of the tokenizer in
    threads, each batch then padded here. What the model's ``tokenize`` does for single texts
    (strip, lowercase where the module does, truncate to ``max_seq_length``, pad to the longest of
    the batch, here rounded up to ``PAD_MULTIPLE``); checked against it on a call's first batch,
    and not used where they differ. :meth:`make` gives None for a model it does not know, and the
    same object for the same model (the copies are made once, as they are first needed)."""

    _made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, module, tokenizer, backend):
        self.module, self.tokenizer, self.source = module, tokenizer, backend
        self.backends = []  # copies with their own truncation settings (a Rust tokenizer is not reentrant)
        self.lock = threading.Lock()  # one call at a time uses the copies
        self.names = [n for n in tokenizer.model_input_names if n in ("input_ids", "token_type_ids", "attention_mask")]
        self.pad = (tokenizer.pad_token_id or 0, tokenizer.pad_token_type_id or 0)
        self.left = tokenizer.padding_side == "left"

    @classmethod
    def make(cls, model, kind: str):
        if kind != "sentence-transformers":
            return None
        try:
            module = model[0]
            tokenizer = module.tokenizer
            backend = tokenizer.backend_tokenizer  # a fast (Rust) tokenizer
            if not hasattr(backend, "encode_batch") or not isinstance(module.max_seq_length, int):
                return None
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return None
        made = cls._made.get(model)
        if made is None or made.tokenizer is not tokenizer or made.source is not backend:
            made = cls._made[model] = cls(module, tokenizer, backend)
        return made

    def copies(self, n: int) -> list:
        """``n`` tokenizer copies, truncating at the module's ``max_seq_length`` as it is now."""
        while len(self.backends) < n:
            b = type(self.source).from_str(self.source.to_str())
            b.no_padding()
            self.backends.append(b)
        for b in self.backends[:n]:
            b.enable_truncation(self.module.max_seq_length, strategy="longest_first",
                                direction=getattr(self.tokenizer, "truncation_side", "right"))
        return self.backends[:n]

    def encode(self, texts: list[str]) -> list:
        texts = [t.strip() for t in texts]
        if getattr(self.module, "do_lower_case", False):
            texts = [t.lower() for t in texts]
        with self.lock:
            backends = self.copies(max(1, min(TOKENIZE_THREADS, len(texts) // TEXTS_PER_THREAD)))
            step = -(-len(texts) // len(backends))
            parts = [texts[i : i + step] for i in range(0, len(texts), step)]

            def run(i):
                b = backends[i]
                encode = getattr(b, "encode_batch_fast", b.encode_batch)  # fast: no character offsets
                return [e.ids for e in encode(parts[i], add_special_tokens=True)]

            if len(parts) <= 1:
                return run(0) if parts else []
            with ThreadPoolExecutor(len(parts)) as pool:
                return [x for part in pool.map(run, range(len(parts))) for x in part]

    def batch(self, encoded: list, rows) -> dict:
        width = -(-max(len(encoded[r]) for r in rows) // PAD_MULTIPLE) * PAD_MULTIPLE
        ids = np.full((len(rows), width), self.pad[0], dtype=np.int64)
        types = np.full((len(rows), width), self.pad[1], dtype=np.int64)  # one text, one segment: all 0
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, r in enumerate(rows):
            a = encoded[r]
            sl = slice(width - len(a), width) if self.left else slice(0, len(a))
            ids[i, sl], types[i, sl], mask[i, sl] = a, 0, 1
        got = {"input_ids": ids, "token_type_ids": types, "attention_mask": mask}
        return {n: torch.from_numpy(got[n]) for n in self.names}

    def same_as_model(self, model, texts: list[str], encoded: list, rows) -> bool:
        want = model.tokenize([texts[r] for r in rows])
        mine = self.batch(encoded, rows)
        width = want["input_ids"].shape[1] if isinstance(want.get("input_ids"), torch.Tensor) else -1
        if set(mine) - set(want) or any(k not in mine for k in ("input_ids", "token_type_ids", "attention_mask")
                                        if k in want):
            return False
        for k in mine:  # equal up to the model's width; past it only padding
            w, m = want[k], mine[k]
            if not isinstance(w, torch.Tensor) or m.shape[1] < width or not torch.equal(w.long(), m[:, :width]):
                return False
            if m.shape[1] > width and bool((m[:, width:] != (self.pad[0] if k == "input_ids" else 0)).any()):
                return False
        return not self.left or mine["input_ids"].shape[1] == width


def _tokenize(model, kind: str, batch: list[str], is_query: bool) -> dict:
    return model.tokenize(texts=batch, is_query=is_query) if kind == "pylate" else model.tokenize(batch)


def batches(model, kind: str, texts: list[str], is_query: bool, batch_size: int, pin: bool):
    """(chunk start, chunk end, the batch's positions in the chunk, features) for every batch, in
    the order they run: each chunk sorted by length (longest first)."""
    fast = FastTokens.make(model, kind)
    checked = False
    for c0 in range(0, len(texts), batch_size * CHUNK_BATCHES):
        c1 = min(len(texts), c0 + batch_size * CHUNK_BATCHES)
        chunk = texts[c0:c1]
        order = np.argsort([-len(t) for t in chunk])  # as the model's encode sorts
        encoded = fast.encode(chunk) if fast is not None else None
        for b0 in range(0, c1 - c0, batch_size):
            rows = order[b0 : b0 + batch_size]
            if fast is not None and not checked:
                checked = True
                if not fast.same_as_model(model, chunk, encoded, rows):
                    fast = encoded = None
            feats = fast.batch(encoded, rows) if fast is not None else _tokenize(model, kind, [chunk[r] for r in rows],
                                                                                  is_query)
            if pin:
                feats = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in feats.items()}
            yield c0, c1, rows, feats


def _keep(model, kind: str, feats: dict, is_query: bool) -> torch.Tensor:
    """[B, L] bool on the host, from the batch's features before they go to the device: the
    positions whose vectors the model's encode returns."""
    mask = feats["attention_mask"]
    if kind == "pylate":
        if not is_query:
            return torch.logical_and(model.skiplist_mask(input_ids=feats["input_ids"], skiplist=model.skiplist), mask)
        if getattr(model, "do_query_expansion", False):
            return torch.ones_like(feats["input_ids"], dtype=torch.bool)
        return mask.bool()
    # Sentence Transformers: every position up to the last attended one (at least the first)
    pos = torch.arange(1, mask.shape[1] + 1)
    last = (mask.to(torch.int64) * pos).amax(dim=1).clamp_min(1)
    return pos[None, :] <= last[:, None]


def _normalised(x: torch.Tensor, normalize: str) -> torch.Tensor:
    if normalize == "model":  # PyLate normalises in the model's dtype
        return torch.nn.functional.normalize(x, p=2, dim=1)
    if normalize == "l2":  # the adapter's own: float32, as on the host
        x = x.float()
        return x / x.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return x


def encode(model, kind: str, texts: list[str], *, is_query: bool, batch_size: int, normalize: str,
           out_dtype=np.float32, progress=None) -> tuple[np.ndarray, np.ndarray]:
    """``texts`` through ``model`` -> (tokens [T, dim] numpy of ``out_dtype`` (float32 or
    float16), lengths [n] int64), documents in the order of ``texts``. ``progress``: a step with
    ``update(n_texts)``."""
    out_dtype = torch.float16 if np.dtype(out_dtype) == np.float16 else torch.float32
    p = prompt(model, kind, is_query)
    if p:
        texts = [p + t for t in texts]
    device = torch.device(model.device)
    return _run(model, kind, texts, is_query, batch_size, normalize, out_dtype, progress, device)


def _run(model, kind, texts, is_query, batch_size, normalize, out_dtype, progress, device):
    host = []  # finished vectors on the host: numpy arrays in text order
    held, lengths_out = [], []  # chunks in text order still on the device, and every chunk's lengths
    parts, got = [], []  # the current chunk's packed batches and their positions
    with torch.inference_mode():
        for c0, c1, rows, feats in batches(model, kind, texts, is_query, batch_size, device.type == "cuda"):
            keep = _keep(model, kind, feats, is_query)  # on the host: no wait for the device
            flat = keep.flatten().nonzero().flatten()
            feats = _to_device(feats, device)
            out = model(feats) if kind == "sentence-transformers" else model.forward(input=feats)
            emb = out["token_embeddings"]
            emb = emb.reshape(-1, emb.shape[-1]).index_select(0, flat.to(device, non_blocking=True))
            parts.append((_normalised(emb, normalize).to(out_dtype), keep.sum(dim=1)))
            got.append(rows)
            if progress is not None:
                progress.update(len(rows))
            if sum(len(g) for g in got) == c1 - c0:  # the chunk is done
                tok, lens = _in_text_order(parts, got, c1 - c0)
                held.append(tok)
                lengths_out.append(lens)
                parts, got = [], []
                if sum(t.nbytes for t in held) >= DEVICE_BYTES:
                    host.append(_to_host(held))
                    held = []
    if held or not host:
        host.append(_to_host(held))
    tokens = host[0] if len(host) == 1 else np.concatenate(host)
    lengths = np.concatenate(lengths_out).astype(np.int64) if lengths_out else np.zeros(0, np.int64)
    return tokens, lengths


def _to_host(chunks: list) -> np.ndarray:
    """Device chunks [T_i, dim] -> one numpy array, each chunk copied straight into its place."""
    if not chunks:
        return np.zeros((0, 0), np.float32)
    total = sum(t.shape[0] for t in chunks)
    out = torch.empty((total, chunks[0].shape[1]), dtype=chunks[0].dtype)
    at = 0
    for t in chunks:
        out[at : at + t.shape[0]].copy_(t)
        at += t.shape[0]
    return out.numpy()


def _in_text_order(parts: list, got: list, n: int) -> tuple[torch.Tensor, np.ndarray]:
    """One chunk's batches (packed tokens on the device and lengths on the host, in batch order;
    ``got``: each batch's positions in the chunk) -> the chunk's tokens in text order (on the
    device) and lengths (numpy)."""
    tok = torch.cat([t for t, _ in parts])
    lens_sorted = torch.cat([ln for _, ln in parts]).numpy().astype(np.int64)
    where = np.concatenate(got)  # sorted position -> text position
    src = np.zeros(n + 1, dtype=np.int64)
    src[1:] = np.cumsum(lens_sorted)
    start = np.empty(n, dtype=np.int64)
    start[where] = src[:-1]
    lens = np.empty(n, dtype=np.int64)
    lens[where] = lens_sorted
    dst = np.zeros(n + 1, dtype=np.int64)
    dst[1:] = np.cumsum(lens)
    idx = np.repeat(start - dst[:-1], lens) + np.arange(int(dst[-1]), dtype=np.int64)
    return tok[torch.from_numpy(idx).to(tok.device, non_blocking=True)], lens


def spans(model, kind: str, texts: list[str], is_query: bool) -> list | None:
    """Per text, the character span ``(start, end)`` in the text of each vector the pipeline
    makes for it (None for a special token, or one the prompt holds); None where the model's
    tokenizer does not say (PyLate, whose query and document markers shift the positions, or a
    tokenizer without offsets)."""
    fast = FastTokens.make(model, kind)
    if fast is None:
        return None
    with fast.lock:
        return _spans(fast, prompt(model, kind, is_query) or "", texts)


def _spans(fast: FastTokens, p: str, texts: list[str]) -> list:
    (b,) = fast.copies(1)
    lower = getattr(fast.module, "do_lower_case", False)
    out = []
    for text in texts:
        fed = (p + text).strip()
        # offsets count from the first character the strip kept; the text starts len(p) further
        shift = len(p + text) - len((p + text).lstrip()) - len(p)
        if lower:
            if len(fed.lower()) != len(fed):  # lowercasing moved characters: no spans for this text
                out.append(None)
                continue
            fed = fed.lower()
        e = b.encode(fed, add_special_tokens=True)
        row = []
        for (s, t), special in zip(e.offsets, e.special_tokens_mask):
            s, t = s + shift, t + shift
            row.append(None if special or t <= 0 or s < 0 else (s, t))
        out.append(row)
    return out
