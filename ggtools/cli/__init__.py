"""The `ggtools` command line: thin click commands that parse, call one library function, render, exit.

Exit codes: 0 ok, 1 a check on valid input failed, 2 bad usage or invalid or unreadable input, 128 + the
signal's number when ^C, SIGTERM or SIGHUP stopped it (130, 143, 129; cli/signals.py). Every failure prints one
line on stderr (no traceback unless --debug); with --json also {"error": ..., "exit_code": ...} on stdout.
Text given on the command line must be Unicode (a path may be any bytes). See docs/safety.md.
"""

import importlib
import signal
import sys

import click

from ggtools import __version__
from ggtools.cli import signals
from ggtools.cli.params import require_unicode_text
from ggtools.cli.render import json_text, printable
from ggtools.errors import GGToolsError
from ggtools.cli import gguf_constants

# command name -> module under ggtools.cli defining `command`; imported only when that command runs or shows its
# own help, so `ggtools --help` imports no command and `ggtools inspect` neither numba nor the runtime
COMMANDS = {"inspect": "inspect", "validate": "validate", "convert": "convert", "doctor": "doctor",
            "pair-check": "pair", "patch": "patch", "quantize": "quantize", "requant-trunk": "requant_trunk",
            "run": "run", "accept": "accept",
            "demo": "demo"}

# command name -> the first sentence of its help, which `ggtools --help` lists (tests/test_startup.py holds
# them to the commands' own help)
SUMMARIES = {
    "inspect": "Show metadata, tensors and per-type totals of a GGUF file or a whole shard set.",
    "validate": "Check GGUF files and shard sets against every rule llama.cpp applies, and the ones it misses.",
    "convert": "Convert checkpoints to GGUF.",
    "doctor": "Find every known fault of a DFlash drafter GGUF: for each, its severity, the runtimes it breaks, what "
              "each shows (quoted as it prints it) and the command that fixes it.",
    "pair-check": "Check a DFlash drafter GGUF against its target GGUF: `ggtools doctor DRAFT --target TARGET`, under "
                  "its old name.",
    "patch": "Edit metadata of a GGUF file or shard set; tensors are byte-copied, only shard 1 is rewritten.",
    "quantize": "Quantize a GGUF (drafter or model) with a scheme and per-tensor overrides, bit-exact with "
                "llama-quantize's reference quantizers.",
    "requant-trunk": "Requantize only the --from tensors (the Q8_0 trunk) of a model; MXFP4 experts, F32 norms and "
                     "every other tensor are byte-copied and proven unchanged.",
    "run": "Continue a prompt with a target model, greedily or sampled (--temp), alone or drafted by a DFlash, "
           "DSpark, EAGLE3 or MTP drafter; report speed, memory and (with --draft) acceptance. numba runs it on the "
           "CPU (the default); --backend torch on the CPU or a CUDA GPU (--device cuda).",
    "accept": "Acceptance gate: decode a prompt set with each drafter (DFlash, DSpark, EAGLE3, MTP side by side) "
              "against the target and judge every drafter against a baseline.",
    "demo": "Run the main jobs end to end on the embedded demo pair, with no downloads.",
}


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
        gguf_constants.install()        # before the command's modules import gguf-py
        return require_unicode_text(importlib.import_module(f"ggtools.cli.{COMMANDS[name]}").command)

    def format_commands(self, ctx, formatter):
        """The command list of `ggtools --help`, as click writes it, from SUMMARIES: no command is imported."""
        limit = formatter.width - 6 - max(len(name) for name in COMMANDS)
        rows = [(name, click.utils.make_default_short_help(SUMMARIES[name], limit)) for name in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx, args):
        ctx.meta["ggtools.json"] = "--json" in args
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        """Run the command; turn every failure into one line (and a JSON object with --json), and a stop signal
        into the same clean interruption as ^C."""
        with signals.stop_signals_interrupt() as stop:
            try:
                result = super().invoke(ctx)
            except PASS_THROUGH:
                raise
            except (Exception, KeyboardInterrupt) as e:
                stop.closing = True
                _remove_pending()
                if ctx.obj and ctx.obj.get("debug"):
                    raise
                message, code = describe_failure(e)
                if stop.signum is not None:         # whatever the interruption became on its way up
                    code = signals.exit_code(stop.signum)
                    if not isinstance(e, GGToolsError):     # a KeyboardInterrupt, or what it broke on its way
                        message = signals.interrupted(stop.signum)
                fail(ctx, message, code)
            if stop.signum is not None:         # a signal whose exception was swallowed (signals.py) came late
                stop.closing = True
                _remove_pending()
                fail(ctx, signals.interrupted(stop.signum), signals.exit_code(stop.signum))
            return result


def _remove_pending():
    """Remove the temporary files the command registered (gguf/outputs.py; none if it never loaded that module)."""
    outputs = sys.modules.get("ggtools.gguf.outputs")
    if outputs is not None:
        outputs.remove_pending()


def describe_failure(e: BaseException) -> tuple[str, int]:
    """(one-line message, exit code) for an exception that ends a command."""
    if isinstance(e, KeyboardInterrupt):
        return "interrupted", INTERRUPTED
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
    message = " ".join(printable(message).splitlines())
    if ctx.meta.get("ggtools.json"):
        click.echo(json_text({"error": message, "exit_code": code}))
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


def entry():
    """The process's entry point (the console script, `python -m ggtools`). A ^C outside the command, while click
    parses or after the command while the interpreter exits, ends the process as the signal's default action does:
    Python's KeyboardInterrupt there would print a traceback from wherever it landed (an atexit hook, say). Within
    the command, signals.stop_signals_interrupt handles it and restores this default after."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    main()
