"""The benchmark suites users are shown (docs/benchmarks.md): each one's script, the arguments of
its published figure, what it measures and whether it needs a GPU. ``python -m benchmarks`` runs them."""

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

    @property
    def path(self) -> Path:
        return HERE / self.script

    @property
    def command(self) -> str:
        run = "bash" if self.script.endswith(".sh") else "python"
        return " ".join((run, f"benchmarks/{self.script}", *self.args))


SUITES: tuple[Suite, ...] = (
    Suite("kernels", "kernels.py", (),
          "MaxSim kernels (varlen, ColPali, candidates; fp16/bf16/int8) against flash-maxsim, "
          "late-interaction-kernels and naive torch, each checked against fp32 first", "1"),
    Suite("kernel-floor", "gather_floor.py", (),
          "a kernel that only reads MaxSim's bytes in its order: the HBM floor of cases a and c", "1"),
    Suite("codes-kernel", "codes_kernel.py", ("--docs", "1000000", "--queries", "100", "--pool", "8192"),
          "launch configs of the residual-codes MaxSim kernel on the codes tier's candidate pools", "optional"),
    Suite("e2e", "e2e.py", ("--docs", "1000000"),
          "end to end on a seeded synthetic corpus: build, recall@10, batched QPS, single-query latency",
          "optional"),
    Suite("fastplaid", "e2e_fastplaid.py", ("--docs", "1000000"),
          "fast-plaid on the e2e corpus and queries (needs fast_plaid importable)", "1"),
    Suite("tiers", "tiers.py", ("--docs", "1000000", "--gen", "dups", "--tiers", "device,host,disk,disk-cold",
                                "--queries", "1000"),
          "each residency tier forced on one corpus: recall@10, QPS, p50, GPU memory, open time", "1"),
    Suite("large", "large.py", ("--docs", "5600000", "--gen", "dups"),
          "a database larger than one GPU (104 GB fp16) searched on one GPU in the codes+host tier", "1"),
    Suite("defaults", "defaults.py", ("--docs", "1000000", "--generators", "dups,topics,mixed96"),
          "recall@10 and QPS of the IVF path per generator, k-means training and search setting", "optional"),
    Suite("grow", "grow.py", ("--docs", "1000000", "--generator", "dups", "--modes", "bulk,grow20,grow200",
                              "--settings", "default"),
          "a database grown by many db.add calls against one bulk build of the same corpus", "1"),
    Suite("multigpu", "multigpu.py", ("--docs", "2000000"),
          "one GPU against a database sharded over two GPUs of one host, at matched recall", "2"),
    Suite("ray-ingest", "ray_ingest.py", (),
          "bulk-ingest throughput of mvdb.shards.cluster.ingest with 1, 2 and 4 Ray workers", "no"),
    Suite("serve", "serve.py", ("--docs", "1000000"),
          "mvdb serve under concurrent clients: QPS, p50 and p99 against in-process batched search",
          "optional"),
    Suite("training", "training.py", (),
          "MaxSim fwd + bwd of a contrastive loss (bf16): ms and peak memory against naive autograd", "1"),
    Suite("sparton", "sparton.py", (),
          "the Sparton SPLADE head against PyTorch eager: ms and peak memory, fwd and fwd+bwd", "1"),
    Suite("hybrid", "hybrid.py", (),
          "token index alone vs with BM25 as a second candidate channel, man pages with MiniLM", "no"),
    Suite("quality", "quality.py", (),
          "MRR@10 and recall on real text: 1,979 man pages with MiniLM, summaries as queries", "no"),
    Suite("text-api", "text_api.py", (),
          "the text API against the embeddings path on the man pages: the same MRR@10", "no"),
    Suite("storage", "storage.py", ("--docs", "1000000"),
          "ingest GB/s, open time, random gathers and load_all of a 1M-document store", "optional"),
    Suite("open-checksums", "open_checksums.py", ("--docs", "40000"),
          "reopen time with and without the CRC-32 check of every segment", "no"),
    Suite("first-open", "first_open.py", ("--docs", "40000"),
          "CPU: the first open (trains the index) and first search of a bulk-ingested database", "no"),
    Suite("cpu", "cpu_crossover.py", ("--docs", "40000,120000"),
          "CPU: per-query time of the IVF index against exhaustive MaxSim, and open time, by corpus size", "no"),
    Suite("cpu-pool", "cpu_pool.py", ("--docs", "30000", "--nlist", "4096,16384", "--search", "8:1024,20:1024"),
          "CPU: the IVF pool's recall and crediting time against list count, lists probed and pool width", "no"),
    Suite("install", "installs.sh", ("cpu", "gpu", "plain"),
          "clean-venv installs of mvdb[cpu], mvdb[gpu] and mvdb: time, size, pip check, a smoke search", "no"),
)

BY_NAME = {s.name: s for s in SUITES}
