"""The benchmark runner (``python -m benchmarks``): its list, every registered script present and
answering ``--help`` on a CPU machine, one small run writing its results file, and every suite's
smoke run (``run NAME --smoke``: the whole script at a tiny size on the CPU) writing results whose
key figures hold."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).absolute().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.registry import SUITES  # noqa: E402

IDS = [s.name for s in SUITES]
# the scripts as users run them: conftest turns the Triton interpreter on for the tests' kernels
ENV = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
GPU = {"no": "no", "optional": "optional", "1": "yes", "2": "2 GPUs"}
# the smoke runs, two at a time on the 2-core machine: one thread each
SMOKE_ENV = {**ENV, "OMP_NUM_THREADS": "1", "MVDB_PROGRESS": "0"}
SMOKE_TIMEOUT = 600


def _runner(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "benchmarks", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout, env=ENV)


def _help(suite) -> subprocess.CompletedProcess:
    run = ["bash"] if suite.script.endswith(".sh") else [sys.executable]
    try:
        return subprocess.run([*run, str(suite.path), "--help"], cwd=ROOT, capture_output=True, text=True,
                              timeout=120, env=ENV)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(e.cmd, -1, "", f"timed out after {e.timeout} s")


@pytest.fixture(scope="module")
def helps() -> dict:
    """Every registered script's ``--help``, a few at a time (each imports torch)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(IDS, pool.map(_help, SUITES)))


def test_list_names_every_suite_with_its_command_and_gpu():
    r = _runner("list")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 * len(SUITES)
    for i, s in enumerate(SUITES):
        name, measures, command = lines[3 * i : 3 * i + 3]
        assert name.split() == [s.name, "GPU:", *GPU[s.gpu].split()]
        assert measures.strip() == s.measures
        assert command.strip() == f"$ {s.command}"


def test_registry_names_are_unique_and_cover_the_docs_suites():
    assert len(IDS) == len(set(IDS))
    for name in ("kernels", "e2e", "grow", "tiers", "large", "serve", "multigpu", "quality", "cpu", "install"):
        assert name in IDS


@pytest.mark.heavy
@pytest.mark.parametrize("suite", SUITES, ids=IDS)
def test_registered_script_exists_and_answers_help(suite, helps):
    assert suite.path.is_file(), suite.path
    r = helps[suite.name]
    assert r.returncode == 0, f"{suite.script} --help: {r.stderr[-2000:]}"
    assert "usage" in r.stdout.lower() or suite.script.endswith(".sh")
    assert r.stdout.strip()


def test_run_unknown_suite_says_which_exist():
    r = _runner("run", "nope")
    assert r.returncode == 2
    assert r.stderr.strip() == f"unknown suite 'nope'; expected one of: {', '.join(IDS)}"


def test_run_refuses_out():
    r = _runner("run", "e2e", "--out", "x")
    assert r.returncode == 2
    assert r.stderr.strip() == "the runner chooses --out; use --results DIR before the suite's name"


def test_run_refuses_a_label_that_is_not_a_file_name_part():
    r = _runner("--label", "../x", "run", "e2e")
    assert r.returncode == 2
    assert r.stderr.strip() == "--label: expected letters, digits, '.', '_' or '-' (a file name part), got '../x'"


@pytest.mark.heavy
def test_run_writes_latest_results_with_machine_versions_and_date(tmp_path):
    r = _runner("--results", str(tmp_path), "--label", "small", "run", "first-open", "--docs", "200", timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    path = tmp_path / "first-open-small-cpu.json"
    assert [p.name for p in tmp_path.iterdir()] == [path.name]
    res = json.loads(path.read_text())
    assert res["suite"] == "first-open" and res["label"] == "small"
    assert res["command"] == "python benchmarks/first_open.py --docs 40000 --docs 200"
    assert res["machine"]["tag"] == "cpu" and res["machine"]["cpu_count"] >= 1
    assert {"python", "torch", "numpy"} <= set(res["versions"])
    assert res["date"].endswith("+00:00")
    assert list(res["results"]) == ["first-open-200-cpu.json"]


# ---- smoke runs: every suite end to end at a tiny size on the CPU (issue #46)


def _smoke(suite, root: Path) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.perf_counter()
    try:
        r = subprocess.run([sys.executable, "-m", "benchmarks", "--results", str(root / suite.name), "run", suite.name,
                            "--smoke"], cwd=ROOT, capture_output=True, text=True, timeout=SMOKE_TIMEOUT, env=SMOKE_ENV)
    except subprocess.TimeoutExpired as e:
        r = subprocess.CompletedProcess(e.cmd, -1, str(e.stdout or ""), f"timed out after {e.timeout} s")
    return r, time.perf_counter() - t0


@pytest.fixture(scope="module")
def smokes(request, tmp_path_factory) -> dict:
    """The selected suites' ``run NAME --smoke``, two at a time, the ones running Triton's
    interpreter first (the longest): name -> (process, seconds, its results folder)."""
    root = tmp_path_factory.mktemp("smoke")
    wanted = {item.callspec.params["suite"].name for item in request.session.items
              if getattr(item, "originalname", None) == "test_smoke_run_writes_results_with_its_key_figures"}
    order = sorted((s for s in SUITES if s.name in wanted), key=lambda s: not dict(s.smoke_env).get("TRITON_INTERPRET"))
    with ThreadPoolExecutor(max_workers=2) as pool:
        runs = dict(zip([s.name for s in order], pool.map(lambda s: _smoke(s, root), order)))
    return {name: (r, sec, root / name) for name, (r, sec) in runs.items()}


def _unit(x) -> bool:
    return isinstance(x, (int, float)) and 0 <= x <= 1


# Recall floors. EXACT: where the smoke's tiny corpus makes the search exact or hands the rerank as
# many candidates as there are documents (a CPU's flat-index defaults score every document; a CPU's
# IVF defaults take up to 1024 candidates; n_candidates above the corpus size): anything below it
# is a bug, not an approximation. NARROW: settings that really approximate (2-4 lists a token,
# 64 candidates) and relevance against labels: far below what they reach, far above chance (10 of
# 300 documents), so that only a broken search fails it.
EXACT, NARROW = 0.9, 0.5


def _at_least(x, floor: float) -> bool:
    return _unit(x) and x >= floor


def _positive(x) -> bool:
    return isinstance(x, (int, float)) and x > 0


def _kernels(r):
    rows = r["rows"]
    mvdb_rows = [row for row in rows if row["impl"].startswith("mvdb")]
    assert {row["case"] for row in mvdb_rows} == {"a-8", "a-8-int8", "b-colpali", "b-colpali-int8", "c-16", "c-16-int8"}
    for row in rows:
        assert row["correct"], row
        # the reference's top 10 (int8: quantized, near-ties may swap at the 10th place)
        assert _positive(row["ms"]) and _at_least(row["top10_agreement"], 0.8 if "int8" in row["case"] else EXACT), row
    assert all(v.startswith("skipped: ") for v in r["info"]["peers"].values()), r["info"]["peers"]


def _kernel_floor(r):
    assert set(r["cases"]) == {"c-16 int8", "c-16 fp16", "a-8 int8", "a-8 fp16"}
    for row in r["cases"].values():
        assert row["mvdb_max_rel_err"] <= 3e-2
        assert _positive(row["mvdb_default_ms"]) and _positive(row["read_kernel_best_ms"])
    assert _positive(r["in_order"]["c-16 fp16"]["ms"])


def _codes_kernel(r):
    assert len(r["rows"]) == 2 and all(row["correct"] and _positive(row["ms"]) for row in r["rows"])
    assert r["best"] in r["rows"]


def _e2e(r):
    (run,) = r["runs"]
    assert len(run["sweep"]) == 6 and _positive(r["exhaustive_qps"])
    for row in run["sweep"]:  # 300 documents: the defaults, then 1024 or more candidates
        assert _at_least(row["recall10"], EXACT) and _at_least(row["source_at_1"], EXACT), row
        assert _positive(row["batch_qps"])


def _fastplaid(r):
    assert _positive(r["exhaustive_qps"])
    if "skipped" in r:  # fast_plaid not importable: said so, nothing of it reported
        assert r["skipped"].startswith("fast-plaid: cannot import fast_plaid") and "sweep" not in r
    else:
        assert all(_unit(row["recall10_vs_exhaustive"]) for row in r["sweep"])


def _tiers(r):
    assert [(run["tier"], run["stats"]["tier"]) for run in r["runs"]] == [
        ("device", "device"), ("host", "codes+host"), ("disk", "codes+disk"), ("disk-cold", "codes+disk")]
    for run in r["runs"]:
        assert [row["qlen"] for row in run["rows"]] == ["4-64", "32"]  # real lengths, then the fixed row
        assert all(_at_least(row["recall10"], EXACT) and _positive(row["batch_qps"]) for row in run["rows"])
    assert _at_least(r["runs"][-1]["cold"]["recall10"], EXACT)  # the disk tier's search, its pages evicted
    assert r["command"].startswith("python benchmarks/tiers.py ")


def _large(r):
    assert r["phase"] == "done"
    assert [(run["open"], run["stats"]["tier"]) for run in r["runs"]] == [
        ("auto", "device"), ("host", "codes+host"), ("disk", "codes+disk")]
    assert all(_at_least(run["search"]["recall10"], EXACT) for run in r["runs"])


def _defaults(files):
    assert sorted(files) == ["defaults-dups-300.json", "defaults-topics-300.json"]
    for r in files.values():
        assert len(r["variants"]) == 2
        for v in r["variants"]:
            assert [s.get("nprobe") for s in v["search"]] == [None, 2]
            assert all(_positive(s["batch_qps"]) for s in v["search"])
            default, narrow = v["search"]  # the defaults, then 2 lists a token and 64 candidates
            assert _at_least(default["recall10"], EXACT) and _at_least(narrow["recall10"], NARROW), v["search"]


def _grow(r):
    assert [m["mode"] for m in r["modes"]] == ["bulk", "grow3"]
    for m in r["modes"]:
        # flat index, 300 documents: the defaults are exact on a CPU, 4096 candidates cover them
        assert all(_at_least(s["recall10"], EXACT) for s in m["search"]), m["search"]
        assert _at_least(m["after_reopen"]["search"]["recall10"], EXACT)
    assert r["modes"][1]["after_compact"]["segments"] == 1
    assert _at_least(r["modes"][1]["after_compact"]["search"]["recall10"], EXACT)


def _multigpu(r):
    assert r["devices"] == ["cpu", "cpu"] and len(r["sharded"]["shards"]) == 2
    # flat shards on CPUs at the defaults: every document scored, merged top 10 = the exhaustive one
    assert _at_least(r["one_gpu"]["recall10_vs_exhaustive"], EXACT)
    assert _at_least(r["sharded"]["recall10_vs_exhaustive"], EXACT)
    assert _at_least(r["hits_overlap_one_vs_sharded"], EXACT) and _positive(r["speedup_batch_qps"])


def _ray_ingest(r):
    (run,) = r["runs"]
    assert run["workers"] == 2 and run["added"] == 100 and _positive(run["docs_per_s"])


def _serve(r):
    (server,) = r["servers"]
    assert server["served_equals_in_process"] == "100/100" and server["server_exit"] == 0
    (load,) = server["load"]
    assert load["clients"] == 2 and _positive(load["qps"]) and "errors" not in load
    assert _positive(r["in_process_batched_qps"])


def _training(r):
    assert set(r["cases"]) == {"tiny", "tiny-hardneg"}
    assert r["late_interaction_kernels"].startswith(("not importable", "skipped"))
    for case in r["cases"].values():
        for name in ("mvdb-auto", "mvdb-unified", "mvdb-lowmem"):
            row = case[name]
            assert row["rel_err_dq"] < 2e-2 and row["rel_err_dd"] < 2e-2, (name, row)
            assert _positive(row["ms"]) and _positive(row["fwd_ms"])


def _sparton(r):
    (case,) = r["cases"]
    row = case["sparton"]
    assert max(row[k] for k in ("rel_err_out", "rel_err_d_hidden", "rel_err_d_weight", "rel_err_d_bias")) < 1e-4, row
    assert _positive(row["fwd_ms"]) and _positive(case["speedup_fwd"])


def _hybrid(r):
    assert r["pages"] == 40 and r["model"].startswith("words") and _at_least(r["bm25_alone_mrr10"], NARROW)
    assert _at_least(r["exhaustive_maxsim_mrr10"], NARROW)
    assert len(r["settings"]) == 4
    for row in r["settings"]:
        for channel in ("tokens", "tokens+bm25"):
            c = row[channel]
            # 40 pages: BM25's 100 best are all of them; 100 token candidates cover them too
            covered = channel == "tokens+bm25" or row["search"]["n_candidates"] >= r["pages"]
            assert _at_least(c["candidate_recall"], EXACT if covered else NARROW), (row["name"], channel, c)
            assert _at_least(c["recall_at_10"], NARROW) and _at_least(c["mrr10"], NARROW), (row["name"], channel, c)


def _quality(r):
    assert r["data"]["pages"] == 40 and r["settings"]["model"].startswith("words")
    assert _unit(r["exhaustive"]["mrr10"]) and r["exhaustive"]["mrr10"] > 0.5
    for k in ("mvdb_k10", "mvdb_k100"):  # a flat index's defaults on a CPU: exact
        assert _at_least(r[k]["mrr10"], NARROW) and _at_least(r[k]["recall10_vs_exhaustive"], EXACT), r[k]
    assert r["max_abs_score_diff_vs_exhaustive"] < 1e-2


def _text_api(r):
    assert r["pages"] == 40 and r["model"].startswith("words")
    assert _at_least(r["embeddings_path"]["mrr10"], NARROW) and r["text_path"]["mrr10"] == r["embeddings_path"]["mrr10"]
    assert r["top10_lists_equal"] == 1.0


def _storage(r):
    for key in ("disk_write_fsync_gbps", "ingest_gbps", "open_seconds_median", "gather_1000_ms_median",
                "gather_1000_ms_h5py_slices", "load_all_gbps"):
        assert _positive(r[key]), key


def _open_checksums(r):
    assert all(_positive(t) for k in ("open_s_checksums_True", "open_s_checksums_False") for t in r[k])
    assert isinstance(r["overhead"], float)


def _first_open(r):
    assert r["docs"] == 200 and all(_positive(r[step]["open_s"]) for step in ("first", "reopen"))


def _cpu(r):
    assert [s["docs"] for s in r["sizes"]] == [300, 600]
    assert all(_positive(s["ivf_per_query_s"]) and _positive(s["exhaustive_per_query_s"]) for s in r["sizes"])
    # auto: flat, so exact on a CPU; the IVF index at its defaults on a few hundred documents
    assert all(_at_least(s["ivf_recall10"], EXACT) and _at_least(s["auto_recall10"], EXACT) for s in r["sizes"])
    assert all(s["auto_index"] == "flat" for s in r["sizes"])  # tiny corpora: below "auto"'s threshold


def _first_query(r):
    assert r["build"]["docs"] == 300 and [x["state"] for x in r["runs"]] == ["cold", "second", "warmed"]
    for run in r["runs"]:
        assert run["first_hit_ok"] and _positive(run["first_hit_s"])
        assert _at_least(run["first_pass"]["recall10"], EXACT) and _at_least(run["second_pass"]["recall10"], EXACT)
        assert _positive(run["second_pass"]["qps"]) and len(run["singles"]) == 64
    assert r["runs"][2]["warmup"]["rc"] == 0


def _import_floor(r):
    assert len(r["seconds"]) == 1 and all(_positive(r["seconds"][0][k]) for k in ("python", "torch", "torch_mvdb"))


def _cpu_pool(r):
    assert len(r["runs"]) == 2 and r["runs"][0]["nlist"] > 0 and r["runs"][1]["nlist"] == 128  # 0: the default
    assert len(r["gemm_probe_ms"]) == 2 and all(_positive(t) for t in r["gemm_probe_ms"])
    for run in r["runs"]:
        assert [s["search"] for s in run["searches"]] == ["default", "4:64"]
        default, narrow = run["searches"]
        assert _at_least(default["recall10"], EXACT) and _at_least(narrow["recall10"], NARROW), run["searches"]
        # 4 lists a token, a pool of 64
        assert all(_at_least(p["pool_recall"], NARROW) and _at_least(p["ranked_recall"], NARROW) for p in run["pools"])
        assert all(_positive(p["ranked_ms_per_query"]) for p in run["pools"])


def _text_ingest(r):
    assert r["texts"] == 48 and r["check"]["same_token_counts"] and r["check"]["max_abs_diff_fp16_store"] < 2e-3
    for path in ("mvdb", "mvdb_first_call", "bare", "add_texts"):
        assert _positive(r[path]["docs_per_s"]), path
    assert r["add_texts"]["documents"] == 48 and _positive(r["stages"]["forward_s"])


def _install(r):
    import platform

    import torch

    (case,) = r["cases"]
    assert case["case"] == "local" and case["smoke"]["ok"] and case["packages"]["torch"]
    assert r["python"] == platform.python_version()  # the venv came from the interpreter running the tests
    # and sees that interpreter's packages (its venv's, where it runs in one), not another Python's
    here = os.path.dirname(os.path.dirname(torch.__file__))
    assert os.path.dirname(os.path.dirname(case["smoke"]["torch_file"])) == here, (case["smoke"]["torch_file"], here)


def _pool_quality(r):
    assert r["pages"] == 40
    rows = {f["pool_factor"]: f for f in r["factors"]}
    assert sorted(rows) == [1, 2, 3, 4]
    assert rows[1]["pooling"] is None and rows[1]["tokens"] == r["doc_tokens"]
    assert rows[1]["recall10_vs_unpooled_exhaustive"] == 1.0  # a flat index's defaults on a CPU: exact
    for f in (2, 3, 4):
        assert rows[f]["pooling"] == {"pool_factor": f, "protected": 1}
        assert rows[f]["tokens"] < rows[f - 1]["tokens"] and _unit(rows[f]["mrr10"]) and rows[f]["pool_docs_per_s"] > 0
        assert rows[f]["mrr10"] == rows[f]["exhaustive_pooled_mrr10"]  # exact over the pooled pages


def _pool_speed(r):
    assert r["texts"] == 48 and r["pool_factor"] == 2
    assert r["pool"]["mvdb_docs_per_s"] > 0 and 0.4 < r["pool"]["kept"] < 0.7
    if "st_docs_per_s" in r["pool"]:  # sentence-transformers 6 there: the same clusters as its pooling
        assert r["pool"]["same_clusters"] >= 0.9
    ingest = r["ingest"]
    assert ingest["pool_factor_2"]["tokens"] < ingest["plain"]["tokens"] and ingest["pooled_over_plain"] > 0
    if isinstance(r["multivector"], dict):
        assert r["multivector"]["same_lengths"] and r["multivector"]["max_abs_diff"] < 1e-3


CHECKS = {"pool-quality": _pool_quality, "pool-speed": _pool_speed, "kernels": _kernels, "kernel-floor": _kernel_floor, "codes-kernel": _codes_kernel, "e2e": _e2e,
          "fastplaid": _fastplaid, "tiers": _tiers, "large": _large, "grow": _grow, "multigpu": _multigpu,
          "ray-ingest": _ray_ingest, "serve": _serve, "training": _training, "sparton": _sparton, "hybrid": _hybrid,
          "quality": _quality, "text-api": _text_api, "text-ingest": _text_ingest, "storage": _storage, "open-checksums": _open_checksums,
          "first-open": _first_open, "cpu": _cpu, "first-query": _first_query, "import-floor": _import_floor, "cpu-pool": _cpu_pool, "install": _install}
CHECK_FILES = {"defaults": _defaults}  # suites whose script writes several files: checked together


def test_every_suite_has_a_smoke_run_and_a_check():
    assert set(CHECKS) | set(CHECK_FILES) == set(IDS)
    for s in SUITES:
        assert s.smoke, s.name


@pytest.mark.heavy
@pytest.mark.parametrize("suite", SUITES, ids=IDS)
def test_smoke_run_writes_results_with_its_key_figures(suite, smokes):
    r, seconds, folder = smokes[suite.name]
    assert r.returncode == 0, f"{suite.smoke_command}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    (path,) = folder.iterdir()
    assert path.name.startswith(f"{suite.name}-") and path.name.endswith("-smoke.json")
    res = json.loads(path.read_text())
    assert res["suite"] == suite.name and res["smoke"] is True and res["command"] == suite.smoke_command
    files = res["results"]
    if suite.name in CHECK_FILES:
        CHECK_FILES[suite.name](files)
    else:
        (r,) = files.values()
        CHECKS[suite.name](r)
    print(f"{suite.name}: {seconds:.1f} s")
