"""The model-file rules as doctor findings: the container rules `validate` applies (a truncated file, tensors
that overlap, ...) and the hyperparameter rules (ggtools.hparam_rules: what llama.cpp's loader checks and what it
misses, applied by ggtools' runtime too), for a drafter and for its target. A file that breaks one breaks every
runtime that reads it: each finding says what each of them does with it.
"""

from ggtools.dflash.findings import ERROR, Effect, Finding, failed
from ggtools.dflash.profiles import LLAMACPP, LUCEBOX, V2_KEYS
from ggtools.gguf.check import Problem, errors

LOADS_ANYWAY = "not checked when the file loads: a later failure (a tensor's shape, an assert, a crash) or garbage"
# llama.cpp's words for tensor data cut by the end of the file (llama-model-loader.h)
OUT_OF_BOUNDS = "tensor '{}' data is not within the file bounds, model is corrupted or incomplete"
# drafter keys whose right value `doctor --hf --fix` takes from the checkpoint (dflash/source_check.py)
FIXED_FROM_CHECKPOINT = ("rope.freq_base", "attention.layer_norm_rms_epsilon", "attention.key_length",
                         "attention.value_length", "attention.head_count", "attention.head_count_kv", "block_size",
                         "target_layers", "target_layer_ids", "mask_token_id", *V2_KEYS)


def container_findings(path: str, problems: list[Problem], runtimes, what: str = "the drafter") -> list[Finding]:
    """The container rules' errors (check_file): the file does not load in any runtime."""
    out = []
    for p in errors(problems):
        cut = "the file is truncated" in p.rule and p.where.startswith("tensor '")
        says = OUT_OF_BOUNDS.format(p.where[len("tensor '"):-1]) if cut else None
        effects = tuple(Effect(r, says if r == LLAMACPP.runtime else f"{p}" if r == "ggtools" else None,
                               None if r != LUCEBOX.runtime else "the file does not load") for r in runtimes)
        out.append(Finding("file", ERROR, f"{what}: {p.where}: {p.rule}", effects,
                           f"get {path} again (or rewrite it: ggtools validate {path} names every broken rule)"))
    return out


def hparam_findings(path: str, violations, runtimes, fix, loaders=None) -> list[Finding]:
    """One finding per broken hyperparameter rule, with what each runtime does: ggtools' runtime refuses it in these
    words; llama.cpp's loader refuses it in its own words (`says`) or loads it anyway; so does lucebox's. loaders:
    runtime -> its loader findings (dflash/loaders.py), which already speak for it where they fail in the same
    class (lucebox's own words on a missing block size, say): a violation only such a runtime is checked for is
    left to that finding."""
    out = []
    for v in violations:
        effects = []
        for r in runtimes:
            if r == "ggtools":
                effects.append(Effect(r, f"{path}: {v}"))
            elif any(f.check == v.check for f in failed((loaders or {}).get(r, ()))):
                continue
            elif r == LLAMACPP.runtime:
                effects.append(Effect(r, v.says, None if v.says else LOADS_ANYWAY))
            else:
                effects.append(Effect(r, None, LOADS_ANYWAY))
        if effects or not runtimes:
            out.append(Finding(v.check, ERROR, str(v), tuple(effects), fix(v)))
    return out


def drafter_fix(path: str, profile):
    """The fix of a drafter's broken key: the checkpoint's value where doctor --fix takes it from there, else a
    reconversion."""
    def fix(v) -> str:
        if v.key and any(v.key.endswith(k) for k in FIXED_FROM_CHECKPOINT):
            return f"ggtools doctor {path} --hf HF_DIR --fix -o OUT"
        return f"ggtools convert dflash HF_DIR -o OUT --profile {profile.name if profile else LLAMACPP.name}"
    return fix


def target_fix(path: str):
    def fix(v) -> str:
        if v.tensor:        # the keys and the tensors disagree: one of them is not the model's
            return (f"ggtools patch set {path} KEY=TYPE:VALUE -o OUT (the key its shape comes from, set to the value "
                    "the model was trained with), or convert the model again")
        return f"ggtools patch set {path} {v.key or 'KEY'}=TYPE:VALUE -o OUT (the value the model was trained with)"
    return fix
