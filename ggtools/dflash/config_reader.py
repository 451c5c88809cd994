"""The one reader of numbers from a checkpoint's config.json: each value is checked as it is read, for its JSON type
(a number, an integer where the value is a count), finite, and inside the range of what it becomes (the GGUF type it
is written as; a layer count llama.cpp loads, which also bounds every per-layer list before one is built). The
objects and lists that hold numbers are checked for being objects and lists as they are opened.

A value that breaks a rule is a CheckpointError naming config.json, the key where config.json keeps it (a key merged
in from `text_config` or the speculators' `transformer_layer_config` is named there) and the rule:

    config.json: key 'dflash_config.block_size': 4294967296 is outside 0..4294967295, the range of a GGUF u32
"""

from dataclasses import dataclass

import numpy as np

from ggtools.dflash.errors import CheckpointError
from ggtools.hparam_rules.keys import LLAMA_MAX_LAYERS

F32_MAX = float(np.finfo(np.float32).max)


@dataclass(frozen=True)
class Range:
    """What a number must be: an integer or any real, within [low, high]; `why` says what the range is."""
    integer: bool
    low: float
    high: float
    why: str


U32 = Range(True, 0, 2 ** 32 - 1, "the range of a GGUF u32")
I32 = Range(True, -2 ** 31, 2 ** 31 - 1, "the range of a GGUF i32")
F32 = Range(False, -F32_MAX, F32_MAX, "the range of a GGUF f32")
LAYERS = Range(True, 1, LLAMA_MAX_LAYERS, f"the layer counts llama.cpp loads (LLAMA_MAX_LAYERS {LLAMA_MAX_LAYERS})")
LAYER_ID = Range(True, 0, LLAMA_MAX_LAYERS - 1, f"the layers of a model llama.cpp loads (LLAMA_MAX_LAYERS "
                                                f"{LLAMA_MAX_LAYERS})")
FRACTION = Range(False, 0.0, 1.0, "the share of a head's dimensions RoPE rotates")


class ConfigReader:
    """The numbers of one config.json, or of one object in it (parent: its place). places: a key as the converters
    read it -> where config.json keeps it, for keys that came from elsewhere (merged objects, mirrored keys)."""

    def __init__(self, path, places: dict[str, str] | None = None, parent: str | None = None):
        self.path, self.places, self.parent = path, places or {}, parent

    def place(self, key: str) -> str:
        name, bracket, index = key.partition("[")       # a list's element: "target_layer_ids[2]"
        if name in self.places:
            return self.places[name] + bracket + index
        return (f"{self.parent}.{name}" if self.parent else name) + bracket + index

    def within(self, key: str, places: dict[str, str] | None = None) -> "ConfigReader":
        """The reader of the object at key (places: its keys that config.json keeps elsewhere)."""
        return ConfigReader(self.path, places, self.place(key))

    # ---- numbers ----------------------------------------------------------------------------------------------

    def number(self, value, key: str, want: Range) -> int | float:
        """value (config.json's, at key), checked against want."""
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.refuse(key, f"{_short(value)} is not a number")
        if want.integer and not isinstance(value, int):
            self.refuse(key, f"{value!r} is not an integer")
        if isinstance(value, float) and not np.isfinite(value):
            self.refuse(key, f"{value!r} is not a finite number")
        if not want.low <= value <= want.high:
            self.refuse(key, f"{value!r} is outside {_bound(want.low)}..{_bound(want.high)}, {want.why}")
        return value

    def get(self, d: dict, key: str, want: Range, default=None, prefix: str = ""):
        """d[key] checked (null counts as absent: default), named prefix + key."""
        value = d.get(key)
        return default if value is None else self.number(value, prefix + key, want)

    def require(self, d: dict, key: str, want: Range, prefix: str = ""):
        value = d.get(key)
        if value is None:
            self.refuse(prefix + key, "missing (needed to convert a DFlash drafter)")
        return self.number(value, prefix + key, want)

    def numbers(self, value, key: str, want: Range) -> list:
        """A list of numbers, each checked against want."""
        if not isinstance(value, list):
            self.refuse(key, f"{_short(value)} is not a list of numbers")
        return [self.number(v, f"{key}[{i}]", want) for i, v in enumerate(value)]

    # ---- what holds numbers -----------------------------------------------------------------------------------

    def table(self, d: dict, key: str) -> dict | None:
        """The object at d[key] (None when absent or null)."""
        value = d.get(key)
        if value is not None and not isinstance(value, dict):
            self.refuse(key, f"{_short(value)} is not a JSON object")
        return value

    def items(self, d: dict, key: str) -> list:
        """The list at d[key] ([] when absent or null)."""
        value = d.get(key)
        if value is not None and not isinstance(value, list):
            self.refuse(key, f"{_short(value)} is not a list")
        return value or []

    def refuse(self, key, rule):
        raise CheckpointError(self.path, rule, f"key '{self.place(key)}'")


def merge_nested(config: dict, key: str) -> tuple[dict, dict[str, str]]:
    """config with the object at `key` merged into its top level (its keys win), and where each merged key is kept
    (name -> "key.name"); config unchanged when `key` holds no object."""
    nested = config.get(key)
    if not isinstance(nested, dict):
        return config, {}
    return {**config, **nested}, {name: f"{key}.{name}" for name in nested}


def _bound(x) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
