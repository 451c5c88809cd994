"""EAGLE3 drafter (llama.cpp's `eagle3` arch: src/models/eagle3.cpp, common/speculative.cpp's draft-eagle3), run by the
target's backend (its ops and pieces), the draft loop shared with MTP (autoregressive.py).

    feat  = concat(target taps)              the inputs of layers eagle3.target_layers (TargetModel taps: the
                                             residual stream entering layer id; id == n_layer: the target's h_nextn)
    g     = fc . (rms(feat) * enc.output_norm if norm_before_fc else feat)     the encoder, once per position
    step (token x, g) at position p, the decoder's one layer:
      en  = rms(embed(x)) * attn_norm,  gn = rms(g) * attn_norm_2
      r   = W_o attention(W_{q,k,v} . concat(en, gn))  (NORM RoPE at p, own KV, 1/sqrt(head_dim))
            + (gn if norm_before_residual else g)
      y   = r + SwiGLU(rms(r) * ffn_norm)              the next step's g (pre-norm: llama.cpp's t_h_nextn)
      logits = head(rms(y) * output_norm)              own output or the target's; d2t scatters a reduced vocabulary
"""

from dataclasses import dataclass

import numpy as np

from ggtools.dflash import eagle3 as E
from ggtools.hparam_rules import eagle3_pair_violations, model_violations
from ggtools.hparam_rules.eagle3 import stale_tap
from ggtools.runtime import nonfinite
from ggtools.runtime.drafter.autoregressive import DEFAULT_DRAFTS, AutoregressiveDrafter
from ggtools.runtime.errors import ModelError, refuse_violations
from ggtools.runtime.kernels import ops as numba_ops

# target archs (of this runtime) whose llama.cpp graph sets t_h_nextn to the state after output_norm, what
# TargetModel's tap at n_layer gives (gpt-oss's is the state before it; llama, qwen3 ... never write it)
POST_NORM_NEXTN_ARCHS = ("qwen35", "qwen35moe")


@dataclass(frozen=True)
class Eagle3HParams:
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    rope_dims: int
    rope_freq_scale: float
    taps: tuple                 # eagle3.target_layers: llama_set_embeddings_layer_inp ids (layer inputs)
    target_hidden_size: int
    norm_before_fc: bool
    norm_before_residual: bool
    context_length: int
    profile: str = "llama.cpp"
    n_layer: int = 1
    block_size: int = DEFAULT_DRAFTS + 1    # the rows a step verifies at the default --n-max
    rope_neox: bool = False     # llama.cpp gives eagle3 LLAMA_ROPE_TYPE_NORM
    v2 = None
    dspark = None

    @property
    def attn_scale(self) -> float:
        return float(np.float32(1.0) / np.sqrt(np.float32(self.head_dim)))

    @property
    def fc_in(self) -> int:
        return E.N_TAPS * self.target_hidden_size


def read_eagle3_hparams(gguf, locate=None) -> Eagle3HParams:
    """The keys llama.cpp's eagle3 loader reads (src/models/eagle3.cpp), once the family's model-file rules
    (hparam_rules/eagle3.py, through model_violations: keys, tensors, d2t) pass; what this runtime cannot run although
    the file is valid is refused here."""
    refuse_violations(gguf.path, model_violations(gguf, locate))

    def key(name, default=None):
        value = gguf.get(f"{E.ARCH}.{name}")
        return default if value is None else value

    n_embd, n_head = int(key("embedding_length")), int(key("attention.head_count"))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    scaling = key("rope.scaling.type", "none")
    factor = float(key("rope.scaling.factor", 0.0) or 1.0)
    if scaling not in ("none", "linear") and factor != 1.0:
        raise ModelError(f"{gguf.path}: {E.ARCH}.rope.scaling.type '{scaling}' is not supported by this runtime yet")
    taps = [int(t) for t in np.asarray(key(E.TARGET_LAYERS), np.int64)]
    return Eagle3HParams(
        n_embd=n_embd, n_ff=int(key("feed_forward_length")), n_head=n_head,
        n_head_kv=int(key("attention.head_count_kv", n_head)), head_dim=head_dim,
        rms_eps=float(key("attention.layer_norm_rms_epsilon")), rope_base=float(key("rope.freq_base", 10000.0)),
        rope_dims=int(key("rope.dimension_count", head_dim)), rope_freq_scale=1.0 / factor, taps=tuple(taps),
        target_hidden_size=int(key(E.TARGET_HIDDEN)), norm_before_fc=bool(key(E.NORM_BEFORE_FC, False)),
        norm_before_residual=bool(key(E.NORM_BEFORE_RESIDUAL, False)), context_length=int(key("context_length")))


class Eagle3Drafter(AutoregressiveDrafter):
    """An EAGLE3 drafter GGUF bound to its target (whose embedding and head it uses unless it has its own)."""

    family = "eagle3"
    kind = "EAGLE3"
    shift = 1            # row p pairs tokens[p + 1] with g[p]

    def __init__(self, path, target):
        self.path, self.target = str(path), target
        self.ops = ops = target.ops
        self.weights = w = ops.open_weights(path)
        self.hp = hp = read_eagle3_hparams(w.meta, w.locate)
        self._check_target(target)
        E, q_dim, kv_dim = hp.n_embd, hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        self.fc = w.matrix("fc.weight", hp.fc_in, E)
        self.enc_norm = ops.vector(w.vector("enc.output_norm.weight", hp.fc_in)) if hp.norm_before_fc else None
        self.attn_norm = ops.vector(w.vector("blk.0.attn_norm.weight", E))
        self.g_norm = ops.vector(w.vector("blk.0.attn_norm_2.weight", E))
        self.attention = ops.pieces.Attention(wq=w.matrix("blk.0.attn_q.weight", 2 * E, q_dim),
                                              wk=w.matrix("blk.0.attn_k.weight", 2 * E, kv_dim),
                                              wv=w.matrix("blk.0.attn_v.weight", 2 * E, kv_dim),
                                              wo=w.matrix("blk.0.attn_output.weight", q_dim, E))
        self.ffn_norm = ops.vector(w.vector("blk.0.ffn_norm.weight", E))
        self.ffn = ops.pieces.DenseFFN.load(w, hp, 0)
        self.output_norm = ops.vector(w.vector("output_norm.weight", E))
        self.embedding = w.matrix("token_embd.weight", E) if w.has("token_embd.weight") else target.token_embd
        self.head = w.matrix("output.weight", E) if w.has("output.weight") else target.output
        self.d2t = w.id_vector("d2t") if w.has("d2t") else None
        self._check_vocabulary()
        freq_factors = w.optional_vector("rope_freqs.weight", hp.rope_dims // 2)
        self.freq_factors = np.zeros(0, np.float32) if freq_factors is None else freq_factors

    @property
    def taps(self) -> list[int]:
        return list(self.hp.taps)

    @property
    def context_length(self) -> int:
        return self.hp.context_length

    def _check_target(self, target):
        """eagle3_pair_violations (llama.cpp's aborts: feature width, tap ids, a borrowed embedding or head that does
        not fit), less what this runtime runs all the same: a target arch whose llama.cpp graph exposes no layer
        inputs (run_speculative warns: pair_warnings) and another vocabulary (doctor's finding; drafts are rejected);
        then the tap at n_layer, which must be the state this runtime taps there."""
        th = target.hp
        refuse_violations(self.path, [v for v in eagle3_pair_violations(self.weights.meta, target.weights.meta,
                                                                        target.weights.locate)
                                      if v.check not in ("target_arch", "vocab")])
        if th.n_layer not in self.hp.taps or th.arch in POST_NORM_NEXTN_ARCHS:
            return
        stale = stale_tap(self.weights.meta, th.arch, th.n_layer)
        raise ModelError(f"{self.path}: {E.ARCH}.target_layers {list(self.hp.taps)}: " + (
            stale or f"target layer id {th.n_layer} is the target's h_nextn, which llama.cpp's '{th.arch}' graph takes "
                     "before output_norm; this runtime taps the state after it (the h_nextn of "
                     f"{', '.join(POST_NORM_NEXTN_ARCHS)})"))

    def _check_vocabulary(self):
        """The embedding, head and d2t the drafter reads, against the target's vocabulary, which its tokens index (the
        model-file rules check the file against its own tokenizer)."""
        if self.embedding.n_rows != self.n_vocab:
            raise ModelError(f"{self.path}: token_embd.weight has {self.embedding.n_rows} rows for the target's "
                             f"{self.n_vocab}-token vocabulary")
        rows = self.n_vocab if self.d2t is None else len(self.d2t)
        if self.head.n_rows != rows:
            head = "output.weight" if self.weights.has("output.weight") else f"the target's head ({self.target.path})"
            needs = f"the {rows} ids of d2t" if self.d2t is not None else f"the target's {rows}-token vocabulary"
            raise ModelError(f"{self.path}: {head} has {self.head.n_rows} rows for {needs}")
        if self.d2t is not None:
            bad = np.flatnonzero((self.d2t < 0) | (self.d2t >= self.n_vocab))
            if bad.size:
                raise ModelError(f"{self.path}: tensor 'd2t': d2t[{bad[0]}] = {self.d2t[bad[0]]} lies outside the "
                                 f"target's {self.n_vocab}-token vocabulary (EAGLE-3 d2t target ids out of range)")

    def project(self, features):
        """Target taps (T, 3 * target hidden) -> g (T, E): the encoder (one-row kernels, so a row's bits do not
        depend on its batch)."""
        if self.enc_norm is not None:
            features = self.ops.rms_norm(features, self.enc_norm, self.hp.rms_eps)
        return self.fc(features, stepwise=True)

    def _rope(self, positions):
        hp = self.hp
        return self.ops.tables(numba_ops.rope_angles(np.asarray(positions, np.int64), hp.rope_dims, hp.rope_base,
                                                     np.float32(hp.rope_freq_scale), self.freq_factors,
                                                     *numba_ops.NO_YARN))

    def decode(self, cache, tokens, g, positions, need_logits: bool):
        """The decoder on (tokens, g rows) at positions (their K/V written to the cache) -> (logits in the target
        vocabulary on the host, or None; y, the pre-norm hidden rows)."""
        ops, hp = self.ops, self.hp
        ids = np.asarray(tokens, np.int64)
        en = ops.rms_norm(self.embedding.rows(ids), self.attn_norm, hp.rms_eps)
        gn = ops.rms_norm(g, self.g_norm, hp.rms_eps)
        attn = self.attention(ops.arrays.cat([en, gn], 1), positions, self._rope(positions), cache, 0, hp, True)
        cache.n_tokens = max(cache.n_tokens, int(positions[-1]) + 1)
        if not need_logits:         # a committed row: only its K/V, now in the cache, are read again
            return None, None
        y = self.ffn.with_residual(ops, attn + (gn if hp.norm_before_residual else g), self.ffn_norm, hp.rms_eps, True)
        logits = ops.host(self.head(ops.rms_norm(y, self.output_norm, hp.rms_eps), True))
        if not np.isfinite(logits).all():
            raise nonfinite.drafter_error(self, ids)
        return self.to_target_vocab(logits), y

    def close(self):
        self.weights.close()
