"""What people read of an acceptance gate (jobs/accept.py): the summary table (one row per drafter, delta against
the baseline, a per-position acceptance sparkline), the draft-tree table (one row per drafter and tree budget, its
chain's figures beside), the failures, and the same as Markdown for a CI job summary.
"""

import os

from ggtools.byte_sizes import human_bytes
from ggtools.errors import GGToolsError
from ggtools.gguf.outputs import check_output, write_bytes
from ggtools.jobs.accept import AcceptError, AcceptReport
from ggtools.runtime import DEFINITIONS, numerics_note

SPARK = "▁▂▃▄▅▆▇█"
HEADERS = ["drafter", "acceptance", "tau", "Δtau", "mean len", "tok/s", "speedup", "draft KV", "= greedy",
           "accept by position", "verdict"]
ALIGN = "lrrrrrrrlll"


def sparkline(values) -> str:
    """One block character per value in [0, 1] (absolute scale: drafters compare at a glance)."""
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int(v * len(SPARK))))] for v in values)


def summary_rows(report: AcceptReport) -> list[list[str]]:
    rows = []
    for d in report.drafters:
        s, r = d.run.stats, d.run
        rows.append([d.name + (" (baseline)" if d.baseline else ""), f"{s['acceptance_rate']:.3f}",
                     f"{s['tau_zlab']:.3f}", "" if d.baseline else f"{d.delta_tau:+.3f} ({100 * d.delta_tau_relative:+.1f}%)",
                     f"{s['mean_accepted_length_incl_bonus']:.3f}", f"{r.speculative_tokens_per_second:.0f}",
                     f"{d.speedup:.2f}x", human_bytes(r.draft_kv_bytes), "yes" if r.outputs_match_target else "NO",
                     sparkline(s["per_position_accept_rate"]), "pass" if d.passed else "FAIL"])
    return rows


TREE_HEADERS = ["drafter", "tree budget", "top-K", "AL", "tau", "nodes/step", "chain AL", "chain tau",
                "chain drafts/step", "ΔAL", "tok/s", "speedup", "= greedy"]
TREE_ALIGN = "lrrrrrrrrrrrl"


def tree_rows(report: AcceptReport) -> list[list[str]]:
    """Per drafter and tree budget: the tree's AL (lucebox's: mean accepted length incl. the bonus), τ, nodes
    verified per step, and its chain's AL, τ and drafts per step beside them."""
    rows = []
    for d in report.drafters:
        chain = d.run.stats
        for t in d.trees:
            s = t.run.stats
            rows.append([d.name, str(t.budget), str(t.run.settings["tree_top_k"]),
                         f"{s['mean_accepted_length_incl_bonus']:.3f}", f"{s['tau_zlab']:.3f}",
                         f"{_drafted_per_step(s):.2f}", f"{chain['mean_accepted_length_incl_bonus']:.3f}",
                         f"{chain['tau_zlab']:.3f}", f"{_drafted_per_step(chain):.2f}", f"{t.delta_mean_len:+.3f}",
                         f"{t.run.speculative_tokens_per_second:.0f}", f"{t.speedup:.2f}x",
                         "yes" if t.run.outputs_match_target else "NO"])
    return rows


def _drafted_per_step(stats: dict) -> float:
    return stats["drafted_tokens"] / stats["steps"] if stats["steps"] else 0.0


def tree_definition_lines() -> list[str]:
    return ["AL = " + DEFINITIONS["mean_accepted_length_incl_bonus"] + " (lucebox's acceptance length; the chain's "
            "'mean len')",
            "nodes/step = tree nodes verified per step (the verify batch is 1 + nodes rows); chain drafts/step = the "
            "chain's drafts verified per step",
            "top-K = ranks per position the tree reads (lucebox's: 8 when the budget exceeds n_max, else 1); "
            "ΔAL = the tree's AL - its chain's; a tree is never cut"]


def setting_line(report: AcceptReport) -> str:
    s = report.settings
    gate = f"--max-drop {report.max_drop:g}" if report.max_drop is not None else "no --max-drop"
    if report.min_tau is not None:
        gate += f", --min-tau {report.min_tau:g}"
    source = "the default set" if report.prompt_source == "default" else report.prompt_source
    return (f"target {os.path.basename(report.target)}; {len(report.prompts)} prompts ({source}) × up to "
            f"{report.n} new tokens; draft KV {report.draft_kv}; n_max {_n_max(report)}, cut {s['cut']} "
            f"(p_min {s['p_min']:g}, n_min {s['n_min']}){_trees(report)}; {_runs_on(report)}; baseline "
            f"{report.baseline}, {gate}; target-only {report.target_tokens_per_second:.0f} tok/s")


def _trees(report: AcceptReport) -> str:
    if not report.tree_budgets:
        return ""
    k = report.settings.get("tree_top_k")
    top_k = "lucebox's" if k is None else str(k)
    return f"; draft trees of {', '.join(map(str, report.tree_budgets))} nodes (top-K {top_k})"


def _runs_on(report: AcceptReport) -> str:
    run = report.drafters[0].run
    threads = f"{report.threads} thread(s)"
    if run.backend == "numba":
        return threads
    note = numerics_note(run.backend, run.dtype)
    return f"torch on {run.device} ({run.dtype}{'; ' + note if note else ''}), {threads}"


def _n_max(report: AcceptReport) -> str:
    values = sorted({d.run.settings["n_max"] for d in report.drafters})
    return "/".join(map(str, values))


def failure_lines(report: AcceptReport) -> list[str]:
    return [f"{d.name}: {f}" for d in report.failed for f in d.failures]


def verdict_line(report: AcceptReport) -> str:
    if not report.failed:
        return f"PASS: {len(report.drafters)} drafter(s), verdict in {report.seconds:.1f} s"
    return (f"FAIL: {len(report.failed)} of {len(report.drafters)} drafter(s) failed: "
            f"{', '.join(d.name for d in report.failed)} (verdict in {report.seconds:.1f} s)")


def definition_lines() -> list[str]:
    return ["acceptance = " + DEFINITIONS["acceptance_rate"], "tau = " + DEFINITIONS["tau_zlab"],
            "Δtau = tau - the baseline's (relative to the baseline's)",
            "mean len = " + DEFINITIONS["mean_accepted_length_incl_bonus"],
            "tok/s = generated tokens / speculative decode seconds (after the shared prefill); speedup = over "
            "target-only greedy decoding of the same prompts in this run",
            "draft KV = the drafter's K/V memory", "= greedy: every output equals target-only greedy decoding",
            "accept by position = " + DEFINITIONS["per_position_accept_rate"] + ", bars from 0 to 1"]


def markdown(report: AcceptReport) -> str:
    lines = [f"# ggtools accept: {'FAIL' if report.failed else 'PASS'}", "", setting_line(report), "",
             _md_table(HEADERS, summary_rows(report), ALIGN), ""]
    if report.tree_budgets:
        lines += ["## Draft tree (DDTree) beside the chain", "", _md_table(TREE_HEADERS, tree_rows(report), TREE_ALIGN),
                  ""] + [f"- {line}" for line in tree_definition_lines()] + [""]
    if report.failed:
        lines += ["**Failed:**", ""] + [f"- {line}" for line in failure_lines(report)] + [""]
    lines += ["## τ per prompt", "", _md_table(["prompt", "tokens"] + [d.name for d in report.drafters],
                                                _tau_rows(report), "lr" + "r" * len(report.drafters)), ""]
    width = max(len(d.run.stats["per_position_accept_rate"]) for d in report.drafters)
    lines += ["## Acceptance by draft position", "",
              _md_table(["drafter"] + [str(i + 1) for i in range(width)],
                        [[d.name] + [f"{v:.3f}" for v in d.run.stats["per_position_accept_rate"]]
                         + [""] * (width - len(d.run.stats["per_position_accept_rate"])) for d in report.drafters],
                        "l" + "r" * width), ""]
    lines += ["## Definitions", ""] + [f"- {line}" for line in definition_lines()] + [""]
    lines += [verdict_line(report), ""]
    return "\n".join(lines)


def _tau_rows(report: AcceptReport) -> list[list[str]]:
    return [[p.id, str(len(p.ids))] + [f"{d.run.tau_per_prompt[i]:.3f}" for d in report.drafters]
            for i, p in enumerate(report.prompts)]


def _md_table(headers, rows, align) -> str:
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"

    rule = "|" + "|".join("---:" if a == "r" else "---" for a in align) + "|"
    return "\n".join([line(headers), rule] + [line(r) for r in rows])


def check_destination(path, option: str, inputs=(), *, force=False) -> None:
    """Refuse, before any work is done, an output path whose directory is missing, a directory, one of the
    command's inputs (or another output of it), or an existing file without force."""
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise AcceptError(f"{path}: no such directory {directory} ({option})")
    if os.path.isdir(path):
        raise AcceptError(f"{path}: is a directory ({option})")
    try:
        check_output(path, inputs, force=force)
    except GGToolsError as e:
        raise AcceptError(f"{e} ({option})") from None


def write_markdown(report: AcceptReport, path, inputs=(), *, force=False) -> None:
    write_bytes(path, markdown(report).encode("utf-8"), inputs=inputs, force=force)
