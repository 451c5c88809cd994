"""A float64 Kimi K3 forward pass from the HF checkpoint (the tiny fixture's bf16 safetensors and config.json), for
the tests: the layer inputs (what the runtime taps), the final normed state and the logits.

Written from the checkpoint's side, not from llama.cpp's graph or the runtime: HF tensor names, MLA in its
un-absorbed form (kv_b_proj expanded into per-head keys and values, multi-head attention), the KDA recurrence on
the state S (key dim first), the experts as separate matrices. What it shares with llama.cpp's kimi-k3 graph is the
architecture: which layers are KDA (linear_attn_config.full_attn_layers, 1-indexed), the cross-layer residual
attention's bank (the raw layer input banked every attn_res_block_size layers, the stream restarting from the
mixer's output there), the sigmoid routing with its selection bias, and situ.
"""

import json
from pathlib import Path

import numpy as np


def _load(hf_dir: Path) -> dict:
    from safetensors.torch import load_file

    tensors = load_file(str(Path(hf_dir) / "model.safetensors"))
    return {k.removeprefix("language_model."): v.double().numpy() for k, v in tensors.items()}


def rms_norm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softmax(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def situ(g, u, beta, linear_beta):
    act = beta * np.tanh(g / beta) * sigmoid(g)
    return act * (linear_beta * np.tanh(u / linear_beta) if linear_beta > 0 else u)


class KimiK3Reference:
    def __init__(self, hf_dir):
        self.cfg = json.loads((Path(hf_dir) / "config.json").read_text())
        self.w = _load(hf_dir)
        self.eps = self.cfg["rms_norm_eps"]

    def forward(self, ids):
        """-> (inputs (n_layer + 1, T, n_embd): each layer's input, then the final normed state; logits (T, V))."""
        cfg, w = self.cfg, self.w
        block = cfg["attn_res_block_size"]
        x = w["model.embed_tokens.weight"][ids]
        bank, inputs = [], []
        for i in range(cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            inputs.append(x)
            cur = self.mix(bank, x, p + "self_attention_res") if block else x
            restart = block and i % block == 0
            if restart:
                bank.append(x)
            h = rms_norm(cur, w[p + "input_layernorm.weight"], self.eps)
            kda = i + 1 not in cfg["linear_attn_config"]["full_attn_layers"]
            out = self.kda(p + "self_attn.", h) if kda else self.mla(p + "self_attn.", h)
            x = out if restart else x + out
            cur = self.mix(bank, x, p + "mlp_res") if block else x
            h = rms_norm(cur, w[p + "post_attention_layernorm.weight"], self.eps)
            x = x + (self.dense(p + "mlp.", h) if i < cfg["first_k_dense_replace"] else self.moe(p, h))
        if block:
            x = self.mix(bank, x, "model.output_attn_res")
        final = rms_norm(x, w["model.norm.weight"], self.eps)
        inputs.append(final)
        return np.stack(inputs), final @ w["lm_head.weight"].T

    def mix(self, bank, cur, prefix):
        if not bank:
            return cur
        score = self.w[prefix + "_norm.weight"] * self.w[prefix + "_proj.weight"].reshape(-1)
        values = np.stack(bank + [cur])                                     # (n + 1, T, n_embd)
        p = softmax(rms_norm(values, score, self.eps).sum(-1), axis=0)      # (n + 1, T)
        return (values * p[..., None]).sum(0)

    def kda(self, p, h):
        cfg, w = self.cfg, self.w
        lin = cfg["linear_attn_config"]
        n_head, s, kernel = cfg["num_attention_heads"], lin["head_dim"], lin["short_conv_kernel_size"]
        n = len(h)

        def conv(x, name):                                   # causal depthwise conv over time, then SiLU
            k = w[p + name].reshape(x.shape[1], kernel)       # (d, K), tap K - 1 the current token
            padded = np.concatenate([np.zeros((kernel - 1, x.shape[1])), x])
            y = sum(padded[j:j + n] * k[:, j] for j in range(kernel))
            return y * sigmoid(y)

        q, k, v = (conv(h @ w[p + f"{x}_proj.weight"].T, f"{x}_conv1d.weight").reshape(n, n_head, s) for x in "qkv")
        q, k = (x / np.sqrt((x * x).sum(-1, keepdims=True) + self.eps) for x in (q, k))
        f = (h @ w[p + "f_a_proj.weight"].T) @ w[p + "f_b_proj.weight"].T + w[p + "dt_bias"]
        a = np.exp(w[p + "A_log"]).repeat(s)
        lower = lin.get("gate_lower_bound")
        g = (lower * sigmoid(a * f) if lower is not None else -a * np.log1p(np.exp(f))).reshape(n, n_head, s)
        beta = sigmoid(h @ w[p + "b_proj.weight"].T)
        state = np.zeros((n_head, s, s))                     # S[h, key dim, value dim]
        out = np.empty((n, n_head, s))
        for t in range(n):
            state = state * np.exp(g[t])[:, :, None]
            predicted = np.einsum("hk,hkv->hv", k[t], state)
            state = state + np.einsum("hk,hv->hkv", k[t], (v[t] - predicted) * beta[t][:, None])
            out[t] = np.einsum("hk,hkv->hv", q[t], state) / np.sqrt(s)
        gate = sigmoid(h @ w[p + "g_proj.weight"].T).reshape(n, n_head, s)
        normed = rms_norm(out, w[p + "o_norm.weight"], self.eps) * gate
        return normed.reshape(n, -1) @ w[p + "o_proj.weight"].T

    def mla(self, p, h):
        cfg, w = self.cfg, self.w
        n_head, nope, rope = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"]
        v_dim, lora, n = cfg["v_head_dim"], cfg["kv_lora_rank"], len(h)
        if cfg.get("q_lora_rank"):
            q_a = rms_norm(h @ w[p + "q_a_proj.weight"].T, w[p + "q_a_layernorm.weight"], self.eps)
            q = q_a @ w[p + "q_b_proj.weight"].T
        else:
            q = h @ w[p + "q_proj.weight"].T
        q = q.reshape(n, n_head, nope + rope)
        kv = h @ w[p + "kv_a_proj_with_mqa.weight"].T
        latent = rms_norm(kv[:, :lora], w[p + "kv_a_layernorm.weight"], self.eps)
        expanded = (latent @ w[p + "kv_b_proj.weight"].T).reshape(n, n_head, nope + v_dim)
        keys = np.concatenate([expanded[..., :nope], np.repeat(kv[:, None, lora:], n_head, 1)], -1)
        values = expanded[..., nope:]
        scores = np.einsum("thd,shd->hts", q, keys) / np.sqrt(nope + rope)
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
        out = np.einsum("hts,shd->thd", softmax(scores), values).reshape(n, -1)
        out = out * sigmoid(h @ w[p + "g_proj.weight"].T)
        return out @ w[p + "o_proj.weight"].T

    def dense(self, p, h):
        w, cfg = self.w, self.cfg
        act = situ(h @ w[p + "gate_proj.weight"].T, h @ w[p + "up_proj.weight"].T, cfg["activation_situ_beta"],
                   cfg["activation_situ_linear_beta"])
        return act @ w[p + "down_proj.weight"].T

    def moe(self, p, h):
        cfg, w = self.cfg, self.w
        m = p + "block_sparse_moe."
        probs = sigmoid(h @ w[m + "gate.weight"].T)
        chosen = np.argsort(-(probs + w[m + "gate.e_score_correction_bias"]), axis=-1, kind="stable")
        chosen = chosen[:, :cfg["num_experts_per_tok"]]
        weights = np.take_along_axis(probs, chosen, -1)
        if cfg["moe_renormalize"]:
            weights = weights / weights.sum(-1, keepdims=True)
        weights = weights * cfg["routed_scaling_factor"]
        latent = cfg.get("routed_expert_hidden_size")
        z = h @ w[m + "routed_expert_down_proj.weight"].T if latent else h
        routed = np.zeros((len(h), z.shape[1]))
        for t in range(len(h)):
            for e, weight in zip(chosen[t], weights[t]):
                x = m + f"experts.{e}."
                act = situ(z[t] @ w[x + "w1.weight"].T, z[t] @ w[x + "w3.weight"].T, cfg["activation_situ_beta"],
                           cfg["activation_situ_linear_beta"])
                routed[t] += weight * (act @ w[x + "w2.weight"].T)
        if latent:
            routed = rms_norm(routed, w[m + "routed_expert_norm.weight"], self.eps)
            routed = routed @ w[m + "routed_expert_up_proj.weight"].T
        return routed + self.dense(m + "shared_experts.", h)
