"""kimi-k3's mixers on torch: KDA (the linear-attention layers) and nope-only absorbed MLA (the others); numba's
mixers/kda.py and mixers/mla.py give the formulas and llama.cpp's operation order.

KDA per token and head (S the head size, the state M kept transposed as numba keeps it: row j is output dim j):

    q, k, v = silu(short causal conv of each projection);  q, k l2-normed (x / sqrt(sum x^2 + eps))
    g       = lb * sigmoid(-(f_b(f_a(x)) + dt_bias) * A)   with kda.gate_lower_bound lb, else softplus(.) * A
    M[j, i] *= exp(g_i);  delta = (v - M k) beta;  M += delta k^T;  o = M q / sqrt(S)
    out     = W_o (rmsnorm(o) * norm * sigmoid(W_g x))

MLA: Q_h = [k_b_h q_nope_h, q_pe_h] over the cache's rows K = [rmsnorm(c), k_pe], V = K's first kv_lora values,
o_h = v_b_h (softmax(Q_h K^T / sqrt(nope + rope)) V), out = W_o (o * sigmoid(W_gate x)).

In float32 both are numba's operations in numba's order (the conv a chain of separately rounded products and sums,
ggml's SiLU per projection, rms_norm(eps / n) then 1 / sqrt(n) for the L2 norms, libm's sigmoid / softplus / exp,
vec_dot's 4x8 dots and fma updates for the recurrence; MLA's per-head k_b / v_b in llama.cpp's unrepacked order,
F32 k_b row by row, llama.cpp's attention over the f16 cache), so they give its bits. In bf16 / f16 torch's own.
A draft tree's rows (tree_batch.py): KDA runs each from its parent row's state (RecurrentState.walk_tree), MLA
attends over the latent cache and each row's own path (attention.cache_attention).
"""

import torch
import torch.nn.functional as F
from gguf import GGMLQuantizationType as T

from ggtools.runtime.model.kimi_k3_pieces import KDATensors, MLATensors
from ggtools.runtime.torch_backend import ggml_math as gm, tensor_math
from ggtools.runtime.torch_backend.attention import cache_attention
from ggtools.runtime.torch_backend.matrix import DeviceGroup
from ggtools.runtime.torch_backend.vectors import device_vector

NO_SINKS = torch.zeros(0)


class KDA(KDATensors):
    tree_verify = True

    def __post_init__(self):
        self.inputs = DeviceGroup(self.wq, self.wk, self.wv, self.wf_a, self.wbeta, self.wg)
        device = self.wq.blocks.device
        self.conv, self.dt_bias, self.norm = (device_vector(x, device) for x in (self.conv, self.dt_bias, self.norm))
        self.a_channels = device_vector(self.a, device).repeat_interleave(self.head_dim)
        n = gm.f32(self.head_dim)     # float32's rms_norm(eps / n), then 1 / sqrt(n): the L2 norms (numba's)
        self.l2_eps = gm.div(torch.tensor(gm.f32(self.eps)), n).item()
        self.l2_scale = gm.div(torch.ones(()), gm.sqrt(torch.tensor(n))).item()

    @property
    def exact(self) -> bool:
        return self.wq.dtype == torch.float32

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> torch.Tensor:
        """The mixer interface: kv is a HybridCache and slot this layer's index among its recurrent states."""
        return self.mix(h, kv.recurrent[slot], stepwise, kv.tree)

    def mix(self, h: torch.Tensor, state, stepwise: bool = False, tree=None) -> torch.Tensor:
        """h: (T, n_embd) normed input; state: this layer's RecurrentState, advanced by T tokens (a tree batch,
        tree_batch.TreeBatch: each row from its parent row's state, the state itself left as it is)."""
        q, k, v, f_a, beta_in, gate = self.inputs(h, stepwise)
        qkv = torch.cat([q, k, v], 1).float()
        g = self.wf_b(f_a, stepwise).float() + self.dt_bias
        exact = self.exact
        sigmoid = gm.sigmoid if exact else torch.sigmoid
        if self.gate_lower_bound > -float("inf"):
            g = sigmoid((g * self.a_channels) * -1.0) * gm.f32(self.gate_lower_bound)
        else:
            g = (gm.softplus(g) if exact else F.softplus(g, threshold=20.0)) * self.a_channels
        beta = sigmoid(beta_in.float())
        decay = gm.expf(g) if exact else torch.exp(g)     # per element: once for all rows, not per tree row
        core = torch.empty((len(h), self.d_inner), dtype=torch.float32, device=h.device)

        def recur_rows(conv, ssm, r):
            core[r] = self.recur(conv, ssm, qkv[r], decay[r], beta[r])

        state.advance(qkv, decay, beta, recur_rows, tree)
        heads = core.reshape(len(h), self.n_v_heads, self.head_dim)
        normed = tensor_math.rms_norm(heads, self.norm, self.eps) * sigmoid(gate.float()).reshape(heads.shape)
        return self.wo(normed.reshape(len(h), -1).to(h.dtype), stepwise)

    def recur(self, conv_state, ssm_state, qkv, decay, beta) -> torch.Tensor:
        """Advance conv_state ((K - 1, 3 d)) and ssm_state ((n_head, S, S)) in place over the rows of qkv, decay
        (exp(g), the state's logged form of the gate), beta; returns the heads' outputs (T, d)."""
        kernel, d, s, n_head, n_tokens = self.conv.shape[0], self.d_inner, self.head_dim, self.n_v_heads, len(qkv)
        window = torch.cat([conv_state, qkv])
        conv_state.copy_(window[len(window) - len(conv_state):])
        if not self.exact:
            conv = F.silu((window.unfold(0, kernel, 1) * self.conv.T).sum(-1))
            q, k, v = (conv[:, i * d:(i + 1) * d].reshape(n_tokens, n_head, s) for i in range(3))
            q, k = (x * torch.rsqrt(x.square().sum(-1, keepdim=True) + self.eps) for x in (q, k))
            scale = s ** -0.5
        else:
            conv = torch.zeros_like(qkv)
            for i in range(kernel):
                conv = conv + window[i:i + n_tokens] * self.conv[i]
            # ggml's SiLU per projection (blocks of 8 along each): one call over the three
            q, k, v = gm.silu(conv.reshape(n_tokens, 3, d)).reshape(n_tokens, 3, n_head, s).unbind(1)
            scale = self.l2_scale
            q, k = (gm.rms_norm(x, None, self.l2_eps) * scale for x in (q, k))
        decay = decay.reshape(n_tokens, n_head, 1, s)
        m, out = ssm_state, torch.empty_like(v)
        for t in range(n_tokens):
            m = m * decay[t]
            if self.exact:
                delta = (v[t] - gm.dot_one_row(m, k[t, :, None], f16_tail=False)) * beta[t, :, None]
                m = gm.fma(k[t, :, None, :], delta[:, :, None], m)
                out[t] = gm.dot_one_row(m, q[t, :, None], f16_tail=False) * scale
            else:
                delta = (v[t] - (m @ k[t, :, :, None])[..., 0]) * beta[t, :, None]
                m = m + delta[:, :, None] * k[t, :, None, :]
                out[t] = (m @ q[t, :, :, None])[..., 0] * scale
        ssm_state.copy_(m)
        return out.reshape(n_tokens, -1)


class MLA(MLATensors):
    tree_verify = True

    def __post_init__(self):
        first = [self.wq_a if self.wq is None else self.wq, self.wkv_a] + ([self.wgate] if self.wgate else [])
        self.inputs = DeviceGroup(*first)
        device = self.wkv_a.blocks.device
        self.kv_a_norm = device_vector(self.kv_a_norm, device)
        if self.q_a_norm is not None:
            self.q_a_norm = device_vector(self.q_a_norm, device)
        for m in self.wk_b + self.wv_b:     # 3-D weights: llama.cpp never repacks them (numba's mla.plain_order)
            if m.exact is not None:
                m.exact.repacked = False
        # the permuted q_nope: F32 weights take it row by row (no tinyBLAS without a contiguous input)
        self.k_b_stepwise = self.wk_b[0].qtype == T.F32

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> torch.Tensor:
        n_tokens, n_head, lora = len(h), self.n_head, self.kv_lora
        q, kv_a, *gate = self.inputs(h, stepwise)
        if self.wq is None:
            q = self.wq_b(tensor_math.rms_norm(q, self.q_a_norm, self.eps), stepwise)
        latent = tensor_math.rms_norm(kv_a[:, :lora], self.kv_a_norm, self.eps)
        heads = q.reshape(n_tokens, n_head, self.q_head)
        absorbed = torch.stack([self.wk_b[i](heads[:, i, :self.qk_nope].contiguous(), stepwise or self.k_b_stepwise)
                                for i in range(n_head)], 1)
        query = torch.cat([absorbed, heads[:, :, self.qk_nope:]], -1)
        start, n_ctx = int(positions[0]), int(positions[0]) + n_tokens
        keys = kv.k[slot]
        keys[0, start:n_ctx] = torch.cat([latent, kv_a[:, lora:]], -1).to(keys.dtype)
        # V is K's first kv_lora values: attend over K as values, keep those (each output dim its own dot)
        mixed = cache_attention(query, keys, keys.transpose(1, 2), positions, 0, hp.attn_scale, NO_SINKS.to(h.device),
                                n_tokens == 1 or stepwise, kv.tree)
        mixed = mixed.reshape(n_tokens, n_head, -1)[..., :lora]
        out = torch.cat([self.wv_b[i](mixed[:, i].contiguous(), stepwise) for i in range(n_head)], -1)
        if gate:
            out = out * (gm.sigmoid(gate[0]) if h.dtype == torch.float32 else torch.sigmoid(gate[0]))
        return self.wo(out, stepwise)
