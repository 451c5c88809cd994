"""The `ggtools` command line: thin click commands that parse, call one library function, render, exit.

Exit codes: 0 ok, 1 a check failed, 2 usage or input error. Errors print one line (no traceback unless
--debug).
"""

import importlib
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


class Group(click.Group):
    def list_commands(self, ctx):
        return list(COMMANDS)

    def get_command(self, ctx, name):
        if name not in COMMANDS:
            return None
        return importlib.import_module(f"ggtools.cli.{COMMANDS[name]}").command

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except GGToolsError as e:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"error: {e}", err=True)
            sys.exit(e.exit_code)


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
