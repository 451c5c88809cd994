"""TargetModel: a llama-family target GGUF (llama, qwen3) run on the CPU, as llama.cpp runs it.

Each layer is `x += mixer(norm(x)); x += ffn(norm(x))`. The mixer is causal self-attention here; the
layer structure is what lets a recurrent mixer (qwen35's Gated DeltaNet) or a routed FFN (qwen35moe)
slot in beside it.

    model = TargetModel("target.gguf")
    logits, features = model.forward(prompt_ids, taps=[1, 5])   # appends to model.kv
    model.kv.crop(n)                                             # roll back to n tokens
"""

from dataclasses import dataclass, field

import numpy as np

from ggtools.runtime import ops, workers
from ggtools.runtime.attention import attention, prepare_attention
from ggtools.runtime.hparams import HParams, ModelError, read_hparams
from ggtools.runtime.kvcache import KVCache
from ggtools.runtime.weights import Matrix, MatrixGroup, WeightFile

NO_NORM = np.zeros(0, np.float32)


@dataclass
class Attention:
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wo: Matrix
    bq: np.ndarray | None = None
    bk: np.ndarray | None = None
    bv: np.ndarray | None = None
    # qwen3: per-head RMS norms of q and k before RoPE (empty: none)
    q_norm: np.ndarray = field(default_factory=lambda: NO_NORM)
    k_norm: np.ndarray = field(default_factory=lambda: NO_NORM)

    def __post_init__(self):
        self.qkv = MatrixGroup(self.wq, self.wk, self.wv)

    def __call__(self, h, positions, rope, kv: KVCache, slot: int, hp: HParams, stepwise: bool) -> np.ndarray:
        n_tokens = h.shape[0]
        q, k, v = self.qkv(h, stepwise)
        for out, bias in ((q, self.bq), (k, self.bk), (v, self.bv)):
            if bias is not None:
                out += bias
        start = int(positions[0])
        roped = np.empty((n_tokens, hp.n_head, hp.head_dim), np.float32)
        prepare_attention(q, k, v, self.q_norm, self.k_norm, np.float32(hp.rms_eps), *rope, hp.rope_neox,
                          kv.k[slot], kv.v[slot], start, kv.f16, roped)
        n_ctx = start + n_tokens
        out = attention(roped, kv.k[slot], kv.v[slot], positions, n_ctx, hp.attn_scale, kv.f16, stepwise)
        return self.wo(out, stepwise)


@dataclass
class DenseFFN:
    gate: Matrix
    up: Matrix
    down: Matrix

    def __post_init__(self):
        self.gate_up = MatrixGroup(self.gate, self.up)

    def __call__(self, h, stepwise: bool) -> np.ndarray:
        gate, up = self.gate_up(h, stepwise)
        return self.down(ops.swiglu(gate, up), stepwise)


@dataclass
class Layer:
    attn_norm: np.ndarray
    mixer: Attention
    ffn_norm: np.ndarray
    ffn: DenseFFN


class TargetModel:
    """A target model with its own KV cache (`kv`). Not thread-safe; one sequence at a time."""

    def __init__(self, path, threads: int | None = None, kv_type: str = "f16"):
        """path: a target GGUF (the first shard of a split model); threads: worker threads (process-wide,
        default all cores); kv_type: "f16" (llama.cpp's default cache type) or "f32"."""
        self.threads = (workers.set_threads(threads) if threads else workers.pool()).n_threads
        self.weights = w = WeightFile(path)
        self.path = str(path)
        self.token_embd = w.matrix("token_embd.weight")
        self.hp = hp = read_hparams(w.meta, n_vocab=self.token_embd.n_rows)
        self.output_norm = w.vector("output_norm.weight", hp.n_embd)
        # tied embeddings: llama.cpp uses token_embd as the head when output.weight is absent
        self.output = w.matrix("output.weight", hp.n_embd) if w.has("output.weight") else self.token_embd
        freq_factors = w.optional_vector("rope_freqs.weight")
        self.rope_freq_factors = np.zeros(0, np.float32) if freq_factors is None else freq_factors
        self.layers = [self._load_layer(i) for i in range(hp.n_layer)]
        self.kv = KVCache(hp.n_layer, hp.n_head_kv, hp.head_dim, type=kv_type)

    def _load_layer(self, i: int) -> Layer:
        w, hp = self.weights, self.hp
        p = f"blk.{i}."
        q_dim, kv_dim = hp.n_head * hp.head_dim, hp.n_head_kv * hp.head_dim
        attn = Attention(
            wq=w.matrix(p + "attn_q.weight", hp.n_embd, q_dim),
            wk=w.matrix(p + "attn_k.weight", hp.n_embd, kv_dim),
            wv=w.matrix(p + "attn_v.weight", hp.n_embd, kv_dim),
            wo=w.matrix(p + "attn_output.weight", q_dim, hp.n_embd),
            bq=w.optional_vector(p + "attn_q.bias", q_dim),
            bk=w.optional_vector(p + "attn_k.bias", kv_dim),
            bv=w.optional_vector(p + "attn_v.bias", kv_dim),
        )
        q_norm = w.optional_vector(p + "attn_q_norm.weight", hp.head_dim)
        k_norm = w.optional_vector(p + "attn_k_norm.weight", hp.head_dim)
        if (q_norm is None) != (k_norm is None):
            raise ModelError(f"{self.path}: layer {i} has only one of attn_q_norm / attn_k_norm")
        if q_norm is not None:
            attn.q_norm, attn.k_norm = q_norm, k_norm
        ffn = DenseFFN(
            gate=w.matrix(p + "ffn_gate.weight", hp.n_embd, hp.n_ff),
            up=w.matrix(p + "ffn_up.weight", hp.n_embd, hp.n_ff),
            down=w.matrix(p + "ffn_down.weight", hp.n_ff, hp.n_embd),
        )
        return Layer(w.vector(p + "attn_norm.weight", hp.n_embd), attn,
                     w.vector(p + "ffn_norm.weight", hp.n_embd), ffn)

    @property
    def n_vocab(self) -> int:
        return self.output.n_rows

    def forward(self, tokens, positions=None, taps=(), logits: str = "all", stepwise: bool = False):
        """Run tokens at positions kv.n_tokens, kv.n_tokens+1, ... and append them to the cache.

        taps: layer ids j; features[:, i] is the residual stream entering layer taps[i] for every
        token (HF hidden_states[j]; j = n_layer gives the final normed state, as HF does).
        logits: "all" (one row per token), "last" or "none".
        stepwise: compute every row with the kernels llama.cpp uses for a one-token batch, so the
        results are bit-identical to feeding the tokens one at a time (speculative verification);
        by default a batch uses llama.cpp's batch kernels, as its prompt processing does.
        Returns (logits (rows, n_vocab) float32 or None, features (T, len(taps), n_embd) float32)."""
        hp = self.hp
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        start = self.kv.n_tokens
        expected = np.arange(start, start + len(tokens))
        positions = expected if positions is None else np.asarray(positions, np.int64).reshape(-1)
        if len(tokens) == 0:
            raise ValueError("forward needs at least one token")
        if not np.array_equal(positions, expected):
            raise ValueError(f"positions must continue the cache: expected {start}..{start + len(tokens) - 1}")
        if tokens.min() < 0 or tokens.max() >= self.token_embd.n_rows:
            raise ModelError(f"token id out of range [0, {self.token_embd.n_rows})")
        taps = list(taps)
        if any(not 0 <= j <= hp.n_layer for j in taps):
            raise ValueError(f"tap layer ids must lie in [0, {hp.n_layer}]")
        if logits not in ("all", "last", "none"):
            raise ValueError("logits must be 'all', 'last' or 'none'")

        self.kv.reserve(start + len(tokens))
        rope = ops.rope_angles(positions, hp.rope_dims, hp.rope_base, np.float32(hp.rope_freq_scale),
                               self.rope_freq_factors)
        features = np.empty((len(tokens), len(taps), hp.n_embd), np.float32)
        x = self.token_embd.rows(tokens)
        for i, layer in enumerate(self.layers):
            self._tap(features, taps, i, x)
            h = ops.rms_norm(x, layer.attn_norm, hp.rms_eps)
            x = layer.mixer(h, positions, rope, self.kv, i, hp, stepwise) + x
            x = layer.ffn(ops.rms_norm(x, layer.ffn_norm, hp.rms_eps), stepwise) + x
        self.kv.n_tokens = start + len(tokens)
        out = ops.rms_norm(x, self.output_norm, hp.rms_eps)
        self._tap(features, taps, hp.n_layer, out)
        if logits == "none":
            return None, features
        return self.output(out if logits == "all" else out[-1:], stepwise), features

    @staticmethod
    def _tap(features, taps, layer, x):
        for i, j in enumerate(taps):
            if j == layer:
                features[:, i] = x

    def close(self):
        self.weights.close()
