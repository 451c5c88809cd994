"""Tiny qwen35 GGUFs with MTP (NextN) blocks, written here in a blink (no converter), laid out as llama.cpp's
converter lays them out (tests/test_mtp.py proves that layout on its own conversions): the trunk of
tests/tiny_targets.write_qwen35 (blocks 0..3), then each MTP block `blk.{4+i}`: a copy of the full-attention block 3
and `nextn.eh_proj` {2E, E}, `nextn.enorm`, `nextn.hnorm`, `nextn.shared_head_norm`; `block_count` counting them,
`nextn_predict_layers` their number. Inputs of the hostile corpus, the OS-error and interrupt tests and the
refusals of tests/test_mtp.py.
"""

import os

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

from ggtools.gguf import GGUFFile, GGUFWriter
from tests.tiny_targets import EMBD, write_qwen35

TRUNK = 4               # write_qwen35's blocks; block 3 is its full-attention one
NEXTN = ("nextn.eh_proj.weight", "nextn.enorm.weight", "nextn.hnorm.weight", "nextn.shared_head_norm.weight")


def write_qwen35_mtp(path, n_nextn=1, drop=(), keys=(), seed=0) -> str:
    """A qwen35 target with n_nextn MTP blocks (0: none, and no nextn_predict_layers key); drop: tensor names left
    out; keys: (key, vtype, value) set (in place where the key exists)."""
    base = f"{path}.trunk"
    write_qwen35(base, n_layer=TRUNK, seed=seed)
    rng = np.random.default_rng(seed + 1)
    with GGUFFile(base) as f, GGUFWriter(str(path)) as w:
        given = {key: (vtype, value) for key, vtype, value in keys}
        given = {"qwen35.block_count": (VT.UINT32, TRUNK + n_nextn)} | given
        for kv in f.kvs:
            if kv.key in given:
                w.add_kv(kv.key, *given.pop(kv.key))
            else:
                w.add_kv_record(kv)
        if n_nextn:
            w.add_kv("qwen35.nextn_predict_layers", VT.UINT32, n_nextn)
        for key, (vtype, value) in given.items():
            w.add_kv(key, vtype, value)
        tensors = [(t.name, t.ne, t.type_id, bytes(f.tensor_data(t))) for t in f.tensors]
        full = [x for x in tensors if x[0].startswith(f"blk.{TRUNK - 1}.")]
        for b in range(TRUNK, TRUNK + n_nextn):
            tensors += [(name.replace(f"blk.{TRUNK - 1}.", f"blk.{b}."), ne, t, data) for name, ne, t, data in full]
            for name in NEXTN:
                ne = (2 * EMBD, EMBD) if "eh_proj" in name else (EMBD,)
                values = rng.standard_normal(ne[::-1]) * 0.1 + (0 if "eh_proj" in name else 1)
                tensors.append((f"blk.{b}.{name}", ne, int(T.F32), values.astype("<f4").tobytes()))
        tensors = [x for x in tensors if x[0] not in drop]
        for name, ne, t, data in tensors:
            w.add_tensor_info(name, ne, t, len(data))
        for *_, data in tensors:
            w.write(data)
    os.remove(base)
    return str(path)


def sidecar_of(src, dst) -> str:
    """What `convert mtp` writes of src, by hand: its keys, token_embd, output_norm, output and the MTP blocks."""
    with GGUFFile(src) as f, GGUFWriter(str(dst)) as w:
        n_layer = f.get("qwen35.block_count") - f.get("qwen35.nextn_predict_layers")
        keep = [t for t in f.tensors if t.name in TRUNK_KEPT or _block(t.name) >= n_layer]
        for kv in f.kvs:
            w.add_kv_record(kv)
        for t in keep:
            w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
        for t in keep:
            w.write(f.tensor_data(t))
    return str(dst)


TRUNK_KEPT = ("token_embd.weight", "output_norm.weight", "output.weight")


def _block(name) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1
