"""The `ggtools` command line: thin click commands that parse, call one library function, render, exit.

Exit codes: 0 ok, 1 a check on valid input failed, 2 bad usage or invalid or unreadable input, 130
interrupted. Every failure prints one line on stderr (no traceback unless --debug); with --json also
{"error": ..., "exit_code": ...} on stdout. See docs/safety.md.
"""

import importlib
import json
import sys

import click

from ggtools import __version__
from ggtools.errors import GGToolsError

# command name -> module under ggtools.cli defining `command`; imported only when that command runs (or for
# --help), so `ggtools inspect` does not load numba and the runtime
COMMANDS = {"inspect": "inspect", "validate": "validate", "convert": "convert", "doctor": "doctor",
            "pair-check": "pair", "patch": "patch", "quantize": "quantize", "requant-trunk": "requant_trunk",
            "run": "run", "accept": "accept",
            "demo": "demo"}


INTERRUPTED = 130
# not failures: --help, --version, a group called without a command (click shows its help)
PASS_THROUGH = tuple(getattr(click.exceptions, name) for name in ("Exit", "Abort", "NoArgsIsHelpError")
                     if hasattr(click.exceptions, name))


class Group(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        return importlib.import_module(f"ggtools.cli.{COMMANDS[name]}").command

    def parse_args(self, ctx, args):
        ctx.meta["ggtools.json"] = "--json" in args
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        """Run the command; turn every failure into one line (and a JSON object with --json)."""
        try:
            return super().invoke(ctx)
        except PASS_THROUGH:
            raise
        except Exception as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            fail(ctx, *describe_failure(e))
        except KeyboardInterrupt:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            fail(ctx, "interrupted", INTERRUPTED)


def describe_failure(e: Exception) -> tuple[str, int]:
    """(one-line message, exit code) for an exception that ends a command."""
    if isinstance(e, GGToolsError):
        return str(e), e.exit_code
    if isinstance(e, click.UsageError):
        where = f" (see '{e.ctx.command_path} --help')" if e.ctx is not None else ""
        return e.format_message() + where, 2
    if isinstance(e, click.ClickException):
        return e.format_message(), e.exit_code
    if isinstance(e, OSError):
        return (f"{e.filename}: {e.strerror}" if e.filename else str(e)), 2
    return f"internal error: {type(e).__name__}: {e} (a bug: rerun with --debug for the traceback)", 2


def fail(ctx, message: str, code: int):
    message = " ".join(message.split("\n"))
    if ctx.meta.get("ggtools.json"):
        click.echo(json.dumps({"error": message, "exit_code": code}, ensure_ascii=False))
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="ggtools")
@click.option("--debug", is_flag=True, help="Show tracebacks instead of one-line errors.")
@click.pass_context
def main(ctx, debug):
    """GGUF tooling for DFlash drafters and very large quantized models.

    \b
    Examples:
      ggtools inspect model-00001-of-00032.gguf --tensors 'exps'
      ggtools validate --deep model-00001-of-00032.gguf
    """
    ctx.obj = {"debug": debug}
