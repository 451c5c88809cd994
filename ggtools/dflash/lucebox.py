"""Profile `lucebox`: what Luce-Org/lucebox's `server/scripts/convert_dflash_to_gguf.py` (62880e20) writes for
a DFlash v1 checkpoint: arch `qwen35-dflash-draft`, every key under that prefix, `dflash.fc` /
`dflash.hidden_norm`, raw HF layer ids, no tokenizer, BF16 stored as F16.

Keys, key types, tensor names, order and dtype rules are the reference's. Values follow ggtools' resolution
where the reference falls back to hard-coded 27B defaults: rope theta also from `rope_parameters`, the mask id
also from dflash_config, the block size also from dflash_config, and target ids that do not match the fc width
are an error rather than a silently dropped key. Sliding-window keys, which its loader reads but this revision of
its converter no longer writes, are written when the drafter has sliding layers (as earlier revisions did).
lucebox has no DFlash2 support.
"""

import re

from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

from ggtools.dflash.checkpoint import Checkpoint
from ggtools.dflash.config import DraftConfig
from ggtools.dflash.metadata import KVList
from ggtools.dflash.safetensors import CheckpointError
from ggtools.dflash.tensors import TensorJob

ARCH = "qwen35-dflash-draft"
DEFAULT_CONTEXT = 32768
DEFAULT_MASK_TOKEN_ID = 248070          # qwen35's; what lucebox's converter writes without a top-level id
NAMES = {"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
         "norm.weight": "output_norm.weight"}
LAYER_NAMES = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
               "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
               "mlp.down_proj.weight": "ffn_down.weight"}
DROPPED = ("embed_tokens.weight", "lm_head.weight")      # lucebox uses the target's embedding and head
_LAYER = re.compile(r"layers\.(\d+)\.(.+)")


def gguf_name(hf_name: str) -> str | None:
    if hf_name in NAMES:
        return NAMES[hf_name]
    m = _LAYER.fullmatch(hf_name)
    if m and m.group(2) in LAYER_NAMES:
        return f"blk.{m.group(1)}.{LAYER_NAMES[m.group(2)]}"
    return None


def check_supported(ckpt: Checkpoint):
    if ckpt.version == 2:
        raise CheckpointError(ckpt.config_path, "DFlash2DraftModel: lucebox has no DFlash2 support (no conv or "
                                                "candidate-selector tensors in its loader); use --profile llama.cpp",
                              "architectures")


def tensor_jobs(ckpt: Checkpoint, cfg: DraftConfig) -> tuple[list[TensorJob], list[str]]:
    """The output tensors in lucebox's order (dflash.*, output_*, then blk.* by layer), and notes on what was dropped."""
    jobs, notes = [], []
    for hf_name, src in ckpt.tensors.items():
        name = gguf_name(hf_name)
        if name is None:
            if hf_name in DROPPED:
                notes.append(f"dropped {src.name}: lucebox takes the embedding and head from the target")
                continue
            raise CheckpointError(src.path, "the lucebox profile has no place for it (its loader would not read "
                                            "it); use --profile llama.cpp", f"tensor '{src.name}'")
        jobs.append(_job(src, name))
    jobs.sort(key=_order)
    return jobs, notes


def _job(src, name) -> TensorJob:
    # BF16 is narrowed to F16 (via F32, numpy RNE); norms are then widened back to F32, so a BF16 norm takes
    # the F16 round trip too. F16 and F32 sources are stored in their own type, norms as F32.
    is_norm = name.endswith("_norm.weight")
    via_f16 = src.dtype == "BF16"
    if is_norm:
        return TensorJob(src, name, T.F32, f"norm: F32{' (through F16)' if via_f16 else ''}", via_f16=via_f16)
    if src.dtype in ("BF16", "F16"):
        return TensorJob(src, name, T.F16, f"{src.dtype} source: F16")
    if src.dtype == "F32":
        return TensorJob(src, name, T.F32, "F32 source: F32")
    raise CheckpointError(src.path, f"dtype {src.dtype}: lucebox's converter takes BF16, F16 and F32 only",
                          f"tensor '{src.name}'")


def _order(job: TensorJob):
    n = job.name
    if n.startswith("dflash."):
        return (0, 0, n)
    if n.startswith("output_"):
        return (1, 0, n)
    return (2, int(n.split(".")[1]), n)


def metadata(kvs: KVList, ckpt: Checkpoint, cfg: DraftConfig) -> KVList:
    c = ckpt.config
    kvs.put("general.architecture", VT.STRING, ARCH)
    kvs.put("general.name", VT.STRING, f"DFlash-Draft-{cfg.hidden}h-{cfg.n_layer}L")
    for key, value in (("context_length", c.get("max_position_embeddings") or DEFAULT_CONTEXT),
                       ("embedding_length", cfg.hidden), ("block_count", cfg.n_layer),
                       ("feed_forward_length", cfg.n_ff), ("attention.head_count", cfg.n_head),
                       ("attention.head_count_kv", cfg.n_head_kv), ("attention.key_length", cfg.head_dim),
                       ("attention.value_length", cfg.head_dim)):
        kvs.put(f"{ARCH}.{key}", VT.UINT32, int(value))
    if cfg.vocab is None:
        raise CheckpointError(ckpt.config_path, "missing (the lucebox profile writes vocab_size)", "vocab_size")
    kvs.put(f"{ARCH}.vocab_size", VT.UINT32, cfg.vocab)
    kvs.put(f"{ARCH}.attention.layer_norm_rms_epsilon", VT.FLOAT32, float(c.get("rms_norm_eps") or 1e-6))
    kvs.put(f"{ARCH}.rope.freq_base", VT.FLOAT32, float(rope_theta(c, ckpt.config_path)))
    kvs.put(f"{ARCH}.dflash.n_target_layers", VT.UINT32, len(cfg.target_layer_ids))
    kvs.put(f"{ARCH}.dflash.block_size", VT.UINT32, cfg.block_size)
    kvs.put(f"{ARCH}.dflash.mask_token_id", VT.UINT32, cfg.mask_token_id)
    kvs.put(f"{ARCH}.dflash.target_layer_ids", VT.ARRAY, list(cfg.target_layer_ids), VT.INT32)
    _sliding_window(kvs, c)
    return kvs


def rope_theta(c: dict, where) -> float:
    for v in (c.get("rope_theta"), (c.get("rope_parameters") or {}).get("rope_theta"),
              (c.get("rope_scaling") or {}).get("rope_theta")):
        if v is not None:
            return v
    raise CheckpointError(where, "missing (neither rope_theta nor rope_parameters.rope_theta); lucebox's own "
                                 "converter would write its 27B default 1e6", "rope_theta")


def _sliding_window(kvs, c):
    pattern = [lt == "sliding_attention" for lt in c.get("layer_types") or []]
    window = c.get("sliding_window")
    if any(pattern) and window:
        kvs.put(f"{ARCH}.attention.sliding_window", VT.UINT32, int(window))
        kvs.put(f"{ARCH}.attention.sliding_window_pattern", VT.ARRAY, pattern, VT.BOOL)
