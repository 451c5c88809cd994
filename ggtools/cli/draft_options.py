"""The speculative-decoding options `run --draft` and `accept` share: draft KV (ring or full), drafts per step, early
cut."""

import click

from ggtools.cli.params import FiniteFloatRange

from ggtools.jobs.accept import DEFAULT_RING_CAP
from ggtools.jobs.run import DraftSettings

DRAFT_OPTIONS = [
    click.option("--ring-cap", type=click.IntRange(min=1),
                 help=f"Draft KV: a ring of N context slots (default {DEFAULT_RING_CAP}, lucebox's draft context)."),
    click.option("--full-kv", is_flag=True, help="Draft KV: keep every committed position."),
    click.option("--n-max", type=click.IntRange(min=0),
                 help="Drafts per step (default: the most a block gives, as llama.cpp clamps it: block size - 1; "
                      "block size for an anchor-first DSpark drafter)."),
    click.option("--cut", type=click.Choice(["none", "prob", "margin", "confidence"]), default="none",
                 show_default=True,
                 help="Early cut: prob = stop at p(top1) < P (llama.cpp's DFlash rule); margin = stop at top1 - top2 "
                      "< 3*P (DFlash2: lattice scores); confidence = stop at a DSpark confidence < P (llama.cpp's "
                      "--spec-draft-p-min with a DSpark drafter)."),
    click.option("--p-min", type=FiniteFloatRange(min=0), default=0.0, show_default=True,
                 help="Threshold P of the cut."),
    click.option("--n-min", type=click.IntRange(min=0), default=0, show_default=True,
                 help="Fewer surviving drafts than this: offer none (llama.cpp)."),
]


def draft_options(f):
    for option in reversed(DRAFT_OPTIONS):
        f = option(f)
    return f


def draft_setup(ring_cap, full_kv, n_max, cut, p_min, n_min) -> tuple[int | None, DraftSettings]:
    """(the draft KV's ring cap, None for a full draft KV; the draft settings) from the options."""
    if ring_cap and full_kv:
        raise click.UsageError("give at most one of --ring-cap and --full-kv")
    return (None if full_kv else ring_cap or DEFAULT_RING_CAP), DraftSettings(n_max=n_max, cut=cut, p_min=p_min,
                                                                              n_min=n_min)


def draft_options_given(ring_cap, full_kv, n_max, cut) -> bool:
    return bool(ring_cap or full_kv or n_max is not None or cut != "none")
