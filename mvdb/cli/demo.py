"""``mvdb demo``: man pages embedded, indexed and searched, or the kernels on synthetic shapes."""

from __future__ import annotations

import click

from mvdb.cli.group import DEBUG, DEVICE


@click.command()
@DEVICE
@click.option("--docs", default=300, show_default=True, help="Man pages to index (at most 300).")
@click.option("--path", default=None, help="Database directory to build (default: a temporary one).")
@click.option("--kernels", is_flag=True, help="Run the kernel-only demo instead (synthetic shapes).")
@DEBUG
def demo(device: str, docs: int, path: str | None, kernels: bool) -> None:
    """Embed man pages with MiniLM, build a database, search it, and check recall.

    Example: mvdb demo --docs 100
    """
    if kernels:
        from mvdb.demo import run_kernel_demo

        run_kernel_demo(device=device, echo=click.echo)
        return
    from mvdb.demo import run_demo

    run_demo(path=path, n_docs=docs, device=device, echo=click.echo)
