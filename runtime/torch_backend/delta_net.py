"""Gated DeltaNet (qwen35 / qwen35moe's linear-attention mixer) on torch, in float32.

Per token t, per value head h (its query/key head h % n_k_heads, as llama.cpp's converter tiles them):

    c     = silu(causal depthwise conv over the last K rows of W_qkv x)      the K - 1 earlier rows: conv state
    q, k  = l2-normed heads of c (x / sqrt(sum x^2 + eps));  v = the rest of c
    g     = softplus(W_alpha x + dt_bias) * a;   beta = sigmoid(W_beta x)
    M     = exp(g) M;   delta = (v - M k) beta;   M += delta k^T;   o = M q / sqrt(head_dim)
    out   = W_out (rmsnorm(o) * norm * silu(W_gate x))   per value head

M is the state kept transposed as numba keeps it (row j: output dim j), so the cache's rollback (hybrid_cache.py,
shared with numba) replays the logged inputs through `recur` the same way.
"""

import torch
import torch.nn.functional as F

from ggtools.runtime.target.pieces import DeltaNetTensors
from ggtools.runtime.torch_backend import tensor_math
from ggtools.runtime.torch_backend.matrix import DeviceGroup
from ggtools.runtime.torch_backend.vectors import device_vector


class GatedDeltaNet(DeltaNetTensors):
    def __post_init__(self):
        self.inputs = DeviceGroup(self.wqkv, self.wgate, self.wbeta, self.walpha)
        device = self.wqkv.blocks.device
        self.conv, self.dt_bias, self.a, self.norm = (device_vector(x, device) for x in (
            self.conv, self.dt_bias, self.a, self.norm))

    tree_verify = True

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> torch.Tensor:
        """The mixer interface: kv is a HybridCache and slot this layer's index among its recurrent states."""
        return self.mix(h, kv.recurrent[slot], tree=kv.tree)

    def mix(self, h: torch.Tensor, state, stepwise: bool = False, tree=None) -> torch.Tensor:
        """h: (T, n_embd) normed input; state: this layer's RecurrentState, advanced by T tokens (a tree batch,
        tree_batch.TreeBatch: each row from its parent row's state, the state itself left as it is)."""
        qkv, z, beta_in, alpha = (x.float() for x in self.inputs(h))
        g = F.softplus(alpha + self.dt_bias, threshold=20.0) * self.a
        beta = torch.sigmoid(beta_in)
        state.append(qkv, g, beta)
        if tree is None:
            core = self.recur(state.conv, state.ssm, qkv, g, beta)
        else:
            core = torch.empty((len(h), self.n_v_heads * self.head_dim), dtype=torch.float32, device=h.device)

            def advance(conv, ssm, i):
                core[i:i + 1] = self.recur(conv, ssm, qkv[i:i + 1], g[i:i + 1], beta[i:i + 1])

            state.walk_tree(tree.parents, advance)
        heads = core.reshape(len(h), self.n_v_heads, self.head_dim)
        z = z.reshape(heads.shape)
        normed = tensor_math.rms_norm(heads, self.norm, self.eps) * F.silu(z)
        return self.wout(normed.reshape(len(h), -1).to(h.dtype))

    def recur(self, conv_state, ssm_state, qkv, g, beta) -> torch.Tensor:
        """Advance conv_state ((K - 1, C)) and ssm_state ((n_v_heads, S, S)) in place over the rows of qkv, g,
        beta; returns the heads' outputs (T, value_dim)."""
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
