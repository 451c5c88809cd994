"""The `ggtools` command line: thin click commands that parse, call one library function, render, exit.

Exit codes: 0 ok, 1 a check failed, 2 usage or input error. Errors print one line (no traceback unless
--debug).
"""

import importlib
import sys

import click

from ggtools import __version__
from ggtools.errors import GGToolsError

COMMANDS = ["inspect", "validate", "convert", "pair", "patch", "quantize", "requant_trunk", "run", "demo"]     # modules under ggtools.cli, each defining `command`


class Group(click.Group):
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


for _name in COMMANDS:
    main.add_command(importlib.import_module(f"ggtools.cli.{_name}").command)
