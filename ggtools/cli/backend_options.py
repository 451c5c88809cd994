"""The options that choose what runs the models, shared by `run`, `accept` and `demo`: --backend, --device,
--dtype (runtime/backends.py checks them; a missing torch is one line naming the extra)."""

import click

from ggtools.jobs.run import numerics_note

BACKEND_OPTIONS = [
    click.option("--backend", type=click.Choice(["numba", "torch"]), default="numba", show_default=True,
                 help="numba: the CPU runtime with llama.cpp's numerics; torch: CPU or CUDA "
                      "(pip install 'ggtools[torch]')."),
    click.option("--device", metavar="cpu|cuda[:N]", help="torch's device (default cpu)."),
    click.option("--dtype", type=click.Choice(["f32", "bf16", "f16"]),
                 help="torch's compute dtype (default: f32 on the CPU, bf16 on a GPU). f32 computes llama.cpp's "
                      "CPU numerics bit for bit; bf16 / f16 are faster and do not."),
]


def backend_options(f):
    for option in reversed(BACKEND_OPTIONS):
        f = option(f)
    return f


def runs_on(result) -> str:
    """'numba, 2 threads' or 'torch on cuda:0 (bf16; ...)': what ran a RunResult or SpecRun, and whether that is
    llama.cpp's arithmetic."""
    if result.backend == "numba":
        return f"numba, {result.threads} thread(s)"
    note = numerics_note(result.backend, result.dtype)
    return f"torch on {result.device} ({result.dtype}{'; ' + note if note else ''})"
