"""The batched text-encoding pipeline of :class:`mvdb.Encoder` over a Sentence Transformers
(``SentenceTransformer`` or 6's ``MultiVectorEncoder``) or PyLate model: what ``add_texts`` and
``search_text`` run through.

The model's generic encode loop spends its time outside the model: it synchronises with the
device for every padding position of every text and copies every text's output to the host on
its own. Here the texts go in chunks (``CHUNK_BATCHES`` batches); a chunk is sorted by length (as
the model's own ``encode`` sorts a call's texts, so batches pad little) and, for a Sentence
Transformers model, tokenized in one call of its Rust tokenizer (:class:`FastTokens`, which
spreads the texts over the cores itself), the next chunk in a thread while the device runs this
one. Each batch's kept positions are known on the host before the forward, and everything the
host sends is pinned, so the host does not wait for the device inside a chunk: the valid tokens
are selected, normalised and packed there, the chunk put back in text order, and the chunks
copied to the host in few transfers, each straight into its place.

The vectors are the model's own: the same tokenizer, prompts, truncation, forward, masks (for
PyLate its skiplist and query expansion) and normalisation as its ``encode`` with
``output_value="token_embeddings"``. A ``MultiVectorEncoder``'s documents are tokenized like a
Sentence Transformers model's (its document prompt and length), its queries by its own
``preprocess`` (query expansion), each run through its forward by task; its scoring mask, known
only after the forward, picks the vectors once the chunk is done (one wait for the device a
chunk). A model without fast tokens (PyLate) is tokenized by its own call, ``AHEAD`` batches in
advance in a thread. A call of at most one chunk of texts makes the same batches
as that ``encode``; larger calls are sorted a chunk at a time, which changes only the padding of
the batches (differences of the order of the model dtype's rounding).
"""

from __future__ import annotations

import contextlib
import mmap
import sys
import threading
import weakref
from collections import deque
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

CHUNK_BATCHES = 64  # batches sorted by length together and copied to the host in one transfer
# batches padded to a multiple of this many positions: fewer distinct shapes for the device's
# kernels to meet for the first time (the padding is masked: the vectors do not change)
PAD_MULTIPLE = 8
# finished chunks of vectors waiting on the device for their copy to the host: at most this many bytes
DEVICE_BYTES = 4 << 30
STAGING_BYTES = 256 << 20  # the pinned buffer vectors go through from the device to the host
_MAP_NORESERVE = 0x4000  # Linux mmap flag: do not reserve swap for the mapping (pages committed as written)


def supported(model, kind: str) -> bool:
    """Whether the pipeline can stand in for ``model``'s own encode (else the adapter calls it)."""
    if kind == "multi-vector":  # Sentence Transformers 6: its own preprocess and forward, by task
        return all(hasattr(model, a) for a in ("preprocess", "forward", "device", "prompts"))
    if not all(hasattr(model, a) for a in ("forward", "device")) or not (
            hasattr(model, "tokenize") or hasattr(model, "preprocess")):
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
    if kind == "multi-vector":  # encode_query's "query"; encode_document's first of document / passage / corpus
        names = ("query",) if is_query else ("document", "passage", "corpus")
        found = next((n for n in names if n in prompts), None) or getattr(model, "default_prompt_name", None)
        return (prompts.get(found) or None) if found else None
    if kind == "sentence-transformers" and hasattr(model, "encode_query") and name in prompts:
        return prompts[name] or None
    default = getattr(model, "default_prompt_name", None)
    return (prompts.get(default) or None) if default else None


def _to_device(features: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in features.items()}


class FastTokens:
    """A Sentence Transformers model's tokenization straight from its Rust tokenizer: a whole
    chunk of texts in one call (the Rust side spreads them over the cores), each batch then
    padded here. What the model's tokenization does for single texts (strip where Sentence
    Transformers 5's ``tokenize`` strips, lowercase where the module does, truncate to
    ``max_seq_length`` or a multi-vector model's document length, pad to the longest of the batch,
    here rounded up to ``PAD_MULTIPLE``); checked against it on a call's first batch,
    and not used where they differ. :meth:`make` gives None for a model it does not know, and the
    same object for the same model (its copy of the tokenizer is made once, when first needed)."""

    _made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self, module, tokenizer, backend, length=None, prefix: str = "", strip: bool = True):
        self.module, self.tokenizer, self.source = module, tokenizer, backend
        self.length, self.prefix, self.strip = length, prefix, strip
        self.backend = None  # a copy with its own truncation settings (a Rust tokenizer is not reentrant)
        self.lock = threading.Lock()  # one call at a time uses the copy
        self.names = [n for n in tokenizer.model_input_names if n in ("input_ids", "token_type_ids", "attention_mask")]
        self.pad = (tokenizer.pad_token_id or 0, tokenizer.pad_token_type_id or 0)
        self.left = tokenizer.padding_side == "left"

    @classmethod
    def make(cls, model, kind: str, is_query: bool = False):
        """A plain Sentence Transformers model's tokens, or a multi-vector model's documents' (its
        document prompt and length; its queries are expanded, and go through its own preprocess)."""
        if kind not in ("sentence-transformers", "multi-vector") or (kind == "multi-vector" and is_query):
            return None
        try:
            module = model[0]
            tokenizer = module.tokenizer
            backend = tokenizer.backend_tokenizer  # a fast (Rust) tokenizer
            length = getattr(module, "document_length", None) if kind == "multi-vector" else None
            if not hasattr(backend, "encode_batch") or not isinstance(length or module.max_seq_length, int):
                return None
        except (AttributeError, IndexError, KeyError, TypeError, ValueError):
            return None
        # Sentence Transformers 5's tokenize strips each text; 6's preprocess does not
        prefix, strip = (prompt(model, kind, False) or "") if kind == "multi-vector" else "", not hasattr(model, "preprocess")
        made = cls._made.get(model)
        if made is None or (made.tokenizer, made.source, made.length, made.prefix, made.strip) != (
                tokenizer, backend, length, prefix, strip):
            made = cls._made[model] = cls(module, tokenizer, backend, length, prefix, strip)
        return made

    def copy(self):
        """The tokenizer's copy, truncating at the module's ``max_seq_length`` as it is now (or the
        multi-vector model's document length)."""
        if self.backend is None:
            self.backend = type(self.source).from_str(self.source.to_str())
            self.backend.no_padding()
        self.backend.enable_truncation(self.length or self.module.max_seq_length, strategy="longest_first",
                                       direction=getattr(self.tokenizer, "truncation_side", "right"))
        return self.backend

    def encode(self, texts: list[str]) -> list:
        texts = [self.prefix + t for t in texts] if self.prefix else texts
        if self.strip:
            texts = [t.strip() for t in texts]
        if getattr(self.module, "do_lower_case", False):
            texts = [t.lower() for t in texts]
        with self.lock:
            b = self.copy()
            encode = getattr(b, "encode_batch_fast", b.encode_batch)  # fast: no character offsets
            return [e.ids for e in encode(texts, add_special_tokens=True)]

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

    def same_as_model(self, model, kind: str, texts: list[str], encoded: list, rows) -> bool:
        want = _tokenize(model, kind, [texts[r] for r in rows], False)
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
    if kind == "multi-vector":  # the prompt, expansion and lengths of the task, as its encode does
        return dict(model.preprocess(batch, prompt=prompt(model, kind, is_query), task=_task(is_query)))
    return model.tokenize(texts=batch, is_query=is_query) if kind == "pylate" else _st_tokenize(model, batch)


def _st_tokenize(model, texts: list[str]) -> dict:
    """A plain Sentence Transformers model's tokenization: ``preprocess`` where the model has it
    (Sentence Transformers 6, whose ``tokenize`` is deprecated), else ``tokenize``."""
    return model.preprocess(texts) if hasattr(model, "preprocess") else model.tokenize(texts)


def _task(is_query: bool) -> str:
    return "query" if is_query else "document"


def batches(model, kind: str, texts: list[str], is_query: bool, batch_size: int, pin: bool):
    """(chunk start, chunk end, the batch's positions in the chunk, features) for every batch, in
    the order they run: each chunk sorted by length (longest first). The fast tokens are checked
    against the model's own on the first batch (the model's own tokenization from there if they
    differ). Tokens are made in a thread while the device runs: the next chunk's fast tokens, or
    the model's own tokenization of the next ``AHEAD`` batches."""
    fast = FastTokens.make(model, kind, is_query)
    step = batch_size * CHUNK_BATCHES
    starts = range(0, len(texts), step)

    def plan(c0):
        chunk = texts[c0 : c0 + step]
        order = np.argsort([-len(t) for t in chunk])  # as the model's encode sorts
        return chunk, [order[b0 : b0 + batch_size] for b0 in range(0, len(chunk), batch_size)]

    def pinned(feats: dict) -> dict:
        return {k: v.pin_memory() if pin and isinstance(v, torch.Tensor) else v for k, v in feats.items()}

    def own(chunk, rows):
        return pinned(_tokenize(model, kind, [chunk[r] for r in rows], is_query))

    ahead = ThreadPoolExecutor(1)
    try:
        coming = None  # the next chunk's fast tokens
        for c0 in starts:
            c1 = min(len(texts), c0 + step)
            chunk, rows_list = plan(c0)
            encoded = coming.result() if coming is not None else fast.encode(chunk) if fast is not None else None
            if c0 == 0 and fast is not None and not fast.same_as_model(model, kind, chunk, encoded, rows_list[0]):
                fast = encoded = None
            if fast is None:  # the model's own tokenization from here on, AHEAD batches made in advance
                yield from _own_batches(ahead, own, plan, c0, len(texts), step)
                return
            coming = ahead.submit(fast.encode, texts[c1 : c1 + step]) if c1 < len(texts) else None
            for rows in rows_list:
                yield c0, c1, rows, pinned(fast.batch(encoded, rows))
    finally:  # a generator closed early (an error, a break) does not wait for the work queued ahead
        ahead.shutdown(wait=False, cancel_futures=True)


AHEAD = 8  # batches the model's own tokenization makes ahead of the device


def _own_batches(ahead, own, plan, start: int, n: int, step: int):
    """``batches``' items made by the model's own tokenization in the thread ``ahead``, at most
    ``AHEAD`` batches in advance (their pinned features are held until handed out)."""
    todo = ((c0, min(n, c0 + step), chunk, rows) for c0 in range(start, n, step)
            for chunk, rows_list in [plan(c0)] for rows in rows_list)
    window = deque()
    for c0, c1, chunk, rows in todo:
        window.append((c0, c1, rows, ahead.submit(own, chunk, rows)))
        if len(window) > AHEAD:
            c0_, c1_, rows_, made = window.popleft()
            yield c0_, c1_, rows_, made.result()
    while window:
        c0_, c1_, rows_, made = window.popleft()
        yield c0_, c1_, rows_, made.result()


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
    if kind == "multi-vector":  # its preprocess adds the prompt; its Normalize module (if any) normalised
        normalize = "none"
    elif p := prompt(model, kind, is_query):
        texts = [p + t for t in texts]
    device = torch.device(model.device)
    return _run(model, kind, texts, is_query, batch_size, normalize, out_dtype, progress, device)


def _run(model, kind, texts, is_query, batch_size, normalize, out_dtype, progress, device):
    host = _Host(device, len(texts) * (_max_tokens(model, kind, is_query) or 0))
    lengths_out = []  # every chunk's lengths, in text order
    parts, got = [], []  # the current chunk's packed batches and their positions
    with torch.inference_mode():
        try:
            for c0, c1, rows, feats in batches(model, kind, texts, is_query, batch_size, device.type == "cuda"):
                if kind == "multi-vector":  # its scoring mask comes out of its forward: kept on the
                    # device and applied when the chunk is done, so the host does not wait a batch
                    out = model(_to_device(feats, device), task=_task(is_query))
                    parts.append((_normalised(out["token_embeddings"], normalize).to(out_dtype),
                                  out["attention_mask"].bool()))
                else:
                    keep = _keep(model, kind, feats, is_query)  # on the host: no wait for the device
                    flat = _pinned(keep.flatten().nonzero().flatten(), device)
                    feats = _to_device(feats, device)
                    out = model(feats) if kind == "sentence-transformers" else model.forward(input=feats)
                    emb = out["token_embeddings"]
                    emb = emb.reshape(-1, emb.shape[-1]).index_select(0, flat.to(device, non_blocking=True))
                    parts.append((_normalised(emb, normalize).to(out_dtype), keep.sum(dim=1)))
                got.append(rows)
                if progress is not None:
                    progress.update(len(rows))
                if sum(len(g) for g in got) == c1 - c0:  # the chunk is done: to the host while the next runs
                    if kind == "multi-vector":  # each batch's vectors its mask keeps
                        parts = [(emb[keep], keep.sum(dim=1).cpu()) for emb, keep in parts]
                    tok, lens = _in_text_order(parts, got, c1 - c0)
                    host.put(tok)
                    lengths_out.append(lens)
                    parts, got = [], []
            tokens = host.result()
        finally:
            host.close()
    lengths = np.concatenate(lengths_out).astype(np.int64) if lengths_out else np.zeros(0, np.int64)
    return tokens, lengths


def _max_tokens(model, kind: str, is_query: bool) -> int | None:
    """The most vectors the model makes for one text (its limit as the adapter set it), if known."""
    if kind == "pylate":
        n = getattr(model, "query_length" if is_query else "document_length", None)
    elif kind == "multi-vector":  # its Transformer module's; a query expanded to its expansion's length
        first = model[0]
        n = getattr(first, "query_length" if is_query else "document_length", None)
        if is_query:
            n = max(n or 0, (getattr(first, "query_expansion", None) or {}).get("length") or 0)
    else:
        n = getattr(model, "max_seq_length", None)
    return n if isinstance(n, int) and n > 0 else None


class _Host:
    """The finished chunks' vectors on the host, one array in text order. From a CUDA device each
    chunk is copied in a thread on its own stream, through a pinned buffer, as soon as it is done,
    while the device runs the next ones (at most ``DEVICE_BYTES`` waiting). With room known in
    advance (``bound`` tokens: the texts times the model's limit), the copies go straight into
    place in one array whose pages are committed only as they are written; else each chunk gets
    its array and they are joined at the end."""

    def __init__(self, device: torch.device, bound: int):
        self.device, self.cuda = device, device.type == "cuda"
        self.bound, self.at, self.out, self.chunks = bound, 0, None, []
        self.pending: list = []  # (future, bytes) of copies not known to be done
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.pool = ThreadPoolExecutor(1) if self.cuda else None
        self.staging = None  # the copy thread's pinned buffer

    def put(self, tok: torch.Tensor) -> None:
        n = tok.shape[0]
        if self.bound:  # the first chunk: room for them all, asked for once
            room = _reserved((self.bound, tok.shape[1]), tok.dtype)
            self.bound = 0
            self.out = None if room is None else torch.from_numpy(room)
        if self.out is not None and self.at + n <= self.out.shape[0]:
            dst = self.out[self.at : self.at + n]
        else:  # no room known: an array of its own
            if self.out is not None:  # (a model that made more than its limit said: keep what is there)
                self.chunks.append(self.out[: self.at])
                self.out = None
            dst = torch.empty(tok.shape, dtype=tok.dtype)
            self.chunks.append(dst)
        self.at += n
        if not self.cuda:
            dst.copy_(tok)
            return
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(self.device))  # the stream that made tok (its device's, not the current one's)
        tok.record_stream(self.stream)
        self.pending.append((self.pool.submit(self._copy, dst, tok, ready), tok.nbytes))
        while sum(b for _, b in self.pending) > DEVICE_BYTES:
            self.pending.pop(0)[0].result()

    def _copy(self, dst: torch.Tensor, tok: torch.Tensor, ready) -> None:
        """In the copy thread: ``tok`` through a pinned buffer into ``dst`` (a copy from the device
        straight into pageable memory holds up the other thread's launches while it runs)."""
        with torch.inference_mode(), torch.cuda.stream(self.stream):  # (inference mode is per thread)
            if not tok.numel():
                return
            self.stream.wait_event(ready)
            rows = max(1, min(tok.shape[0], STAGING_BYTES // (tok.element_size() * tok[0].numel())))
            if (self.staging is None or self.staging.dtype != tok.dtype or self.staging.shape[1:] != tok.shape[1:]
                    or self.staging.shape[0] < rows):
                self.staging = torch.empty((rows, *tok.shape[1:]), dtype=tok.dtype, pin_memory=True)
            for r0 in range(0, tok.shape[0], rows):
                n = min(rows, tok.shape[0] - r0)
                self.staging[:n].copy_(tok[r0 : r0 + n], non_blocking=True)
                self.stream.synchronize()
                dst[r0 : r0 + n].copy_(self.staging[:n])

    def result(self) -> np.ndarray:
        for f, _ in self.pending:
            f.result()
        self.pending = []
        if not self.chunks:
            return self.out[: self.at].numpy() if self.out is not None else np.zeros((0, 0), np.float32)
        if self.out is not None:
            self.chunks.append(self.out[: self.at])
        return self.chunks[0].numpy() if len(self.chunks) == 1 else torch.cat(self.chunks).numpy()

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True)


def _reserved(shape: tuple, dtype: torch.dtype) -> np.ndarray | None:
    """An array of ``shape`` whose memory the system commits only as it is written (on Linux:
    anonymous memory without a swap reservation, in huge pages where allowed); None where the
    system will not map that much (then each chunk gets its own array)."""
    np_dtype = np.float16 if dtype == torch.float16 else np.float32
    nbytes = int(np.prod(shape)) * np.dtype(np_dtype).itemsize
    if nbytes < (64 << 20):
        return np.empty(shape, np_dtype)
    if sys.platform != "linux":
        return None
    try:
        m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_NORESERVE)
    except (OSError, ValueError, OverflowError):
        return None
    with contextlib.suppress(AttributeError, OSError):
        m.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(m, np_dtype).reshape(shape)


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
    return tok[_pinned(torch.from_numpy(idx), tok.device).to(tok.device, non_blocking=True)], lens


def _pinned(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` in pinned memory when it is bound for a CUDA device: a copy from pageable memory
    waits for the device to finish its queue first, so the host could not run ahead."""
    return t.pin_memory() if device.type == "cuda" else t


def spans(model, kind: str, texts: list[str], is_query: bool) -> list | None:
    """Per text, the character span ``(start, end)`` in the text of each vector the pipeline
    makes for it (None for a special token, or one the prompt holds); None where the model's
    tokenizer does not say (PyLate, whose query and document markers shift the positions, or a
    tokenizer without offsets; a multi-vector model, whose scoring mask drops tokens)."""
    fast = FastTokens.make(model, kind) if kind == "sentence-transformers" else None
    if fast is None:
        return None
    with fast.lock:
        return _spans(fast, prompt(model, kind, is_query) or "", texts)


def _spans(fast: FastTokens, p: str, texts: list[str]) -> list:
    b = fast.copy()
    lower = getattr(fast.module, "do_lower_case", False)
    out = []
    for text in texts:
        fed = (p + text).strip() if fast.strip else p + text  # as the pipeline feeds the tokenizer
        # offsets count from the first character the strip kept; the text starts len(p) further
        shift = len(p + text) - len((p + text).lstrip() if fast.strip else p + text) - len(p)
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
