"""The ``mvdb`` command line: a thin click group over the Python API."""

from __future__ import annotations

import click

from mvdb import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mvdb")
def main() -> None:
    """mvdb: multi-vector (late-interaction) retrieval with fused MaxSim kernels."""


@main.command()
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (cuda when present).")
@click.option("--docs", default=2000, show_default=True, help="Documents in the corpus of the varlen demo.")
@click.option("--seed", default=0, show_default=True)
def demo(device: str, docs: int, seed: int) -> None:
    """Score realistic shapes with the fused MaxSim kernels and print timings.

    Example: mvdb demo --docs 5000
    """
    from mvdb.demo import run_kernel_demo

    run_kernel_demo(device=device, n_docs=docs, seed=seed, echo=click.echo)


if __name__ == "__main__":
    main()
