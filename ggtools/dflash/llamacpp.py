"""The `llama.cpp` profile's converter: what llama.cpp's own converter (`convert_hf_to_gguf.py`, class
DFlashModel at 0c1e570) writes for a DFlash / DFlash2 checkpoint: its dtype rules and keys in the same order,
with the same types. The facts (arch, key and tensor names, id convention) come from the profile object `p`
each function is given (profiles.LLAMACPP).

DSpark (class DSparkModel): the Markov and confidence heads under their GGUF names, `t2d` dropped, `lm_head`
dropped unless the draft vocabulary is reduced, `d2t` written last as absolute I64 target ids, and the keys
`sample_from_anchor` and `has_confidence_head` after the DFlash ones.

Where ggtools deliberately differs: the tokenizer comes from the target GGUF (`tokenizer.*` copied verbatim)
instead of the target's HF directory; the mask id may come from the config's top level or an explicit
override (the reference reads only dflash_config, leaving drafters that draft nothing, LC#26761); an M-RoPE
target is recognised by `rope.dimension_sections` in its GGUF; a DSpark `markov_head.markov_w2.scale`, which the
reference cannot map, is written as `markov_w2.scale` (F32, the scale llama.cpp's loader and graph take).
"""

from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT
from gguf import LlamaFileType

from ggtools.dflash.checkpoint import Checkpoint
from ggtools.dflash.config import DraftConfig
from ggtools.dflash.config_reader import F32, FRACTION, I32, LAYERS, U32, ConfigReader
from ggtools.dflash.dspark import absolute_ids
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.metadata import KVList, general_kvs
from ggtools.dflash.profiles import D2T, T2D
from ggtools.dflash.tensors import DerivedTensor, TensorJob

OUTTYPES = {"f32": (T.F32, LlamaFileType.ALL_F32), "f16": (T.F16, LlamaFileType.MOSTLY_F16),
            "bf16": (T.BF16, LlamaFileType.MOSTLY_BF16), "q8_0": (T.Q8_0, LlamaFileType.MOSTLY_Q8_0)}
ROPE_PERMUTED = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.q_norm.weight",
                 "self_attn.k_norm.weight")


def plan(p, ckpt: Checkpoint, cfg: DraftConfig, outtype: str, target, name):
    """(resolved outtype, tensor jobs, metadata, notes) for profile p (the llama.cpp profile's facts)."""
    resolved = auto_outtype(ckpt) if outtype == "auto" else outtype
    jobs = plan_tensors(p, ckpt, cfg, resolved)
    kvs = KVList()
    general_kvs(kvs, p.arch, ckpt.path, name, sum(j.n_elements for j in jobs))
    metadata(p, kvs, ckpt, cfg, OUTTYPES[resolved][1], target)
    return resolved, jobs, kvs, []


def plan_tensors(p, ckpt: Checkpoint, cfg: DraftConfig, outtype: str) -> list[TensorJob]:
    return tensor_jobs(p, ckpt, cfg, auto_outtype(ckpt) if outtype == "auto" else outtype)


def tensor_order(p, name: str) -> tuple:
    """llama.cpp's converter writes tensors in HF name order (within one safetensors part)."""
    return (p.hf_name(name) or name,)


def auto_outtype(ckpt: Checkpoint) -> str:
    """The converter's guess: the dtype of the first tensor with 2+ dims, BF16 kept, anything else F16."""
    for t in ckpt.tensors.values():
        if len(t.shape) >= 2:
            return {"BF16": "bf16", "F16": "f16"}.get(t.dtype, "f16")
    return "f16"


def tensor_jobs(p, ckpt: Checkpoint, cfg: DraftConfig, outtype: str) -> list[TensorJob]:
    want = OUTTYPES[outtype][0]
    permute = not ckpt.config.get("rope_is_neox_style", True)
    jobs = []
    for hf_name, src in ckpt.tensors.items():
        if hf_name == "embed_tokens.weight" and not ckpt.config.get("has_embed_tokens", True):
            continue
        if cfg.dspark is not None and _dspark_skips(hf_name, cfg):
            continue
        name = p.gguf_name(hf_name)
        if name is None:
            raise CheckpointError(src.path, "the llama.cpp profile has no place for it", f"tensor '{src.name}'")
        dst, reason = _type(name, src.shape, want)
        head_dim = cfg.head_dim if permute and hf_name.endswith(ROPE_PERMUTED) else None
        jobs.append(TensorJob(src, name, dst, reason, permute_head_dim=head_dim))
    if cfg.dspark is not None and D2T in ckpt.tensors:
        src = ckpt.tensors[D2T]
        jobs.append(TensorJob(DerivedTensor(src.name, src.path, absolute_ids(ckpt)), p.gguf_name(D2T), T.I64,
                              "offset + row index: absolute target ids, I64 (written last)"))
    return jobs


def _dspark_skips(hf_name: str, cfg: DraftConfig) -> bool:
    """t2d (unused); d2t (written last, as ids); lm_head of a full draft vocabulary (the target's serves)."""
    return hf_name in (T2D, D2T) or (hf_name == "lm_head.weight" and not cfg.dspark.reduced)


def _type(name, shape, want) -> tuple[T, str]:
    if len(shape) <= 1 or name.endswith("_norm.weight"):
        return T.F32, "1-D or norm: F32"
    if not name.endswith(".weight"):
        return T.F32, "name does not end in .weight: F32"
    if want == T.Q8_0 and shape[-1] % 32:
        return T.F16, f"ne0={shape[-1]} does not fit Q8_0 blocks of 32: F16 (the converter's fallback)"
    return want, f"outtype {want.name}"


def metadata(p, kvs: KVList, ckpt: Checkpoint, cfg: DraftConfig, ftype: LlamaFileType, target) -> KVList:
    """Everything after the general.* keys, in the converter's order: TextModel hparams, file type, the
    DFlash keys, the quantization version, then the target's tokenizer and the mask id."""
    h, dc, n = ckpt.config, ckpt.dflash_config, ckpt.numbers
    rope, rope_n = rope_parameters(h, n)
    _text_model_hparams(kvs, p.key, h, n, rope, rope_n, ftype)
    _dflash_hparams(kvs, p, h, dc, n, rope, rope_n, cfg, target)
    if cfg.dspark is not None:
        kvs.put(p.key("sample_from_anchor"), VT.BOOL, cfg.dspark.sample_from_anchor)
        kvs.put(p.key("has_confidence_head"), VT.BOOL, cfg.dspark.confidence)
    kvs.put("general.quantization_version", VT.UINT32, 2)
    if target is not None:
        for kv in target.tokenizer_kvs:
            kvs.copy(kv)
    if cfg.mask_token_id is not None:
        kvs.put(p.key("mask"), VT.UINT32, cfg.mask_token_id)
    return kvs


def rope_parameters(h: dict, n: ConfigReader) -> tuple[dict, ConfigReader]:
    """TextModel.__init__: rope_parameters (or rope_scaling) with the top-level rope keys mirrored in; and the reader
    of its numbers, which names each where config.json keeps it."""
    source = "rope_parameters" if "rope_parameters" in h else "rope_scaling"
    rp = dict(n.table(h, source) or {})
    places = {}
    theta = _find(h, ("global_rope_theta", "rope_global_theta", "rope_theta_global", "rope_theta", "rotary_emb_base"))
    local = _find(h, ("local_rope_theta", "rope_local_theta", "rope_theta_local", "swa_rope_theta",
                      "rope_local_base_freq"))
    partial = _find(h, ("partial_rotary_factor", "rope_pct", "rope_percent"))
    orig = _find(h, ("original_max_position_embeddings",))
    if "full_attention" not in rp and "sliding_attention" not in rp:
        if local[1] is not None:
            rp["sliding_attention"] = {"rope_theta": local[1]}
            places["sliding_attention.rope_theta"] = n.place(local[0])
        for key, (name, value) in (("rope_theta", theta), ("partial_rotary_factor", partial),
                                   ("original_max_position_embeddings", orig)):
            if key not in rp and value is not None:
                rp[key], places[key] = value, n.place(name)
        if "rope_type" not in rp and rp.get("type") is not None:
            rp["rope_type"] = rp["type"]
    return rp, n.within(source, places)


def _find(h, keys) -> tuple[str | None, object]:
    """find_hparam(optional=True): (the first key present, its value, even when it is null), or (None, None)."""
    return next(((k, h[k]) for k in keys if k in h), (None, None))


def _u32(kvs, k, key, n: ConfigReader, place, value, want=U32):
    """The config value at place, checked, as key's u32 (k: the profile's key namer)."""
    kvs.put(k(key), VT.UINT32, n.number(value, place, want))


def _f32(kvs, k, key, n: ConfigReader, place, value):
    kvs.put(k(key), VT.FLOAT32, float(n.number(value, place, F32)))


def _text_model_hparams(kvs, k, h, n, rope, rope_n, ftype):
    """k: the profile's key namer; n: config.json's numbers, rope_n: those of the RoPE parameters."""
    _u32(kvs, k, "block_count", n, *_find(h, ("n_layers", "num_hidden_layers", "n_layer", "num_layers")), LAYERS)
    for key, names in (
            ("context_length", ("max_position_embeddings", "n_ctx", "n_positions", "max_length",
                                "max_sequence_length", "model_max_length")),
            ("embedding_length", ("hidden_size", "n_embd", "dim")),
            ("feed_forward_length", ("prefix_dense_intermediate_size", "dense_intermediate_size",
                                     "intermediate_size", "n_inner", "hidden_dim")),
            ("attention.head_count", ("num_attention_heads", "n_head", "n_heads")),
            ("attention.head_count_kv", ("num_key_value_heads", "n_kv_heads"))):
        name, value = _find(h, names)
        if value is not None:
            _u32(kvs, k, key, n, name, value)
    if h.get("is_causal") is False:
        kvs.put(k("attention.causal"), VT.BOOL, False)
    full = "full_attention" if "full_attention" in rope else None
    rp = (rope_n.table(rope, full) or {}) if full else rope
    prefix = f"{full}." if full else ""
    _rope_scaling(kvs, k, rp, rope_n, prefix)
    if "mrope_section" in rope:
        sections = (rope_n.numbers(rope["mrope_section"], "mrope_section", I32) + [0, 0, 0, 0])[:4]
        kvs.put(k("rope.dimension_sections"), VT.ARRAY, sections, VT.INT32)
    if (theta := rp.get("rope_theta")) is not None:
        _f32(kvs, k, "rope.freq_base", rope_n, prefix + "rope_theta", theta)
    sliding = rope_n.table(rope, "sliding_attention") or {}
    if (local := sliding.get("rope_theta")) is not None:
        _f32(kvs, k, "rope.freq_base_swa", rope_n, "sliding_attention.rope_theta", local)
    name, eps = _find(h, ("rms_norm_eps", "norm_eps"))
    if eps is not None:
        _f32(kvs, k, "attention.layer_norm_rms_epsilon", n, name, eps)
    name, eps = _find(h, ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"))
    if eps is not None:
        _f32(kvs, k, "attention.layer_norm_epsilon", n, name, eps)
    if _find(h, ("num_local_experts", "num_experts", "n_routed_experts"))[1] is not None:
        raise CheckpointError(n.path, "a mixture-of-experts drafter is not a DFlash v1/v2 drafter", "num_experts")
    if (head_dim := h.get("head_dim")) is not None:
        _u32(kvs, k, "attention.key_length", n, "head_dim", head_dim)
        _u32(kvs, k, "attention.value_length", n, "head_dim", head_dim)
    kvs.put("general.file_type", VT.UINT32, int(ftype))


def _rope_scaling(kvs, k, rp, n: ConfigReader, prefix):
    rope_type, factor = rp.get("rope_type"), rp.get("factor")
    if rope_type == "linear" and factor is not None:
        kvs.put(k("rope.scaling.type"), VT.STRING, "linear")
        _f32(kvs, k, "rope.scaling.factor", n, prefix + "factor", factor)
    elif rope_type == "yarn" and factor is not None:
        kvs.put(k("rope.scaling.type"), VT.STRING, "yarn")
        _f32(kvs, k, "rope.scaling.factor", n, prefix + "factor", factor)
        if "original_max_position_embeddings" not in rp:
            raise CheckpointError(n.path, "YaRN rope scaling needs original_max_position_embeddings", "rope_scaling")
        _u32(kvs, k, "rope.scaling.original_context_length", n, prefix + "original_max_position_embeddings",
             rp["original_max_position_embeddings"])
        for key, name in (("yarn_ext_factor", "extrapolation_factor"),
                          ("yarn_attn_factor", "attention_factor" if "attention_factor" in rp else "attn_factor"),
                          ("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow")):
            if rp.get(name) is not None:
                _f32(kvs, k, f"rope.scaling.{key}", n, prefix + name, rp[name])
    elif rope_type in ("su", "longrope"):
        kvs.put(k("rope.scaling.type"), VT.STRING, "longrope")


def _dflash_hparams(kvs, p, h, dc, n, rope, rope_n, cfg: DraftConfig, target):
    k = p.key
    head_dim = h.get("head_dim") or h["hidden_size"] // h["num_attention_heads"]
    if (partial := rope.get("partial_rotary_factor")) is not None:
        share = rope_n.number(partial, "partial_rotary_factor", FRACTION)
        kvs.put(k("rope.dimension_count"), VT.UINT32, int(head_dim * share))
    dcn = n.within("dflash_config")
    if (value_scale := dc.get("attention_value_scale")) is not None:
        _f32(kvs, k, "attention.value_scale", dcn, "attention_value_scale", value_scale)
    kvs.put(k("block_size"), VT.UINT32, cfg.block_size)
    if cfg.v2:
        for key in ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k"):
            kvs.put(k(key), VT.UINT32, cfg.v2[key])
    for key, name in (("logit_scale", "output_multiplier"), ("final_logit_softcapping", "final_logit_softcapping"),
                      ("embedding_scale", "input_embedding_scale")):
        reader, d = (dcn, dc) if name in dc else (n, h)
        if (value := d.get(name)) is None:
            continue
        if key == "final_logit_softcapping" and reader.number(value, name, F32) <= 0:
            continue                                  # the converter writes a softcap only when it is above 0
        _f32(kvs, k, key, reader, name, value)
    kvs.put(k("target_ids"), VT.ARRAY, p.stored_ids(cfg.target_layer_ids), VT.INT32)
    _sliding_window(kvs, k, h, dc, n, cfg)
    causal = h.get("is_causal")
    if causal is None:
        causal = dc.get("causal")
    if causal is not None:
        kvs.put(k("attention.causal"), VT.BOOL, bool(causal))
    if target is not None and target.uses_mrope:
        kvs.put(k("rope.dimension_sections"), VT.ARRAY, [head_dim // 2, 0, 0, 0], VT.INT32)


def _sliding_window(kvs, k, h, dc, n, cfg):
    dcn = n.within("dflash_config")
    use = h.get("use_sliding_window", False) or dc.get("use_swa", False)
    reader, d, name = (dcn, dc, "swa_window_size") if dc.get("swa_window_size") else (n, h, "sliding_window")
    window = d.get(name)
    if not (use and window):
        return
    if dc.get("use_swa", False):
        pattern = [True] * cfg.n_layer
    else:
        pattern = [lt == "sliding_attention" for lt in n.items(h, "layer_types")]
    _u32(kvs, k, "attention.sliding_window", reader, name, window)
    if pattern:
        kvs.put(k("attention.sliding_window_pattern"), VT.ARRAY, pattern, VT.BOOL)
