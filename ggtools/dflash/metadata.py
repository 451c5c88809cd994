"""KVList: the ordered metadata a converter writes, and the general.* keys llama.cpp's converter derives.

A key set twice keeps its first position and takes the new value, as gguf-py's writer does (llama.cpp's
converter relies on that, e.g. for `attention.causal`). KVs copied from another GGUF (the target's
tokenizer) are kept as records and written byte for byte.
"""

from dataclasses import dataclass
from pathlib import Path

import gguf
from gguf import GGUFValueType as VT

from ggtools.gguf import KV, GGUFWriter
from ggtools.gguf.values import encode_kv


@dataclass(frozen=True)
class CopiedKV:
    """A KV record copied out of another file (so that file may be closed before writing)."""
    key: str
    vtype: VT
    raw: bytes
    summary: object          # the value, or "[n x TYPE]" for an array

    @property
    def value(self):
        return self.summary


class KVList:
    def __init__(self):
        self._items: dict[str, tuple] = {}        # key -> (vtype, value, elem) | (KV record,)

    def put(self, key: str, vtype: VT, value, elem_type: VT | None = None):
        encode_kv(key, vtype, value, elem_type)    # fail here, with the key, if the value does not fit
        self._items[key] = (vtype, value, elem_type)

    def copy(self, kv: KV):
        summary = f"[{kv.count} x {kv.elem_type.name}]" if kv.is_array else kv.value
        self._items[kv.key] = (CopiedKV(kv.key, kv.vtype, bytes(kv.raw), summary),)

    def __contains__(self, key):
        return key in self._items

    def keys(self) -> list[str]:
        return list(self._items)

    def value(self, key):
        item = self._items[key]
        return item[0].value if len(item) == 1 else item[1]

    def write_to(self, w: GGUFWriter):
        for key, item in self._items.items():
            if len(item) == 1:
                w.add_kv_record(item[0])
            else:
                w.add_kv(key, *item)

    def as_dict(self) -> dict:
        return {k: _plain(self.value(k)) for k in self._items}


def general_kvs(kvs: KVList, arch: str, hf_dir, name: str | None, n_params: int):
    """general.architecture, general.type and the model-card keys exactly as llama.cpp's converter writes
    them: gguf-py's Metadata heuristics (README.md model card, directory name), name falling back to the
    directory name, size label from the parameter count."""
    meta = gguf.Metadata.load(None, Path(hf_dir), name, n_params)
    if meta.name is None:
        meta.name = Path(hf_dir).name
    if meta.size_label is None and n_params > 0:
        meta.size_label = gguf.size_label(n_params, n_params, 0, 0)
    # gguf-py's writer serves only as a recorder of which general.* keys the model card yields, and their
    # order; the bytes are written by ggtools' own writer.
    recorder = gguf.GGUFWriter(None, arch)
    recorder.add_type(gguf.GGUFType.MODEL)
    meta.set_gguf_meta_model(recorder)
    for key, v in recorder.kv_data[0].items():
        elem = None
        if v.type == VT.ARRAY:
            elem = v.sub_type or (VT.get_type(v.value[0]) if len(v.value) else VT.STRING)
        kvs.put(key, v.type, v.value, elem)


def _plain(v):
    if hasattr(v, "tolist"):
        return v.tolist()
    return v
