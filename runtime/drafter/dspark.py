"""DSpark's heads on top of a DFlash drafter (reference §13; llama.cpp's build_dspark_markov_head in
src/models/dflash.cpp and the draft-dspark loop of common/speculative.cpp).

Markov head, low rank R: W1 (markov_w1, one R-vector per target token) and W2 (markov_w2, R -> draft vocabulary,
times markov_w2.scale when the file has it). Over the drafting rows i of a block, in order:

    L_i    = U_i + scatter(W2 . W1[prev_i])      U_i the row's base logits (in the target vocabulary), the bias
                                                 scattered through d2t when the draft vocabulary is reduced
    prev_0 = the anchor;  prev_{i+1} = argmax L_i (the first maximum, as ggml_argmax)

Confidence head (optional): c_i = sigmoid(conf_proj . [h_i ; W1[prev_i]] + b), h_i the row's final normed hidden
state. llama.cpp cuts the draft before the first row with c_i < p_min (chain.cut_length "confidence").

Which rows draft is the block layout (Drafter.draft): anchor-first (dflash.sample_from_anchor, DeepSpec) every
row of [anchor, MASK ...], the anchor's included; bonus anchor (speculators) rows 1.., as DFlash.
"""

import numpy as np

from ggtools.runtime import nonfinite
from ggtools.runtime.drafter.chain import DraftChain, chain_v1
from ggtools.runtime.errors import ModelError
from ggtools.runtime.kernels.ops import sigmoid_rows


class MarkovHead:
    """W1, W2 (and its scale), the confidence projection; runs the chain on the host (`ops.host` brings the
    backend's rows there)."""

    def __init__(self, w, hp, ops, n_vocab: int, d2t: np.ndarray | None):
        """w: the drafter's WeightFile; n_vocab: the target vocabulary (W1's rows); d2t: the target id of each
        draft-vocabulary row (None: the draft vocabulary is the target's)."""
        self.ops, self.d2t = ops, d2t
        self.path, self.weights = w.meta.path, w
        with w.recording() as markov_tensors:
            shape = w.shape("markov_w1.weight")
            if len(shape) != 2 or shape[0] < 1:
                raise ModelError(f"{w.meta.path}: markov_w1.weight has ne {shape}, expected [rank, {n_vocab}]")
            self.rank = rank = shape[0]
            self.w1 = w.matrix("markov_w1.weight", rank, n_vocab)
            self.w2 = w.matrix("markov_w2.weight", rank, n_vocab if d2t is None else len(d2t))
            scale = w.optional_vector("markov_w2.scale", 1)
        self.w2_scale = None if scale is None else np.float32(scale[0])
        self.markov_tensors = markov_tensors
        with w.recording() as conf_tensors:
            self.conf = w.matrix("conf_proj.weight", hp.n_embd + rank, 1) if w.has("conf_proj.weight") else None
            bias = w.optional_vector("conf_proj.bias", 1)
        self.conf_bias = np.float32(0.0) if bias is None else np.float32(bias[0])
        self.conf_tensors = conf_tensors + markov_tensors        # it reads W1's rows too

    def walk(self, logits: np.ndarray, hidden, anchor: int) -> DraftChain:
        """logits: the drafting rows' base logits (rows, n_vocab) on the host; hidden: their normed hidden states
        (the backend's array) -> the chain, with each row's confidence when the file has the head."""
        rows, w1_rows = self.chain_logits(logits, anchor)
        chain = chain_v1(rows)
        if self.conf is not None and len(rows):
            chain.confidence = self.confidence(hidden, self.ops.arrays.cat(w1_rows, 0)).tolist()
        return chain

    def chain_logits(self, logits: np.ndarray, anchor: int) -> tuple[np.ndarray, list]:
        """The Markov chain over the drafting rows: (their biased logits L_i, W1[prev_i] of each row)."""
        rows, w1_rows, prev = [], [], int(anchor)
        for base in logits:
            w1_prev = self.w1.rows([prev])
            bias = self.ops.host(self.w2(w1_prev))[0]
            if self.w2_scale is not None:
                bias = bias * self.w2_scale
            if not np.isfinite(bias).all():
                raise nonfinite.tensors_error(self.path, self.weights, "the Markov head", self.markov_tensors,
                                              "the draft logits are not finite")
            row = base.copy()
            if self.d2t is None:
                row += bias
            else:
                row[self.d2t] += bias
            rows.append(row)
            w1_rows.append(w1_prev)
            prev = int(np.argmax(row))
        return (np.stack(rows) if rows else logits), w1_rows

    def confidence(self, hidden, w1_prev) -> np.ndarray:
        """sigmoid(conf_proj . [hidden ; W1[prev]] + b) per row (float32, ggml's sigmoid); NonFiniteError when
        the sum is not finite (NaN would never be below p_min, and the sigmoid of inf is a finite 1)."""
        z = self.ops.host(self.conf(self.ops.arrays.cat([hidden, w1_prev], 1)))[:, :1] + self.conf_bias
        z = np.ascontiguousarray(z, np.float32)
        if not np.isfinite(z).all():
            raise nonfinite.tensors_error(self.path, self.weights, "the confidence head", self.conf_tensors,
                                          "the draft confidences are not finite")
        sigmoid_rows(z, z)
        return z[:, 0]
