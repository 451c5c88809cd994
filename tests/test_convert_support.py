"""Synthetic DFlash checkpoints and target GGUFs for the convert dflash / pair-check tests (numpy only, no oracle).

Shapes are written out here independently of ggtools.dflash.layout, so the tests do not check the code
against itself. No tests in this module.
"""

import json
import os
from pathlib import Path

import numpy as np
from gguf import GGUFValueType as VT

from ggtools.gguf import GGUFFile, GGUFWriter
from scripts.fixtures import dspark_checkpoints as DS

H, NH, NKV, HD, FF, NL, VOCAB = 64, 2, 1, 32, 128, 2, 128
V2 = {"conv_kernel_size": 2, "conv_group_size": 16, "selector_rank": 8, "selector_top_k": 2}


def drafter_config(version=1, **top) -> dict:
    dc = {"block_size": 8, "mask_token_id": 100, "target_layer_ids": [1, 5]}
    if version == 2:
        dc |= V2
    cfg = {"architectures": ["DFlash2DraftModel" if version == 2 else "DFlashDraftModel"], "model_type": "qwen3",
           "hidden_size": H, "num_attention_heads": NH, "num_key_value_heads": NKV, "head_dim": HD,
           "intermediate_size": FF, "num_hidden_layers": NL, "vocab_size": VOCAB, "num_target_layers": 8,
           "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "attention_bias": False,
           "rope_parameters": {"rope_theta": 10000.0, "rope_type": "default"}, "dflash_config": dc}
    cfg.update(top)
    return cfg


def drafter_shapes(cfg) -> dict[str, tuple]:
    n = len(cfg["dflash_config"].get("target_layer_ids", [1, 5]))
    s = {"fc.weight": (H, n * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    v2 = "conv_kernel_size" in cfg["dflash_config"]
    if v2:
        R, K, gs = V2["selector_rank"], V2["conv_kernel_size"], V2["conv_group_size"]
        s |= {"candidate_selector.hidden_projection.weight": (R, H),
              "candidate_selector.predecessor_codebook.weight": (VOCAB, R),
              "candidate_selector.successor_codebook.weight": (VOCAB, R)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"layers.{i}."
        s |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
              p + "self_attn.q_proj.weight": (NH * HD, H), p + "self_attn.k_proj.weight": (NKV * HD, H),
              p + "self_attn.v_proj.weight": (NKV * HD, H), p + "self_attn.o_proj.weight": (H, NH * HD),
              p + "self_attn.q_norm.weight": (HD,), p + "self_attn.k_norm.weight": (HD,),
              p + "mlp.gate_proj.weight": (FF, H), p + "mlp.up_proj.weight": (FF, H), p + "mlp.down_proj.weight": (H, FF)}
        if v2:
            for conv in ("attention_conv", "mlp_conv"):
                s[f"{p}{conv}.base_kernel"] = (2, K, H)
                s[f"{p}{conv}.kernel_projection.weight"] = (2 * K * (H // gs), H)
    return s


def random_tensors(cfg, seed=0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in drafter_shapes(cfg).items():
        x = rng.normal(0, 0.05, shape).astype(np.float32)
        out[name] = x + 1 if name.endswith("norm.weight") else x
    return out


to_bf16_bits = DS.bf16_bits


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    return (b.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors: dict[str, tuple[str, np.ndarray]]):
    """tensors: name -> (safetensors dtype, values), written in the order given (the fixtures' writer)."""
    DS.write_safetensors(path, tensors, sort=False)


def make_checkpoint(directory, version=1, *, dtype="BF16", config=None, tensors=None, shards=1, prefix="",
                    hub_codebooks=False, seed=0) -> Path:
    """A drafter directory. config / tensors: full replacements (default: drafter_config / random_tensors)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    cfg = config if config is not None else drafter_config(version)
    values = tensors if tensors is not None else random_tensors(cfg, seed)
    stored = {}
    for name, x in values.items():
        if hub_codebooks and "_codebook." in name:
            name = name.removesuffix(".weight")
        stored[prefix + name] = x if isinstance(x, tuple) else (dtype, x)
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    names = sorted(stored)          # as save_pretrained shards them
    if shards == 1:
        write_safetensors(d / "model.safetensors", stored)
        return d
    per, weight_map = -(-len(names) // shards), {}
    for i in range(shards):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = names[i * per:(i + 1) * per]
        write_safetensors(d / fname, {n: stored[n] for n in part})
        weight_map |= {n: fname for n in part}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return d


DSPARK_RANK, DSPARK_DRAFT_VOCAB, DSPARK_MASK = 32, 64, 100
DSPARK_BACKBONE = dict(model_type="qwen3", hidden_size=H, num_hidden_layers=NL, num_attention_heads=NH,
                       num_key_value_heads=NKV, head_dim=HD, intermediate_size=FF, vocab_size=VOCAB,
                       max_position_embeddings=4096, rms_norm_eps=1e-6, rope_theta=10000.0)


def make_dspark_checkpoint(path, *, arch="Qwen3DSparkModel", layout="flat", conf=True, reduced=False, scale=False,
                           extra=None, drop=()) -> Path:
    """A DSpark drafter of this module's shapes (rank 32; reduced: 64 of the 128 tokens), written by the fixture
    maker's numpy writer (scripts/fixtures/dspark_checkpoints.py)."""
    vd = DSPARK_DRAFT_VOCAB if reduced else None
    cfg = DS.dspark_config(arch, layout, dict(DSPARK_BACKBONE), draft_vocab=vd, rank=DSPARK_RANK,
                           mask_token_id=DSPARK_MASK, extra=extra)
    tensors = DS.dspark_tensors(dict(DSPARK_BACKBONE), confidence=conf, draft_vocab=vd, w2_scale=scale,
                                rank=DSPARK_RANK)
    return DS.write_dspark(path, cfg, {k: v for k, v in tensors.items() if k not in drop})


def make_target_gguf(path, *, arch="qwen3", n_layer=8, hidden=H, vocab=VOCAB, extra=()) -> Path:
    """A target GGUF: what the converter and pair-check read, the keys llama.cpp's loader requires of the arch (the
    model-file rules doctor applies to a target), and zero tensors of the shapes those keys give; `extra` adds keys
    or replaces these."""
    kvs = {"general.architecture": (VT.STRING, arch, None), f"{arch}.block_count": (VT.UINT32, n_layer, None),
           f"{arch}.context_length": (VT.UINT32, 4096, None), f"{arch}.embedding_length": (VT.UINT32, hidden, None),
           f"{arch}.attention.head_count": (VT.UINT32, 4, None),
           f"{arch}.attention.layer_norm_rms_epsilon": (VT.FLOAT32, 1e-6, None),
           f"{arch}.feed_forward_length": (VT.UINT32, FF, None)}
    if arch in ("qwen35", "qwen35moe"):
        kvs[f"{arch}.rope.dimension_sections"] = (VT.ARRAY, [4, 4, 0, 0], VT.INT32)
        kvs |= {f"{arch}.ssm.{k}": (VT.UINT32, v, None) for k, v in (
            ("conv_kernel", 4), ("inner_size", 64), ("state_size", 16), ("time_step_rank", 4), ("group_count", 2))}
    kvs |= {"tokenizer.ggml.model": (VT.STRING, "llama", None),
            "tokenizer.ggml.tokens": (VT.ARRAY, [f"<t{i}>" for i in range(vocab)], VT.STRING),
            "tokenizer.ggml.bos_token_id": (VT.UINT32, 1, None)}
    kvs |= {key: (vtype, value, elem) for key, vtype, value, elem in extra}
    with GGUFWriter(path, force=True) as w:
        for key, (vtype, value, elem) in kvs.items():
            w.add_kv(key, vtype, value, elem)
    return with_required_tensors(path)


def with_required_tensors(path) -> Path:
    """The GGUF with zero F32 tensors added for every tensor its arch's loader requires that it lacks (the shapes
    its keys give; a size they leave open: 1), so that a file made for its keys is a whole model."""
    from ggtools.hparam_rules.required_tensors import required_shapes
    path, tmp = Path(path), Path(f"{path}.with-tensors")
    with GGUFFile(path) as f:
        have = {t.name for t in f.tensors}
        shapes = required_shapes(f, lambda name: (f, f.tensor[name]) if name in have else None)
        added = {name: [s.n or 1 for s in shape] for name, shape in shapes.items() if name not in have}
        if not added:
            return path
        with GGUFWriter(tmp, force=True) as w:
            for kv in f.kvs:
                w.add_kv_record(kv)
            for t in f.tensors:
                w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
            for name, ne in added.items():
                w.add_tensor_info(name, ne, 0, 4 * int(np.prod(ne)))
            for t in f.tensors:
                w.write(f.tensor_data(t))
            for ne in added.values():
                w.write(bytes(4 * int(np.prod(ne))))
    os.replace(tmp, path)
    return path


def rewrite_gguf(src, dst, *, drop_tensors=(), drop_keys=(), set_keys=(), retype=None) -> Path:
    """A copy of a GGUF with tensors or keys removed and keys set (key, vtype, value, elem): broken drafters.
    retype: {tensor: (ggml type, its data bytes)} stores a tensor in another type."""
    retype = retype or {}
    with GGUFFile(src) as f, GGUFWriter(dst, force=True) as w:
        new = {k: (vt, v, e) for k, vt, v, e in set_keys}
        for kv in f.kvs:
            if kv.key in drop_keys:
                continue
            if kv.key in new:
                w.add_kv(kv.key, *new.pop(kv.key))
            else:
                w.add_kv_record(kv)
        for k, (vt, v, e) in new.items():
            w.add_kv(k, vt, v, e)
        keep = [t for t in f.tensors if t.name not in drop_tensors]
        for t in keep:
            type_id, data = retype.get(t.name, (t.type_id, None))
            w.add_tensor_info(t.name, t.ne, type_id, len(data) if data is not None else t.nbytes)
        for t in keep:
            w.write(retype[t.name][1] if t.name in retype else f.tensor_data(t))
    return Path(dst)


def kv_table(path) -> list[tuple]:
    """(key, type label, value) for every KV, arrays as lists."""
    with GGUFFile(path) as f:
        return [(kv.key, kv.type_label, kv.value.tolist() if hasattr(kv.value, "tolist") else kv.value)
                for kv in f.kvs]
