"""The `lucebox` profile's converter: what Luce-Org/lucebox's `server/scripts/convert_dflash_to_gguf.py`
(62880e20) writes for a DFlash v1 checkpoint: every key under the arch prefix, raw HF layer ids, no tokenizer,
BF16 stored as F16. The facts (arch, key and tensor names, id convention) come from the profile object `p` each
function is given (profiles.LUCEBOX).

Keys, key types, tensor names, order and dtype rules are the reference's. Values follow ggtools' resolution
where the reference falls back to hard-coded 27B defaults: rope theta also from `rope_parameters`, the mask id
also from dflash_config, the block size also from dflash_config, and target ids that do not match the fc width
are an error rather than a silently dropped key. Sliding-window keys, which its loader reads but this revision of
its converter no longer writes, are written when the drafter has sliding layers (as earlier revisions did).
lucebox has no DFlash2 support.

DSpark: lucebox's converter takes the heads from a separate aux-heads file (`--aux-heads`, names
`dspark_markov_head.*` / `dspark_confidence_head.*`); here they come from the checkpoint itself. Written as it
writes them: `dflash.dspark.markov.{w1,w2}` and `dflash.dspark.confidence.weight` F16 (whatever the source
dtype), `dflash.dspark.confidence.bias` F32 (a zero bias when the checkpoint has none), after every other
tensor; the keys `dflash.dspark.{enabled, markov_rank, vocab_size}` (+ `confidence_dim`, `confidence.enabled`)
after the DFlash ones. What its DSpark path cannot draft (anchor-first blocks, a reduced vocabulary, a scale on
markov_w2) is refused before this converter runs (profiles.Profile.dspark_refusal).
"""

from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

import numpy as np

from ggtools.dflash.checkpoint import Checkpoint
from ggtools.dflash.config import DraftConfig, rope_base
from ggtools.dflash.config_reader import F32, U32, ConfigReader
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.metadata import KVList
from ggtools.dflash.profiles import CONF_B, CONF_W, DSPARK_HEADS, MARKOV_W1, MARKOV_W2, T2D
from ggtools.dflash.tensors import DerivedTensor, TensorJob

DEFAULT_CONTEXT = 32768
DROPPED = ("embed_tokens.weight", "lm_head.weight", T2D)  # lucebox uses the target's embedding, head, vocabulary
DSPARK_ORDER = (MARKOV_W1, MARKOV_W2, CONF_W, CONF_B)     # the order its converter appends the heads in


def plan(p, ckpt: Checkpoint, cfg: DraftConfig, outtype: str, target, name):
    """(outtype, tensor jobs, metadata, notes) for profile p (the lucebox profile's facts)."""
    jobs, notes = tensor_jobs(p, ckpt, cfg)
    return "auto", jobs, metadata(p, KVList(), ckpt, cfg), notes


def plan_tensors(p, ckpt: Checkpoint, cfg: DraftConfig, outtype: str) -> list[TensorJob]:
    return tensor_jobs(p, ckpt, cfg)[0]


def tensor_jobs(p, ckpt: Checkpoint, cfg: DraftConfig) -> tuple[list[TensorJob], list[str]]:
    """The output tensors in lucebox's order (dflash.*, output_*, blk.* by layer, then the DSpark heads), and notes
    on what was dropped or added."""
    jobs, notes = [], []
    for hf_name, src in ckpt.tensors.items():
        name = p.gguf_name(hf_name)
        if name is None:
            if hf_name in DROPPED:
                notes.append(f"dropped {src.name}: lucebox takes the embedding, head and vocabulary from the target")
                continue
            raise CheckpointError(src.path, "the lucebox profile has no place for it (its loader would not read "
                                            "it); use --profile llama.cpp", f"tensor '{src.name}'")
        jobs.append(_dspark_job(src, name) if hf_name in DSPARK_HEADS else _job(src, name))
    if cfg.dspark is not None and cfg.dspark.confidence and not cfg.dspark.conf_bias:
        zero = DerivedTensor("<zero bias>", ckpt.path, np.zeros(1, np.float32))
        jobs.append(TensorJob(zero, p.gguf_name(CONF_B), T.F32, "no confidence bias in the checkpoint: a zero bias, "
                                                                  "as lucebox's converter writes"))
        notes.append("no confidence_head.proj.bias: wrote a zero bias (lucebox's loader needs one)")
    jobs.sort(key=lambda j: tensor_order(p, j.name))
    return jobs, notes


def _dspark_job(src, name) -> TensorJob:
    """lucebox's converter stores the heads' weights F16 whatever their dtype (BF16 through F32), the bias F32
    (a BF16 bias through F16)."""
    if name.endswith(".bias"):
        return TensorJob(src, name, T.F32, f"DSpark bias: F32{' (through F16)' if src.dtype == 'BF16' else ''}",
                         via_f16=src.dtype == "BF16")
    return TensorJob(src, name, T.F16, "DSpark head: F16 (lucebox's converter stores its heads F16)")


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


def tensor_order(p, name: str) -> tuple:
    """lucebox's converter: dflash.* singletons, output_*, blk.* by layer, then the DSpark heads it appends."""
    heads = [p.gguf_name(n) for n in DSPARK_ORDER]
    if name in heads:
        return (4, heads.index(name), name)
    if name.startswith(("dflash.", "dflash_")):
        return (0, 0, name)
    if name.startswith("output_"):
        return (1, 0, name)
    parts = name.split(".")
    return (2, int(parts[1]), name) if parts[0] == "blk" and parts[1].isdigit() else (3, 0, name)


def metadata(p, kvs: KVList, ckpt: Checkpoint, cfg: DraftConfig) -> KVList:
    c, k, n = ckpt.config, p.key, ckpt.numbers
    kvs.put("general.architecture", VT.STRING, p.arch)
    kvs.put("general.name", VT.STRING, f"DFlash-Draft-{cfg.hidden}h-{cfg.n_layer}L")
    for key, value in (("context_length", n.get(c, "max_position_embeddings", U32) or DEFAULT_CONTEXT),
                       ("embedding_length", cfg.hidden), ("block_count", cfg.n_layer),
                       ("feed_forward_length", cfg.n_ff), ("attention.head_count", cfg.n_head),
                       ("attention.head_count_kv", cfg.n_head_kv), ("attention.key_length", cfg.head_dim),
                       ("attention.value_length", cfg.head_dim)):
        kvs.put(k(key), VT.UINT32, value)
    if cfg.vocab is None:
        raise CheckpointError(ckpt.config_path, "missing (the lucebox profile writes vocab_size)", "vocab_size")
    kvs.put(k("vocab_size"), VT.UINT32, cfg.vocab)
    kvs.put(k("attention.layer_norm_rms_epsilon"), VT.FLOAT32, float(n.get(c, "rms_norm_eps", F32) or 1e-6))
    theta, where = rope_base(ckpt)
    if theta is None:
        raise CheckpointError(ckpt.config_path, f"missing ({where}); lucebox's own converter would write its 27B "
                                                "default 1e6", "rope_theta")
    kvs.put(k("rope.freq_base"), VT.FLOAT32, theta)
    kvs.put(k("n_target_ids"), VT.UINT32, len(cfg.target_layer_ids))
    kvs.put(k("block_size"), VT.UINT32, cfg.block_size)
    kvs.put(k("mask"), VT.UINT32, cfg.mask_token_id)
    kvs.put(k("target_ids"), VT.ARRAY, p.stored_ids(cfg.target_layer_ids), VT.INT32)
    _sliding_window(kvs, k, c, n)
    if cfg.dspark is not None:
        ds = cfg.dspark
        for role, value in (("dspark_enabled", 1), ("markov_rank", ds.rank), ("dspark_vocab_size", ds.vocab)):
            kvs.put(k(role), VT.UINT32, value)
        if ds.confidence:
            kvs.put(k("confidence_dim"), VT.UINT32, cfg.hidden + ds.rank)
            kvs.put(k("confidence_enabled"), VT.UINT32, 1)
    return kvs


def _sliding_window(kvs, k, c, n: ConfigReader):
    pattern = [lt == "sliding_attention" for lt in n.items(c, "layer_types")]
    window = n.get(c, "sliding_window", U32)
    if any(pattern) and window:
        kvs.put(k("attention.sliding_window"), VT.UINT32, window)
        kvs.put(k("attention.sliding_window_pattern"), VT.ARRAY, pattern, VT.BOOL)
