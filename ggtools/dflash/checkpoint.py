"""Checkpoint: a Hugging Face DFlash drafter directory (config.json + one or more safetensors files).

Tensor names are made canonical: a leading `model.` is dropped and the DFlash2 codebooks get their
`.weight` (hub checkpoints store them without it, `save_pretrained` with it). The order of `tensors` is the
order llama.cpp's converter writes them in: parts sorted by file name, names sorted within each part.
"""

import json
import os
from dataclasses import dataclass, field

from ggtools.dflash.config_reader import ConfigReader, merge_nested
from ggtools.dflash.dspark import DSparkSource, is_dspark, normalize_config
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.profiles import DSPARK_ARCHITECTURES, DSPARK_OTHER_BACKBONES
from ggtools.dflash.safetensors import SourceTensor, read_header
from ggtools.gguf.inputs import regular_file

# HF architecture -> the backbone's DFlash version (DSpark: a DFlash v1 backbone with its heads)
ARCHITECTURES = {"DFlashDraftModel": 1, "DFlash2DraftModel": 2} | {a: 1 for a in DSPARK_ARCHITECTURES}
INDEX = "model.safetensors.index.json"
CODEBOOKS = ("candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook")


@dataclass
class Checkpoint:
    path: str
    config: dict                    # config.json, with a text_config merged into the top level (DSpark: normalized)
    version: int                    # 1 (DFlashDraftModel, DSpark) or 2 (DFlash2DraftModel)
    tensors: dict[str, SourceTensor] = field(repr=False)   # canonical name -> tensor, converter order
    dspark: DSparkSource | None = None                      # a DSpark drafter: its config layout
    places: dict[str, str] = field(default_factory=dict)    # a merged key -> where config.json keeps it

    @property
    def architecture(self) -> str:
        return self.config["architectures"][0]

    @property
    def family(self) -> str:
        return "DSpark" if self.dspark else "DFlash2" if self.version == 2 else "DFlash v1"

    @property
    def config_path(self) -> str:
        return os.path.join(self.path, "config.json")

    @property
    def numbers(self) -> ConfigReader:
        """The reader every number of config.json is read through (checked, named where config.json keeps it)."""
        return ConfigReader(self.config_path, self.places)

    @property
    def dflash_config(self) -> dict:
        return self.numbers.table(self.config, "dflash_config") or {}


def files_of(hf_dir) -> list[str]:
    """Every file of the checkpoint directory (none of them may be an output)."""
    return [os.path.join(hf_dir, name) for name in sorted(os.listdir(hf_dir))]


def open_checkpoint(hf_dir) -> Checkpoint:
    hf_dir = os.fspath(hf_dir)
    if not os.path.isdir(hf_dir):
        raise CheckpointError(hf_dir, "not a directory (expected a Hugging Face model directory)")
    config, places = read_config(hf_dir)
    where = os.path.join(hf_dir, "config.json")
    version = drafter_version(config, where)
    dspark = None
    if is_dspark(config["architectures"][0]):
        config, dspark, layout_places = normalize_config(config, where)
        places |= layout_places
    tensors = {}
    for part in part_files(hf_dir):
        for t in sorted(read_header(os.path.join(hf_dir, part)), key=lambda t: t.name):
            name = canonical_name(t.name)
            if name in tensors:
                raise CheckpointError(t.path, f"duplicates tensor '{tensors[name].name}' of "
                                              f"{os.path.basename(tensors[name].path)}", f"tensor '{t.name}'")
            tensors[name] = t
    _check_index(hf_dir, tensors)
    return Checkpoint(hf_dir, config, version, tensors, dspark, places)


def read_config(hf_dir) -> tuple[dict, dict[str, str]]:
    """config.json, with a text_config merged into the top level, and where each merged key is kept."""
    path = os.path.join(hf_dir, "config.json")
    if os.path.lexists(path):
        regular_file(path)
    try:
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except FileNotFoundError:
        raise CheckpointError(hf_dir, "no config.json: not a Hugging Face model directory") from None
    except (OSError, ValueError, RecursionError) as e:       # ValueError: bad JSON, or an integer of 4300+ digits
        raise CheckpointError(path, f"cannot read as JSON: {e}") from None
    if not isinstance(config, dict):
        raise CheckpointError(path, "is not a JSON object")
    return merge_nested(config, "text_config")


def drafter_version(config: dict, where: str) -> int:
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch in DSPARK_OTHER_BACKBONES:
        raise CheckpointError(where, f"{arch}: a DSpark drafter on {DSPARK_OTHER_BACKBONES[arch]}; ggtools converts "
                                     "the DSpark drafters on a DFlash (Qwen3-named) backbone: "
                                     f"{', '.join(DSPARK_ARCHITECTURES)}", "architectures")
    if arch not in ARCHITECTURES:
        raise CheckpointError(where, f"{archs!r}: not a DFlash drafter (expected DFlashDraftModel, "
                                     f"DFlash2DraftModel or a DSpark architecture: {', '.join(DSPARK_ARCHITECTURES)})",
                              "architectures")
    return ARCHITECTURES[arch]


def part_files(hf_dir) -> list[str]:
    """Safetensors files in the order llama.cpp's converter reads them: the index's files, else model*.safetensors."""
    index = os.path.join(hf_dir, INDEX)
    if os.path.isfile(index):
        parts = sorted(set(_weight_map(index).values()))
        for p in parts:
            if not os.path.isfile(os.path.join(hf_dir, p)):
                raise CheckpointError(index, f"names '{p}', which is not in the directory", "weight_map")
        return parts
    parts = sorted(f for f in os.listdir(hf_dir) if f.startswith("model") and f.endswith(".safetensors"))
    if not parts:
        raise CheckpointError(hf_dir, "no model*.safetensors file (and no model.safetensors.index.json)")
    return parts


def _weight_map(index) -> dict:
    regular_file(index)
    try:
        with open(index, encoding="utf-8") as fh:
            wm = json.load(fh).get("weight_map")
    except (OSError, ValueError, AttributeError, RecursionError) as e:
        raise CheckpointError(index, f"cannot read: {e}") from None
    if not isinstance(wm, dict) or not all(isinstance(v, str) for v in wm.values()):
        raise CheckpointError(index, "needs a weight_map object of tensor name -> file name", "weight_map")
    return wm


def _check_index(hf_dir, tensors):
    index = os.path.join(hf_dir, INDEX)
    if not os.path.isfile(index):
        return
    listed = {canonical_name(n) for n in _weight_map(index)}
    stored = set(tensors)
    if listed - stored:
        raise CheckpointError(index, f"lists tensors no part holds: {sorted(listed - stored)[:5]}", "weight_map")
    if stored - listed:
        raise CheckpointError(index, f"misses tensors the parts hold: {sorted(stored - listed)[:5]}", "weight_map")


def canonical_name(name: str) -> str:
    name = name.removeprefix("model.")
    if name in CODEBOOKS:
        name += ".weight"
    return name
