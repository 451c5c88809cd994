"""Speculative decoding (reference §10): the drafter proposes, the target verifies.

    prefill the target on the prompt with the drafter's feature taps; anchor = its argmax (or its sampler's draw)
    each step:  draft KV takes the newly committed positions' features (begin_step)
                drafter drafts up to n_max tokens from [anchor, MASK ...] (n_max + 1 rows; n_max rows for an
                anchor-first DSpark drafter, whose anchor row drafts too); an early cut may offer fewer
                the target verifies [anchor, drafts] in one batch (stepwise: each row as a one-token step)
                acc = leading drafts equal to the target's token one row earlier; bonus = its token at row acc
                (the target's token: its argmax at temperature 0, else its sampler's draw, row by row along
                the path: llama.cpp's exact-match rule, one draw per committed token)
                commit anchor + acc drafts; crop the target cache; the bonus is the next anchor
    stop at a stop token (kept) or after n tokens; the last blocks shrink to fit n (z-lab)

With a tree budget (DDTree, runtime/ddtree.py) a step drafts a tree instead of a chain: the same block gives each
position's top-K distribution (Drafter.draft_top_k), build_tree spends the budget on the most likely paths, the
target verifies the flattened tree in one batch (each row seeing its own path only), the accepted path follows the
target's argmax from the root (follow_verified_tree), and the cache keeps that path (kv.keep_path).

Verification rows are bit-identical to one-token steps (a tree's rows to one-token steps along their paths) and
prefill is the same call as plain decoding's, so the output equals `greedy(target, prompt, n)` exactly (with a
sampler: `greedy(target, prompt, n, sampler=...)` with the same seed), whatever the drafter proposes. A sampled
chain's step also records its expected acceptance (expected_acceptance.py).
"""

import time
from dataclasses import dataclass, field

from ggtools.runtime.ddtree import DraftTree, build_tree, default_top_k, follow_verified_tree, most_tree_nodes
from ggtools.runtime.drafter.chain import cut_length
from ggtools.runtime.drafter.draft_kv import DraftKV
from ggtools.runtime.errors import SettingsError
from ggtools.runtime.expected_acceptance import ExpectedAcceptance, expected_acceptance
from ggtools.runtime.greedy_decoding import next_token


# llama.cpp's refusal of p_min > 0 for a DSpark drafter without a confidence head (common/speculative.cpp)
NO_CONFIDENCE_HEAD = "DSpark draft has no confidence head: please set --spec-draft-p-min 0"


@dataclass
class DraftSettings:
    n_max: int | None = None     # drafts per step (default: default_n_max, the most a block gives or EAGLE3 / MTP's 3)
    cut: str = "none"            # "none" | "prob" | "margin" | "confidence"
    p_min: float = 0.0
    n_min: int = 0
    tree_budget: int | None = None   # verify a draft tree of this many nodes (DDTree) instead of a chain
    tree_top_k: int | None = None    # ranks per position the tree reads (default: lucebox's, default_top_k)


def tree_top_k(drafter, settings: DraftSettings, n_max: int) -> int:
    """The K a tree reads: settings.tree_top_k, else lucebox's (8 when the budget exceeds the block's drafts n_max,
    else 1: the tree is the chain) within what the drafter has (Drafter.tree_top_k_limit)."""
    if settings.tree_top_k is not None:
        return settings.tree_top_k
    return min(default_top_k(settings.tree_budget, n_max), drafter.tree_top_k_limit)


def default_n_max(drafter) -> int:
    """Drafts per step when --n-max is not given: a block drafter's max_drafts (the most its block gives, as llama.cpp
    clamps n_max), an autoregressive drafter's default_drafts (llama.cpp's --spec-draft-n-max default; its chain has
    no block). Test doubles that copy a drafter's max_drafts only get max_drafts."""
    return getattr(drafter, "default_drafts", drafter.max_drafts)


def check_settings(drafter, settings: DraftSettings) -> None:
    """Refuse draft settings the drafter cannot draft with, in the words of the option that set them."""
    _check_tree(drafter, settings)
    n_max = settings.n_max
    if n_max is not None and not 0 <= n_max <= drafter.max_drafts:
        raise SettingsError(drafter.n_max_refusal(n_max))
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


def _check_tree(drafter, settings: DraftSettings) -> None:
    budget, k = settings.tree_budget, settings.tree_top_k
    if budget is None:
        if k is not None:
            raise SettingsError(f"--tree-top-k {k}: needs --tree-budget (a draft tree)")
        return
    if budget < 1:
        raise SettingsError(f"--tree-budget {budget}: a draft tree needs at least one node")
    if settings.cut != "none" or settings.n_min:
        raise SettingsError(f"--tree-budget {budget} with --cut {settings.cut} / --n-min {settings.n_min}: a cut stops "
                            "a chain at its first unsure draft; a tree spends its budget by the drafts' probabilities "
                            "(and a DSpark confidence belongs to the chain's tokens, not a branch's): use one or the "
                            "other")
    limit = drafter.tree_top_k_limit
    if k is not None and not 1 <= k <= limit:
        why = (f"{drafter.path} is a DFlash2 drafter: its lattice scores {limit} candidates per position (the "
               "selector's top_k), the other tokens have no probability" if drafter.selector else
               f"{drafter.path} drafts from a vocabulary of {limit} tokens")
        raise SettingsError(f"--tree-top-k {k}: must lie in 1..{limit}: {why}")
    n_max = default_n_max(drafter) if settings.n_max is None else settings.n_max
    k = tree_top_k(drafter, settings, n_max)
    most = most_tree_nodes(k, n_max, budget)
    if budget > most:
        raise SettingsError(f"--tree-budget {budget}: more than the {most} nodes (besides the root) a draft tree can "
                            f"have: {_tree_shape(k, n_max)}")
    blocked = drafter.target.no_tree_verify
    if blocked:
        raise SettingsError(f"--tree-budget: {drafter.target.path}: the {', '.join(blocked)} mixer cannot verify a "
                            "draft tree yet")


def _tree_shape(k: int, n_max: int) -> str:
    """Why a tree of k ranks over n_max positions has at most most_tree_nodes(k, n_max) nodes, in words."""
    if k == 1:
        return f"with top-K 1 (--tree-top-k) it is the chain of the step's {n_max} drafts (--n-max)"
    powers = [str(k)] + [f"{k}^{d}" for d in range(2, n_max + 1)]
    powers = " + ".join(powers if n_max <= 3 else powers[:2] + ["...", powers[-1]])
    return (f"top-K {k} (--tree-top-k) at each of the step's {n_max} positions (--n-max) gives at most "
            f"{powers} (k^d nodes at depth d)")


@dataclass
class Step:
    drafted: int                 # drafts offered for verification (a tree's nodes)
    accepted: int                # of them accepted (excluding the bonus; capped at a stop)
    produced: int                # tokens committed this step (accepted + bonus, capped at a stop)
    expected: ExpectedAcceptance | None = None   # sampled chains: the expected accepted drafts (expected_acceptance)


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
                         settings: DraftSettings | None = None, progress=None, sampler=None) -> SpecOutput:
    """The continuation of prompt_ids by up to n tokens, drafted by `drafter` with the draft KV `kv`: greedy, or
    sampled by `sampler` (the target's draw at each verified row, llama.cpp's exact-match rule; the output is then
    plain sampled decoding's with the same seed). progress(k): called with the number of new tokens as they are
    committed."""
    s = settings or DraftSettings()
    n_max = default_n_max(drafter) if s.n_max is None else s.n_max
    if not 0 <= n_max <= drafter.max_drafts:
        raise ValueError(f"n_max must lie in 0..{drafter.max_drafts} (the block size is {drafter.block_size})")
    top_k = None if s.tree_budget is None else tree_top_k(drafter, s, n_max)
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
    if sampler is not None:
        sampler.accept_tokens(prompt_ids)
    out.tokens.append(next_token(logits[-1], sampler))
    if progress:
        progress(1)
    while len(out.tokens) < n and out.tokens[-1] not in stop_ids:
        anchor = out.tokens[-1]
        n_drafts = min(n_max, n - len(out.tokens))
        drafts, draft_rows, tree = [], None, None if s.tree_budget is None else DraftTree.root_only()
        if n_drafts > 0:
            td = time.perf_counter()
            kv.begin_step(committed, pending.reshape(len(pending), -1), tokens=sequence(prompt_ids, out.tokens))
            if tree is None:
                chain = drafter.draft(kv, anchor, n_drafts)
                drafts = chain.tokens[:cut_length(chain, s.cut, s.p_min, s.n_min)]
                if sampler is not None and chain.rows is not None:      # the drafter's distributions
                    draft_rows = chain.rows[:len(drafts)]
            else:
                tree = build_tree(*drafter.draft_top_k(kv, anchor, n_drafts, top_k), s.tree_budget)
                drafts = tree.tokens
            out.draft_seconds += time.perf_counter() - td
        as_tree = {} if tree is None else {"tree": tree.parents}
        logits, features = target.forward([anchor] + drafts, taps=drafter.taps, logits="all", stepwise=True, **as_tree)
        expected = None
        if sampler is not None and tree is None:
            expected = expected_acceptance(sampler, logits, drafts, draft_rows)
        rows, bonus = accepted_rows(logits, drafts, tree, sampler, stop_ids)
        new = [drafts[r - 1] for r in rows[1:]] + [bonus]
        new = new[:n - len(out.tokens)]
        stop_at = next((i for i, t in enumerate(new) if t in stop_ids), None)
        if stop_at is not None:
            new = new[:stop_at + 1]
        out.tokens += new
        if progress:
            progress(len(new))
        out.steps.append(Step(drafted=len(drafts), accepted=len(new) - 1, produced=len(new), expected=expected))
        committed += len(new)
        rows = rows[:len(new)]           # the anchor and the accepted drafts the cache keeps (the bonus is not in it)
        if tree is None:
            target.kv.crop(committed)
            pending = features[:len(new)]
        else:
            target.kv.keep_path(rows)
            pending = features[rows]
    out.stop = "end-of-generation" if out.tokens[-1] in stop_ids else "length"
    out.decode_seconds = time.perf_counter() - t1
    out.draft_kv_bytes = kv.nbytes
    return out


def sequence(prompt_ids, tokens) -> list[int]:
    """The tokens so far, the anchor (tokens[-1], not yet in the target's cache) last: what an EAGLE3 / MTP draft KV
    pairs with the features (a DFlash draft KV needs features only)."""
    return [int(t) for t in prompt_ids] + tokens


def accepted_rows(logits, drafts: list, tree: DraftTree | None, sampler=None, stop_ids=()) -> tuple[list[int], int]:
    """The verified batch's accepted rows (row 0, the anchor, first; row i + 1 is draft i) and the bonus token: the
    path from the root along which the target's token at each row (its argmax, or its sampler's draw, drawn row by row
    as the path goes: one draw per committed token) is the next draft, a chain's or a tree's; a stop token ends it."""
    def target_token(row: int) -> int:
        return next_token(logits[row], sampler)

    return follow_verified_tree(tree or DraftTree.chain(drafts), target_token, stop_ids)
