"""Gated DeltaNet (qwen35 / qwen35moe's linear-attention mixer) on torch, in float32.

Per token t, per value head h (its query/key head h % n_k_heads, as llama.cpp's converter tiles them):

    c     = silu(causal depthwise conv over the last K rows of W_qkv x)      the K - 1 earlier rows: conv state
    q, k  = l2-normed heads of c (x / sqrt(sum x^2 + eps));  v = the rest of c
    g     = softplus(W_alpha x + dt_bias) * a;   beta = sigmoid(W_beta x)
    M     = exp(g) M;   delta = (v - M k) beta;   M += delta k^T;   o = M q / sqrt(head_dim)
    out   = W_out (rmsnorm(o) * norm * silu(W_gate x))   per value head

M is the state kept transposed as numba keeps it (row j: output dim j), so the cache's rollback (hybrid_cache.py,
shared with numba) replays the logged inputs through `recur` the same way.

In float32 every step is the numba runtime's (target/mixers/gated_delta_net.py: ggml's operation order): the
conv as a chain of separately rounded products and sums, ggml's SiLU, the L2 norm as rms_norm(eps / n) then a
scale by 1 / sqrt(n), libm's softplus / sigmoid / exp, M^T k and M^T q as vec_dot's 4x8 dots, the update as fma.
Each token's step has the same shapes whatever the batch, so a replay after a crop gives the same bits.
"""

import torch
import torch.nn.functional as F

from ggtools.runtime.model.pieces import DeltaNetTensors
from ggtools.runtime.torch_backend import ggml_math as gm, tensor_math
from ggtools.runtime.torch_backend.matrix import DeviceGroup
from ggtools.runtime.torch_backend.vectors import device_vector


class GatedDeltaNet(DeltaNetTensors):
    tree_verify = True

    def __post_init__(self):
        self.inputs = DeviceGroup(self.wqkv, self.wgate, self.wbeta, self.walpha)
        device = self.wqkv.blocks.device
        self.conv, self.dt_bias, self.a, self.norm = (device_vector(x, device) for x in (
            self.conv, self.dt_bias, self.a, self.norm))

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> torch.Tensor:
        """The mixer interface: kv is a HybridCache and slot this layer's index among its recurrent states."""
        return self.mix(h, kv.recurrent[slot], stepwise, kv.tree)

    def mix(self, h: torch.Tensor, state, stepwise: bool = False, tree=None) -> torch.Tensor:
        """h: (T, n_embd) normed input; state: this layer's RecurrentState, advanced by T tokens (a tree batch,
        tree_batch.TreeBatch: each row from its parent row's state, the state itself left as it is)."""
        exact = h.dtype == torch.float32
        qkv, z, beta_in, alpha = (x.float() for x in self.inputs(h, stepwise))
        if exact:
            g, beta = gm.softplus(alpha + self.dt_bias) * self.a, gm.sigmoid(beta_in)
        else:
            g, beta = F.softplus(alpha + self.dt_bias, threshold=20.0) * self.a, torch.sigmoid(beta_in)
        core = torch.empty((len(h), self.n_v_heads * self.head_dim), dtype=torch.float32, device=h.device)

        def recur_rows(conv, ssm, r):
            core[r] = self.recur(conv, ssm, qkv[r], g[r], beta[r])

        state.advance(qkv, g, beta, recur_rows, tree)
        heads = core.reshape(len(h), self.n_v_heads, self.head_dim)
        z = z.reshape(heads.shape)
        silu = gm.silu if exact else F.silu
        normed = tensor_math.rms_norm(heads, self.norm, self.eps) * silu(z)
        return self.wout(normed.reshape(len(h), -1).to(h.dtype), stepwise)

    def recur(self, conv_state, ssm_state, qkv, g, beta) -> torch.Tensor:
        """Advance conv_state ((K - 1, C)) and ssm_state ((n_v_heads, S, S)) in place over the rows of qkv, g,
        beta; returns the heads' outputs (T, value_dim)."""
        if self.exact:
            return self._ggml_recur(conv_state, ssm_state, qkv, g, beta)
        kernel = self.conv.shape[0]
        window = torch.cat([conv_state, qkv])
        conv = (window.unfold(0, kernel, 1) * self.conv.T).sum(-1)       # (T, C): window[t + i, c] * conv[i, c]
        conv_state.copy_(window[len(window) - len(conv_state):])
        conv = F.silu(conv)
        d, n_tokens = self.head_dim, len(qkv)
        q, k = (conv[:, i * self.key_dim:(i + 1) * self.key_dim].reshape(n_tokens, self.n_k_heads, d)
                for i in (0, 1))
        q, k = (x * torch.rsqrt(x.square().sum(-1, keepdim=True) + self.eps) for x in (q, k))
        tiled = torch.arange(self.n_v_heads, device=qkv.device) % self.n_k_heads
        q, k = q[:, tiled], k[:, tiled]                                   # (T, n_v_heads, S)
        v = conv[:, 2 * self.key_dim:].reshape(n_tokens, self.n_v_heads, d)
        m, out = ssm_state, torch.empty_like(v)
        scale = d ** -0.5
        for t in range(n_tokens):
            m = m * torch.exp(g[t])[:, None, None]
            delta = (v[t] - (m @ k[t, :, :, None])[..., 0]) * beta[t, :, None]
            m = m + delta[:, :, None] * k[t, :, None, :]
            out[t] = (m @ q[t, :, :, None])[..., 0] * scale
        ssm_state.copy_(m)
        return out.reshape(n_tokens, -1)

    @property
    def exact(self) -> bool:
        return self.wqkv.dtype == torch.float32

    def _ggml_recur(self, conv_state, ssm_state, qkv, g, beta) -> torch.Tensor:
        """recur as numba's conv_silu_l2 and delta_rule_heads compute it."""
        kernel, d, n_tokens = self.conv.shape[0], self.head_dim, len(qkv)
        window = torch.cat([conv_state, qkv])
        conv = torch.zeros_like(qkv)
        for i in range(kernel):
            conv = conv + window[i:i + n_tokens] * self.conv[i]
        conv_state.copy_(window[len(window) - len(conv_state):])
        conv = gm.silu(conv)
        n = gm.f32(d)
        head_eps = gm.div(torch.tensor(gm.f32(self.eps)), n).item()
        rescale = gm.div(torch.ones(()), gm.sqrt(torch.tensor(n))).item()
        q, k = (gm.rms_norm(conv[:, i * self.key_dim:(i + 1) * self.key_dim].reshape(n_tokens, self.n_k_heads, d),
                            None, head_eps) * rescale for i in (0, 1))
        tiled = torch.arange(self.n_v_heads, device=qkv.device) % self.n_k_heads
        q, k = q[:, tiled], k[:, tiled]                                   # (T, n_v_heads, S)
        v = conv[:, 2 * self.key_dim:].reshape(n_tokens, self.n_v_heads, d)
        scale = rescale
        decay = gm.expf(g)
        m, out = ssm_state, torch.empty_like(v)
        for t in range(n_tokens):
            m = m * decay[t, :, None, None]
            delta = (v[t] - gm.dot_one_row(m, k[t, :, None], f16_tail=False)) * beta[t, :, None]
            m = gm.fma(k[t, :, None, :], delta[:, :, None], m)
            out[t] = gm.dot_one_row(m, q[t, :, None], f16_tail=False) * scale
        ssm_state.copy_(m)
        return out.reshape(n_tokens, -1)
