"""inspect: metadata and tensor table of a file or a whole shard set, as plain data (dicts) for rendering."""

import re

import numpy as np

from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.eagle3 import ARCH as EAGLE3, SPEC_TYPE, TARGET_HIDDEN, TARGET_LAYERS, is_eagle3_arch
from ggtools.gguf import ShardSet
from ggtools.jobs.errors import UsageError

ARRAY_HEAD = 8


def inspect(path, *, tensors: str | None = None, kv: str | None = None, full_arrays: bool = False) -> dict:
    """Describe the model at `path` (any shard names the whole set). Regexes filter tensor names and keys."""
    shards = ShardSet(path)
    try:
        tensor_re, kv_re = _compile(tensors, "--tensors"), _compile(kv, "--kv")
        files = shards.files
        first = files[0]
        out = {
            "files": [{"path": f.path, "version": f.version, "size": f.file_size, "alignment": f.alignment,
                       "data_offset": f.data_offset, "kv_count": len(f.kvs), "tensor_count": len(f.tensors)}
                      for f in files],
            "kv": [describe_kv(k, full_arrays) for k in first.kvs if kv_re is None or kv_re.search(k.key)],
            "tensors": [{"name": t.name, "type": t.type_name, "ne": list(t.ne), "bytes": t.nbytes,
                         "shard": i, "offset": t.offset}
                        for i, f in enumerate(files) for t in f.tensors
                        if tensor_re is None or tensor_re.search(t.name)],
        }
        out["totals"] = _totals(out["tensors"])
        out["drafter"] = drafter_summary(first)
        out["mtp"] = mtp_summary(first, [t.name for f in files for t in f.tensors])
        return out
    finally:
        shards.close()


def drafter_summary(f) -> dict | None:
    """What a DFlash / DSpark drafter file is (its layout; DSpark: heads, rank, block layout, vocabularies), from its
    keys and tensor infos; None for any other file. `validate` and `doctor` check it."""
    if is_eagle3_arch(f.architecture):
        return eagle3_summary(f)
    d = DraftFile.read(f)
    if d.profile is None:
        return None
    family = "DSpark" if d.is_dspark else "DFlash2" if d.is_dflash2 else "DFlash v1"
    out = {"layout": d.profile.name, "family": family, "summary": d.dspark_summary() or family}
    if d.is_dspark:
        out["dspark"] = {"markov_rank": d.markov_rank, "sample_from_anchor": d.sample_from_anchor,
                         "confidence_head": d.has_confidence, "draft_vocab": d.draft_vocab,
                         "d2t": d.tensor("d2t") is not None}
    return out


NEXTN_KEY = "nextn_predict_layers"      # hparam_rules.mtp.NEXTN_KEY (tests/test_startup.py holds them equal)


def mtp_summary(f, names) -> dict | None:
    """A model's MTP (NextN) blocks: nextn_predict_layers, which blocks they are, their tensors, and whether the file
    is an MTP sidecar (no trunk block); None without any. `validate` and `doctor` check them."""
    if not f.get(f"{f.architecture}.{NEXTN_KEY}"):
        return None             # no MTP block: the model-file rules (hparam_rules, tens of ms to import) not needed
    from ggtools.hparam_rules.mtp import mtp_blocks
    blocks = mtp_blocks(f)
    if blocks is None or not blocks.n_nextn:
        return None
    return {"nextn_predict_layers": blocks.n_nextn, "block_count": blocks.n_layer_all, "trunk_blocks": blocks.n_layer,
            "blocks": list(blocks.ids), "sidecar": "blk.0.attn_norm.weight" not in names,
            "tensors": [n for n in names if blocks.holds(n)]}


def eagle3_summary(f) -> dict:
    """An EAGLE3 drafter (llama.cpp's layout): the target layers it taps, the features' width, its vocabulary and
    whether it has its own embedding and head, and the spec type llama.cpp must be told."""
    d2t = f.tensor.get("d2t")
    ids = f.get(f"{EAGLE3}.{TARGET_LAYERS}")
    info = {"target_layers": [int(i) for i in ids] if hasattr(ids, "__len__") else ids,
            "target_hidden_size": f.get(f"{EAGLE3}.{TARGET_HIDDEN}"),
            "norm_before_residual": f.get(f"{EAGLE3}.norm_before_residual"),
            "norm_before_fc": f.get(f"{EAGLE3}.norm_before_fc"),
            "draft_vocab": int(d2t.ne[0]) if d2t is not None else None,
            "own_embedding": "token_embd.weight" in f.tensor, "own_head": "output.weight" in f.tensor,
            "spec_type": SPEC_TYPE}
    vocab = f"draft vocabulary {info['draft_vocab']} (d2t)" if d2t is not None else "the target's vocabulary"
    summary = (f"EAGLE3: taps target layers {info['target_layers']} ({info['target_hidden_size']}-wide features), "
               f"{vocab}; llama.cpp: --spec-type {SPEC_TYPE}")
    return {"layout": "llama.cpp", "family": "EAGLE3", "summary": summary, "eagle3": info}


def _compile(pattern, option):
    if pattern is None:
        return None
    try:
        return re.compile(pattern)
    except re.error as e:
        raise UsageError(option, f"bad regular expression {pattern!r}: {e}") from None


def describe_kv(k, full_arrays=False) -> dict:
    d = {"key": k.key, "type": k.type_label}
    value = k.value if full_arrays else k.head(ARRAY_HEAD)
    if k.is_array:
        d["count"] = k.count
    d["value"] = json_value(value)
    return d


def json_value(v):
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, list):
        return [json_value(x) for x in v]
    if isinstance(v, str):
        return v.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    if isinstance(v, float) and not np.isfinite(v):
        return str(v)
    return v


def _totals(tensors) -> dict:
    by_type = {}
    for t in tensors:
        entry = by_type.setdefault(t["type"], {"tensors": 0, "bytes": 0})
        entry["tensors"] += 1
        entry["bytes"] += t["bytes"] or 0
    return {"by_type": dict(sorted(by_type.items())), "tensors": len(tensors),
            "bytes": sum(e["bytes"] for e in by_type.values())}
