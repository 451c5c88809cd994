"""Drafter: a DFlash v1 / DFlash2 / DSpark drafter GGUF (llama.cpp or lucebox profile) run beside its target, by the
target's backend (its `ops`: numba on the CPU, or torch); this code is the same for every backend.

    ctx   = rms(fc . concat(target features)) * hidden_norm          once per committed position
    K, V  = k_norm(W_k ctx) rotated at the absolute position, W_v ctx  per layer, kept in a draft KV
    h     = embed([anchor, MASK, ...]) (* embedding_scale)            the noise block, target embedding
    layer: n = rms(h) * attn_norm; q, k, v from n (noise k/v join the context keys);
           h += W_o attention(q, context + block keys, non-causal); h += SwiGLU(rms(h) * ffn_norm)
    out   = rms(h) * output_norm; row j >= 1 predicts the token at position start + j (target head)

DFlash2 wraps both sublayers in a grouped dynamic convolution over the block (reference §5) and scales and
softcaps its logits; chain.py turns logits (and DFlash2's candidate lattice) into drafts. DSpark (dspark.py) adds
a Markov head and a confidence head; an anchor-first DSpark block drafts from every row (the anchor's too, up to
block_size drafts), every other drafter from rows 1.. (up to block_size - 1). A reduced draft vocabulary (`d2t`:
the target id of each row of the drafter's own output head) is scattered into the target vocabulary, -inf
elsewhere (llama.cpp's graph).

Context rows use `stepwise` matmuls, so a row's K/V are the same bits whatever batch it is projected in
(the ring's window equals recomputing it, and appends of any size agree).
"""

import numpy as np

from ggtools.runtime.ddtree import top_k_log_probs
from ggtools.runtime.drafter.chain import DraftChain, Selector, chain_v1, lattice_top_k
from ggtools.runtime.drafter.dspark import MarkovHead
from ggtools.runtime.drafter.hparams import DraftHParams, read_draft_hparams
from ggtools.runtime.drafter.draft_kv import DraftKV, FullKV, RingKV
from ggtools.runtime import nonfinite
from ggtools.runtime.errors import ModelError
from ggtools.runtime.kernels import ops as numba_ops


def scatter_to_target_vocab(logits: np.ndarray, d2t: np.ndarray | None, n_vocab: int) -> np.ndarray:
    """Logits over a reduced draft vocabulary (d2t: the target id of each; None: the target's vocabulary already)
    scattered into the target's n_vocab, -inf elsewhere (llama.cpp's ggml_set_rows over a -inf fill)."""
    if d2t is None:
        return logits
    full = np.full((len(logits), n_vocab), -np.inf, np.float32)
    full[:, d2t] = logits
    return full


class DynamicConv:
    """DFlash2's grouped dynamic convolution around one sublayer: the kernel is base[side, tap, channel]
    plus a per-token, per-group part projected from the sublayer's normed input; zero left padding at the
    block start. Side 0 filters the sublayer's input, side 1 its output (with the same dynamic part)."""

    def __init__(self, base, proj, kernel: int, group: int, zeros_like):
        self.base, self.proj, self.kernel, self.group, self.zeros_like = base, proj, kernel, group, zeros_like

    def prepare(self, x):
        """Normed input (T, H) -> (convolved input, dynamic kernels (T, 2, K, H / group))."""
        dyn = self.proj(x).reshape(len(x), 2, self.kernel, -1)
        return self.apply(x, dyn, 0), dyn

    def apply(self, x, dyn, side: int):
        out = self.zeros_like(x)
        n, width = x.shape
        for tap in range(min(self.kernel, n)):
            shifted = x[:n - tap]
            out[tap:] += self.base[side, tap] * shifted
            grouped = shifted.reshape(n - tap, -1, self.group)     # each group's channels scaled by its kernel
            out[tap:] += (dyn[tap:, side, tap][:, :, None] * grouped).reshape(n - tap, width)
        return out


class DraftLayer:
    def __init__(self, w, i: int, hp: DraftHParams, ops):
        """Layer i's tensors (blk.i.*) from a WeightFile of the backend `ops`."""
        p, H = f"blk.{i}.", hp.n_embd
        q_dim, kv_dim = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        self.attn_norm = ops.vector(w.vector(p + "attn_norm.weight", H))
        self.wq = w.matrix(p + "attn_q.weight", H, q_dim)
        self.wk = w.matrix(p + "attn_k.weight", H, kv_dim)
        self.wv = w.matrix(p + "attn_v.weight", H, kv_dim)
        self.wo = w.matrix(p + "attn_output.weight", q_dim, H)
        self.q_norm = ops.vector(w.vector(p + "attn_q_norm.weight", hp.head_dim))
        self.k_norm = ops.vector(w.vector(p + "attn_k_norm.weight", hp.head_dim))
        self.ffn_norm = ops.vector(w.vector(p + hp.names["ffn_norm"] + ".weight", H))
        self.gate = w.matrix(p + "ffn_gate.weight", H, hp.n_ff)
        self.up = w.matrix(p + "ffn_up.weight", H, hp.n_ff)
        self.down = w.matrix(p + "ffn_down.weight", hp.n_ff, H)
        self.qkv, self.kv, self.gate_up = (ops.group(self.wq, self.wk, self.wv), ops.group(self.wk, self.wv),
                                           ops.group(self.gate, self.up))
        self.window = hp.sliding_window if hp.sliding_layers[i] else 0
        self.attn_conv = self.ffn_conv = None
        if hp.v2:
            K, gs = hp.v2.conv_kernel, hp.v2.conv_group
            if H % gs:
                raise ModelError(f"DFlash2 hidden size {H} is not divisible by conv_group_size {gs}")
            self.attn_conv, self.ffn_conv = (
                DynamicConv(ops.vector(w.vector(p + f"{side}_conv_base", 2 * K * H).reshape(2, K, H)),
                            w.matrix(p + f"{side}_conv_proj.weight", H, 2 * K * (H // gs)), K, gs, ops.zeros_like)
                for side in ("attn", "ffn"))


class Drafter:
    """A drafter bound to its target (whose embedding and output head it uses unless it has its own)."""

    def __init__(self, path, target, mask_id: int | None = None):
        """path: drafter GGUF; target: the TargetModel it drafts for; mask_id overrides the stored one."""
        self.path = str(path)
        self.ops = ops = target.ops
        self.weights = w = ops.open_weights(path)
        self.n_vocab = target.n_vocab
        self.hp = hp = read_draft_hparams(w.meta, w.names, mask_id, self.n_vocab, w.locate)
        self.target = target
        self._check_target(target)
        H = hp.n_embd
        self.fc = w.matrix(hp.names["fc"] + ".weight", hp.fc_in, H)
        self.hidden_norm = ops.vector(w.vector(hp.names["hidden_norm"] + ".weight", H))
        self.output_norm = ops.vector(w.vector("output_norm.weight", H))
        self.layers = [DraftLayer(w, i, hp, ops) for i in range(hp.n_layer)]
        self.embedding = w.matrix("token_embd.weight", H) if w.has("token_embd.weight") else target.token_embd
        self.head = (w.matrix("output.weight", H) if w.has("output.weight")
                     else w.matrix("token_embd.weight", H) if w.has("token_embd.weight") else target.output)
        if not 0 <= hp.mask_id < self.embedding.n_rows:
            raise ModelError(f"{self.path}: mask token id {hp.mask_id} is outside the {self.embedding.n_rows}-token "
                             "embedding")
        self.d2t = w.id_vector("d2t") if w.has("d2t") else None     # its ids checked by the model-file rules
        self._check_head()
        self.selector = Selector(w, hp, ops.host) if hp.v2 else None
        self.markov = MarkovHead(w, hp, ops, self.n_vocab, self.d2t) if hp.dspark else None
        self.scale = float(np.float32(1.0) / np.sqrt(np.float32(hp.head_dim)))
        self.freq_factors = np.zeros(0, np.float32)

    def _check_head(self):
        """One row of the output head per target token, or per id of the draft vocabulary (d2t)."""
        if self.d2t is None and self.head.n_rows != self.n_vocab:
            raise ModelError(f"{self.path}: the output head has {self.head.n_rows} rows for a {self.n_vocab}-token "
                             "target vocabulary and there is no d2t table")
        if self.d2t is not None and self.head.n_rows != len(self.d2t):
            raise ModelError(f"{self.path}: the output head has {self.head.n_rows} rows for the {len(self.d2t)} ids "
                             "of the d2t table")

    def _check_target(self, target):
        hp, th = self.hp, target.hp
        if hp.n_embd != th.n_embd:
            raise ModelError(f"{self.path}: drafter hidden size {hp.n_embd} != target's {th.n_embd}")
        bad = [t for t in hp.taps if not 1 <= t <= th.n_layer]
        if bad:
            raise ModelError(f"{self.path}: target layer taps {list(hp.taps)} (HF ids + 1): {bad} outside "
                             f"1..{th.n_layer} for the {th.n_layer}-layer target")

    @property
    def taps(self) -> list[int]:
        return list(self.hp.taps)

    @property
    def block_size(self) -> int:
        return self.hp.block_size

    @property
    def anchor_first(self) -> bool:
        """The block's anchor row drafts too (DSpark with dflash.sample_from_anchor)."""
        return bool(self.hp.dspark and self.hp.dspark.sample_from_anchor)

    @property
    def max_drafts(self) -> int:
        """The most drafts one block gives (llama.cpp clamps n_max to it): block_size anchor-first, else
        block_size - 1."""
        return self.hp.block_size if self.anchor_first else self.hp.block_size - 1

    def n_max_refusal(self, n_max: int) -> str:
        """check_settings' refusal of an --n-max beyond max_drafts, in words."""
        layout = ", the anchor's row included" if self.anchor_first else ""
        return (f"--n-max {n_max}: the drafter's block of {self.block_size} drafts at most "
                f"{self.max_drafts} tokens per step{layout}")

    @property
    def family(self) -> str:
        return "dspark" if self.hp.dspark else "dflash2" if self.hp.v2 else "dflash"

    @property
    def kind(self) -> str:
        """What drafts, in words: "DFlash v1", "DFlash2", "DSpark (anchor-first, confidence head)", ..."""
        name = {"dspark": "DSpark", "dflash2": "DFlash2", "dflash": "DFlash v1"}[self.family]
        parts = []
        if self.hp.dspark:
            parts.append("anchor-first" if self.anchor_first else "bonus anchor")
            parts.append("confidence head" if self.markov.conf is not None else "no confidence head")
        if self.d2t is not None:
            parts.append(f"draft vocabulary {len(self.d2t)}")
        return name + (f" ({', '.join(parts)})" if parts else "")

    def new_kv(self, ring_cap: int | None = None, kv_type: str = "f16") -> DraftKV:
        """A FullKV, or a RingKV of ring_cap context slots."""
        hp = self.hp
        args = (self.context_kv, hp.n_layer, hp.n_head_kv, hp.head_dim, hp.block_size)
        if ring_cap is None:
            return FullKV(*args, kv_type=kv_type, zeros=self.ops.kv_zeros)
        return RingKV(*args, cap=ring_cap, kv_type=kv_type, zeros=self.ops.kv_zeros)

    def _rope(self, positions):
        rope = self._plain_rope(positions)
        # llama.cpp's converter gives drafters of M-RoPE targets the sections [n_rot/2, 0, 0, 0], which rotate
        # every pair by the position as plain RoPE does; text_rope_angles keeps any other split exact too
        still = numba_ops.fourth_section_pairs(self.hp.rope_dims // 2, self.hp.rope_sections, False) \
            if any(self.hp.rope_sections) else np.zeros(0, bool)
        if still.any():
            rope = numba_ops.text_rope_angles(rope, self._plain_rope([0]), still)
        return self.ops.tables(rope)

    def _plain_rope(self, positions):
        hp = self.hp
        return numba_ops.rope_angles(np.asarray(positions, np.int64), hp.rope_dims, hp.rope_base,
                                     np.float32(hp.rope_freq_scale), self.freq_factors, *numba_ops.NO_YARN)

    def context(self, features):
        """Target features (T, n_taps * H) -> fused context rows (T, H)."""
        return self.ops.rms_norm(self.fc(features, stepwise=True), self.hidden_norm, self.hp.rms_eps)

    def context_kv(self, features, positions) -> list[tuple]:
        """Per layer (K (T, n_kv, d) normed and rotated at `positions`, V (T, n_kv, d)) of context rows."""
        hp, ops = self.hp, self.ops
        ctx = self.context(features.reshape(len(positions), -1))
        rope = self._rope(positions)
        out = []
        for layer in self.layers:
            k, v = layer.kv(ctx, stepwise=True)
            out.append((ops.norm_rope(k, hp.n_head_kv, layer.k_norm, hp.rms_eps, rope),
                        v.reshape(len(ctx), hp.n_head_kv, hp.head_dim)))
        return out

    def forward_block(self, kv: DraftKV, block_ids):
        """The noise block at positions kv.committed, ... over the cached context -> normed hidden (T, H)."""
        hp, ops = self.hp, self.ops
        block_ids = np.asarray(block_ids, np.int64)
        positions = kv.committed + np.arange(len(block_ids))
        rope = self._rope(positions)
        h = self.embedding.rows(block_ids)
        if hp.embedding_scale != 1.0:
            h = h * np.float32(hp.embedding_scale)
        for i, layer in enumerate(self.layers):
            h = h + self._attention(layer, i, kv, ops.rms_norm(h, layer.attn_norm, hp.rms_eps), positions, rope)
            h = h + self._ffn(layer, ops.rms_norm(h, layer.ffn_norm, hp.rms_eps))
        return ops.rms_norm(h, self.output_norm, hp.rms_eps)

    def _attention(self, layer, i, kv, n, positions, rope):
        hp, ops = self.hp, self.ops
        if layer.attn_conv:
            n, dyn = layer.attn_conv.prepare(n)
        q, k, v = layer.qkv(n)
        kv.write_noise(i, ops.norm_rope(k, hp.n_head_kv, layer.k_norm, hp.rms_eps, rope),
                       v.reshape(len(n), hp.n_head_kv, hp.head_dim))
        k_store, v_store, rows, key_pos = kv.visible(i)
        attn = ops.draft_attention(ops.norm_rope(q, hp.n_head, layer.q_norm, hp.rms_eps, rope), k_store, v_store,
                                   rows, key_pos, positions, self.scale, layer.window, hp.causal)
        out = layer.wo(attn)
        return layer.attn_conv.apply(out, dyn, 1) if layer.attn_conv else out

    def _ffn(self, layer, m):
        if layer.ffn_conv:
            m, dyn = layer.ffn_conv.prepare(m)
        gate, up = layer.gate_up(m)
        out = layer.down(self.ops.swiglu(gate, up))
        return layer.ffn_conv.apply(out, dyn, 1) if layer.ffn_conv else out

    def logits(self, hidden, block=()) -> np.ndarray:
        """Draft rows' hidden states -> logits in the target vocabulary on the host (draft_logits)."""
        return self.to_target_vocab(self.draft_logits(hidden, block))

    def draft_logits(self, hidden, block=()) -> np.ndarray:
        """Draft rows' hidden states -> logits in the draft vocabulary on the host (DFlash2: scaled, then
        softcapped); NonFiniteError when the head's are not finite (checked before the softcap, whose tanh makes
        inf finite; block: the block's ids, to name an embedding row that made them)."""
        logits = self.ops.host(self.head(hidden))
        if not np.isfinite(logits).all():
            raise nonfinite.drafter_error(self, block)
        v2 = self.hp.v2
        if v2:
            if v2.logit_scale != 1.0:
                logits *= np.float32(v2.logit_scale)
            if v2.softcap > 0:
                c = np.float32(v2.softcap)
                logits = np.tanh(logits / c) * c
        return logits

    def to_target_vocab(self, logits: np.ndarray) -> np.ndarray:
        """A reduced draft vocabulary's logits scattered through d2t into the target's, -inf elsewhere."""
        return scatter_to_target_vocab(logits, self.d2t, self.n_vocab)

    def draft(self, kv: DraftKV, anchor: int, n_drafts: int) -> DraftChain:
        """n_drafts drafts (1 .. max_drafts) for positions kv.committed + 1 ... from the block [anchor, MASK, ...]:
        n_drafts rows anchor-first, else n_drafts + 1 rows of which rows 1.. draft."""
        hidden, block = self._drafting_rows(kv, anchor, n_drafts)
        return self.propose(hidden, anchor, block)

    def _drafting_rows(self, kv: DraftKV, anchor: int, n_drafts: int):
        """(the drafting rows' hidden states, the block's ids) of the block for n_drafts drafts."""
        first = 0 if self.anchor_first else 1
        block = [anchor] + [self.hp.mask_id] * (n_drafts + first - 1)
        return self.forward_block(kv, block)[first:], block

    def propose(self, hidden, anchor: int, block=None) -> DraftChain:
        """The drafting rows' hidden states -> the draft chain; NonFiniteError when their logits are not finite
        (block: the block's ids, to name an embedding row that made them)."""
        logits = self.logits(hidden, block if block is not None else [anchor])
        if self.selector:
            return self.selector.walk(logits, hidden, anchor)
        if self.markov:
            return self.markov.walk(logits, hidden, anchor)
        return chain_v1(logits)

    @property
    def tree_top_k_limit(self) -> int:
        """The most ranks per position a draft tree can read: DFlash2's candidates per row (only they have a
        score), else the tokens of the draft vocabulary (the others have no probability)."""
        if self.selector:
            return min(self.selector.top_k, self.n_vocab)
        return self.n_vocab if self.d2t is None else len(self.d2t)

    def draft_top_k(self, kv: DraftKV, anchor: int, n_drafts: int, k: int) -> tuple[np.ndarray, np.ndarray]:
        """What a draft tree (runtime/ddtree.py) reads from the block draft() runs: for each of the n_drafts
        positions, the k most likely tokens and their log-probabilities, (L, k) float32 and ids, rank 0 the chain's
        draft. DFlash v1: the log-softmax of each drafting row's logits (in the target vocabulary). DSpark: of its
        Markov-biased logits along the chain (each row biased by the chain's token before it, as draft() walks
        it). DFlash2: of the lattice scores of each row of the walk (its candidates only; k <= the selector's
        top_k)."""
        if not 1 <= k <= self.tree_top_k_limit:
            raise ValueError(f"k must lie in 1..{self.tree_top_k_limit}")
        hidden, block = self._drafting_rows(kv, anchor, n_drafts)
        logits = self.logits(hidden, block)
        if self.selector:
            return lattice_top_k(self.selector.lattice(logits, hidden, anchor), k)
        if self.markov:
            logits, _ = self.markov.chain_logits(logits, anchor)
        return top_k_log_probs(logits, k)

    def close(self):
        self.weights.close()
