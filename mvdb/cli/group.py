"""The ``mvdb`` click group: one ``Error:`` line per failure, ``--debug``, and the options the
commands share."""

from __future__ import annotations

import sys

import click

from mvdb import __version__
from mvdb.errors import MvdbError

QUIET = click.option("--quiet", "-q", is_flag=True, help="No progress bars or summaries.")
DEVICE = click.option("--device", default="auto", show_default=True, help="cpu, cuda, or auto (cuda when present).")
JSON_OUT = click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead of text.")
MODEL = click.option("--model", default=None, metavar="SPEC",
                     help="Text model: minilm (all-MiniLM-L6-v2, the demo extra), package.module:attr (an "
                          "mvdb.Encoder or a function f(texts, is_query); the current directory is importable), "
                          "or a model folder or Hugging Face name.")
BATCH_SIZE = click.option("--batch-size", type=int, default=None,
                          help="Texts per call of the text model [default: 32].")
_DEBUG_KEY = "mvdb.debug"


def _set_debug(ctx: click.Context, _param, value: bool) -> None:
    if value:
        ctx.meta[_DEBUG_KEY] = True  # meta is shared by the group's and the command's contexts


DEBUG = click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=_set_debug,
                     help="On an error, raise it with its traceback instead of printing one 'Error:' line.")


class _Group(click.Group):
    """Every error of a command becomes one ``Error: <message>`` line on stderr and exit status 1:
    mvdb's own errors (MvdbError) and OSError by their message, anything else by its type and
    message. ``--debug`` raises it instead, with its traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except (click.exceptions.ClickException, click.exceptions.Exit, click.exceptions.Abort):
            raise  # usage errors, --help, Ctrl-C: click reports them
        except Exception as e:
            if ctx.meta.get(_DEBUG_KEY):
                raise
            _fail(e)


def _message(e: BaseException) -> str:
    text = " ".join(line.strip() for line in str(e).splitlines() if line.strip())
    if isinstance(e, (MvdbError, OSError)):
        return text or type(e).__name__
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _fail(e: BaseException) -> None:
    click.echo(f"Error: {_message(e)}", err=True)
    sys.exit(1)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="mvdb")
@DEBUG
def main() -> None:
    """mvdb: multi-vector (late-interaction) retrieval with fused MaxSim kernels."""

