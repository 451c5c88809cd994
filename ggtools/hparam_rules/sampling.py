"""A model's sampling defaults: the `general.sampling.*` keys, read as llama.cpp reads them, every value checked.

llama.cpp (common/common.cpp, common_init_sampler_from_model): unless the user set the option, each key's value
is printed as text (llama_model_meta_val_str: std::to_string, six decimals for a float) and parsed back with
strtol (top_k, penalty_last_n, mirostat) or strtof (the others); a value that does not parse is skipped without a
word, and `general.sampling.sequence` is a ';'-separated list of sampler names whose unknown names are skipped with
a warning. Here a value that llama.cpp would skip or misread is a broken rule instead: not a number (a string, a
bool, an array), NaN or inf, an integer outside int32, a negative temperature, an unknown sampler name.

`sampling_defaults(f)` -> (the SamplingParams fields the file sets, the rules it breaks).
"""

import math

from gguf import GGUFValueType as VT

from ggtools.hparam_rules.keys import FLOATS, INTEGERS, type_name
from ggtools.hparam_rules.violation import TYPE, VALUE, Violation

# llama.cpp's sampler names (common_sampler_types_from_names): canonical names, their kebab-case and no-dash forms,
# and three aliases
CANONICAL = ("dry", "top_k", "top_p", "top_n_sigma", "typ_p", "min_p", "temperature", "xtc", "infill", "penalties",
             "adaptive_p")
ALIASES = {**{n.replace("_", "-"): n for n in CANONICAL if "_" in n}, **{n.replace("_", ""): n for n in CANONICAL},
           "nucleus": "top_p", "temp": "temperature", "typ": "typ_p", **{n: n for n in CANONICAL}}

PREFIX = "general.sampling."
INT_KEYS = {"top_k": "top_k", "penalty_last_n": "penalty_last_n", "mirostat": "mirostat"}
FLOAT_KEYS = {"top_p": "top_p", "min_p": "min_p", "temp": "temp", "penalty_repeat": "penalty_repeat",
              "xtc_probability": "xtc_probability", "xtc_threshold": "xtc_threshold",
              "mirostat_tau": "mirostat_tau", "mirostat_eta": "mirostat_eta"}
SEQUENCE = "sequence"
SUPPRESS = "tokenizer.ggml.suppress_tokens"      # llama.cpp's vocabulary: token ids every sampler chain bans
INT32 = (-2 ** 31, 2 ** 31 - 1)


def sampling_defaults(f) -> tuple[dict, list[Violation]]:
    """(field -> value for every general.sampling.* key the file holds, the violations)."""
    values, broken = {}, []
    for name, field in {**INT_KEYS, **FLOAT_KEYS}.items():
        kv = f.kv.get(PREFIX + name)
        if kv is None:
            continue
        value, rule = _number(kv, integer=name in INT_KEYS)
        if rule is None and name == "temp" and value < 0:
            rule = f"is {value:g}: a temperature cannot be negative (llama.cpp would decode greedily)"
        if rule:
            broken.append(Violation(PREFIX + name, rule, kind=TYPE if "type" in rule else VALUE, check="sampling",
                                    symptom="llama.cpp ignores the value or misreads it"))
        else:
            values[field] = value
    sequence = f.kv.get(PREFIX + SEQUENCE)
    if sequence is not None:
        names, rule = _sequence(sequence)
        if rule:
            broken.append(Violation(PREFIX + SEQUENCE, rule, check="sampling"))
        else:
            values["samplers"] = names
    suppress = f.kv.get(SUPPRESS)
    if suppress is not None:
        ids, rule = _suppress(suppress, f)
        if rule:
            broken.append(Violation(SUPPRESS, rule, f"invalid gguf type for {SUPPRESS}", TYPE, "sampling"))
        else:
            values["suppress"] = ids
    return values, broken


def _suppress(kv, f):
    """The ids llama.cpp keeps (it drops those outside the vocabulary), or the rule an INT32 array breaks."""
    if not kv.is_array or kv.elem_type != VT.INT32:
        return None, "must be an array of INT32 token ids"
    tokens = f.kv.get("tokenizer.ggml.tokens")
    n_vocab = tokens.count if tokens is not None and tokens.is_array else 0
    return tuple(int(i) for i in kv.value if 0 <= int(i) < n_vocab), None


def sampling_violations(f) -> list[Violation]:
    return sampling_defaults(f)[1]


def _number(kv, integer: bool):
    """(the value llama.cpp takes, None) or (None, the rule it breaks)."""
    if kv.is_array or kv.vtype not in INTEGERS | FLOATS:
        return None, f"has type {type_name(kv)}: a number is required"
    value = kv.value
    if kv.vtype in FLOATS and not math.isfinite(float(value)):
        return None, f"is {float(value)}: it must be a finite number"
    text = f"{float(value):f}" if kv.vtype in FLOATS else str(int(value))   # std::to_string
    if integer:
        number = int(float(text)) if kv.vtype in FLOATS else int(text)      # strtol stops at the '.'
        if not INT32[0] <= number <= INT32[1]:
            return None, f"is {number}: it must fit a 32-bit integer"
        return number, None
    return float(text), None


def _sequence(kv):
    if kv.is_array or type_name(kv) != "str":
        return None, f"has type {type_name(kv)}: a string of sampler names separated by ';' is required"
    names = kv.value.split(";")
    unknown = [n for n in names if n.strip().lower() not in ALIASES]
    if unknown:
        return None, (f"names {', '.join(repr(n) for n in unknown)}: not a llama.cpp sampler (llama.cpp skips it with "
                      "a warning)")
    return tuple(ALIASES[n.strip().lower()] for n in names), None
