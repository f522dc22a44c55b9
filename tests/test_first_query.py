"""The first query (issue #57): shapes that do not multiply compiled variants, autotune winners
that persist across processes, ``db.warmup`` / ``mvdb warmup`` / ``open(warm=)``, the server's
readiness route, and ``index="auto"``'s choice on each side of its threshold."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import types

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import mvdb
from mvdb.cli import main
from mvdb.engine import state as engine_state
from mvdb.kernels import winners
from mvdb.kernels.codes.fused import block_q
from mvdb.kernels.lists import ops as list_ops
from mvdb.kernels.maxsim import launcher, tuning

DIM = 16


def _docs(n, seed=0, lo=3, hi=20):
    rng = np.random.default_rng(seed)
    out = [rng.standard_normal((int(rng.integers(lo, hi)), DIM)).astype(np.float32) for _ in range(n)]
    return [d / np.linalg.norm(d, axis=1, keepdims=True) for d in out]


# ---- shapes that do not multiply


def test_query_lengths_1_to_64_meet_two_buckets():
    assert {tuning.lq_bucket(n) for n in range(1, 65)} == {32, 64}
    assert {block_q(n) for n in range(1, 65)} == {32, 64}  # the codes tier's query tile


@pytest.mark.heavy
def test_every_query_length_reuses_its_buckets_launch(tmp_path, monkeypatch):
    """Searches with queries of every length 1..64 (one at a time, and in batches) launch the
    MaxSim kernel with two sets of compile-time values: one per bucket (counted, not timed)."""
    seen = set()
    run = launcher._run

    def counting(grid, args, meta, device, q_dtype, d_dtype):
        seen.add((q_dtype, d_dtype, tuple(sorted(meta.items()))))
        return run(grid, args, meta, device, q_dtype, d_dtype)

    monkeypatch.setattr(launcher, "_run", counting)
    with mvdb.open(tmp_path / "db.mvdb", progress=False) as db:
        db.add(_docs(12))
        pool = np.concatenate(_docs(2, seed=1, lo=64, hi=65))
        for n in range(1, 65):
            db.search(pool[:n], k=3)
        db.search([pool[:n] for n in (1, 7, 30)], k=3)
        db.search([pool[:n] for n in (2, 33, 64)], k=3)
    assert len(seen) == 2
    assert sorted(dict(m)["LQ_BUCKET"] for _, _, m in seen) == [32, 64]


def test_list_crediting_compiles_once_for_every_split(monkeypatch):
    """The crediting kernel's launches for 1, 2, 4, 8 and 16 parts a token (single queries of
    different lengths) pass the same compile-time values, and the values that change with the
    split are not specialised by Triton: one compile serves them all."""
    calls = []

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **consts):
                calls.append((args, consts))
            return launch

    monkeypatch.setattr(list_ops, "_credit_tokens_kernel", Recorder())
    n_rows, nlist = 200, 8
    rng = np.random.default_rng(0)
    rows = np.sort(rng.integers(0, n_rows, 300))
    list_rows = torch.from_numpy(rows.astype(np.int32))
    list_offsets = torch.from_numpy(np.linspace(0, 300, nlist + 1).astype(np.int64))
    bounds = list_ops.list_bounds(list_offsets, list_rows, n_rows, 16)
    probes = torch.randint(0, nlist, (4, 3))
    gains = torch.ones(4, 3, dtype=torch.int32)
    qid = torch.zeros(4, dtype=torch.int32)
    for parts in (1, 2, 4, 8, 16):
        list_ops.credit_lists_fixed(list_offsets, list_rows, n_rows, probes, gains, [0, 4], qid, parts=parts,
                                    bounds=bounds if parts > 1 else None)
    assert len(calls) == 5
    assert len({tuple(sorted(c.items())) for _, c in calls}) == 1
    from mvdb.kernels.lists.fused import _credit_tokens_kernel

    names = _credit_tokens_kernel.arg_names
    varying = {names[i] for i in range(len(calls[0][0])) if len({repr(a[i]) for a, _ in calls}) > 1
               and isinstance(calls[0][0][i], int)}
    assert varying  # stride / step change with the split ...
    kernel = _credit_tokens_kernel
    # (the interpreter's stand-in keeps the decorator's arguments; the JIT function the indices)
    unspecialised = set(kernel.kwargs["do_not_specialize"]) if hasattr(kernel, "kwargs") else \
        {names[i] for i in kernel.do_not_specialize}
    assert varying <= unspecialised  # ... and are not specialised


# ---- tuning that persists


def _in_new_process(code: str, env: dict) -> str:
    import os

    p = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env}, text=True,
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


@pytest.mark.heavy
def test_a_winner_stored_by_one_process_is_read_by_the_next(tmp_path):
    env = {"MVDB_TUNE_CACHE": str(tmp_path / "tune")}
    setup = """
        import torch
        from mvdb.kernels import winners
        e = winners.environment(torch.device("cpu"), source="abc")
    """
    _in_new_process(setup + """
        winners.put("maxsim_fwd", "LQ_BUCKET=64,DIM=128", e, {"BLOCK_Q": 64, "num_warps": 4, "odd": object()})
    """, env)
    files = list((tmp_path / "tune").glob("winners-*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["environment"]["source"] == "abc"
    got = _in_new_process(setup + """
        import json
        print(json.dumps([winners.get("maxsim_fwd", "LQ_BUCKET=64,DIM=128", e),
                          winners.get("maxsim_fwd", "LQ_BUCKET=32,DIM=128", e),
                          winners.get("maxsim_fwd", "LQ_BUCKET=64,DIM=128", dict(e, triton="0.0"))]))
    """, env)
    assert json.loads(got) == [{"BLOCK_Q": 64, "num_warps": 4}, None, None]  # another version: another file


def test_winner_store_settings(tmp_path, monkeypatch):
    e = winners.environment(torch.device("cpu"), source="s")
    monkeypatch.setenv("MVDB_TUNE_CACHE", "0")  # memory only
    winners.forget()
    winners.put("k", "a", e, {"BLOCK_Q": 32})
    assert winners.get("k", "a", e) == {"BLOCK_Q": 32} and not list(tmp_path.iterdir())
    monkeypatch.setenv("MVDB_TUNE_CACHE", str(tmp_path))
    winners.forget()
    winners.put("k", "a", e, {"BLOCK_Q": 64})
    monkeypatch.setenv("MVDB_AUTOTUNE", "full")  # tunes every config: reads no stored winner
    assert winners.get("k", "a", e) is None
    monkeypatch.setenv("MVDB_AUTOTUNE", "1")
    assert winners.get("k", "a", e) == {"BLOCK_Q": 64}
    path = next(tmp_path.glob("winners-*.json"))
    path.write_text("{torn")  # damaged by hand: tuned again, then written whole
    winners.forget()
    assert winners.get("k", "a", e) is None
    winners.put("k", "b", e, {"BLOCK_Q": 128})
    assert json.loads(path.read_text())["winners"] == {"k": {"b": {"BLOCK_Q": 128}}}


def test_the_shipped_table_answers_for_its_gpu(tmp_path, monkeypatch):
    table = tmp_path / "winners.json"
    table.write_text(json.dumps({"cpu": {"k": {"a": {"BLOCK_Q": 32}}}, "NVIDIA X": {"k": {"a": {"BLOCK_Q": 64}}}}))
    monkeypatch.setattr(winners, "SHIPPED", table)
    monkeypatch.setenv("MVDB_TUNE_CACHE", str(tmp_path / "empty"))
    winners.forget()
    try:
        e = winners.environment(torch.device("cpu"))
        assert winners.get("k", "a", e) == {"BLOCK_Q": 32}
        assert winners.get("k", "a", dict(e, gpu="NVIDIA Y")) is None
    finally:
        monkeypatch.undo()
        winners.forget()


def test_the_shipped_table_is_well_formed():
    table = json.loads(winners.SHIPPED.read_text())
    assert "NVIDIA H200" in table
    for gpu, kernels in table.items():
        for name, entries in kernels.items():
            if name == "measured_with":
                continue
            for key, config in entries.items():
                assert key.startswith("q=") and {"BLOCK_Q", "BLOCK_D", "num_warps", "num_stages"} <= set(config), key


def _launch_args():
    q = torch.randn(5, 8)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    d = torch.randn(12, 8).half()
    off = torch.tensor([0, 4, 9, 12])
    cand = torch.tensor([[0, 2], [1, -1]])
    return q, cu, d, off, cand


@pytest.mark.skipif(not launcher.interpreting(), reason="runs the kernel under the Triton interpreter")
def test_the_launcher_takes_a_stored_winner_before_autotuning(monkeypatch):
    """With autotuning on, a launch whose key has a stored winner runs it and never autotunes; one
    without runs the autotuner once and stores what it picked."""
    stored, tuned = {}, []

    class FakeTuner:
        best_config = types.SimpleNamespace(all_kwargs=lambda: dict(tuning.default_config(32)))

        def __getitem__(self, grid):
            def run(*args, **meta):
                tuned.append(meta["LQ_BUCKET"])
                launcher.launch_kernel(launcher._maxsim_fwd_kernel, grid, args, {**meta, **tuning.default_config(32)})
            return run

    monkeypatch.setattr(launcher, "autotuning", lambda: True)
    monkeypatch.setattr(launcher, "_tuned", FakeTuner())
    monkeypatch.setattr(launcher, "_BEST", {})
    monkeypatch.setattr(launcher, "_PLANS", {})
    monkeypatch.setattr(launcher, "stored_winner",
                        lambda dev, qd, dd, meta: stored.get(meta["LQ_BUCKET"]))
    monkeypatch.setattr(launcher, "store_winner",
                        lambda dev, qd, dd, meta, cfg: stored.__setitem__(meta["LQ_BUCKET"], cfg))
    from mvdb.kernels import maxsim_candidates
    from mvdb.kernels.maxsim.naive import maxsim_csr

    q, cu, d, off, cand = _launch_args()
    stored[32] = dict(tuning.default_config(32))
    want = maxsim_csr(q, cu, d, off, cand)
    got = maxsim_candidates(q, cu, d, off, cand, max_seqlen_q=3, check=False)
    assert tuned == [] and torch.allclose(got, want, atol=1e-2)
    got = maxsim_candidates(q, cu, d, off, cand, max_seqlen_q=40, check=False)  # bucket 64: nothing stored
    assert tuned == [64] and 64 in stored and torch.allclose(got, want, atol=1e-2)
    maxsim_candidates(q, cu, d, off, cand, max_seqlen_q=50, check=False)
    assert tuned == [64]  # tuned once a process


def test_shared_memory_prunes_configs_that_cannot_launch(monkeypatch):
    """Wide dims (384: MiniLM) with float32 queries: no config whose tiles overflow shared memory
    is autotuned, and the fallback stays a handful, not every config."""
    monkeypatch.setattr(tuning, "shared_memory_limit", lambda index: 232448)  # an H100 / H200

    class Cuda:
        is_cuda, device = True, types.SimpleNamespace(index=0)

        def __init__(self, size):
            self.size = size

        def element_size(self):
            return self.size

    for lq in (32, 64, 128, 256):
        keep = tuning._prune(tuning._configs(), {"Q": Cuda(4), "D": Cuda(2)}, LQ_BUCKET=lq, BLOCK_DIM=512)
        assert 1 <= len(keep) <= 16
        for c in keep:
            need = tuning.shared_bytes(c.kwargs["BLOCK_Q"], c.kwargs["BLOCK_D"], c.num_stages, 512, 4, 2)
            assert need <= 232448
    monkeypatch.setattr(tuning, "interpreting", lambda: False)  # the compiled kernel's configs
    c = tuning.default_config(128, lambda c: tuning.shared_bytes(c["BLOCK_Q"], c["BLOCK_D"], c["num_stages"], 512, 4,
                                                                  2) <= 232448)
    assert tuning.shared_bytes(c["BLOCK_Q"], c["BLOCK_D"], c["num_stages"], 512, 4, 2) <= 232448


# ---- warming up


@pytest.mark.heavy
def test_warmup_searches_and_changes_nothing(tmp_path):
    path = tmp_path / "db.mvdb"
    with mvdb.open(path, progress=False) as db:
        db.add(_docs(30), ids=[f"d{i}" for i in range(30)])
        before = (path / "MANIFEST.json").read_bytes()
        hits = db.search(_docs(1, seed=5)[0], k=5)
        out = db.warmup()
        assert out["searches"] > 0 and out["query_lengths"] == [32, 64] and out["seconds"] >= 0
        assert db.warmup(100)["query_lengths"] == [32, 64, 100]
        assert (path / "MANIFEST.json").read_bytes() == before
        assert db.search(_docs(1, seed=5)[0], k=5) == hits
    with mvdb.open(tmp_path / "empty.mvdb", progress=False) as db:
        assert db.warmup()["searches"] == 0


def test_warmup_covers_the_query_limit_of_the_encoder_texts_were_added_with(tmp_path):
    from mvdb.testing.words import encode as words
    from mvdb.warm import default_query_tokens

    assert default_query_tokens(None) == 64 and default_query_tokens(None, {"query_max_tokens": 32}) == 64
    assert default_query_tokens(None, {"query_max_tokens": 256}) == 256
    assert default_query_tokens(None, {"query_max_tokens": "x"}) == 64
    path = tmp_path / "t.mvdb"
    with mvdb.open(path, progress=False, encoder=mvdb.Encoder(words, query_max_tokens=100)) as db:
        db.add_texts(["free disk space", "copy files"])
    with mvdb.open(path, progress=False) as db:  # no encoder open: the recorded one's limit
        assert db.warmup()["query_lengths"] == [32, 64, 100]


@pytest.mark.parametrize("bad, err", [("64", mvdb.InvalidTypeError), (True, mvdb.InvalidTypeError),
                                      (0, mvdb.InvalidInputError), (1 << 20, mvdb.InvalidInputError)],
                         ids=["str", "bool", "zero", "huge"])
def test_warmup_refuses_bad_lengths(tmp_path, bad, err):
    with mvdb.open(tmp_path / "db.mvdb", progress=False) as db:
        db.add(_docs(5))
        with pytest.raises(err, match="max_query_tokens"):
            db.warmup(bad)


def test_open_warm(tmp_path):
    path = tmp_path / "db.mvdb"
    with mvdb.open(path, progress=False) as db:
        db.add(_docs(10))
    with mvdb.open(path, progress=False, warm=True) as db:
        assert len(db.search(_docs(1, seed=2)[0], k=3)) == 3
    with mvdb.open(path, progress=False, warm=16) as db:
        assert len(db) == 10
    with pytest.raises(mvdb.InvalidTypeError, match="warm: expected a bool or a positive int, got str"):
        mvdb.open(tmp_path / "new.mvdb", warm="yes")
    assert not (tmp_path / "new.mvdb").exists()  # refused before anything was created


def test_cli_warmup(tmp_path):
    path = tmp_path / "db.mvdb"
    with mvdb.open(path, progress=False) as db:
        db.add(_docs(10))
    r = CliRunner().invoke(main, ["warmup", str(path), "--json", "--max-query-tokens", "40"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["query_lengths"] == [32, 40]
    r = CliRunner().invoke(main, ["warmup", str(path), "--quiet"])
    assert r.exit_code == 0 and r.output == ""
    r = CliRunner().invoke(main, ["warmup", str(tmp_path / "none.mvdb")])
    assert r.exit_code == 1 and "no database here (no such directory; warm up does not create one)" in r.output
    assert not (tmp_path / "none.mvdb").exists()
    r = CliRunner().invoke(main, ["warmup", str(path), "--max-query-tokens", "0"])
    assert r.exit_code == 2 and "--max-query-tokens" in r.output


def test_ready_route_waits_for_the_warmup(tmp_path):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from mvdb.serve.app import create_app
    from mvdb.serve.readiness import Readiness

    with mvdb.open(tmp_path / "db.mvdb", progress=False) as db:
        db.add(_docs(10))
        readiness = Readiness()
        with TestClient(create_app(db, readiness=readiness)) as c:
            r = c.get("/ready", headers={"accept": "application/json"})
            assert r.status_code == 503 and r.json()["ready"] is False
            assert c.get("/health", headers={"accept": "application/json"}).status_code == 200  # liveness meanwhile
            readiness.start(db).join(timeout=120)
            r = c.get("/ready", headers={"accept": "application/json"})
            assert r.status_code == 200 and r.json()["ready"] is True and r.json()["warmup"]["searches"] > 0
        with TestClient(create_app(db)) as c:  # no warm-up asked for: ready at once
            assert c.get("/ready", headers={"accept": "application/json"}).status_code == 200


def test_a_failed_warmup_leaves_the_server_ready_and_says_why():
    from mvdb.serve.readiness import Readiness

    class Broken:
        def warmup(self, n=None, stop=None):
            raise RuntimeError("no GPU left")

    r = Readiness()
    r.start(Broken()).join(timeout=10)
    assert r.state()["ready"] and r.state()["error"] == "RuntimeError: no GPU left"


def test_closing_the_readiness_ends_the_warmup_after_its_search_in_progress(tmp_path):
    """A server shutting down ends its warm-up before it closes the database (a warm-up thread still
    inside torch when the interpreter exits aborts the process): the search in progress finishes,
    no other starts, and the server says nothing about being ready."""
    from mvdb.serve.readiness import Readiness

    with mvdb.open(tmp_path / "db.mvdb", progress=False) as db:
        db.add(_docs(10))
        real, calls = db.search, []
        entered, release = threading.Event(), threading.Event()

        def search(*args, **kwargs):
            calls.append(1)
            entered.set()
            assert release.wait(30)
            return real(*args, **kwargs)

        db.search = search
        said = []
        r = Readiness()
        r.start(db, on_done=said.append)
        assert entered.wait(30)
        assert r.close(timeout=0.2) is False  # the search in progress is waited for
        release.set()
        assert r.close(timeout=30) is True
        assert len(calls) == 1 and said == []
        assert r.state()["warmup"]["stopped"] is True and r.state()["warmup"]["searches"] == 1
        assert db.warmup(stop=r._stop)["searches"] == 0  # an event already set: nothing runs
        with pytest.raises(mvdb.InvalidTypeError, match="stop: expected a threading.Event or None, got bool"):
            db.warmup(stop=True)
    assert Readiness().close(timeout=0) is True  # never started: nothing to wait for


# ---- index="auto" on each side of its threshold


def test_auto_picks_flat_below_the_threshold_and_ivf_above(tmp_path, monkeypatch):
    monkeypatch.setattr(engine_state, "CPU_FLAT_MAX_TOKENS", 1500)
    small, large = _docs(100, lo=10, hi=11), _docs(200, lo=10, hi=11)  # 1,000 and 2,000 tokens
    with mvdb.open(tmp_path / "small.mvdb", progress=False, device="cpu") as db:
        db.add(small)
        assert db.stats()["index"] == "flat"
    with mvdb.open(tmp_path / "large.mvdb", progress=False, device="cpu") as db:
        db.add(large)
        assert db.stats()["index"] == "ivf"


def test_auto_thresholds():
    def kind(device, n, prerank="auto"):
        engine = types.SimpleNamespace(config={"kind": "auto"}, tier="device", prerank=prerank,
                                       device=torch.device(device))
        engine.codes_rank = types.MethodType(engine_state.Engine.codes_rank, engine)
        return engine_state.Engine.kind(engine, n)

    cpu, gpu = engine_state.CPU_FLAT_MAX_TOKENS, engine_state.FLAT_MAX_TOKENS
    assert (kind("cpu", cpu - 1), kind("cpu", cpu)) == ("flat", "ivf")
    assert (kind("cuda", gpu - 1), kind("cuda", gpu)) == ("flat", "ivf")
    assert kind("cuda", 10, prerank="codes") == "ivf"  # the codes rank a pool from the lists
