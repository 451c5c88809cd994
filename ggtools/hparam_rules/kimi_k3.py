"""kimi-k3's own keys (target.py applies them after the generic ones), as llama.cpp reads them
(`llama_model_kimi_k3::load_arch_hparams`, src/models/kimi-k3.cpp: every count u32, every float f32,
expert_weights_norm a BOOL; the ones read without `false` required) and the relations its converter
(conversion/kimi_k3.py) writes and its graph and ggtools' runtime rely on:

- a layer with 0 KV heads is KDA, one with 1 is MLA served as MQA (the converter writes 1: the cache holds one
  latent head); any other count is no kimi-k3 layer;
- MLA has no RoPE: rope.dimension_count sizes the un-rotated tail of a key head, so attention.key_length (what
  the cache holds per token) is kv_lora_rank + rope.dimension_count, and key_length_mla = qk_nope + that tail
  keeps qk_nope above 0;
- the routed experts are gated by sigmoid (the converter asserts it; llama.cpp would route any other function);
- situ divides the gate by activation.situ_beta; leading dense layers need feed_forward_length.
"""

import math

from gguf import GGUFValueType as VT

from ggtools.hparam_rules.keys import Keys

SIGMOID_GATING = 2           # llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SIGMOID
KDA, MLA = 0, 1              # attention.head_count_kv of a KDA layer, of an MLA layer


def kimi_k3_rules(k: Keys, n_head_kv, head_dim, n_rot, n_ff):
    """n_head_kv: the KV heads per layer; head_dim: attention.key_length as llama.cpp takes it; n_rot:
    rope.dimension_count; n_ff: feed_forward_length per layer (None where absent or refused)."""
    _kda(k)
    _mla(k, n_head_kv, head_dim, n_rot)
    _moe(k, n_ff)
    beta = k.float("activation.situ_beta", required=True)
    k.check("activation.situ_beta", beta != 0, "is 0: situ divides the gate by it")
    k.float("activation.situ_linear_beta", required=True)
    k.uint("attn_res.block_size", required=True)


def _positive(k: Keys, key: str, what: str) -> int | None:
    value = k.uint(key, required=True)
    return value if k.check(key, value != 0, f"is 0: {what}") else None


def _kda(k: Keys):
    _positive(k, "kda.head_dim", "a KDA head has dims")
    _positive(k, "ssm.conv_kernel", "KDA's short convolutions have taps")
    key = "kda.gate_lower_bound"
    kv = k.f.kv.get(k.name(key))
    if kv is None or kv.vtype != VT.FLOAT32 or kv.value != -math.inf:     # -inf: unset, as llama.cpp's default
        k.float(key)


def _mla(k: Keys, n_head_kv, head_dim, n_rot):
    if n_head_kv is not None:
        other = sorted({h for h in n_head_kv if h not in (KDA, MLA)})
        k.check("attention.head_count_kv", not other, f"holds {other}: a kimi-k3 layer has {KDA} KV heads (KDA) or "
                f"{MLA} (MLA, served as MQA over one latent head)")
    k.uint("attention.q_lora_rank")
    kv_lora = _positive(k, "attention.kv_lora_rank", "MLA's cache holds the latent")
    key_mla = _positive(k, "attention.key_length_mla", "MLA's key heads have dims")
    _positive(k, "attention.value_length_mla", "MLA's value heads have dims")
    if n_rot is None:
        return
    if head_dim is not None and kv_lora is not None:
        k.check("attention.key_length", head_dim == kv_lora + n_rot,
                f"is {head_dim}: kimi-k3's MLA cache holds kv_lora_rank + rope.dimension_count = "
                f"{kv_lora} + {n_rot} values per token")
    if key_mla is not None:
        k.check("rope.dimension_count", n_rot < key_mla,
                f"is {n_rot}, not below attention.key_length_mla {key_mla}: a key head is qk_nope dims (above 0) and "
                "this tail")


def _moe(k: Keys, n_ff):
    k.uint("expert_shared_count", required=True)
    k.uint("expert_latent_length")
    k.bool("expert_weights_norm")
    gating = k.uint("expert_gating_func", required=True)
    k.check("expert_gating_func", gating is None or gating == SIGMOID_GATING,
            f"is {gating}: kimi-k3 routes its experts by sigmoid ({SIGMOID_GATING}; its converter writes nothing else)")
    lead = k.uint("leading_dense_block_count", 0)
    if lead and k.has("feed_forward_length") and n_ff is not None:
        k.check("feed_forward_length", min(n_ff[:lead]) > 0,
                f"is 0 for a leading dense layer (leading_dense_block_count {lead}): it has a feed-forward network")
    elif lead:
        k.check("feed_forward_length", k.has("feed_forward_length"),
                f"missing with leading_dense_block_count {lead}: the leading dense layers need its width")
