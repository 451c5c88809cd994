"""The speculative-decoding options `run --draft` and `accept` share: draft KV (ring or full), drafts per step, early
cut, draft tree (`--tree-budget`: one for run, a list for accept; `--tree-top-k`)."""

import click

from ggtools.cli.params import INT32_MAX, Count, FiniteFloatRange, shortened

from ggtools.jobs.accept import DEFAULT_RING_CAP
from ggtools.jobs.run import DraftSettings

DRAFT_OPTIONS = [
    click.option("--ring-cap", type=Count(min=1),
                 help=f"Draft KV: a ring of N context slots (default {DEFAULT_RING_CAP}, lucebox's draft context)."),
    click.option("--full-kv", is_flag=True, help="Draft KV: keep every committed position."),
    click.option("--n-max", type=Count(min=0),
                 help="Drafts per step (default: the most a block gives, as llama.cpp clamps it: block size - 1; "
                      "block size for an anchor-first DSpark drafter)."),
    click.option("--cut", type=click.Choice(["none", "prob", "margin", "confidence"]), default="none",
                 show_default=True,
                 help="Early cut: prob = stop at p(top1) < P (llama.cpp's DFlash rule); margin = stop at top1 - top2 "
                      "< 3*P (DFlash2: lattice scores); confidence = stop at a DSpark confidence < P (llama.cpp's "
                      "--spec-draft-p-min with a DSpark drafter)."),
    click.option("--p-min", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
                 help="Threshold P of the cut."),
    click.option("--n-min", type=Count(min=0), default=0, show_default=True,
                 help="Fewer surviving drafts than this: offer none (llama.cpp)."),
]


TREE_BUDGET_HELP = ("Verify a draft tree (DDTree, as lucebox builds it: best-first from each position's top-K, "
                    "top-1 chain first) of N nodes instead of a chain; lucebox's default is 22.")
TREE_TOP_K = click.option("--tree-top-k", type=Count(min=1),
                          help="Ranks per position the draft tree reads (default lucebox's: 8 when the budget exceeds "
                               "--n-max, else 1, which makes the tree the chain; DFlash2: at most its selector's "
                               "top_k).")


class BudgetList(click.ParamType):
    """N[,M...]: distinct tree budgets, each 1..INT32_MAX (Count)."""

    name = "N[,M...]"

    def convert(self, value, param, ctx):
        if isinstance(value, list):
            return value
        texts = value.replace(" ", "").split(",")
        if not all(t.lstrip("+-").isascii() and t.lstrip("+-").isdigit() for t in texts):
            self.fail(f"{value!r}: expected node counts separated by commas, e.g. 4,22,64", param, ctx)
        for t in texts:
            if t.startswith("-") or not t.lstrip("+0"):
                self.fail(f"{t}: a draft tree needs at least one node", param, ctx)
            if len(t.lstrip("+0")) > len(str(INT32_MAX)) or int(t) > INT32_MAX:
                self.fail(f"{shortened(t)} is more than {INT32_MAX}", param, ctx)
        budgets = [int(t) for t in texts]
        if len(set(budgets)) != len(budgets):
            self.fail(f"{value!r}: a budget given twice", param, ctx)
        return budgets


def tree_options(many: bool):
    """--tree-budget (run: one budget; accept, many=True: a list measured beside the chain) and --tree-top-k."""
    if many:
        budget = click.option("--tree-budget", "tree_budgets", type=BudgetList(),
                              help="Also decode with draft trees (DDTree) of these node budgets, e.g. 4,22,64, and "
                                   "report each beside the drafter's chain: AL, tau, nodes verified per step "
                                   "(a tree is never cut; the cut applies to the chain).")
    else:
        budget = click.option("--tree-budget", type=Count(min=1), help=TREE_BUDGET_HELP)

    def decorate(f):
        return budget(TREE_TOP_K(f))
    return decorate


def draft_options(f):
    for option in reversed(DRAFT_OPTIONS):
        f = option(f)
    return f


def draft_setup(ring_cap, full_kv, n_max, cut, p_min, n_min, tree_budget=None,
                tree_top_k=None) -> tuple[int | None, DraftSettings]:
    """(the draft KV's ring cap, None for a full draft KV; the draft settings) from the options."""
    if ring_cap and full_kv:
        raise click.UsageError("give at most one of --ring-cap and --full-kv")
    return (None if full_kv else ring_cap or DEFAULT_RING_CAP), DraftSettings(
        n_max=n_max, cut=cut, p_min=p_min, n_min=n_min, tree_budget=tree_budget, tree_top_k=tree_top_k)


def draft_options_given(ring_cap, full_kv, n_max, cut, tree_budget=None, tree_top_k=None) -> bool:
    return bool(ring_cap or full_kv or n_max is not None or cut != "none" or tree_budget or tree_top_k)
