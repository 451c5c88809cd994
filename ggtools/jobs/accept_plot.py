"""The figure of an acceptance gate (`ggtools accept --plot`): per-position acceptance curves, one line per
drafter, and τ per prompt. matplotlib is the optional extra `ggtools[plot]`."""

import importlib.util
import os

from ggtools.gguf.outputs import write_with
from ggtools.jobs.accept import AcceptError, AcceptReport
from ggtools.jobs.accept_report import check_destination

FORMATS = {".png": "png", ".svg": "svg"}


def check_plot_path(path, inputs=(), *, force=False) -> None:
    """Before any work: a .png or .svg path in an existing directory, none of the inputs (nor the --report),
    not an existing file without force, and matplotlib installed."""
    if os.path.splitext(path)[1].lower() not in FORMATS:
        raise AcceptError(f"{path}: --plot writes .png or .svg files")
    check_destination(path, "--plot", inputs, force=force)
    if importlib.util.find_spec("matplotlib") is None:
        raise AcceptError("--plot needs matplotlib, the optional extra: pip install 'ggtools[plot]'")


def write_plot(report: AcceptReport, path, inputs=(), *, force=False) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(11, 4.2), layout="constrained")
    curves, per_prompt = fig.subplots(1, 2, width_ratios=[1, 1.6])
    for d in report.drafters:
        rate = d.run.stats["per_position_accept_rate"]
        curves.plot(range(1, len(rate) + 1), rate, marker="o", label=d.name)
        per_prompt.plot(range(len(report.prompts)), d.run.tau_per_prompt, marker="o", label=d.name)
    curves.set(title="acceptance by draft position", xlabel="draft position", ylabel="steps accepting it",
               ylim=(0, 1.02))
    per_prompt.set(title="τ (z-lab) per prompt", ylabel="τ")
    per_prompt.set_xticks(range(len(report.prompts)), [p.id for p in report.prompts], rotation=45, ha="right",
                          fontsize="small")
    curves.legend(fontsize="small")
    fig.suptitle(f"ggtools accept: {'FAIL' if report.failed else 'PASS'} ({os.path.basename(report.target)}, "
                 f"draft KV {report.draft_kv})")
    fmt = FORMATS[os.path.splitext(path)[1].lower()]
    write_with(path, lambda tmp: fig.savefig(tmp, format=fmt), inputs=inputs, force=force)
