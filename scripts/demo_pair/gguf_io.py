"""target.gguf: write the torch target in llama.cpp's qwen3 layout, and read it back into torch.

Layout and KV names follow llama.cpp's converter for Qwen3 (no transposes, ne = numpy shape reversed,
HF q/k rows as is: llama.cpp runs qwen3 with NeoX RoPE, the same rotate-half convention as HF).
Matrices F16, 1-D norms F32, tied embeddings (no output.weight).
"""

import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

from ggtools.gguf import GGUFFile, GGUFWriter

ARCH = "qwen3"
TOKEN_NORMAL, TOKEN_CONTROL = 1, 3

_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def gguf_name(hf_name: str) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    parts = hf_name.split(".")
    assert parts[0] == "model" and parts[1] == "layers", hf_name
    sub = ".".join(parts[3:-1])
    return f"blk.{parts[2]}.{_LAYER_NAMES[sub]}.{parts[-1]}"


def hf_name(gguf_tensor: str) -> str:
    inverse = {v: k for k, v in _LAYER_NAMES.items()}
    if gguf_tensor == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_tensor == "output_norm.weight":
        return "model.norm.weight"
    if gguf_tensor == "output.weight":
        return "lm_head.weight"
    _, layer, sub, last = gguf_tensor.split(".")
    return f"model.layers.{layer}.{inverse[sub]}.{last}"


def write_target_gguf(model, tokens: list[str], merges: list[str], special_ids: dict, path, *, name: str):
    """special_ids: {"eos": id, "mask": id}; tokens by id; merges in rank order."""
    cfg = model.config
    w = GGUFWriter(path, force=True)
    w.add_kv("general.architecture", VT.STRING, ARCH)
    w.add_kv("general.type", VT.STRING, "model")
    w.add_kv("general.name", VT.STRING, name)
    w.add_kv("general.file_type", VT.UINT32, 1)             # LLAMA_FTYPE_MOSTLY_F16
    w.add_kv("general.quantization_version", VT.UINT32, 2)
    w.add_kv(f"{ARCH}.block_count", VT.UINT32, cfg.num_hidden_layers)
    w.add_kv(f"{ARCH}.context_length", VT.UINT32, cfg.max_position_embeddings)
    w.add_kv(f"{ARCH}.embedding_length", VT.UINT32, cfg.hidden_size)
    w.add_kv(f"{ARCH}.feed_forward_length", VT.UINT32, cfg.intermediate_size)
    w.add_kv(f"{ARCH}.attention.head_count", VT.UINT32, cfg.num_attention_heads)
    w.add_kv(f"{ARCH}.attention.head_count_kv", VT.UINT32, cfg.num_key_value_heads)
    w.add_kv(f"{ARCH}.rope.freq_base", VT.FLOAT32, float(rope_theta(cfg)))
    w.add_kv(f"{ARCH}.attention.layer_norm_rms_epsilon", VT.FLOAT32, float(cfg.rms_norm_eps))
    w.add_kv(f"{ARCH}.attention.key_length", VT.UINT32, cfg.head_dim)
    w.add_kv(f"{ARCH}.attention.value_length", VT.UINT32, cfg.head_dim)
    special = set(special_ids.values())
    w.add_kv("tokenizer.ggml.model", VT.STRING, "gpt2")
    w.add_kv("tokenizer.ggml.pre", VT.STRING, "qwen2")
    w.add_kv("tokenizer.ggml.tokens", VT.ARRAY, tokens, VT.STRING)
    w.add_kv("tokenizer.ggml.token_type", VT.ARRAY,
             [TOKEN_CONTROL if i in special else TOKEN_NORMAL for i in range(len(tokens))], VT.INT32)
    w.add_kv("tokenizer.ggml.merges", VT.ARRAY, merges, VT.STRING)
    w.add_kv("tokenizer.ggml.eos_token_id", VT.UINT32, special_ids["eos"])
    w.add_kv("tokenizer.ggml.padding_token_id", VT.UINT32, special_ids["eos"])
    w.add_kv("tokenizer.ggml.bos_token_id", VT.UINT32, special_ids["eos"])
    w.add_kv("tokenizer.ggml.add_bos_token", VT.BOOL, False)

    arrays = []
    for hf, p in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        a = p.detach().float().numpy()
        a = np.ascontiguousarray(a.astype(np.float16) if a.ndim >= 2 else a.astype(np.float32))
        arrays.append((gguf_name(hf), a))
    order = {"token_embd.weight": 0, "output_norm.weight": 2, "output.weight": 1}
    arrays.sort(key=lambda na: (order.get(na[0], 3), _layer_of(na[0])))
    for n, a in arrays:
        w.add_tensor_info(n, a.shape[::-1], QT.F16 if a.dtype == np.float16 else QT.F32, a.nbytes)
    for _, a in arrays:
        w.write(a.tobytes())
    w.commit()


def _layer_of(name):
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def rope_theta(cfg):
    rp = getattr(cfg, "rope_parameters", None) or {}
    return rp.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))


def read_target_config(f: GGUFFile) -> dict:
    g = lambda k: f.get(f"{ARCH}.{k}")
    return dict(
        vocab_size=len(f.get("tokenizer.ggml.tokens")),
        hidden_size=int(g("embedding_length")),
        intermediate_size=int(g("feed_forward_length")),
        num_hidden_layers=int(g("block_count")),
        num_attention_heads=int(g("attention.head_count")),
        num_key_value_heads=int(g("attention.head_count_kv")),
        head_dim=int(g("attention.key_length")),
        max_position_embeddings=int(g("context_length")),
        rope_theta=_f32(g("rope.freq_base")),
        rms_norm_eps=_f32(g("attention.layer_norm_rms_epsilon")),
        tie_word_embeddings="output.weight" not in f.tensor,
        attention_bias=False,
    )


def _f32(v) -> float:
    """The shortest decimal that reads back as the same f32 (1e-06, not 9.999999974752427e-07)."""
    return float(str(np.float32(v)))


def load_target_from_gguf(path):
    """The torch Qwen3ForCausalLM holding exactly target.gguf's weights (f16 → f32)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with GGUFFile(path) as f:
        cfg = Qwen3Config(**read_target_config(f))
        cfg._attn_implementation = "sdpa"
        model = Qwen3ForCausalLM(cfg)
        state = {}
        for t in f.tensors:
            dtype = {QT.F16: np.float16, QT.F32: np.float32}[QT(t.type_id)]
            a = f.tensor_data(t).view(dtype).reshape(t.shape).astype(np.float32)
            state[hf_name(t.name)] = torch.from_numpy(a.copy())
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and not [m for m in missing if m != "lm_head.weight"], (missing, unexpected)
    model.tie_weights()
    model.eval()
    return model
