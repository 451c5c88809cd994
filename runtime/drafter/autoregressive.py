"""What EAGLE3 and MTP drafters share (llama.cpp's draft-eagle3 and draft-mtp loops, common/speculative.cpp): one
decoder step per draft, each fed the token drafted before it and the decoder's own hidden state, over the drafter's
own KV cache of one attention layer.

The decoder's KV at position p holds a (token, feature row) pair. With shift s:

    row p = (tokens[p + s], features[p + s - 1])      EAGLE3: s = 1, features = g = fc(target taps) (eagle3.py)
                                                      MTP:    s = 0, features = the target's h (mtp.py); h[-1] = 0

so every committed token (prompt, accepted drafts) is paired with the target's feature row one position before it,
as process() pairs them. A draft step seeds with (anchor, features[committed - 1]) at position committed - s (the
anchor is the target's latest token, not yet in its cache: llama.cpp's id_last) and chains: draft k + 1 is
decoded from (draft k, the step's hidden state) at the next position. Rows for drafts are written where the next
committed rows go and are overwritten later: a rejected draft's row is never kept (llama.cpp drops them with
seq_rm). Committed rows are computed when the next step needs them, each with the one-row kernels (`stepwise`),
so a row has the same bits whatever batch it came in, and the same as llama.cpp's one-row decode of it.

The draft token of a step is the argmax of its logits (llama.cpp's drafter sampler: top_k 10, the first candidate);
its probability within the top 10 is what `--cut prob --p-min` tests (chain.chain_v1). A draft tree reads each
chain row's top K (the drafter gives a distribution only along its own chain, as DSpark's Markov rows).
"""

import numpy as np

from ggtools.runtime.ddtree import top_k_log_probs
from ggtools.runtime.drafter.chain import DraftChain, chain_v1
from ggtools.runtime.drafter.model import scatter_to_target_vocab
from ggtools.runtime.errors import SettingsError
from ggtools.runtime.model.kvcache import KVCache

DEFAULT_DRAFTS = 3         # llama.cpp's --spec-draft-n-max default (common.h: n_max = 3)
INITIAL_ROWS = 256         # the decoder KV's first capacity (it doubles as a sequence grows)


class PairKV:
    """An autoregressive drafter's decoder KV (module docstring): a KVCache of one attention layer holding the
    committed rows, plus the last feature row (the next step's seed pairs the anchor with it). cap: the most
    committed positions it may hold (a --ring-cap: the decoder attends to every committed position, as llama.cpp's
    draft context does, so a longer sequence is refused); None: no limit."""

    def __init__(self, drafter, kv_type: str = "f16", cap: int | None = None):
        self.drafter, self.shift, self.cap = drafter, drafter.shift, cap
        self.cache = KVCache(1, drafter.hp.n_head_kv, drafter.hp.head_dim, INITIAL_ROWS, kv_type, drafter.ops.arrays)
        self.kv_type = kv_type
        self.reset()

    def reset(self) -> None:
        self.cache.clear()
        self.rows = 0               # committed rows in the cache: positions 0 .. rows - 1
        self.committed = 0
        self.tail = None            # features[committed - 1] (projected)

    def begin_step(self, committed: int, features, tokens) -> None:
        """features: the target's tapped rows of positions [committed - len(features), committed), covering those
        not seen yet; tokens: the sequence so far, tokens[committed] the anchor. Appends the committed rows the cache
        lacks."""
        if self.cap is not None and committed > self.cap:
            raise SettingsError(f"--ring-cap {self.cap}: the {self.drafter.family} drafter attends to every "
                                f"committed position (llama.cpp keeps its whole draft KV); a sequence reached "
                                f"{committed}: use --full-kv or a larger --ring-cap")
        if committed - self.shift < self.rows or committed < self.committed:
            self.reset()
        c0, first = self.committed, committed - len(features)       # first: the position of features[0]
        if first > c0:
            raise ValueError(f"features from position {first} leave positions {c0}..{first - 1} out")
        # known[i]: the feature row of position c0 - 1 + i: the kept tail (h[-1] = 0 at the start), then the new rows
        new = self.drafter.project(features[c0 - first:].reshape(committed - c0, -1))
        known = self.drafter.ops.arrays.cat([self.tail if c0 else self.drafter.ops.zeros_like(new[:1]), new], 0)
        end = committed - self.shift                # the committed rows: positions [rows, end)
        if end > self.rows:
            lo = self.rows + self.shift - c0        # row p reads the features of position p + shift - 1
            self.cache.reserve(end)
            self.drafter.decode(self.cache, [int(t) for t in tokens[self.rows + self.shift:end + self.shift]],
                                known[lo:lo + end - self.rows], np.arange(self.rows, end), need_logits=False)
            self.rows = end
        self.committed = committed
        self.tail = known[-1:]

    @property
    def nbytes(self) -> int:
        return self.cache.nbytes

    def bytes_for(self, context: int) -> int:
        """What the cache holds once a sequence reaches `context` positions (KVCache: 256 rows, doubled as needed)."""
        rows = INITIAL_ROWS
        while rows < context:
            rows *= 2
        element = 2 if self.kv_type == "f16" else 4
        return 2 * rows * self.drafter.hp.n_head_kv * self.drafter.hp.head_dim * element


class AutoregressiveDrafter:
    """The draft loop and the loop-facing properties of an EAGLE3 or MTP drafter. A subclass sets ops, target, hp,
    path, family, shift, taps, context_length and provides project(features) -> feature rows and
    decode(cache, tokens, features, positions, need_logits) -> (logits on the host or None, hidden rows)."""

    markov = selector = d2t = None
    anchor_first = False
    default_drafts = DEFAULT_DRAFTS

    @property
    def max_drafts(self) -> int:
        """No block bounds a chain: the context does (llama.cpp caps a draft at what the context still holds)."""
        return self.context_length - 1

    def n_max_refusal(self, n_max: int) -> str:
        """check_settings' refusal of an --n-max beyond max_drafts, in words."""
        return (f"--n-max {n_max}: an {self.family.upper()} draft and its anchor fit the drafter's context of "
                f"{self.context_length} positions: at most {self.max_drafts} drafts per step")

    @property
    def block_size(self) -> int:
        """The rows a step verifies at the default --n-max (the statistics' block)."""
        return self.hp.block_size

    def new_kv(self, ring_cap: int | None = None, kv_type: str = "f16") -> PairKV:
        return PairKV(self, kv_type, ring_cap)

    def draft(self, kv: PairKV, anchor: int, n_drafts: int) -> DraftChain:
        """n_drafts drafts for positions kv.committed + 1 ...: the seed step from the anchor, then each draft fed
        back with the step's hidden state."""
        return chain_v1(self._chain_logits(kv, anchor, n_drafts))

    def draft_top_k(self, kv: PairKV, anchor: int, n_drafts: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each chain row's k most likely tokens and their log-probabilities (rank 0 the chain's draft): the only
        distributions an autoregressive drafter has are along its own chain."""
        if not 1 <= k <= self.tree_top_k_limit:
            raise ValueError(f"k must lie in 1..{self.tree_top_k_limit}")
        return top_k_log_probs(self._chain_logits(kv, anchor, n_drafts), k)

    def _chain_logits(self, kv: PairKV, anchor: int, n_drafts: int) -> np.ndarray:
        rows = []
        token, feature, position = anchor, kv.tail, kv.committed - self.shift
        kv.cache.reserve(position + n_drafts)
        for _ in range(n_drafts):
            logits, hidden = self.decode(kv.cache, [token], feature, np.array([position]), need_logits=True)
            rows.append(logits[0])
            token, feature, position = int(np.argmax(logits[0])), hidden, position + 1
        return np.stack(rows) if rows else np.zeros((0, self.n_vocab), np.float32)

    @property
    def tree_top_k_limit(self) -> int:
        return self.n_vocab if self.d2t is None else len(self.d2t)

    @property
    def n_vocab(self) -> int:
        return self.target.n_vocab

    def to_target_vocab(self, logits: np.ndarray) -> np.ndarray:
        """A reduced draft vocabulary's logits scattered through d2t into the target's (EAGLE3's ggml_set_rows)."""
        return scatter_to_target_vocab(logits, self.d2t, self.n_vocab)
