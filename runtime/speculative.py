"""Speculative decoding at temperature 0 (reference §10): the drafter proposes, the target verifies.

    prefill the target on the prompt with the drafter's feature taps; anchor = its argmax
    each step:  draft KV takes the newly committed positions' features (begin_step)
                drafter drafts up to n_max tokens from [anchor, MASK ...] (n_max + 1 rows; n_max rows for an
                anchor-first DSpark drafter, whose anchor row drafts too); an early cut may offer fewer
                the target verifies [anchor, drafts] in one batch (stepwise: each row as a one-token step)
                acc = leading drafts equal to the target's argmax one row earlier; bonus = argmax at row acc
                commit anchor + acc drafts; crop the target cache; the bonus is the next anchor
    stop at a stop token (kept) or after n tokens; the last blocks shrink to fit n (z-lab)

Verification rows are bit-identical to one-token steps and prefill is the same call as plain greedy
decoding's, so the output equals `greedy(target, prompt, n)` exactly, whatever the drafter proposes.
"""

import time
from dataclasses import dataclass, field

import numpy as np

from ggtools.runtime.drafter.chain import cut_length
from ggtools.runtime.drafter.draft_kv import DraftKV
from ggtools.runtime.errors import SettingsError


# llama.cpp's refusal of p_min > 0 for a DSpark drafter without a confidence head (common/speculative.cpp)
NO_CONFIDENCE_HEAD = "DSpark draft has no confidence head: please set --spec-draft-p-min 0"


@dataclass
class DraftSettings:
    n_max: int | None = None     # drafts per step (default: the most a block gives, Drafter.max_drafts)
    cut: str = "none"            # "none" | "prob" | "margin" | "confidence"
    p_min: float = 0.0
    n_min: int = 0


def check_settings(drafter, settings: DraftSettings) -> None:
    """Refuse draft settings the drafter cannot draft with, in the words of the option that set them."""
    n_max = settings.n_max
    if n_max is not None and not 0 <= n_max <= drafter.max_drafts:
        layout = ", the anchor's row included" if drafter.anchor_first else ""
        raise SettingsError(f"--n-max {n_max}: the drafter's block of {drafter.block_size} drafts at most "
                            f"{drafter.max_drafts} tokens per step{layout}")
    if settings.cut == "confidence" and settings.p_min > 0:
        if drafter.markov is None:
            raise SettingsError(f"--cut confidence: {drafter.path} is a {drafter.family} drafter; the confidence cut "
                                "needs a DSpark drafter with a confidence head")
        if not drafter.hp.dspark.confidence_head:
            raise SettingsError(f"--cut confidence --p-min {settings.p_min:g}: {drafter.path}: {NO_CONFIDENCE_HEAD} "
                                "(llama.cpp); use --p-min 0 or another cut")
        if drafter.markov.conf is None:
            raise SettingsError(f"--cut confidence: {drafter.path} says dflash.has_confidence_head but holds no "
                                "conf_proj.weight")


@dataclass
class Step:
    drafted: int                 # drafts offered for verification
    accepted: int                # of them accepted (excluding the bonus; capped at a stop)
    produced: int                # tokens committed this step (accepted + bonus, capped at a stop)


@dataclass
class SpecOutput:
    tokens: list[int]
    stop: str                    # "length" | "end-of-generation"
    steps: list[Step] = field(default_factory=list)
    draft_kv_bytes: int = 0      # the draft KV's memory at the end
    prompt_seconds: float = 0.0
    decode_seconds: float = 0.0  # everything after the target's prefill
    draft_seconds: float = 0.0   # of which drafting (draft KV appends + drafter forward)


def speculative_generate(target, drafter, kv: DraftKV, prompt_ids, n: int, stop_ids=(),
                         settings: DraftSettings | None = None, progress=None) -> SpecOutput:
    """Greedy continuation of prompt_ids by up to n tokens, drafted by `drafter` with the draft KV `kv`.
    progress(k): called with the number of new tokens as they are committed."""
    s = settings or DraftSettings()
    n_max = drafter.max_drafts if s.n_max is None else s.n_max
    if not 0 <= n_max <= drafter.max_drafts:
        raise ValueError(f"n_max must lie in 0..{drafter.max_drafts} (the block size is {drafter.block_size})")
    target.kv.clear()
    kv.reset()
    out = SpecOutput(tokens=[], stop="length")
    if n <= 0:
        return out
    t0 = time.perf_counter()
    logits, features = target.forward(prompt_ids, taps=drafter.taps, logits="last")
    t1 = time.perf_counter()
    out.prompt_seconds = t1 - t0
    committed, pending = len(prompt_ids), features     # pending: features not yet in the draft KV
    out.tokens.append(int(np.argmax(logits[-1])))
    if progress:
        progress(1)
    while len(out.tokens) < n and out.tokens[-1] not in stop_ids:
        anchor = out.tokens[-1]
        n_drafts = min(n_max, n - len(out.tokens))
        drafts = []
        if n_drafts > 0:
            td = time.perf_counter()
            kv.begin_step(committed, pending.reshape(len(pending), -1))
            chain = drafter.draft(kv, anchor, n_drafts)
            drafts = chain.tokens[:cut_length(chain, s.cut, s.p_min, s.n_min)]
            out.draft_seconds += time.perf_counter() - td
        logits, features = target.forward([anchor] + drafts, taps=drafter.taps, logits="all", stepwise=True)
        posterior = np.argmax(logits, axis=1)
        acc = 0
        while acc < len(drafts) and drafts[acc] == posterior[acc]:
            acc += 1
        new = drafts[:acc] + [int(posterior[acc])]
        new = new[:n - len(out.tokens)]
        stop_at = next((i for i, t in enumerate(new) if t in stop_ids), None)
        if stop_at is not None:
            new = new[:stop_at + 1]
        out.tokens += new
        if progress:
            progress(len(new))
        out.steps.append(Step(drafted=len(drafts), accepted=len(new) - 1, produced=len(new)))
        committed += len(new)
        target.kv.crop(committed)
        pending = features[:len(new)]
    out.stop = "end-of-generation" if out.tokens[-1] in stop_ids else "length"
    out.decode_seconds = time.perf_counter() - t1
    out.draft_kv_bytes = kv.nbytes
    return out
