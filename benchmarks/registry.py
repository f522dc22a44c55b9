"""The benchmark suites users are shown (docs/benchmarks.md): each one's script, the arguments of
its published figure, what it measures, whether it needs a GPU, and the tiny run on a 2-core CPU
that the smoke test makes of it. ``python -m benchmarks`` runs them."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Suite:
    name: str
    script: str  # file name under benchmarks/
    args: tuple[str, ...]  # the arguments of the figure in docs/benchmarks.md
    measures: str
    gpu: str  # "no", "optional" (runs on a CPU too) or "1" / "2": GPUs needed
    # The smoke run (``run NAME --smoke``, tests/test_benchmarks_runner.py): arguments in place of
    # ``args`` that run the whole script in seconds on a 2-core CPU, and environment variables set
    # for it; "{tmp}" in either is a scratch folder of the run.
    smoke: tuple[str, ...] = ()
    smoke_env: tuple[tuple[str, str], ...] = ()

    @property
    def path(self) -> Path:
        return HERE / self.script

    @property
    def command(self) -> str:
        return self._command(self.args)

    @property
    def smoke_command(self) -> str:
        env = [f"{k}={v}" for k, v in self.smoke_env]
        return " ".join((*env, self._command(self.smoke)))

    def _command(self, args: tuple[str, ...]) -> str:
        run = "bash" if self.script.endswith(".sh") else "python"
        return " ".join((run, f"benchmarks/{self.script}", *args))


# the kernel suites' smoke runs: the Triton kernels themselves, on the CPU, in Triton's interpreter
INTERPRET = (("TRITON_INTERPRET", "1"),)
# the text suites' smoke runs: the man pages shipped in the package, and a stand-in for the model
# that needs no download (mvdb.testing.words)
TEXT = ("--data", "mvdb/data/manpages-sample.jsonl.gz", "--limit", "40", "--encoder", "words")

SUITES: tuple[Suite, ...] = (
    Suite("kernels", "kernels.py", (),
          "MaxSim kernels (varlen, ColPali, candidates; fp16/bf16/int8) against flash-maxsim, "
          "late-interaction-kernels and naive torch, each checked against fp32 first", "1",
          ("--smoke",), INTERPRET),
    Suite("kernel-floor", "gather_floor.py", (),
          "a kernel that only reads MaxSim's bytes in its order: the HBM floor of cases a and c", "1",
          ("--device", "cpu", "--docs-c", "16", "--docs-a", "8", "--queries-c", "1", "--configs", "2",
           "--rounds", "1"), INTERPRET),
    Suite("codes-kernel", "codes_kernel.py", ("--docs", "1000000", "--queries", "100", "--pool", "8192"),
          "launch configs of the residual-codes MaxSim kernel on the codes tier's candidate pools", "optional",
          ("--docs", "200", "--queries", "2", "--pool", "16", "--nlist", "64", "--configs", "2", "--check-width", "8"),
          INTERPRET),
    Suite("e2e", "e2e.py", ("--docs", "1000000"),
          "end to end on a seeded synthetic corpus: build, recall@10, batched QPS, single-query latency",
          "optional", ("--docs", "300", "--queries", "10", "--path", "{tmp}/e2e.mvdb")),
    Suite("fastplaid", "e2e_fastplaid.py", ("--docs", "1000000"),
          "fast-plaid on the e2e corpus and queries (needs fast_plaid importable)", "1",
          ("--docs", "300", "--queries", "10", "--device", "cpu", "--index-dir", "{tmp}/fastplaid", "--missing-ok")),
    Suite("tiers", "tiers.py", ("--docs", "1000000", "--gen", "dups", "--tiers", "device,host,disk,disk-cold",
                                "--queries", "1000"),
          "each residency tier forced on one corpus: recall@10, QPS, p50, GPU memory, open time", "1",
          ("--docs", "300", "--queries", "10", "--tiers", "device,host,disk,disk-cold", "--latency-queries", "3",
           "--passes", "1", "--path", "{tmp}/tiers.mvdb")),
    Suite("large", "large.py", ("--docs", "5600000", "--gen", "dups"),
          "a database larger than one GPU (104 GB fp16) searched on one GPU in the codes+host tier", "1",
          ("--docs", "300", "--queries", "10", "--device", "cpu", "--also", "host,disk",
           "--latency-queries", "3", "--path", "{tmp}/large.mvdb")),
    Suite("defaults", "defaults.py", ("--docs", "1000000", "--generators", "dups,topics,mixed96"),
          "recall@10 and QPS of the IVF path per generator, k-means training and search setting", "optional",
          ("--docs", "300", "--queries", "10", "--generators", "dups,topics", "--train", "40x2,160x2",
           "--settings", "default,2:64", "--latency-queries", "3", "--path", "{tmp}/defaults.mvdb")),
    Suite("grow", "grow.py", ("--docs", "1000000", "--generator", "dups", "--modes", "bulk,grow20,grow200",
                              "--settings", "default"),
          "a database grown by many db.add calls against one bulk build of the same corpus", "1",
          ("--docs", "300", "--queries", "10", "--modes", "bulk,grow3", "--latency-queries", "3",
           "--path", "{tmp}/grow.mvdb")),
    Suite("multigpu", "multigpu.py", ("--docs", "2000000"),
          "one GPU against a database sharded over two GPUs of one host, at matched recall", "2",
          ("--docs", "400", "--queries", "10", "--devices", "cpu,cpu", "--root", "{tmp}/multigpu")),
    Suite("ray-ingest", "ray_ingest.py", (),
          "bulk-ingest throughput of mvdb.shards.cluster.ingest with 1, 2 and 4 Ray workers", "no",
          ("--files", "2", "--docs-per-file", "50", "--workers", "2", "--root", "{tmp}/ray")),
    Suite("serve", "serve.py", ("--docs", "1000000"),
          "mvdb serve under concurrent clients: QPS, p50 and p99 against in-process batched search",
          "optional", ("--docs", "300", "--queries", "100", "--clients", "2", "--seconds", "1", "--warmup", "0.5",
                       "--procs", "1", "--path", "{tmp}/serve.mvdb")),
    Suite("training", "training.py", (),
          "MaxSim fwd + bwd of a contrastive loss (bf16): ms and peak memory against naive autograd", "1",
          ("--device", "cpu", "--cases", "tiny,tiny-hardneg"), INTERPRET),
    Suite("sparton", "sparton.py", (),
          "the Sparton SPLADE head against PyTorch eager: ms and peak memory, fwd and fwd+bwd", "1",
          ("--device", "cpu", "--dtype", "float32", "--vocab", "200", "--batches", "2", "--batch", "2", "--seq", "16",
           "--hidden", "32"),
          INTERPRET),
    Suite("hybrid", "hybrid.py", (),
          "token index alone vs with BM25 as a second candidate channel, man pages with MiniLM", "no", TEXT),
    Suite("quality", "quality.py", (),
          "MRR@10 and recall on real text: 1,979 man pages with MiniLM, summaries as queries", "no", TEXT),
    Suite("pool-quality", "pool_quality.py", (),
          "token pooling at factors 1-4 on the man pages with MiniLM: MRR@10, recall, tokens, memory, pooling docs/s",
          "optional", TEXT),
    Suite("pool-speed", "pool_speed.py", ("--texts", "60000"),
          "token pooling's documents/s against Sentence Transformers' HierarchicalTokenPooling, ingest with "
          "and without pool_factor, a MultiVectorEncoder through mvdb's pipeline against its encode_document",
          "optional", ("--texts", "48", "--batch-size", "16", "--device", "cpu", "--check", "16",
                       "--data", "mvdb/data/manpages-sample.jsonl.gz")),
    Suite("text-api", "text_api.py", (),
          "the text API against the embeddings path on the man pages: the same MRR@10", "no", TEXT),
    Suite("text-ingest", "text_ingest.py", ("--texts", "60000"),
          "text in: mvdb's batched encode pipeline against the bare Sentence Transformers call (MiniLM)",
          "optional", ("--texts", "48", "--batch-size", "16", "--device", "cpu", "--threads", "2", "--check", "16",
                       "--data", "mvdb/data/manpages-sample.jsonl.gz")),
    Suite("storage", "storage.py", ("--docs", "1000000"),
          "ingest GB/s, open time, random gathers and load_all of a 1M-document store", "optional",
          ("--docs", "2000", "--probe-mb", "16", "--path", "{tmp}/storage.mvdb")),
    Suite("open-checksums", "open_checksums.py", ("--docs", "40000"),
          "reopen time with and without the CRC-32 check of every segment", "no",
          ("--docs", "300", "--repeat", "1", "--path", "{tmp}/open-checksums.mvdb")),
    Suite("first-open", "first_open.py", ("--docs", "40000"),
          "CPU: the first open (trains the index) and first search of a bulk-ingested database", "no",
          ("--docs", "200", "--path", "{tmp}/first-open.mvdb")),
    Suite("cpu", "cpu_crossover.py", ("--gen", "uniform96", "--docs", "1000,2000,4000,8000,16000,30000,60000,120000",
                                      "--queries", "256"),
          "CPU: per-query time of the IVF index, exhaustive MaxSim and index=\"auto\", and open time, by corpus "
          "size", "no", ("--docs", "300,600", "--queries", "5", "--path", "{tmp}/cpu.mvdb")),
    Suite("first-query", "first_query.py", ("--corpus", "dups", "--docs", "1000000"),
          "a new process's first hit and first batched pass (queries of 4-64 tokens) next to the warm pass, "
          "with empty caches, warm caches and after mvdb warmup", "optional",
          ("--docs", "300", "--queries", "10", "--singles", "1", "--path", "{tmp}/first-query.mvdb")),
    Suite("import-floor", "import_floor.py", ("--rounds", "3"),
          "the floor under a new process's first hit: whole processes that import torch, make the CUDA "
          "context, and import mvdb", "optional", ("--rounds", "1")),
    Suite("cpu-pool", "cpu_pool.py", ("--docs", "120000", "--nlist", "0", "--probes", "16", "--pools", "1024",
                                      "--search", "default", "--queries", "200"),
          "CPU: searches at the defaults (recall@10, ms a query in batches of 20), the IVF pool's recall "
          "and time, alone and ranked by centroid interaction, against list count, probes and pool width", "no",
          ("--docs", "300", "--queries", "10", "--nlist", "0,128", "--probes", "4", "--pools", "64",
           "--search", "default,4:64", "--threads", "1", "--path", "{tmp}/cpu-pool.mvdb")),
    Suite("install", "installs.sh", ("cpu", "gpu", "plain"),
          "clean-venv installs of mvdb[cpu], mvdb[gpu] and mvdb: time, size, pip check, a smoke search", "no",
          ("local",), (("RAW", "{tmp}/raw"), ("VENVS", "{tmp}"))),
)

BY_NAME = {s.name: s for s in SUITES}
