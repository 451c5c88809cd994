"""An EAGLE3 drafter checkpoint (config.json + safetensors), read as llama.cpp's converter reads it.

The converter (conversion/llama.py, LlamaModel) sees config.json through transformers: a config whose model_type
is "llama" becomes LlamaConfig(...).to_dict(), which fills what the file leaves out (head_dim = hidden_size /
num_attention_heads, num_key_value_heads = num_attention_heads, max_position_embeddings 2048, rms_norm_eps 1e-6,
the RoPE parameters with rope_theta 10000 and rope_type "default"); any other config is read as it is. Then a
nested `transformer_layer_config` (Red Hat speculators) and a `text_config` are merged in. The EAGLE3 keys
(`eagle_aux_hidden_state_layer_ids`, `target_hidden_size`, `norm_before_residual`, `norm_before_fc`) are read
from config.json's root as written. Tensor names: `midlayer.*` and `layers.0.*` are the decoder layer, a leading
`model.` is dropped; parts in file-name order, names sorted within a part (the converter's order).
"""

import json
import os
from dataclasses import dataclass, field

from ggtools.dflash import eagle3 as E
from ggtools.dflash.checkpoint import INDEX, part_files, read_config
from ggtools.dflash.config_reader import U32, ConfigReader, merge_nested
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.safetensors import SourceTensor, read_header

# transformers' LlamaConfig (5.x) defaults for what the converter reads; head_dim, num_key_value_heads and the RoPE
# parameters are derived (llama_hparams)
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
                  "tie_word_embeddings": False, "attention_bias": False}
DEFAULTED = "{} (absent: transformers' LlamaConfig default, as llama.cpp's converter reads it)"
LAYOUTS = {"LlamaForCausalLMEagle3": "EAGLE", "Eagle3LlamaForCausalLM": "SpecForge",
           "Eagle3Speculator": "speculators", "Eagle3DraftModel": "Eagle3DraftModel"}


@dataclass
class Eagle3Checkpoint:
    path: str
    raw: dict                       # config.json as written (the EAGLE3 keys are read from its root)
    hparams: dict                   # what the converter's hparams are (defaults filled, nested configs merged)
    tensors: dict[str, SourceTensor] = field(repr=False)    # canonical name -> tensor, the converter's order
    places: dict[str, str] = field(default_factory=dict)    # a key -> where config.json keeps it (or its default)
    skipped: list[str] = field(default_factory=list)        # tensors the converter skips (rotary inv_freq, ...)

    @property
    def architecture(self) -> str:
        return self.raw["architectures"][0]

    @property
    def config_path(self) -> str:
        return os.path.join(self.path, "config.json")

    @property
    def numbers(self) -> ConfigReader:
        return ConfigReader(self.config_path, self.places)

    @property
    def layout(self) -> str:
        """Whose layout, in words (the trainer's, and how its decoder layer is named)."""
        names = "layers.0.*" if any(t.name.startswith(("layers.0.", "model.layers.0."))
                                    for t in self.tensors.values()) else "midlayer.*"
        nested = ", transformer_layer_config" if isinstance(self.raw.get("transformer_layer_config"), dict) else ""
        return f"{LAYOUTS.get(self.architecture, self.architecture)} layout: {names}{nested}"


def is_eagle3(config: dict) -> bool:
    """Whether llama.cpp's converter converts this config (config.json, text_config merged) as EAGLE3: one of the
    EAGLE3 architectures, or a plain llama one with a draft vocabulary and one layer."""
    archs = config.get("architectures")
    arch = archs[0] if isinstance(archs, list) and archs and isinstance(archs[0], str) else None
    if arch in E.HF_ARCHITECTURES:
        return True
    if arch not in E.HPARAM_DETECTED:
        return False
    hp, _ = merge_nested(config, "transformer_layer_config")
    return "draft_vocab_size" in hp and hp.get("num_hidden_layers") == 1


def open_eagle3(hf_dir) -> Eagle3Checkpoint:
    hf_dir = os.fspath(hf_dir)
    if not os.path.isdir(hf_dir):
        raise CheckpointError(hf_dir, "not a directory (expected a Hugging Face model directory)")
    config, _ = read_config(hf_dir)                      # checks the file: regular, JSON, an object
    where = os.path.join(hf_dir, "config.json")
    if not is_eagle3(config):
        raise CheckpointError(where, f"{config.get('architectures')!r}: not an EAGLE3 drafter (expected "
                                     f"{', '.join(E.HF_ARCHITECTURES)})", "architectures")
    with open(where, encoding="utf-8") as fh:
        raw = json.load(fh)
    hparams, places = converter_hparams(raw, where)
    _check_detected(raw, hparams, where, places)
    tensors, skipped = _read_tensors(hf_dir)
    return Eagle3Checkpoint(hf_dir, raw, hparams, tensors, places, skipped)


def converter_hparams(raw: dict, where) -> tuple[dict, dict[str, str]]:
    """(the hparams llama.cpp's converter works with, where config.json keeps each key that is not at its root)."""
    model_type = raw.get("model_type")
    places = {}
    if model_type in E.LLAMA_MODEL_TYPES:
        hp, places = llama_hparams(raw, where)
    elif model_type is None:
        hp = dict(raw)
    else:
        raise CheckpointError(where, f"{model_type!r}: llama.cpp's converter reads config.json through transformers' "
                                     f"config class for it, whose defaults fill what the file leaves out; ggtools "
                                     "reproduces LlamaConfig's only (an EAGLE3 drafter's layer is a llama layer: "
                                     "model_type 'llama')", "model_type")
    tlc = hp.get("transformer_layer_config")
    if tlc is not None and not isinstance(tlc, dict):
        raise CheckpointError(where, "is not a JSON object of the decoder layer's hyperparameters",
                              "transformer_layer_config")
    hp, nested = merge_nested(hp, "transformer_layer_config")
    places |= nested
    hp, nested = merge_nested(hp, "text_config")
    return hp, places | nested


def llama_hparams(raw: dict, where) -> tuple[dict, dict[str, str]]:
    """LlamaConfig(**config).to_dict() for the keys the converter reads (transformers 5.x): its defaults, head_dim
    and num_key_value_heads derived, rope_scaling / rope_theta standardized into rope_parameters. A config
    LlamaConfig refuses (a hidden size that is not a multiple of the head count) falls back to the file itself, as
    the converter does when AutoConfig raises."""
    hp, places = dict(raw), {}
    for key, value in LLAMA_DEFAULTS.items():
        if hp.get(key) is None:
            hp[key], places[key] = value, DEFAULTED.format(key)
    n = ConfigReader(where, places)
    hidden = n.number(hp["hidden_size"], "hidden_size", U32)
    heads = n.number(hp["num_attention_heads"], "num_attention_heads", U32)
    if heads == 0 or hidden % heads:
        return dict(raw), {}
    if hp.get("head_dim") is None:
        hp["head_dim"], places["head_dim"] = hidden // heads, DEFAULTED.format("head_dim") + " = hidden_size / " \
                                                                                            "num_attention_heads"
    if hp.get("num_key_value_heads") is None:
        hp["num_key_value_heads"], places["num_key_value_heads"] = heads, DEFAULTED.format("num_key_value_heads")
    rope = n.table(raw, "rope_scaling") or n.table(raw, "rope_parameters") or {}
    rope = dict(rope)
    rope.setdefault("rope_theta", raw.get("rope_theta", 10000.0))
    rope.setdefault("rope_type", rope.get("type", "default"))
    if rope["rope_type"] in ("llama3", "yarn", "longrope"):
        if "original_max_position_embeddings" in raw:
            rope["original_max_position_embeddings"] = raw["original_max_position_embeddings"]
        else:
            rope.setdefault("original_max_position_embeddings", hp["max_position_embeddings"])
    hp["rope_parameters"] = rope
    for key in ("rope_scaling", "rope_theta"):
        hp.pop(key, None)
    source = "rope_scaling" if raw.get("rope_scaling") else "rope_parameters"
    places["rope_parameters"] = source
    return hp, places


def _check_detected(raw, hp, where, places):
    """An EAGLE3 architecture the converter would not take for EAGLE3 (it would convert a plain llama model and stop
    at fc.weight): one decoder layer and a draft vocabulary are what make it EAGLE3."""
    n = ConfigReader(where, places)
    if "draft_vocab_size" not in hp:
        raise CheckpointError(where, f"missing: an {raw['architectures'][0]} drafter has a draft vocabulary "
                                     "(llama.cpp's converter takes a checkpoint without one for a plain llama model "
                                     "and fails on fc.weight: \"Can not map tensor 'fc.weight'\")", "draft_vocab_size")
    layers = hp.get("num_hidden_layers")
    if layers != 1:
        raise CheckpointError(where, f"is {layers}: an EAGLE3 drafter has exactly one decoder layer (llama.cpp's "
                                     "converter takes any other count for a plain llama model, and its EAGLE3 graph "
                                     "asserts n_layer == 1)", f"key '{n.place('num_hidden_layers')}'")


def _read_tensors(hf_dir) -> tuple[dict[str, SourceTensor], list[str]]:
    bins = sorted(f for f in os.listdir(hf_dir) if f.startswith("pytorch_model") and f.endswith(".bin"))
    if bins and not any(f.startswith("model") and f.endswith(".safetensors") for f in os.listdir(hf_dir)):
        raise CheckpointError(os.path.join(hf_dir, bins[0]), "a pickled PyTorch checkpoint: ggtools reads safetensors "
                                                              "only (loading a pickle can run code); save it as "
                                                              "model.safetensors with safetensors.torch.save_file")
    tensors, skipped = {}, []
    for part in part_files(hf_dir):
        for t in sorted(read_header(os.path.join(hf_dir, part)), key=lambda t: t.name):
            if t.name.endswith(E.SKIPPED_SUFFIXES):
                skipped.append(t.name)
                continue
            name = E.canonical_name(t.name)
            if name in tensors:
                raise CheckpointError(t.path, f"is the same tensor as '{tensors[name].name}' of "
                                              f"{os.path.basename(tensors[name].path)} (midlayer.* and layers.0.* are "
                                              "both the decoder layer)", f"tensor '{t.name}'")
            tensors[name] = t
    _check_index(hf_dir, tensors)
    return tensors, skipped


def _check_index(hf_dir, tensors):
    index = os.path.join(hf_dir, INDEX)
    if not os.path.isfile(index):
        return
    from ggtools.dflash.checkpoint import _weight_map
    listed = {E.canonical_name(n) for n in _weight_map(index) if not n.endswith(E.SKIPPED_SUFFIXES)}
    stored = set(tensors)
    if listed - stored:
        raise CheckpointError(index, f"lists tensors no part holds: {sorted(listed - stored)[:5]}", "weight_map")
    if stored - listed:
        raise CheckpointError(index, f"misses tensors the parts hold: {sorted(stored - listed)[:5]}", "weight_map")
