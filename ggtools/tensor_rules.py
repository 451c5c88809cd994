"""Which tensors llama-quantize never quantizes (tensor_allows_quantization in llama-quant.cpp), by name/shape.

Used by every plan that changes tensor types, so ggtools leaves exactly the tensors llama.cpp leaves.
"""

from ggtools.gguf.writer import ggml_dims

NEVER_SUBSTRINGS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
    "a.rvq.codebook", "mm.a.code_embd",
)
NEVER_NAMES = ("position_embd.weight", "token_types.weight")


def never_quantized(name: str, ne) -> str | None:
    """Why llama-quantize would copy this tensor unchanged whatever the target type, or None."""
    if len(ggml_dims(ne)) < 2:
        return "1-D tensor: never quantized"
    if not name.endswith("weight"):
        return "name does not end in 'weight': never quantized"
    if name in NEVER_NAMES:
        return "positional/token-type embedding: never quantized"
    for s in NEVER_SUBSTRINGS:
        if s in name:
            return "norm: never quantized" if s == "_norm.weight" else \
                "MoE router: never quantized" if "gate_inp" in s else f"'{s}' tensor: never quantized"
    return None
