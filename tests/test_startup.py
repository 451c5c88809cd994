"""Start-up of the commands that run no model: `ggtools --help` imports no command, `ggtools inspect` neither numba,
torch nor matplotlib, nor the parts of gguf-py beyond its constants; the command list `--help` prints from
cli.SUMMARIES is the commands' own help. (Timings: scripts/bench/startup.py, never asserted here.)"""

import json
import subprocess
import sys

import click
import pytest

from ggtools.cli import COMMANDS, SUMMARIES, main
from ggtools.samples import write_moe_set

HEAVY = ("numba", "torch", "matplotlib")

# runs the CLI in a fresh interpreter, then prints which of the named modules it loaded as the last line
PROBE = """
import json, sys
args, modules = json.loads(sys.argv[1]), json.loads(sys.argv[2])
sys.argv = ["ggtools", *args]
from ggtools.cli import main
try:
    main()
except SystemExit:
    pass
print("\\n" + json.dumps(sorted(m for m in modules if m in sys.modules)))
"""


def loaded(args, modules) -> list[str]:
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args), json.dumps(modules)], capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_moe_set(str(tmp_path_factory.mktemp("startup") / "m"), layers=1, hidden=256, ffn=256, experts=2,
                         vocab=512, shards=1)[0]


def test_help_imports_no_command():
    assert loaded(["--help"], [*HEAVY, "numpy", "gguf", *(f"ggtools.cli.{m}" for m in COMMANDS.values())]) == []


@pytest.mark.parametrize("args", [[], ["--json"], ["--tensors", "exps"]])
def test_inspect_loads_no_heavy_module(model, args):
    assert loaded(["inspect", model, *args], [*HEAVY, "gguf.gguf_reader", "gguf.gguf_writer", "gguf.vocab",
                                              "ggtools.runtime", "ggtools.quants", "ggtools.engine",
                                              "ggtools.hparam_rules"]) == []


def test_inspect_knows_the_mtp_key_as_the_rules_do():
    from ggtools.hparam_rules import mtp
    from ggtools.jobs import inspect
    assert inspect.NEXTN_KEY == mtp.NEXTN_KEY


def test_command_list_is_the_commands_own_help():
    assert list(SUMMARIES) == list(COMMANDS)
    for name in COMMANDS:
        command = main.get_command(None, name)
        assert SUMMARIES[name] == click.utils.make_default_short_help(command.help, 10 ** 6), name


def test_gguf_constants_first_then_the_whole_package():
    """The CLI's stand-in for gguf-py: its constants at once; any other name loads the real package into the same
    module, so every name is the object it would have been."""
    probe = """
import sys
from ggtools.cli import gguf_constants
gguf_constants.install()
import gguf
from gguf import GGMLQuantizationType, GGUFValueType
assert "gguf.gguf_reader" not in sys.modules and "gguf.quants" not in sys.modules
from gguf import GGUFReader
import gguf.gguf_reader, gguf.constants
assert GGUFReader is gguf.gguf_reader.GGUFReader and GGMLQuantizationType is gguf.constants.GGMLQuantizationType
assert gguf.GGUFValueType is GGUFValueType and gguf.quants.quant_shape_to_byte_shape is not None
print("ok")
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert run.stdout.strip() == "ok", run.stderr


def test_validate_deep_scans_without_numba(model):
    """The row checks of `validate --deep` are numpy's (quants/rowcheck.py): the scan loads no kernels."""
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(["validate", "--deep", "--json", model]),
                          json.dumps(HEAVY)], capture_output=True, text=True, timeout=300)
    *report, modules = run.stdout.strip().splitlines()
    assert json.loads("\n".join(report))["files"][0]["deep_scanned_bytes"] > 0
    assert json.loads(modules) == []
