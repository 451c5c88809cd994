"""Keys: a GGUF's hyperparameter keys read the way llama.cpp's loader reads them, every value checked as it is read.

llama.cpp (the copy in llama-cpp-python 0.3.36, `src/llama-model-loader.cpp`):
- `get_key<T>` takes a key only in the GGUF type of T (u32 for every count and size, f32 for floats, bool, str);
  any other type throws "key %s has wrong type %s but expected type %s". It does not convert: an i32 or a u64
  block count is refused like an f32 one.
- `get_key_or_arr` takes that scalar, or an array of `n` entries (n = block_count for per-layer values;
  "key %s has wrong array length; expected %u, got %u") of u32/i32 (bool too, for per-layer flags).
- `get_arr` into a vector takes i32/u32 elements for integers ("%s has wrong array element type %s"), and no
  array of another kind ("%s is not a string/float32/uint32/int32/uint64 array").

With `strict=False` (lucebox's drafter loader) any integer type is an integer and either float type a float.

A value that breaks a rule is recorded as a Violation and read as None, so no later rule uses it.
"""

import math

import numpy as np
from gguf import GGUFValueType as VT

from ggtools.hparam_rules.violation import MISSING, TYPE, VALUE, Violation

GGUF_TYPE_NAME = {VT.UINT8: "u8", VT.INT8: "i8", VT.UINT16: "u16", VT.INT16: "i16", VT.UINT32: "u32",
                  VT.INT32: "i32", VT.FLOAT32: "f32", VT.BOOL: "bool", VT.STRING: "str", VT.ARRAY: "arr",
                  VT.UINT64: "u64", VT.INT64: "i64", VT.FLOAT64: "f64"}
INTEGERS = frozenset({VT.UINT8, VT.INT8, VT.UINT16, VT.INT16, VT.UINT32, VT.INT32, VT.UINT64, VT.INT64})
FLOATS = frozenset({VT.FLOAT32, VT.FLOAT64})
FLAG_TYPES = (VT.INT32, VT.UINT32, VT.BOOL)       # per-layer flags: get_arr into a std::array takes bool too
RUNTIME = "runtime"              # `required=RUNTIME`: a key a runtime needs that llama.cpp's loader does not require
LLAMA_MAX_LAYERS = 512          # llama-hparams.h: the per-layer arrays' size
GLOBAL_PREFIXES = ("tokenizer.", "general.")


def type_name(kv) -> str:
    return GGUF_TYPE_NAME.get(kv.vtype, str(kv.vtype))


class Keys:
    """The `<prefix>.<name>` keys of one GGUF (`tokenizer.*` and `general.*` names are whole keys)."""

    def __init__(self, gguf, prefix: str | None, strict: bool = True):
        self.f, self.prefix, self.strict = gguf, prefix, strict
        self.violations: list[Violation] = []

    def name(self, key: str) -> str:
        """The whole key: `<prefix>.<key>`, or key itself when it is global or already starts with the prefix."""
        if not self.prefix or key.startswith(GLOBAL_PREFIXES) or key.startswith(self.prefix + "."):
            return key
        return f"{self.prefix}.{key}"

    def has(self, key: str) -> bool:
        return self.name(key) in self.f.kv

    def fail(self, key: str | None, rule: str, says: str | None = None, kind: str = VALUE, check: str = "hparams"):
        """Record a broken rule; `says` (llama.cpp's words) only where llama.cpp reads the file (strict)."""
        self.violations.append(Violation(self.name(key) if key else None, rule, says if self.strict else None, kind,
                                         check))

    def check(self, key: str | None, holds: bool, rule: str, says: str | None = None, check: str = "hparams") -> bool:
        """Record `rule` as broken unless it holds; returns whether it holds."""
        if not holds:
            self.fail(key, rule, says, check=check)
        return holds

    # ---- scalars ----------------------------------------------------------------------------------------------

    def _kv(self, key, required, check: str):
        """required: True (llama.cpp's loader requires the key), RUNTIME (only a runtime that runs the model needs
        it: llama.cpp loads a file without it and fails later), or False."""
        kv = self.f.kv.get(self.name(key))
        if kv is None and required:
            by_llama = required is True and self.strict
            self.fail(key, "missing (llama.cpp's loader requires it)" if by_llama else "missing (needed to run the "
                      "model)", f"key not found in model: {self.name(key)}" if by_llama else None, MISSING,
                      "keys" if check == "hparams" else check)
        return kv

    def _typed(self, key, kv, want: VT, family, check: str) -> bool:
        """Whether the value has the type the loader reads it as; worded as the container rules word the keys whose
        type they check (ggtools.gguf.check.KEY_TYPES), so a fault reads the same from every command."""
        if kv.vtype == want or (not self.strict and kv.vtype in family):
            return True
        wanted = f"llama.cpp requires {want.name}" if self.strict else \
            ("an integer type is required" if family is INTEGERS else "a float type is required")
        self.fail(key, f"has type {kv.type_label}, {wanted}",
                  f"key {self.name(key)} has wrong type {type_name(kv)} but expected type {GGUF_TYPE_NAME[want]}",
                  TYPE, check)
        return False

    def uint(self, key: str, default=None, required: bool = False, check: str = "hparams") -> int | None:
        """An unsigned count or size (llama.cpp: get_key<uint32_t>)."""
        kv = self._kv(key, required, check)
        if kv is None:
            return default
        if not self._typed(key, kv, VT.UINT32, INTEGERS, check):
            return None
        value = int(kv.value)
        if value < 0:
            self.fail(key, f"is {value}: a count or size cannot be negative", check=check)
            return None
        return value

    def float(self, key: str, default=None, required: bool = False, check: str = "hparams") -> float | None:
        """A float (get_key<float>); NaN and inf are refused here, so every float read is finite."""
        kv = self._kv(key, required, check)
        if kv is None:
            return default
        if not self._typed(key, kv, VT.FLOAT32, FLOATS, check):
            return None
        value = float(kv.value)
        if not math.isfinite(value):
            self.fail(key, f"is {value}: it must be a finite number", check=check)
            return None
        return value

    def string(self, key: str, default=None, choices=None, says: str | None = None) -> str | None:
        kv = self._kv(key, False, "hparams")
        if kv is None:
            return default
        if not self._typed(key, kv, VT.STRING, (VT.STRING,), "hparams"):
            return None
        if choices is not None and kv.value not in choices:
            self.fail(key, f"is {kv.value!r}: one of {', '.join(choices)} is required", says)
            return None
        return kv.value

    def bool(self, key: str, default=None) -> bool | None:
        kv = self._kv(key, False, "hparams")
        if kv is None:
            return default
        return bool(kv.value) if self._typed(key, kv, VT.BOOL, (VT.BOOL,), "hparams") else None

    # ---- arrays -----------------------------------------------------------------------------------------------

    def int_array(self, key: str, required: bool = False, check: str = "hparams",
                  element_types=(VT.INT32, VT.UINT32)) -> list[int] | None:
        """An integer array (get_arr into a vector of int32/uint32); None when absent or refused."""
        kv = self._kv(key, required, check)
        if kv is None:
            return None
        if not kv.is_array:
            self.fail(key, f"has type {kv.type_label}, an array of integers is required",
                      f"array key not found in model: {self.name(key)}", TYPE, check)
            return None
        ok = kv.elem_type in element_types or (not self.strict and kv.elem_type in INTEGERS)
        if not ok:
            known = kv.elem_type in (VT.STRING, VT.FLOAT32, VT.UINT32, VT.INT32, VT.UINT64)
            says = (f"{self.name(key)} has wrong array element type {GGUF_TYPE_NAME[kv.elem_type]}" if known else
                    f"{self.name(key)} is not a string/float32/uint32/int32/uint64 array")
            self.fail(key, f"has type {kv.type_label}, an array of integers is required", says, TYPE, check)
            return None
        return [int(v) for v in np.asarray(kv.value, np.int64)]

    def per_layer(self, key: str, n_layer: int | None, default=None, required: bool = False,
                  flags: bool = False) -> list[int] | None:
        """A per-layer value (get_key_or_arr): one u32 for every layer, or an array of exactly n_layer entries
        (u32/i32; bool too for flags). Returns the n_layer values (None when absent without default, or refused)."""
        kv = self._kv(key, required, "hparams")
        if kv is None:
            return None if default is None or n_layer is None else [default] * n_layer
        if not kv.is_array:
            value = self.uint(key)
            return None if value is None or n_layer is None else [value] * n_layer
        element_types = FLAG_TYPES if flags else (VT.INT32, VT.UINT32)
        values = self.int_array(key, element_types=element_types)
        if values is None or n_layer is None:
            return None
        if len(values) != n_layer:
            self.fail(key, f"has {len(values)} entries for {n_layer} layers (block_count)",
                      f"key {self.name(key)} has wrong array length; expected {n_layer}, got {len(values)}")
            return None
        if not flags and any(v < 0 for v in values):
            self.fail(key, f"holds {min(values)}: a count or size cannot be negative")
            return None
        return values
