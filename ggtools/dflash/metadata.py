"""KVList: the ordered metadata a converter writes, and the general.* keys llama.cpp's converter derives.

A key set twice keeps its first position and takes the new value, as gguf-py's writer does (llama.cpp's
converter relies on that, e.g. for `attention.causal`). KVs copied from another GGUF (the target's
tokenizer) are kept as records and written byte for byte.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import gguf
import yaml
from gguf import GGUFValueType as VT

from ggtools.dflash.config_reader import F32, I32, ConfigReader
from ggtools.dflash.errors import CheckpointError
from ggtools.gguf import KV, GGUFWriter
from ggtools.gguf.inputs import regular_file
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

    def record(self, key: str) -> bytes:
        """The KV's record as a GGUF file holds it (key, value type, value)."""
        item = self._items[key]
        return item[0].raw if len(item) == 1 else encode_kv(key, *item)

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
    them: gguf-py's Metadata heuristics (README.md model card, generation_config.json's sampling values, config.json's
    _name_or_path, directory name), name falling back to the directory name, size label from the parameter count.
    What those files hold is checked first, so a value of the wrong type is refused naming its file and key."""
    _check_card_sources(Path(hf_dir))
    readme = Path(hf_dir) / "README.md"
    # gguf-py's writer serves only as a recorder of which general.* keys the model card yields, and their
    # order; the bytes are written by ggtools' own writer.
    recorder = gguf.GGUFWriter(None, arch)
    try:
        meta = gguf.Metadata.load(None, Path(hf_dir), name, n_params)
        if meta.name is None:
            meta.name = Path(hf_dir).name
        if meta.size_label is None and n_params > 0:
            meta.size_label = gguf.size_label(n_params, n_params, 0, 0)
        recorder.add_type(gguf.GGUFType.MODEL)
        meta.set_gguf_meta_model(recorder)
    except (ValueError, TypeError, AttributeError, yaml.YAMLError) as e:     # ValueError: UTF-8 too
        raise CheckpointError(readme, f"the model card's front matter cannot be read: {_one_line(e)}") from None
    for key, v in recorder.kv_data[0].items():
        elem = None
        if v.type == VT.ARRAY:
            elem = v.sub_type or (VT.get_type(v.value[0]) if len(v.value) else VT.STRING)
        _check_card_value(readme, key, v.type, v.value)
        kvs.put(key, v.type, v.value, elem)


# generation_config.json's sampling values gguf-py writes (general.sampling.*), and the GGUF type of each
SAMPLING_NUMBERS = {"top_k": I32, "top_p": F32, "min_p": F32, "xtc_probability": F32, "xtc_threshold": F32,
                    "temperature": F32, "penalty_last_n": I32, "penalty_repeat": F32, "mirostat": I32,
                    "mirostat_tau": F32, "mirostat_eta": F32}


def _check_card_sources(hf_dir: Path):
    """config.json's _name_or_path (text) and generation_config.json's sampling values (an object of numbers), which
    gguf-py's heuristics use without checking (a generation_config.json that is not JSON at all it ignores)."""
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))      # read_config has checked it
    origin = config.get("_name_or_path")
    if origin is not None and not isinstance(origin, str):
        raise CheckpointError(hf_dir / "config.json", f"{origin!r} is not text", "key '_name_or_path'")
    path = hf_dir / "generation_config.json"
    if not path.is_file():
        return
    regular_file(path)
    try:
        generation = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return
    except (OSError, ValueError, RecursionError) as e:
        raise CheckpointError(path, f"cannot read as JSON: {_one_line(e)}") from None
    if not generation:
        return
    if not isinstance(generation, dict):
        raise CheckpointError(path, "is not a JSON object")
    reader = ConfigReader(path)
    for key, want in SAMPLING_NUMBERS.items():
        reader.get(generation, key, want)
    if generation.get("sequence") is not None and not isinstance(generation["sequence"], str):
        raise CheckpointError(path, f"{generation['sequence']!r} is not text", "key 'sequence'")


def _check_card_value(readme, key, vtype, value):
    """A model-card value is text (or a list of text) where the key holds text."""
    texts = value if vtype == VT.ARRAY and isinstance(value, list) else [value] if vtype == VT.STRING else []
    for text in texts:
        if not isinstance(text, str):
            raise CheckpointError(readme, f"{text!r} is not text (in the model card's front matter)", f"key '{key}'")


def _one_line(e) -> str:
    return " ".join(str(e).split())


def _plain(v):
    if hasattr(v, "tolist"):
        return v.tolist()
    return v
