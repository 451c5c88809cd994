"""What people read of an acceptance gate (jobs/accept.py): the summary table (one row per drafter: its family, delta
against the baseline, drafts and drafting milliseconds per step, a per-position acceptance sparkline; at the first
temperature), the temperature table (one row per drafter and temperature: τ and acceptance over the seeds, the
expected acceptance under both rules), the draft-tree table (one row per drafter and tree budget, its chain's
figures beside), the failures, and the same as Markdown for a CI job summary.
"""

import os

from ggtools.byte_sizes import human_bytes
from ggtools.errors import GGToolsError
from ggtools.gguf.outputs import check_output, write_bytes
from ggtools.jobs.accept import AcceptError, AcceptReport
from ggtools.jobs.accept_temperatures import Spread, drafts_per_step
from ggtools.runtime import DEFINITIONS, numerics_note

SPARK = "▁▂▃▄▅▆▇█"
HEADERS = ["drafter", "family", "acceptance", "tau", "Δtau", "mean len", "drafts/step", "draft ms/step", "tok/s",
           "speedup", "draft KV", "= greedy", "accept by position", "verdict"]
ALIGN = "llrrrrrrrrrlll"
FAMILIES = {"dflash": "DFlash v1", "dflash2": "DFlash2", "dspark": "DSpark", "eagle3": "EAGLE3", "mtp": "MTP"}


def sparkline(values) -> str:
    """One block character per value in [0, 1] (absolute scale: drafters compare at a glance)."""
    return "".join(SPARK[min(len(SPARK) - 1, max(0, int(v * len(SPARK))))] for v in values)


def summary_headers(report: AcceptReport) -> list[str]:
    """HEADERS, the output check named for the first temperature's decoding."""
    return [h if h != "= greedy" or report.temperatures[0] == 0 else "= sampled" for h in HEADERS]


def summary_rows(report: AcceptReport) -> list[list[str]]:
    """One row per drafter at the first temperature (above 0: means over the seeds)."""
    rows = []
    for d in report.drafters:
        t = d.by_temperature[0]
        rows.append([d.name + (" (baseline)" if d.baseline else ""), FAMILIES.get(d.family, d.family),
                     f"{t.acceptance.mean:.3f}", f"{t.tau.mean:.3f}",
                     "" if d.baseline else f"{d.delta_tau:+.3f} ({100 * d.delta_tau_relative:+.1f}%)",
                     f"{t.mean_len:.3f}", f"{t.drafts_per_step:.2f}", f"{t.draft_ms_per_step:.2f}",
                     f"{t.tokens_per_second:.0f}", f"{t.speedup:.2f}x", human_bytes(d.run.draft_kv_bytes),
                     "yes" if t.outputs_match_target else "NO", sparkline(t.per_position_accept_rate),
                     "pass" if d.passed else "FAIL"])
    return rows


TEMP_HEADERS = ["drafter", "T", "seeds", "tau", "Δtau", "acceptance", "expected (exact match)",
                "expected (rejection)", "mean len", "tok/s", "= target", "verdict"]
TEMP_ALIGN = "lrlrrrrrrrll"


def by_temperature(report: AcceptReport) -> bool:
    """Whether the report has a temperature table: several temperatures, or one above 0."""
    return report.temperatures != [0]


def temperature_rows(report: AcceptReport) -> list[list[str]]:
    """One row per drafter and temperature: τ and acceptance as mean (min..max over the seeds), the expected
    acceptance under each rule, the verdict at that temperature."""
    rows = []
    for d in report.drafters:
        for t in d.by_temperature:
            rows.append([d.name + (" (baseline)" if d.baseline else ""), f"{t.temp:g}", _seeds(t.seeds),
                         _spread(t.tau), "" if d.baseline else f"{t.delta_tau:+.3f} ({100 * t.delta_tau_relative:+.1f}%)",
                         _spread(t.acceptance), _maybe(t.expected_acceptance), _maybe(t.expected_acceptance_rejection),
                         f"{t.mean_len:.3f}", f"{t.tokens_per_second:.0f}", "yes" if t.outputs_match_target else "NO",
                         "pass" if t.passed else "FAIL"])
    return rows


def _spread(s: Spread) -> str:
    return f"{s.mean:.3f}" if s.min == s.max else f"{s.mean:.3f} ({s.min:.3f}..{s.max:.3f})"


def _maybe(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def _seeds(seeds: list[int]) -> str:
    if not seeds:
        return "greedy"
    return str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}..{seeds[-1]}"


def temperature_definition_lines() -> list[str]:
    return ["T = the target's sampling temperature (0: greedy decoding, one pass); seeds = the sampler seeds, one "
            "pass of every prompt each (--seed S --seeds N: S..S+N-1)",
            "tau, acceptance = the mean over the seeds (min..max); Δtau = against the baseline's at the same T; "
            "mean len, tok/s = means over the seeds",
            "expected (exact match) = " + DEFINITIONS["expected_acceptance_rate"] + ", averaged over the seeds",
            "expected (rejection) = " + DEFINITIONS["expected_acceptance_rate_rejection"] + " ('-': the drafter gives "
            "no distribution)",
            "= target: every output equals target-only decoding at that T with the same seed (llama.cpp's exact-match "
            "rule keeps the target's own draws)"]


TREE_HEADERS = ["drafter", "tree budget", "top-K", "AL", "tau", "nodes/step", "chain AL", "chain tau",
                "chain drafts/step", "ΔAL", "tok/s", "speedup", "= greedy"]
TREE_ALIGN = "lrrrrrrrrrrrl"


def tree_rows(report: AcceptReport) -> list[list[str]]:
    """Per drafter and tree budget: the tree's AL (lucebox's: mean accepted length incl. the bonus), τ, nodes
    verified per step, and its (greedy) chain's AL, τ and drafts per step beside them."""
    rows = []
    for d in report.drafters:
        greedy = next((t.runs[0] for t in d.by_temperature if t.temp == 0), d.run)
        chain = greedy.stats
        for t in d.trees:
            s = t.run.stats
            rows.append([d.name, str(t.budget), str(t.run.settings["tree_top_k"]),
                         f"{s['mean_accepted_length_incl_bonus']:.3f}", f"{s['tau_zlab']:.3f}",
                         f"{drafts_per_step(t.run):.2f}", f"{chain['mean_accepted_length_incl_bonus']:.3f}",
                         f"{chain['tau_zlab']:.3f}", f"{drafts_per_step(greedy):.2f}", f"{t.delta_mean_len:+.3f}",
                         f"{t.run.speculative_tokens_per_second:.0f}", f"{t.speedup:.2f}x",
                         "yes" if t.run.outputs_match_target else "NO"])
    return rows


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
    base_family = next(d.family for d in report.drafters if d.baseline)
    if report.max_drop is not None and any(d.family != base_family for d in report.drafters):
        gate += f" (for {FAMILIES.get(base_family, base_family)} drafters)"
    if report.min_tau is not None:
        gate += f", --min-tau {report.min_tau:g}"
    if report.min_acceptance is not None:
        gate += f", --min-acceptance {report.min_acceptance:g}"
    source = "the default set" if report.prompt_source == "default" else report.prompt_source
    return (f"target {os.path.basename(report.target)}; {len(report.prompts)} prompts ({source}) × up to "
            f"{report.n} new tokens; draft KV {report.draft_kv}; n_max {_n_max(report)}, cut {s['cut']} "
            f"(p_min {s['p_min']:g}, n_min {s['n_min']}){_trees(report)}{_temperatures(report)}; {_runs_on(report)}; "
            f"baseline {report.baseline}, {gate}; target-only {report.target_tokens_per_second:.0f} tok/s")


def _temperatures(report: AcceptReport) -> str:
    """The temperatures, the seeds (to replay them) and the first sampled decoding's chain; nothing when greedy only."""
    if report.temperatures == [0]:
        return ""
    temps = ", ".join(f"{t:g}" for t in report.temperatures)
    if not report.seeds:
        return f"; T {temps}"
    seeds = _seeds(report.seeds)
    return (f"; T {temps}, seeds {seeds} (replay: --seed {report.seeds[0]} --seeds {len(report.seeds)}), sampled "
            f"with {report.sampling['chain']}")


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


def definition_lines(report: AcceptReport | None = None) -> list[str]:
    sampled = report is not None and report.temperatures[0] > 0
    lines = ["family = what drafts: DFlash v1, DFlash2, DSpark, EAGLE3, MTP (the target's block or a sidecar)",
             "acceptance = " + DEFINITIONS["acceptance_rate"], "tau = " + DEFINITIONS["tau_zlab"],
             "Δtau = tau - the baseline's (relative to the baseline's)",
             "mean len = " + DEFINITIONS["mean_accepted_length_incl_bonus"],
             "drafts/step = drafted_tokens / steps; draft ms/step = milliseconds of drafting (draft KV appends and the "
             "drafter's forward) per verify step",
             "tok/s = generated tokens / speculative decode seconds (after the shared prefill); speedup = over "
             f"target-only {'sampled' if sampled else 'greedy'} decoding of the same prompts in this run",
             "draft KV = the drafter's K/V memory",
             "= sampled: every output equals target-only sampled decoding with the same seed" if sampled else
             "= greedy: every output equals target-only greedy decoding",
             "accept by position = " + DEFINITIONS["per_position_accept_rate"] + ", bars from 0 to 1"]
    if sampled:
        lines.insert(0, f"the table is at T {report.temperatures[0]:g} (the first temperature): each figure the mean "
                        "over the seeds")
    return lines


def markdown(report: AcceptReport) -> str:
    lines = [f"# ggtools accept: {'FAIL' if report.failed else 'PASS'}", "", setting_line(report), "",
             _md_table(summary_headers(report), summary_rows(report), ALIGN), ""]
    if by_temperature(report):
        lines += ["## By temperature", "", _md_table(TEMP_HEADERS, temperature_rows(report), TEMP_ALIGN), ""] + [
            f"- {line}" for line in temperature_definition_lines()] + [""]
    if report.tree_budgets:
        lines += ["## Draft tree (DDTree) beside the chain", "", _md_table(TREE_HEADERS, tree_rows(report), TREE_ALIGN),
                  ""] + [f"- {line}" for line in tree_definition_lines()] + [""]
    if report.failed:
        lines += ["**Failed:**", ""] + [f"- {line}" for line in failure_lines(report)] + [""]
    at = "" if report.temperatures == [0] else f" (T {report.temperatures[0]:g})"
    lines += [f"## τ per prompt{at}", "", _md_table(["prompt", "tokens"] + [d.name for d in report.drafters],
                                                _tau_rows(report), "lr" + "r" * len(report.drafters)), ""]
    rates = [d.by_temperature[0].per_position_accept_rate for d in report.drafters]
    width = max(map(len, rates))
    lines += [f"## Acceptance by draft position{at}", "",
              _md_table(["drafter"] + [str(i + 1) for i in range(width)],
                        [[d.name] + [f"{v:.3f}" for v in rate] + [""] * (width - len(rate))
                         for d, rate in zip(report.drafters, rates)], "l" + "r" * width), ""]
    lines += ["## Definitions", ""] + [f"- {line}" for line in definition_lines(report)] + [""]
    lines += [verdict_line(report), ""]
    return "\n".join(lines)


def _tau_rows(report: AcceptReport) -> list[list[str]]:
    return [[p.id, str(len(p.ids))] + [f"{d.by_temperature[0].tau_per_prompt[i]:.3f}" for d in report.drafters]
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
