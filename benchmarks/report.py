"""Render a kernel-benchmark JSON as a Markdown table.

    python benchmarks/report.py benchmarks/results/kernels-H100.json > benchmarks/results/kernels-H100.md
"""

from __future__ import annotations

import json
import sys


def table(result: dict) -> str:
    info = result["info"]
    c = info["ceilings"]
    lines = [
        f"{info['device']}, torch {info['torch']}, triton {info['triton']}, {info['date']}; peers: "
        + ", ".join(f"{k} {v}" for k, v in info["peers"].items()) if isinstance(info["peers"], dict) else "",
        f"Roofline ceilings measured in the same run: copy {c['hbm_gbps']:.0f} GB/s, bf16 matmul "
        f"{c['bf16_tflops']:.0f} TFLOP/s, int8 matmul {c['int8_tops']:.0f} TOP/s.",
        "",
        "| case | implementation | median ms | % of roofline | extra GPU MB | top-10 vs fp32 | max rel. err |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        if "ms" not in r:
            why = r.get("error") or r.get("note") or "failed the correctness check"
            lines.append(f"| {r['case']} | {r['impl']} | - | - | - | - | {why[:80]} |")
            continue
        lines.append(
            f"| {r['case']} | {r['impl']} | {r['ms']:.3f} | {r['pct_of_roofline']:.0f}% | "
            f"{r['peak_extra_mb']:.1f} | {r['top10_agreement']:.3f} | {r['max_rel_err']:.1e} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.load(open(sys.argv[1]))))
