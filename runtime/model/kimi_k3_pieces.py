"""The pieces of a Kimi K3 layer, as llama.cpp's loader (src/models/kimi-k3.cpp, load_arch_tensors) reads them:
the tensors each reads and how it loads them from a WeightFile. The numba classes (mixers/kda.py, mixers/mla.py,
ffn/latent_moe.py, attn_residual.py) and the torch ones (torch_backend/kimi_k3_*.py) subclass these with their ops.

- KDA (Kimi Delta Attention, the layers with attention.head_count_kv 0): q, k, v projections each through a short
  causal conv, the low-rank per-channel decay gate (f_a, f_b, dt_bias, A), beta, the delta rule, a per-head RMS
  norm and a full-rank sigmoid output gate;
- MLA (the others), nope-only, absorbed: q (optionally through a LoRA with its norm), the compressed latent
  kv_a_mqa + kv_a_norm (the cache holds latent + the un-rotated tail), k_b / v_b per head, a sigmoid output gate
  before attn_output;
- the FFNs: leading dense layers and shared experts with the situ activation, latent routed experts (sigmoid
  routing with the exp_probs_b selection bias);
- the cross-layer residual attention's score vectors (AttnResidualTensors, which also runs the layers' residual
  stream: the bank of layer inputs, reset every block).
"""

from dataclasses import dataclass, field

import numpy as np

from ggtools.runtime.errors import ModelError
from ggtools.runtime.model.pieces import NO_BIAS, SIGMOID, SITU, DenseFFNTensors, Piece, Routing, RoutedExpertsTensors

KIMI_K3_ROUTING = Routing(SIGMOID, normalize=False, activation=SITU)


@dataclass
class KDATensors(Piece):
    """A KDA mixer's tensors. conv: (K, 3 d_inner) float32, the taps of the q, k and v convolutions side by side
    (tap-major), so the recurrent state (hybrid_cache.RecurrentState) keeps one (K - 1, 3 d_inner) conv state."""
    wq: object
    wk: object
    wv: object
    conv: np.ndarray
    wf_a: object             # n_embd -> head_dim
    wf_b: object             # head_dim -> d_inner
    dt_bias: np.ndarray      # (d_inner,)
    a: np.ndarray            # (n_head,) = -exp(A_log), as the converter folds it
    wbeta: object            # n_embd -> n_head
    wg: object               # n_embd -> d_inner: the output gate
    norm: np.ndarray         # (head_dim,)
    wo: object               # d_inner -> n_embd
    head_dim: int
    eps: float
    gate_lower_bound: float  # -inf: g = softplus(.) * A; else g = lower_bound * sigmoid(-A (.))

    @property
    def n_v_heads(self) -> int:
        return len(self.a)

    @property
    def d_inner(self) -> int:
        return self.n_v_heads * self.head_dim

    @classmethod
    def load(cls, w, hp, i: int):
        """Layer i's KDA tensors (blk.i.attn_{q,k,v,output}, ssm_*) from a WeightFile."""
        p, k3, n_embd = f"blk.{i}.", hp.kimi_k3, hp.n_embd
        hd, kernel = k3.kda_head_dim, k3.conv_kernel
        d_inner = hp.n_head * hd

        def conv(x):   # ggml ne [d_conv, 1, d_inner(, 1)]: the kernel varies fastest
            return w.vector(p + f"ssm_conv1d_{x}.weight", d_inner * kernel).reshape(d_inner, kernel).T

        return cls(wq=w.matrix(p + "attn_q.weight", n_embd, d_inner), wk=w.matrix(p + "attn_k.weight", n_embd, d_inner),
                   wv=w.matrix(p + "attn_v.weight", n_embd, d_inner),
                   conv=np.ascontiguousarray(np.concatenate([conv(x) for x in "qkv"], axis=1)),
                   wf_a=w.matrix(p + "ssm_f_a.weight", n_embd, hd), wf_b=w.matrix(p + "ssm_f_b.weight", hd, d_inner),
                   dt_bias=w.vector(p + "ssm_dt.bias", d_inner), a=w.vector(p + "ssm_a", hp.n_head),
                   wbeta=w.matrix(p + "ssm_beta.weight", n_embd, hp.n_head),
                   wg=w.matrix(p + "ssm_g.weight", n_embd, d_inner), norm=w.vector(p + "ssm_norm.weight", hd),
                   wo=w.matrix(p + "attn_output.weight", d_inner, n_embd), head_dim=hd, eps=hp.rms_eps,
                   gate_lower_bound=k3.gate_lower_bound)


@dataclass
class MLATensors(Piece):
    """An MLA mixer's tensors: wq (full rank) or wq_a, q_a_norm, wq_b; wkv_a (n_embd -> kv_lora + rope), kv_a_norm;
    wk_b[h] (qk_nope -> kv_lora) and wv_b[h] (kv_lora -> v_head) per head; the output gate (None: none) and wo."""
    wq: object
    wq_a: object
    q_a_norm: np.ndarray
    wq_b: object
    wkv_a: object
    kv_a_norm: np.ndarray
    wk_b: list
    wv_b: list
    wgate: object
    wo: object
    n_head: int
    kv_lora: int
    qk_nope: int
    rope_dims: int
    v_head: int
    eps: float

    @property
    def q_head(self) -> int:
        return self.qk_nope + self.rope_dims

    @classmethod
    def load(cls, w, hp, i: int):
        """Layer i's MLA tensors (blk.i.attn_*) from a WeightFile. A file with attn_kv_b instead of attn_k_b /
        attn_v_b gets it split per head as llama.cpp's converter splits it (float32 copies)."""
        p, k3, n_embd, n_head = f"blk.{i}.", hp.kimi_k3, hp.n_embd, hp.n_head
        kv_lora, nope, rope, v_head = k3.kv_lora_rank, k3.qk_nope, k3.rope_dims, k3.value_length_mla
        q_dim = n_head * (nope + rope)
        lora = k3.q_lora_rank > 0 and w.has(p + "attn_q_a_norm.weight")
        if w.has(p + "attn_k_b.weight") or not w.has(p + "attn_kv_b.weight"):
            wk_b = w.slices(p + "attn_k_b.weight", nope, kv_lora, n_head)
            wv_b = w.slices(p + "attn_v_b.weight", kv_lora, v_head, n_head)
        else:
            wk_b, wv_b = split_kv_b(w, p + "attn_kv_b.weight", n_head, kv_lora, nope, v_head)
        return cls(wq=None if lora else w.matrix(p + "attn_q.weight", n_embd, q_dim),
                   wq_a=w.matrix(p + "attn_q_a.weight", n_embd, k3.q_lora_rank) if lora else None,
                   q_a_norm=w.vector(p + "attn_q_a_norm.weight", k3.q_lora_rank) if lora else None,
                   wq_b=w.matrix(p + "attn_q_b.weight", k3.q_lora_rank, q_dim) if lora else None,
                   wkv_a=w.matrix(p + "attn_kv_a_mqa.weight", n_embd, kv_lora + rope),
                   kv_a_norm=w.vector(p + "attn_kv_a_norm.weight", kv_lora), wk_b=wk_b, wv_b=wv_b,
                   wgate=w.matrix(p + "attn_gate.weight", n_embd, n_head * v_head) if w.has(p + "attn_gate.weight")
                   else None,
                   wo=w.matrix(p + "attn_output.weight", n_head * v_head, n_embd), n_head=n_head, kv_lora=kv_lora,
                   qk_nope=nope, rope_dims=rope, v_head=v_head, eps=hp.rms_eps)


def split_kv_b(w, name: str, n_head: int, kv_lora: int, nope: int, v_head: int) -> tuple[list, list]:
    """attn_kv_b (ne [kv_lora, n_head * (nope + v_head)]) split as conversion/kimi_k3.py splits kv_b_proj: per head
    the first nope rows, transposed, are k_b (kv_lora x nope), the rest v_b (v_head x kv_lora); float32."""
    from gguf import GGMLQuantizationType as T

    kv_b = w.vector(name, kv_lora * n_head * (nope + v_head)).reshape(n_head, nope + v_head, kv_lora)
    k_b, v_b = [], []
    for h in range(n_head):
        for parts, m in ((k_b, kv_b[h, :nope].T), (v_b, kv_b[h, nope:])):
            data = np.frombuffer(np.ascontiguousarray(m, np.float32).tobytes(), np.uint8)
            parts.append(w.make_matrix(name, T.F32, m.shape[0], m.shape[1], data, 0, 1))
    return k_b, v_b


@dataclass
class SituFFNTensors(DenseFFNTensors):
    """A dense FFN with K3's situ activation: down(situ(gate(h), up(h))) (the leading dense layers and the
    shared experts)."""
    beta: float = 1.0
    linear_beta: float = 0.0

    @classmethod
    def load(cls, w, hp, i: int, suffix: str = "", n_ff: int | None = None):
        base = DenseFFNTensors.load(w, hp, i, suffix, n_ff)
        return cls(base.gate, base.up, base.down, beta=hp.kimi_k3.situ_beta, linear_beta=hp.kimi_k3.situ_linear_beta)


@dataclass
class LatentMoETensors(RoutedExpertsTensors):
    """K3's MoE layer: the router scores the full-width input; the routed experts run at the latent width
    (routed_down, the experts, routed_norm, routed_up; without expert_latent_length at n_embd, none of the
    three); the shared experts (a SituFFN, None: none) read the full-width input."""
    probs_bias: np.ndarray = field(default_factory=lambda: NO_BIAS)   # exp_probs_b: selection only
    weights_norm: bool = False
    routed_down: object = None
    routed_norm: np.ndarray | None = None
    routed_up: object = None
    shared: object = None
    beta: float = 1.0
    linear_beta: float = 0.0
    eps: float = 1e-6       # routed_norm's

    @classmethod
    def load(cls, w, hp, i: int, pieces=None):
        """Layer i's blk.i.ffn_gate_inp, exp_probs_b, ffn_{gate,up,down}_exps, ffn_routed_*, ffn_*_shexp."""
        p, k3, n_embd, n_expert = f"blk.{i}.", hp.kimi_k3, hp.n_embd, hp.n_expert
        latent, n_ff = k3.n_expert_latent or n_embd, hp.n_ff_exp
        has_shared = w.has(p + "ffn_gate_shexp.weight")
        return cls(router=w.matrix(p + "ffn_gate_inp.weight", n_embd, n_expert),
                   gate=w.matrix(p + "ffn_gate_exps.weight", latent, n_ff, n_expert),
                   up=w.matrix(p + "ffn_up_exps.weight", latent, n_ff, n_expert),
                   down=w.matrix(p + "ffn_down_exps.weight", n_ff, latent, n_expert),
                   n_expert_used=hp.n_expert_used, routing=KIMI_K3_ROUTING,
                   weights_scale=hp.expert_weights_scale, weights_norm=k3.weights_norm,
                   probs_bias=w.vector(p + "exp_probs_b.bias", n_expert),
                   routed_down=w.matrix(p + "ffn_routed_down.weight", n_embd, latent) if k3.n_expert_latent else None,
                   routed_up=w.matrix(p + "ffn_routed_up.weight", latent, n_embd) if k3.n_expert_latent else None,
                   routed_norm=w.optional_vector(p + "ffn_routed_norm.weight", latent) if k3.n_expert_latent else None,
                   shared=pieces.SituFFN.load(w, hp, i, suffix="_shexp", n_ff=hp.n_ff_shexp) if has_shared else None,
                   beta=k3.situ_beta, linear_beta=k3.situ_linear_beta, eps=hp.rms_eps)


@dataclass
class AttnResidualTensors(Piece):
    """Cross-layer residual attention (attn_res_block_size > 0): per layer the score vectors before the mixer and
    before the FFN (each the converter's fused res_norm * res_proj), the one before the output norm.

    llama.cpp's graph (kimi-k3.cpp) over the layers, with prefix_sum the residual stream entering layer i:
        cur = mix(prefix_sum, attn_score[i])
        every block_size-th layer: the bank gets prefix_sum (the raw layer input) and the stream restarts
        prefix_sum = mixer(norm(cur)) [+ prefix_sum unless it restarted]
        prefix_sum += ffn(norm(mix(prefix_sum, ffn_score[i])))
    and before the output norm mix(stream, output_score). mix(cur, w): the softmax over the scores
    sum(rmsnorm(x) * w) of the banked inputs x and of cur, then the probability-weighted sum of the raw values.
    A backend's subclass gives `mix(bank, cur, score)`; the bank lives for one forward (one token's depth), so
    there is no state to roll back."""
    attn_scores: list
    ffn_scores: list
    output_score: np.ndarray
    block_size: int
    eps: float

    @classmethod
    def load(cls, w, hp):
        n = hp.n_embd
        if hp.kimi_k3.attn_res_block_size <= 0:
            raise ModelError(f"{w.meta.path}: attn_res.block_size is 0: no cross-layer residual attention")
        return cls(attn_scores=[w.vector(f"blk.{i}.attn_res_score.weight", n) for i in range(hp.n_layer)],
                   ffn_scores=[w.vector(f"blk.{i}.ffn_res_score.weight", n) for i in range(hp.n_layer)],
                   output_score=w.vector("output_res_score.weight", n), block_size=hp.kimi_k3.attn_res_block_size,
                   eps=hp.rms_eps)

    def begin(self) -> "ResidualBank":
        """The bank of one forward."""
        return ResidualBank(self)


class ResidualBank:
    """One forward's banked layer inputs and the layer loop around them (AttnResidualTensors)."""

    def __init__(self, residual: AttnResidualTensors):
        self.residual, self.bank = residual, []

    def run_layer(self, model, i: int, x, positions, rope, stepwise: bool):
        """Layer i of `model` on the residual stream x entering it -> the stream entering layer i + 1."""
        res, layer, hp, ops = self.residual, model.layers[i], model.hp, model.ops
        cur = res.mix(self.bank, x, res.attn_scores[i])
        restart = i % res.block_size == 0
        if restart:
            self.bank.append(x)
        out = layer.mixer(ops.rms_norm(cur, layer.attn_norm, hp.rms_eps), positions, rope, model.kv, layer.slot, hp,
                          stepwise)
        x = out if restart else x + out
        cur = res.mix(self.bank, x, res.ffn_scores[i])
        return x + layer.ffn(ops.rms_norm(cur, layer.ffn_norm, hp.rms_eps), stepwise)

    def final(self, x):
        """The stream after the last layer, mixed with the bank before the output norm."""
        return self.residual.mix(self.bank, x, self.residual.output_score)
