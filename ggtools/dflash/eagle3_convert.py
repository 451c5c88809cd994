"""EAGLE3 conversion: what llama.cpp's own converter (`convert_hf_to_gguf.py`, LlamaModel's eagle3 paths at 0c1e570)
writes for an EAGLE3 checkpoint, byte for byte: the keys in its order and types, the tensors in its order, names,
types and values. Every fact (names, keys, messages) comes from dflash/eagle3.py.

Keys: `general.architecture` eagle3, then the four EAGLE3 keys (`target_layers` INT32, `target_hidden_size`,
`norm_before_residual`, `norm_before_fc`), the general.* model-card keys, TextModel's hparams (with transformers'
LlamaConfig defaults where config.json says model_type 'llama'), `general.file_type`, `vocab_size`,
`rope.dimension_count`, `general.quantization_version`, then the target's tokenizer. Tensors: `rope_freqs` first
(llama3 RoPE scaling), the checkpoint's in the converter's order (q / k rows permuted for llama.cpp's RoPE, t2d
dropped), `d2t` last as absolute I64 target ids.

Where ggtools differs: the tokenizer comes from the target's GGUF (`--target-gguf`, copied verbatim) instead of the
target's Hugging Face tokenizer files (the same bytes when that GGUF was converted by llama.cpp from them); and it
refuses what the converter writes although llama.cpp cannot run it (eagle3_config's checks).
"""

from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

from ggtools.dflash import eagle3 as E
from ggtools.dflash.config_reader import LAYER_ID, U32
from ggtools.dflash.eagle3_checkpoint import Eagle3Checkpoint
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.llamacpp import OUTTYPES, _text_model_hparams, _type, auto_outtype, rope_parameters
from ggtools.dflash.metadata import KVList, general_kvs
from ggtools.dflash.safetensors import FLOAT_DTYPES
from ggtools.dflash.tensors import DerivedTensor, TensorJob


@dataclass
class TargetFacts:
    """What the conversion takes from the target: its layer count (the trunk: block_count - nextn_predict_layers),
    hidden size and vocabulary, and where each came from; the target's arch and tokenizer (its GGUF)."""
    n_layer: int | None
    hidden: int | None
    vocab: int | None
    source: str                  # the GGUF's path, or the target dir's config.json
    arch: str | None = None
    tokenizer_kvs: tuple = ()
    gguf_vocab: int | None = None      # the tokens of the GGUF's tokenizer (d2t's ids index them at run time)


@dataclass
class Eagle3Config:
    hidden: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    vocab: int
    draft_vocab: int
    target_layers: list[int]
    layers_from: str
    target_hidden: int
    hidden_from: str
    norm_before_residual: bool
    norm_before_fc: bool
    rope: dict

    @property
    def reduced(self) -> bool:
        return self.draft_vocab < self.vocab

    def summary(self, ckpt: Eagle3Checkpoint) -> str:
        vocab = (f"draft vocabulary {self.draft_vocab} of {self.vocab} (d2t)" if self.reduced else
                 f"full vocabulary {self.vocab}")
        flags = [f for f in (E.NORM_BEFORE_RESIDUAL, E.NORM_BEFORE_FC) if getattr(self, f)]
        embd = "own embedding" if "embed_tokens.weight" in ckpt.tensors else "the target's embedding"
        return (f"EAGLE3 ({ckpt.architecture}, {ckpt.layout}): hidden {self.hidden}, {vocab}, {embd}, target layers "
                f"{self.target_layers} ({self.layers_from}), target hidden {self.target_hidden}"
                + (f", {', '.join(flags)}" if flags else ""))


def eagle3_config(ckpt: Eagle3Checkpoint, target: TargetFacts) -> Eagle3Config:
    """The hyperparameters the conversion writes, checked as llama.cpp's converter checks them and beyond."""
    h, raw, n, where = ckpt.hparams, ckpt.raw, ckpt.numbers, ckpt.config_path
    hidden = n.require(h, "hidden_size", U32)
    n_head = n.require(h, "num_attention_heads", U32)
    n_head_kv = n.get(h, "num_key_value_heads", U32, n_head)
    if n_head == 0 or n_head_kv == 0 or n_head % n_head_kv:
        raise CheckpointError(where, f"num_attention_heads {n_head} is not a positive multiple of num_key_value_heads "
                                     f"{n_head_kv}", f"key '{n.place('num_key_value_heads')}'")
    head_dim = n.get(h, "head_dim", U32) or hidden // n_head
    if head_dim == 0 or head_dim % 2:
        raise CheckpointError(where, f"head size {head_dim}: RoPE rotates pairs of a head's dimensions (an even "
                                     "size above 0)", f"key '{n.place('head_dim')}'")
    vocab = n.require(h, "vocab_size", U32)
    draft_vocab = n.require(h, "draft_vocab_size", U32)
    if not 0 < draft_vocab <= vocab:
        raise CheckpointError(where, f"draft_vocab_size {draft_vocab} is not in 1..vocab_size {vocab}",
                              f"key '{n.place('draft_vocab_size')}'")
    layers, layers_from = _target_layers(raw, target, n)
    target_hidden, hidden_from = _target_hidden(raw, target, n, hidden)
    cfg = Eagle3Config(hidden, n_head, n_head_kv, head_dim, n.require(h, "intermediate_size", U32), vocab,
                       draft_vocab, layers, layers_from, target_hidden, hidden_from,
                       _flag(raw, E.NORM_BEFORE_RESIDUAL, where), _flag(raw, E.NORM_BEFORE_FC, where),
                       rope_parameters(h, n)[0])
    check_tensors(ckpt, cfg, target)
    return cfg


def _target_layers(raw, target: TargetFacts, n) -> tuple[list[int], str]:
    """The config's eagle_aux_hidden_state_layer_ids, else [2, L // 2, L - 3] of the target's L layers; exactly 3
    (llama.cpp's loader refuses any other count), each a layer input of the target or its last output (id L)."""
    aux = raw.get(E.AUX_IDS)
    if aux:
        ids, source = n.numbers(aux, E.AUX_IDS, LAYER_ID), E.AUX_IDS
    else:
        if target.n_layer is None:
            raise CheckpointError(target.source, "states no layer count, and config.json has no "
                                                 f"{E.AUX_IDS}: nothing to derive the target layers from")
        ids = E.default_target_layers(target.n_layer)
        source = f"[2, L // 2, L - 3] of the target's {target.n_layer} layers (no {E.AUX_IDS} in config.json)"
        if min(ids) < 0:
            raise CheckpointError(target.source, f"has {target.n_layer} layers: the converter's target layers {ids} "
                                                 "are not layers of it; add eagle_aux_hidden_state_layer_ids to "
                                                 "config.json")
    if len(ids) != E.N_TAPS:
        raise CheckpointError(n.path, f"{ids}: llama.cpp refuses the drafter (\"{E.SAYS_THREE}\"): EAGLE3 taps 3 "
                                      "target layers", f"key '{n.place(E.AUX_IDS)}'")
    if target.n_layer is not None and max(ids) > target.n_layer:
        raise CheckpointError(n.path, f"{ids}: id {max(ids)} is beyond the {target.n_layer}-layer target "
                                      f"{target.source} (ids 0..{target.n_layer - 1} tap a layer's input, "
                                      f"{target.n_layer} its last output): llama.cpp aborts "
                                      f"(\"{E.SAYS_BEYOND.format(max(ids), target.n_layer)}\")",
                              f"key '{n.place(E.AUX_IDS)}'" if aux else "target_layers")
    return [int(i) for i in ids], source


def _target_hidden(raw, target: TargetFacts, n, draft_hidden: int) -> tuple[int, str]:
    stated = raw.get(E.TARGET_HIDDEN)
    if stated is not None:
        value, source = n.number(stated, E.TARGET_HIDDEN, U32), f"{E.TARGET_HIDDEN} in config.json"
    elif target.hidden is not None:
        value, source = target.hidden, f"the target's hidden size ({target.source})"
    else:
        raise CheckpointError(target.source, f"states no hidden size, and config.json has no {E.TARGET_HIDDEN}")
    if value == 0:
        raise CheckpointError(n.path, "is 0: the features the drafter reads are 3 x this wide",
                              f"key '{n.place(E.TARGET_HIDDEN)}'")
    if target.hidden is not None and value != target.hidden:
        says = E.SAYS_FEATURES.format(3 * target.hidden, draft_hidden, 3 * value)
        raise CheckpointError(n.path, f"{value}, but the target {target.source} has hidden size {target.hidden}: "
                                      f"llama.cpp refuses the features (\"{says}\"); this drafter belongs to another "
                                      "model", f"key '{n.place(E.TARGET_HIDDEN)}'")
    return int(value), source


def _flag(raw, key, where) -> bool:
    value = raw.get(key, False)
    if not isinstance(value, bool):
        raise CheckpointError(where, f"{value!r} is not true or false", f"key '{key}'")
    return value


# ---- tensors --------------------------------------------------------------------------------------------------

def required_shapes(cfg: Eagle3Config) -> dict[str, tuple]:
    """Canonical name -> HF shape ([out, in]) of what every EAGLE3 drafter holds (eagle3.cpp's required tensors)."""
    H, ff, d = cfg.hidden, cfg.n_ff, cfg.head_dim
    q, kv = cfg.n_head * d, cfg.n_head_kv * d
    p = "layers.0."
    shapes = {"fc.weight": (H, E.N_TAPS * cfg.target_hidden), "norm.weight": (H,),
              p + "input_layernorm.weight": (H,), p + "hidden_norm.weight": (H,),
              p + "post_attention_layernorm.weight": (H,), p + "self_attn.q_proj.weight": (q, 2 * H),
              p + "self_attn.k_proj.weight": (kv, 2 * H), p + "self_attn.v_proj.weight": (kv, 2 * H),
              p + "self_attn.o_proj.weight": (H, q), p + "mlp.gate_proj.weight": (ff, H),
              p + "mlp.up_proj.weight": (ff, H), p + "mlp.down_proj.weight": (H, ff)}
    if cfg.norm_before_fc:
        shapes["input_norm.weight"] = (E.N_TAPS * cfg.target_hidden,)
    if cfg.reduced:
        shapes["lm_head.weight"] = (cfg.draft_vocab, H)
        shapes[E.D2T] = (cfg.draft_vocab,)
    return shapes


def optional_shapes(cfg: Eagle3Config) -> dict[str, tuple | None]:
    out = {"embed_tokens.weight": (cfg.vocab, cfg.hidden), "lm_head.weight": (cfg.draft_vocab, cfg.hidden),
           E.D2T: (cfg.draft_vocab,), E.T2D: None}
    return out


def check_tensors(ckpt: Eagle3Checkpoint, cfg: Eagle3Config, target: TargetFacts):
    """Every tensor llama.cpp's loader requires, in the shape the config gives it; nothing it has no place for."""
    required, optional = required_shapes(cfg), optional_shapes(cfg)
    for name, shape in required.items():
        if name not in ckpt.tensors:
            raise CheckpointError(ckpt.path, f"missing from the safetensors files ({_why_required(name, cfg)})",
                                  f"tensor '{name}'")
    for name, t in ckpt.tensors.items():
        shape = required.get(name, optional.get(name, ...))
        if shape is ...:
            if name == "input_norm.weight":
                raise CheckpointError(t.path, "present, but config.json does not set norm_before_fc: llama.cpp's "
                                              "loader would not take enc.output_norm.weight (\"done_getting_tensors: "
                                              "wrong number of tensors\")", f"tensor '{t.name}'")
            raise CheckpointError(t.path, f"llama.cpp's converter has no place for it (\"Can not map tensor "
                                          f"'{t.name}'\")", f"tensor '{t.name}'")
        if shape is not None and tuple(t.shape) != tuple(shape):
            raise CheckpointError(t.path, f"shape {list(t.shape)}, but config.json implies {list(shape)}"
                                          f"{_shape_rule(name, cfg)}", f"tensor '{t.name}'")
        if t.dtype not in FLOAT_DTYPES and name not in (E.D2T, E.T2D):
            raise CheckpointError(t.path, f"dtype {t.dtype}: a weight must be one of {', '.join(FLOAT_DTYPES)}",
                                  f"tensor '{t.name}'")
    if E.D2T in ckpt.tensors and not cfg.reduced:
        raise CheckpointError(ckpt.tensors[E.D2T].path, f"draft_vocab_size {cfg.draft_vocab} = vocab_size: a d2t "
                                                        "table belongs to a reduced draft vocabulary",
                              f"tensor '{ckpt.tensors[E.D2T].name}'")
    embd = ckpt.tensors.get("embed_tokens.weight")
    if embd is None and target.hidden is not None and target.hidden != cfg.hidden:
        raise CheckpointError(ckpt.path, f"no embed_tokens.weight, and the drafter's hidden size {cfg.hidden} is not "
                                         f"the target's {target.hidden}: llama.cpp would embed tokens with the "
                                         "target's embedding, which the drafter's layer cannot take",
                              "tensor 'embed_tokens.weight'")
    if embd is not None and target.gguf_vocab is not None and cfg.vocab < target.gguf_vocab:
        raise CheckpointError(ckpt.config_path, f"vocab_size {cfg.vocab} (embed_tokens' rows) is below the target's "
                                                f"{target.gguf_vocab} tokens ({target.source}): a target token id "
                                                "beyond it reads outside the drafter's embedding",
                              f"key '{ckpt.numbers.place('vocab_size')}'")


def _why_required(name, cfg) -> str:
    if name == "input_norm.weight":
        return "config.json sets norm_before_fc: llama.cpp's loader requires enc.output_norm.weight"
    if name == "lm_head.weight":
        return (f"draft_vocab_size {cfg.draft_vocab} < vocab_size {cfg.vocab}: without the drafter's own head "
                f"llama.cpp takes the target's ({cfg.vocab} rows) and aborts (\"{E.SAYS_D2T_HEAD}\")")
    if name == E.D2T:
        return (f"draft_vocab_size {cfg.draft_vocab} < vocab_size {cfg.vocab}: without d2t llama.cpp's loader refuses "
                f"output.weight's {cfg.draft_vocab} rows (it expects the vocabulary's {cfg.vocab})")
    return "every EAGLE3 drafter has it (llama.cpp's loader requires it)"


def _shape_rule(name, cfg) -> str:
    if name == "fc.weight":
        return f" (hidden_size {cfg.hidden} x 3 target layers x target hidden size {cfg.target_hidden})"
    if name.startswith("layers.0.self_attn.") and name.split(".")[2] in ("q_proj", "k_proj", "v_proj"):
        return f" (the attention reads [embedding, features]: 2 x hidden_size {cfg.hidden})"
    if name in (E.D2T, "lm_head.weight"):
        return f" (draft_vocab_size {cfg.draft_vocab})"
    return ""


def d2t_ids(ckpt: Eagle3Checkpoint, target: TargetFacts) -> np.ndarray:
    """d2t as the converter writes it: offset + row index, int64, each inside the target's vocabulary (its config's
    vocab_size as the converter checks it, and the tokens of the tokenizer llama.cpp scatters the logits over),
    none twice."""
    src = ckpt.tensors[E.D2T]
    where = f"tensor '{src.name}'"
    values = src.read_exact()
    if values.dtype != np.int64:
        if not np.all(np.isfinite(values)) or np.any(values != np.trunc(values)):
            raise CheckpointError(src.path, "holds values that are not whole numbers (target-id offsets)", where)
        values = values.astype(np.int64)
    ids = values.reshape(-1) + np.arange(values.size, dtype=np.int64)
    for vocab, whose in ((target.vocab, "the converter's check"), (target.gguf_vocab, "the target's tokenizer")):
        if vocab is None:
            continue
        outside = np.flatnonzero((ids < 0) | (ids >= vocab))
        if outside.size:
            row = int(outside[0])
            raise CheckpointError(src.path, f"\"{E.SAYS_D2T_RANGE.format(vocab)}\" ({whose}: row {row} maps to "
                                            f"{int(values[row])} + {row} = {int(ids[row])})", where)
    order = np.argsort(ids, kind="stable")
    repeated = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if repeated.size:
        a, b = sorted(int(r) for r in order[repeated[0]:repeated[0] + 2])
        raise CheckpointError(src.path, f"\"{E.SAYS_D2T_DUPLICATE}\" (rows {a} and {b} both map to {int(ids[a])})",
                              where)
    return ids


def tensor_jobs(ckpt: Eagle3Checkpoint, cfg: Eagle3Config, target: TargetFacts, outtype: str) -> list[TensorJob]:
    want = OUTTYPES[outtype][0]
    jobs = []
    if cfg.rope.get("rope_type", "").lower() == "llama3":
        jobs.append(TensorJob(DerivedTensor("rope_scaling (llama3)", ckpt.config_path, llama3_rope_factors(cfg)),
                              E.ROPE_FREQS, T.F32, "llama3 RoPE scaling: generated, F32 (the converter's first)"))
    for name, src in ckpt.tensors.items():
        if name in (E.D2T, *E.DROPPED):
            continue
        gguf = E.gguf_name(name)
        dst, reason = _type(gguf, src.shape, want)
        heads = _rope_heads(name, cfg)
        head_dim = src.shape[0] // heads if heads else None
        if head_dim:
            reason += "; rows permuted per head for llama.cpp's RoPE"
        jobs.append(TensorJob(src, gguf, dst, reason, interleave_head_dim=head_dim))
    if E.D2T in ckpt.tensors:
        src = ckpt.tensors[E.D2T]
        jobs.append(TensorJob(DerivedTensor(src.name, src.path, d2t_ids(ckpt, target)), E.NAMES[E.D2T], T.I64,
                              "offset + row index: absolute target ids, I64 (written last)"))
    return jobs


def _rope_heads(name: str, cfg: Eagle3Config) -> int | None:
    """The heads whose rows LlamaModel.permute interleaves in this tensor (q: every head, k: the KV heads)."""
    return {"layers.0.self_attn.q_proj": cfg.n_head, "layers.0.self_attn.k_proj": cfg.n_head_kv}.get(
        name.rpartition(".")[0])


def llama3_rope_factors(cfg: Eagle3Config) -> np.ndarray:
    """rope_freqs for llama3 RoPE scaling: LlamaModel.generate_extra_tensors, with torch's float32 operations when
    torch is installed (the converter's, so the same bits on the same machine); else the same formula in float32
    numpy, whose pow may differ from torch's in the last bit."""
    rp = cfg.rope
    base, dim = float(rp.get("rope_theta", 10000.0)), cfg.head_dim
    factor, low, high = rp.get("factor", 8.0), rp.get("low_freq_factor", 1.0), rp.get("high_freq_factor", 4.0)
    old = rp.get("original_max_position_embeddings", 8192)
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        freqs = list(1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)))
    else:
        f32 = np.float32
        freqs = [f32(1.0) / f for f in np.power(f32(base), np.arange(0, dim, 2, dtype=f32) / f32(dim))]
    out = []
    low_wavelen, high_wavelen = old / low, old / high
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    if torch is not None:
        return torch.tensor(out, dtype=torch.float32).numpy()
    return np.array(out, dtype=np.float32)


# ---- metadata -------------------------------------------------------------------------------------------------

def metadata(ckpt: Eagle3Checkpoint, cfg: Eagle3Config, target: TargetFacts, jobs, outtype: str, name) -> KVList:
    k = lambda key: f"{E.ARCH}.{key}"            # noqa: E731
    kvs = KVList()
    kvs.put("general.architecture", VT.STRING, E.ARCH)
    kvs.put(k(E.TARGET_LAYERS), VT.ARRAY, cfg.target_layers, VT.INT32)
    kvs.put(k(E.TARGET_HIDDEN), VT.UINT32, cfg.target_hidden)
    kvs.put(k(E.NORM_BEFORE_RESIDUAL), VT.BOOL, cfg.norm_before_residual)
    kvs.put(k(E.NORM_BEFORE_FC), VT.BOOL, cfg.norm_before_fc)
    general_kvs(kvs, E.ARCH, ckpt.path, name, sum(j.n_elements for j in jobs))
    h, n = ckpt.hparams, ckpt.numbers
    rope, rope_n = rope_parameters(h, n)
    _text_model_hparams(kvs, k, h, n, rope, rope_n, OUTTYPES[outtype][1])
    kvs.put(k("vocab_size"), VT.UINT32, cfg.vocab)
    kvs.put(k("rope.dimension_count"), VT.UINT32, n.get(h, "head_dim", U32) or cfg.hidden // cfg.n_head)
    kvs.put("general.quantization_version", VT.UINT32, 2)
    for kv in target.tokenizer_kvs:
        kvs.copy(kv)
    return kvs


def plan(ckpt: Eagle3Checkpoint, target: TargetFacts, outtype: str, name) -> tuple[str, Eagle3Config, list, KVList]:
    """(resolved outtype, the config, tensor jobs, metadata)."""
    cfg = eagle3_config(ckpt, target)
    resolved = auto_outtype(ckpt) if outtype == "auto" else outtype
    jobs = tensor_jobs(ckpt, cfg, target, resolved)
    return resolved, cfg, jobs, metadata(ckpt, cfg, target, jobs, resolved, name)

