"""The figure of an acceptance gate (`ggtools accept --plot`): per-position acceptance curves, one line per
drafter, and τ per prompt (at the first temperature); with tree budgets, each drafter's AL by tree budget beside its
chain's; with several temperatures, each drafter's τ against the temperature (the mean over the seeds, bars from the
least to the most). matplotlib is the optional extra `ggtools[plot]`."""

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

    extra = [panel for panel, wanted in ((_plot_trees, bool(report.tree_budgets)),
                                         (_plot_temperatures, len(report.temperatures) > 1)) if wanted]
    fig = Figure(figsize=(11 + 4 * len(extra), 4.2), layout="constrained")
    panels = fig.subplots(1, 2 + len(extra), width_ratios=[1, 1.6] + [1] * len(extra))
    curves, per_prompt = panels[0], panels[1]
    for plot, axes in zip(extra, panels[2:]):
        plot(axes, report)
    for d in report.drafters:
        first = d.by_temperature[0]
        rate = first.per_position_accept_rate
        curves.plot(range(1, len(rate) + 1), rate, marker="o", label=d.name)
        per_prompt.plot(range(len(report.prompts)), first.tau_per_prompt, marker="o", label=d.name)
    at = "" if report.temperatures == [0] else f" (T {report.temperatures[0]:g})"
    curves.set(title="acceptance by draft position" + at, xlabel="draft position", ylabel="steps accepting it",
               ylim=(0, 1.02))
    per_prompt.set(title="τ (z-lab) per prompt" + at, ylabel="τ")
    per_prompt.set_xticks(range(len(report.prompts)), [p.id for p in report.prompts], rotation=45, ha="right",
                          fontsize="small")
    curves.legend(fontsize="small")
    fig.suptitle(f"ggtools accept: {'FAIL' if report.failed else 'PASS'} ({os.path.basename(report.target)}, "
                 f"draft KV {report.draft_kv})")
    fmt = FORMATS[os.path.splitext(path)[1].lower()]
    write_with(path, lambda tmp: fig.savefig(tmp, format=fmt), inputs=inputs, force=force)


def _plot_trees(axes, report: AcceptReport) -> None:
    """AL by tree budget, one line per drafter, its chain's AL a dashed line of the same colour."""
    for d in report.drafters:
        budgets = [t.budget for t in d.trees]
        line, = axes.plot(budgets, [t.run.stats["mean_accepted_length_incl_bonus"] for t in d.trees], marker="o",
                          label=d.name)
        axes.axhline(d.run.stats["mean_accepted_length_incl_bonus"], linestyle="--", color=line.get_color())
    axes.set(title="AL by tree budget (dashed: the chain)", xlabel="tree budget (nodes)",
             ylabel="mean accepted length incl. bonus")
    axes.set_xscale("log", base=2)
    axes.set_xticks(report.tree_budgets, [str(b) for b in report.tree_budgets])


def _plot_temperatures(axes, report: AcceptReport) -> None:
    """τ against the temperature, one line per drafter: the mean over the seeds, bars from the least to the most."""
    for d in report.drafters:
        points = sorted(d.by_temperature, key=lambda t: t.temp)
        means = [t.tau.mean for t in points]
        below = [max(0.0, m - t.tau.min) for m, t in zip(means, points)]     # a mean may round past an end
        above = [max(0.0, t.tau.max - m) for m, t in zip(means, points)]
        axes.errorbar([t.temp for t in points], means, yerr=[below, above], marker="o", capsize=3, label=d.name)
    axes.set(title="τ by temperature", xlabel="temperature", ylabel="τ (bars: min..max over the seeds)")
