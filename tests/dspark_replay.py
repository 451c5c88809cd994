"""The runtime's DSpark draft steps replayed through libllama's own drafter graph (scripts/fixtures/llama_drafter.py).

A speculative run is recorded (`record_run`): the target features the draft KV received and, per step, the block
the drafter decoded (committed position, tokens, which rows draft) with the runtime's Markov-biased logits and its
chain. `libllama_blocks` decodes the same blocks on the same features with libllama (the target as ctx_other),
giving each row's draft logits and DSpark confidence. `llama_cpp_drafts` applies common/speculative.cpp's
draft-dspark rule to them (the drafted token is the row's top logit; with p_min > 0 stop before the first row
whose confidence is below p_min; fewer than n_min: none); `accepted_lengths` verifies drafts against the greedy
output as the loop does.

Tolerances (`LogitBound`): libllama's drafter attention multiplies its f16 draft KV cache with q and the
softmax weights rounded to f16 (ggml's mul_mat converts src1 to the f16 cache's vec_dot type), where the runtime's
drafter attention keeps both in f32: each rounding is relative 2^-11. Through the layers and the head that bounds
a logit's difference by RELATIVE * max(1, |logits|) with RELATIVE = 8 * 2^-11 (two roundings per layer, two
layers, a factor 2 of margin); the confidence (a sigmoid, slope <= 1/4, of a projection of the hidden state) by
CONFIDENCE_ATOL. The bounds are loose (the roundings mostly cancel; measured differences are ~20 times smaller),
so drafted tokens are compared exactly (`agreeing_rows`): where libllama's token differs from the runtime's, the
runtime's own logits of the two tokens must lie within twice the bound (a near-tie the roundings may decide
either way), and the block's later rows are not compared (the chain's next prev differs); tests require such
near-ties to be rare, so the comparison is never vacuous.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from scripts.fixtures import llama_drafter

RELATIVE = 8 * 2.0 ** -11
CONFIDENCE_ATOL = 2e-3


@dataclass
class Block:
    committed: int
    tokens: list                # the decoded block [anchor, MASK ...]
    first: int                  # the first drafting row (0 anchor-first, else 1)
    biased: np.ndarray          # the runtime's Markov-biased logits of the drafting rows
    chain: object               # the runtime's DraftChain


@dataclass
class Recording:
    features: dict = field(default_factory=dict)    # position -> feature row the draft KV received
    blocks: list = field(default_factory=list)

    def feature_array(self) -> np.ndarray:
        return np.stack([self.features[p] for p in range(max(self.features) + 1)]).astype(np.float32)


class RecordingKV:
    """A draft KV that keeps the features it is given."""

    def __init__(self, kv, recording: Recording):
        self.kv, self.recording = kv, recording

    def begin_step(self, committed, features, tokens=None):
        first = committed - len(features)
        for i, row in enumerate(features):
            self.recording.features[first + i] = np.array(row, np.float32)
        self.kv.begin_step(committed, features)

    def __getattr__(self, name):
        return getattr(self.kv, name)


class RecordingDrafter:
    """A DSpark drafter that records every block it drafts (its own draft(), spelled out)."""

    def __init__(self, drafter, recording: Recording):
        self.drafter, self.recording = drafter, recording
        self.taps, self.block_size, self.max_drafts = drafter.taps, drafter.block_size, drafter.max_drafts

    def draft(self, kv, anchor, n_drafts):
        d = self.drafter
        first = 0 if d.anchor_first else 1
        block = [anchor] + [d.hp.mask_id] * (n_drafts + first - 1)
        hidden = d.forward_block(kv, block)[first:]
        biased, _ = d.markov.chain_logits(d.logits(hidden), anchor)
        chain = d.propose(hidden, anchor)
        self.recording.blocks.append(Block(kv.committed, block, first, biased, chain))
        return chain


def record_run(generate, drafter, kv, *args, **kwargs):
    """generate(drafter, kv, *args, **kwargs) (speculative_generate's arguments after the target) with recording
    wrappers -> (its output, the Recording)."""
    rec = Recording()
    out = generate(RecordingDrafter(drafter, rec), RecordingKV(kv, rec), *args, **kwargs)
    return out, rec


def libllama_blocks(target, draft, recordings: list[Recording]) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per recording, per block: libllama's (logits of the drafting rows, their confidences), one child process."""
    with tempfile.TemporaryDirectory(prefix="ggtools-dspark-") as tmp:
        ops = []
        for i, rec in enumerate(recordings):
            np.save(Path(tmp) / f"f{i}.npy", rec.feature_array())
            ops.append({"target": str(target), "draft": str(draft),
                        "features": str(Path(tmp) / f"f{i}.npy"), "out": str(Path(tmp) / f"o{i}.npz"),
                        "blocks": [{"committed": b.committed, "tokens": [int(t) for t in b.tokens]}
                                   for b in rec.blocks]})
        results = llama_drafter.run_subprocess(ops)
        assert all(r.get("ok") for r in results), json.dumps(results)[:2000]
        out = []
        for i, rec in enumerate(recordings):
            z = np.load(Path(tmp) / f"o{i}.npz")
            out.append([(z["logits"][j, b.first:len(b.tokens)], z["nextn0"][j, b.first:len(b.tokens)])
                        for j, b in enumerate(rec.blocks)])
        return out


def logit_bound(logits: np.ndarray) -> float:
    finite = logits[np.isfinite(logits)]
    return RELATIVE * max(1.0, float(np.abs(finite).max()) if finite.size else 1.0)


def agreeing_rows(ours: list, biased: np.ndarray, theirs: np.ndarray, bound: float) -> int:
    """How many leading drafting rows draft the same token in the runtime (`ours`, from logits `biased`) and in
    libllama (logits `theirs`); asserts that the first row that differs, if any, is a near-tie under the bound."""
    for i, (mine, row) in enumerate(zip(ours, theirs)):
        other = int(np.argmax(row))
        if other != mine:
            gap = float(biased[i, mine] - biased[i, other])
            assert gap <= 2 * bound, f"row {i}: the runtime drafts {mine}, libllama {other}; logit gap {gap}"
            return i
    return len(ours)


def llama_cpp_drafts(logits: np.ndarray, confidence: np.ndarray, p_min: float = 0.0, n_min: int = 0) -> list:
    """common/speculative.cpp's draft-dspark loop over one block's drafting rows."""
    out = []
    for row, c in zip(logits, confidence):
        if p_min > 0 and c < p_min:
            break
        out.append(int(np.argmax(row)))
    return out if len(out) >= n_min else []


def accepted_lengths(outputs: list, prompt_len: int, blocks: list, drafts: list, n: int, stop_ids=()) -> list:
    """Per step: the drafts the target's greedy output accepts (the loop's count: capped at n and at a stop)."""
    accepted = []
    for b, d in zip(blocks, drafts):
        k = b.committed - prompt_len                  # the anchor is output token k
        want = outputs[k + 1:]
        acc = 0
        while acc < len(d) and acc < len(want) and d[acc] == want[acc]:
            acc += 1
        new = (d[:acc] + want[acc:acc + 1])[:n - (k + 1)]
        stop = next((i for i, t in enumerate(new) if t in stop_ids), None)
        accepted.append(len(new[:stop + 1] if stop is not None else new) - 1)
    return accepted


def assert_drafts_equal_libllama(target, drafter, recordings: list[Recording]) -> None:
    """Every recorded block against libllama's decoding of it (target: the target GGUF): the -inf pattern of the
    drafting rows' logits exactly (d2t: -inf outside the draft vocabulary), their logits and confidences within the
    bounds on the rows both chains drafted from the same prev, and at least 95% of the rows compared (near-ties
    rare)."""
    compared = rows = 0
    for rec, ref in zip(recordings, libllama_blocks(target, drafter.path, recordings)):
        for b, (logits, conf) in zip(rec.blocks, ref):
            assert logits.shape == b.biased.shape
            assert (np.isfinite(logits) == np.isfinite(b.biased)).all()
            bound = logit_bound(logits)
            n = agreeing_rows(b.chain.tokens, b.biased, logits, bound)
            same_prev = slice(0, n + 1)          # rows whose Markov bias both chains computed from the same prev
            finite = np.isfinite(logits[same_prev])
            assert np.abs(logits[same_prev][finite] - b.biased[same_prev][finite]).max() <= bound
            if drafter.markov.conf is not None:
                assert np.abs(np.asarray(b.chain.confidence)[same_prev] - conf[same_prev]).max() <= CONFIDENCE_ATOL
            compared, rows = compared + n, rows + len(b.biased)
    assert compared >= 0.95 * rows, (compared, rows)
