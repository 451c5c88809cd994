"""Kimi K3's hyperparameters, read from the `kimi-k3.*` keys llama.cpp's converter (conversion/kimi_k3.py) writes
and its loader (llama_model_kimi_k3::load_arch_hparams) reads, with the loader's defaults.

K3 does not fit the generic reader (hparams.read_hparams): its `attention.head_count_kv` is per layer (0 marks a
KDA layer, 1 an MLA layer: MLA is served as MQA with one KV head), and its key and value lengths differ (the
cache holds the compressed latent plus the un-rotated dims). The generic fields are filled as the rest of the
runtime uses them (the KV cache: one head of key_length values), the K3 ones go to `HParams.kimi_k3`.
"""

import math
from dataclasses import dataclass

import numpy as np

from ggtools.runtime.model.hparams import HParams, _get, _one_value


@dataclass(frozen=True)
class KimiK3Shape:
    kda_head_dim: int           # kda.head_dim: KDA heads (n_head of them; d_inner = n_head * kda_head_dim)
    conv_kernel: int            # ssm.conv_kernel: the short convolutions on q, k, v
    gate_lower_bound: float     # kda.gate_lower_bound (-inf: unset, the softplus decay gate)
    q_lora_rank: int            # attention.q_lora_rank (0: a full-rank attn_q)
    kv_lora_rank: int           # attention.kv_lora_rank: the latent the MLA cache holds
    key_length_mla: int         # attention.key_length_mla: qk_nope + qk_rope per head
    value_length_mla: int       # attention.value_length_mla
    rope_dims: int              # rope.dimension_count: qk_rope, K's un-rotated tail (K3's MLA has no RoPE)
    n_dense_lead: int           # leading_dense_block_count
    n_expert_shared: int        # expert_shared_count
    n_expert_latent: int        # expert_latent_length (0: the routed experts run at n_embd)
    weights_norm: bool          # expert_weights_norm
    situ_beta: float            # activation.situ_beta
    situ_linear_beta: float     # activation.situ_linear_beta (<= 0: no transform of the up branch)
    attn_res_block_size: int    # attn_res.block_size (0: no cross-layer residual attention)

    @property
    def qk_nope(self) -> int:
        return self.key_length_mla - self.rope_dims


def read_kimi_k3_hparams(gguf, n_vocab: int, arch_entry) -> HParams:
    """The HParams of a kimi-k3 GGUF (shard 1 of a split model), after the model-file rules (ggtools.hparam_rules,
    hparam_rules/kimi_k3.py: every key's type and range, the KV heads of a KDA and an MLA layer, the MLA sizes'
    relations, sigmoid gating, situ's beta)."""
    arch = gguf.architecture

    def key(name, default=None, required=False):
        return _get(gguf, f"{arch}.{name}", default, required)

    def uint(name, default=None, required=False) -> int:
        return int(_one_value(key(name, default, required), f"{arch}.{name}"))

    n_layer = uint("block_count", required=True)
    n_embd, n_head = uint("embedding_length", required=True), uint("attention.head_count", required=True)
    kv_heads = key("attention.head_count_kv", required=True)     # per layer: 0 (KDA) or 1 (MLA)
    kv_heads = [int(v) for v in kv_heads] if hasattr(kv_heads, "__len__") else [int(kv_heads)] * n_layer
    shape = KimiK3Shape(
        kda_head_dim=uint("kda.head_dim", required=True), conv_kernel=uint("ssm.conv_kernel", required=True),
        gate_lower_bound=float(key("kda.gate_lower_bound", -math.inf)),
        q_lora_rank=uint("attention.q_lora_rank", 0), kv_lora_rank=uint("attention.kv_lora_rank", required=True),
        key_length_mla=uint("attention.key_length_mla", required=True),
        value_length_mla=uint("attention.value_length_mla", required=True),
        rope_dims=uint("rope.dimension_count", required=True), n_dense_lead=uint("leading_dense_block_count", 0),
        n_expert_shared=uint("expert_shared_count", required=True), n_expert_latent=uint("expert_latent_length", 0),
        weights_norm=bool(key("expert_weights_norm", False)),
        situ_beta=float(key("activation.situ_beta", required=True)),
        situ_linear_beta=float(key("activation.situ_linear_beta", required=True)),
        attn_res_block_size=uint("attn_res.block_size", required=True))
    key_length = shape.kv_lora_rank + shape.rope_dims     # attention.key_length (the rules hold them equal)
    n_expert, n_expert_used = uint("expert_count", required=True), uint("expert_used_count", required=True)
    n_ff_exp = uint("expert_feed_forward_length", required=True)
    return HParams(
        arch=arch, n_layer=n_layer, n_embd=n_embd, n_ff=uint("feed_forward_length", 0), n_head=n_head,
        n_head_kv=1, head_dim=key_length, n_vocab=n_vocab, n_ctx_train=uint("context_length", 4096),
        rms_eps=float(key("attention.layer_norm_rms_epsilon", required=True)), rope_base=10000.0, rope_dims=0,
        rope_neox=arch_entry.rope_neox, rope_freq_scale=1.0,
        attn_scale=float(np.float32(1.0) / np.sqrt(np.float32(shape.key_length_mla))),
        n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp,
        n_ff_shexp=n_ff_exp * max(shape.n_expert_shared, 1),
        expert_weights_scale=float(key("expert_weights_scale", 0.0)),
        swa_layers=(False,) * n_layer, recurrent_layers=tuple(h == 0 for h in kv_heads), kimi_k3=shape)
