"""From a drafter's block output to a draft chain, with the confidence signals the early cuts use.

- DFlash v1: draft j = argmax of row j's logits. Confidence: `p` = softmax probability of the argmax over
  the top 10 logits (llama.cpp's top-k 10 sampler), `margin` = top1 - top2 logit.
- DFlash2: the candidate-selector lattice (reference §5). Row e's candidates are its top-k tokens by
  scaled/softcapped logit, sorted by logit then lower id (z-lab's tie order); score[j] = logit[cand_j] +
  sum_r pred[prev, r] * gate_e[r] * succ[cand_j, r], with prev the anchor for e = 1, else the token chosen at
  e - 1; the walk takes the first maximum. Confidence over the scores of the row walked: `p` = softmax at
  the chosen slot, `margin` = top1 - top2 score.

- DSpark (dspark.py): v1's chain over the Markov-biased logits, plus each row's confidence head output.

A draft tree (runtime/ddtree.py) reads per-position top-K distributions instead: v1's rows, DSpark's biased rows
along the chain and DFlash2's lattice rows along its walk (`lattice_top_k`); Drafter.draft_top_k says which.

Cuts (`cut_length`): "prob" stops before the first draft with p < p_min (llama.cpp's DFlash rule); "margin"
before the first with margin < 3 * p_min (the seeds' margin cut); "confidence" before the first with confidence
< p_min (llama.cpp's draft-dspark rule: per position, not cumulative). Fewer than n_min surviving drafts: none
are offered (llama.cpp's rule).
"""

from dataclasses import dataclass

import numpy as np

from ggtools.runtime import nonfinite
from ggtools.runtime.ddtree import top_k_log_probs

P_TOP_K = 10          # llama.cpp's DFlash draft sampler: top-k 10, then softmax
MARGIN_SCALE = 3.0    # margin cut threshold = MARGIN_SCALE * p_min
CUTS = ("none", "prob", "margin", "confidence")


@dataclass
class DraftChain:
    tokens: list[int]
    p: list[float]          # probability of each chosen draft (see module docstring)
    margin: list[float]     # top1 - top2 logit (v1) or lattice score (DFlash2)
    confidence: list[float] | None = None   # DSpark's confidence head, per draft (None: no head)
    rows: np.ndarray | None = None          # the logits each draft was chosen from (n, n_vocab), -inf where a
                                            # drafter never proposes (DFlash2: outside its candidates)


def _confidence(values: np.ndarray, chosen: float, top_k: int | None = None) -> tuple[float, float]:
    top = np.sort(values if top_k is None or top_k >= values.size else np.partition(values, -top_k)[-top_k:])
    p = 1.0 / float(np.sum(np.exp((top - chosen).astype(np.float64))))
    margin = float(top[-1] - top[-2]) if top.size > 1 else float("inf")
    return p, margin


def chain_v1(logits: np.ndarray) -> DraftChain:
    tokens = np.argmax(logits, axis=1)
    k = min(P_TOP_K, logits.shape[1])
    top = np.sort(np.partition(logits, -k, axis=1)[:, -k:], axis=1).astype(np.float64)
    p = 1.0 / np.exp(top - top[:, -1:]).sum(axis=1)
    margin = top[:, -1] - top[:, -2] if k > 1 else np.full(len(top), np.inf)
    return DraftChain(tokens.tolist(), p.tolist(), margin.tolist(), rows=logits)


def top_candidates(row: np.ndarray, k: int) -> np.ndarray:
    """The k largest entries' ids, by value descending, ties to the lower id."""
    k = min(k, row.size)
    threshold = row[np.argpartition(-row, k - 1)[:k]].min()
    above = np.flatnonzero(row > threshold)
    ids = np.concatenate([above, np.flatnonzero(row == threshold)[:k - above.size]])
    return ids[np.lexsort((ids, -row[ids]))]


class Selector:
    """DFlash2's candidate selector: hidden projection [R, H] and the two codebooks [V, R]. The walk runs on the
    host: `host` brings a backend's array there (the gates and the codebook rows it reads)."""

    def __init__(self, w, hp, host=np.asarray):
        R = hp.v2.selector_rank
        self.top_k = hp.v2.selector_top_k
        self.weights = w
        with w.recording() as self.tensors:
            self.hidden_projection = w.matrix("selector_hidden.weight", hp.n_embd, R)
            self.predecessor = w.matrix("selector_predecessor.weight", R)
            self.successor = w.matrix("selector_successor.weight", R)
        self.host = host

    def walk(self, logits: np.ndarray, hidden, anchor: int) -> DraftChain:
        tokens, ps, margins = [], [], []
        rows = np.full(np.shape(logits), -np.inf, np.float32)
        for row, (cand, scores) in zip(rows, self.lattice(logits, hidden, anchor)):
            j = int(np.argmax(scores))
            p, margin = _confidence(scores, scores[j])
            tokens.append(int(cand[j]))
            ps.append(p)
            margins.append(margin)
            row[cand] = scores
        return DraftChain(tokens, ps, margins, rows=rows)

    def lattice(self, logits: np.ndarray, hidden, anchor: int):
        """The walk's rows: per drafting row, (its candidates, their scores given the token chosen at the row
        before: the anchor for the first), the chosen token being the candidate of the first maximum score."""
        gates = self.host(self.hidden_projection(hidden))
        prev = anchor
        for row, gate in zip(logits, gates):
            cand = top_candidates(row, self.top_k)
            scores = row[cand] + (self.host(self.predecessor.rows([prev]))[0] * gate) @ self.host(
                self.successor.rows(cand)).T
            if not np.isfinite(scores).all():
                raise nonfinite.tensors_error(self.weights.meta.path, self.weights, "the candidate selector",
                                              self.tensors, "the draft scores are not finite")
            yield cand, scores
            prev = int(cand[int(np.argmax(scores))])


def lattice_top_k(rows, k: int) -> tuple[np.ndarray, np.ndarray]:
    """DFlash2's per-position distributions for a draft tree: each row of the walk (Selector.lattice) as the
    log-softmax of its candidates' scores, the k best (ties to the earlier candidate, so rank 0 is the walk's
    choice) -> (log-probabilities (L, k) float32, token ids (L, k))."""
    log_probs, ids = [], []
    for cand, scores in rows:
        lp, order = top_k_log_probs(np.asarray(scores, np.float32)[None], k)
        log_probs.append(lp[0])
        ids.append(cand[order[0]])
    return np.array(log_probs, np.float32).reshape(-1, k), np.array(ids, np.int64).reshape(-1, k)


def cut_length(chain: DraftChain, cut: str = "none", p_min: float = 0.0, n_min: int = 0) -> int:
    """How many of the chain's drafts to offer for verification."""
    if cut not in CUTS:
        raise ValueError(f"cut must be one of {', '.join(CUTS)}, not {cut!r}")
    n = len(chain.tokens)
    if cut == "prob" and p_min > 0:
        n = next((i for i, p in enumerate(chain.p) if p < p_min), n)
    elif cut == "margin" and p_min > 0:
        n = next((i for i, m in enumerate(chain.margin) if m < MARGIN_SCALE * p_min), n)
    elif cut == "confidence" and p_min > 0:
        if chain.confidence is None:
            raise ValueError("a confidence cut needs a drafter with a confidence head")
        n = next((i for i, c in enumerate(chain.confidence) if c < p_min), n)
    return n if n >= n_min else 0
