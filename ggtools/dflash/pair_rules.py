"""The rules a drafter and its target must satisfy together, per runtime: hidden sizes, fc width = n ids x target
hidden, target layers inside the target in the profile's id convention, the mask id inside the target
vocabulary, a target arch whose graph exposes layer inputs, the same vocabulary; and (without the checkpoint) the same RoPE base.

A rule whose inputs the target lacks is `unchecked` (a failure), never passed. `tap_archs` maps each runtime
to the target archs it can tap; the jobs layer supplies ggtools' own runtime's list.
"""

import math

from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.dspark_rules import lucebox_vocab
from ggtools.dflash.findings import ERROR, WARNING, Effect, Finding, ok, unchecked
from ggtools.dflash.loaders import LAYER_INPUT_ASSERT
from ggtools.dflash.profiles import LLAMACPP, LUCEBOX, LUCEBOX_BACKEND_ARCHS
from ggtools.dflash.target import TargetInfo

RECONVERT = "ggtools convert dflash HF_DIR -o OUT --profile {profile} --target-gguf {target}"


def pair_findings(d: DraftFile, t: TargetInfo, runtimes, tap_archs: dict, target_says: dict) -> list[Finding]:
    """tap_archs: runtime -> the target archs it taps; target_says: runtime -> what it says refusing this target
    (the jobs layer asks ggtools' own runtime)."""
    out = [_hidden(d, t, runtimes), _fc_width(d, t, runtimes), _layers(d, t, runtimes), _mask(d, t, runtimes)]
    out += [_taps(t, r, tap_archs[r], target_says.get(r), tap_archs) for r in runtimes]
    if d.profile.tokenizer:
        out.append(_vocab(d, t))
    if d.is_dspark and LUCEBOX.runtime in runtimes:
        out += [lucebox_vocab(d, t.vocab), _dspark_backend(t)]
    return [f for f in out if f is not None]


def _dspark_backend(t: TargetInfo) -> Finding | None:
    """lucebox runs the Markov chain in some backends only; the others draft with the backbone alone."""
    archs = LUCEBOX.dspark_target_archs
    if t.arch is None or archs is None or t.arch in archs or t.arch not in LUCEBOX.tap_archs:
        return None
    return Finding("dspark_target", WARNING, f"lucebox runs the DSpark heads only for {', '.join(sorted(archs))} "
                   f"targets: for '{t.arch}' it drafts with the DFlash backbone alone",
                   (Effect(LUCEBOX.runtime, None, "no error: the Markov and confidence heads are loaded and unused"),),
                   "no fix in the file")


def _needs(t: TargetInfo, check: str, **values) -> Finding | None:
    missing = [k for k, v in values.items() if v is None]
    if missing:
        return unchecked(check, f"the target {t.path} has no {' or '.join(missing)}")
    return None


def _hidden(d: DraftFile, t, runtimes) -> Finding:
    H = d.int_value("embedding_length")
    if (gap := _needs(t, "hidden", embedding_length=t.hidden)) or H is None:
        return gap or unchecked("hidden", f"{d.path} has no {d.key('embedding_length')}")
    if H == t.hidden:
        return ok("hidden", f"hidden size {H} = target embedding_length")
    n = len(d.stored_ids or [])
    effects = {LLAMACPP.runtime: Effect("llama.cpp", f"encode: embd row width {n * t.hidden} does not match the "
                                                    f"encoder input {n * H}"),
               LUCEBOX.runtime: Effect("lucebox", None, "no loader check: the draft graph's fc matmul fails"),
               "ggtools": Effect("ggtools", None, "the drafter's fc cannot take the target's features")}
    return Finding("hidden", ERROR, f"drafter hidden size {H} != target embedding_length {t.hidden}: the drafter "
                   "belongs to another model", tuple(effects[r] for r in runtimes),
                   "use the drafter trained for this target")


def _fc_width(d: DraftFile, t, runtimes) -> Finding | None:
    ids, fc_in = d.stored_ids, d.fc_in
    if ids is None or fc_in is None:
        return None           # the loader rules report a missing fc or id list
    if gap := _needs(t, "fc", embedding_length=t.hidden):
        return gap
    want = len(ids) * t.hidden
    if fc_in == want:
        return ok("fc", f"fc input width {fc_in} = {len(ids)} ids x target hidden {t.hidden}")
    effects = {LLAMACPP.runtime: Effect("llama.cpp", f"encode: embd row width {want} does not match the encoder "
                                                    f"input {fc_in}"),
               LUCEBOX.runtime: Effect("lucebox", f"GGUF shape mismatch: dflash.fc.weight->ne[0]={fc_in} != "
                                                  f"n_target_layers*n_embd={len(ids)}*{t.hidden}={want}"),
               "ggtools": Effect("ggtools", None, "the fc weight cannot take the tapped features")}
    return Finding("fc", ERROR, f"fc takes {fc_in} inputs, but {len(ids)} target layers x target hidden "
                   f"{t.hidden} = {want}", tuple(effects[r] for r in runtimes),
                   f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT (the ids the drafter was trained with)")


def _layers(d: DraftFile, t, runtimes) -> Finding | None:
    hf = d.hf_ids
    if hf is None:
        return None
    if gap := _needs(t, "target_layers", block_count=t.n_layer):
        return gap
    # HF id i taps the output of target layer i (llama.cpp: t_layer_inp[i + 1], which it never sets for
    # i + 1 = n_layer at 0c1e570); lucebox captures after layer i.
    last = {LLAMACPP.runtime: t.n_layer - 2, LUCEBOX.runtime: t.n_layer - 1, "ggtools": t.n_layer - 1}
    effects = {LLAMACPP.runtime: Effect("llama.cpp", LAYER_INPUT_ASSERT),
               LUCEBOX.runtime: Effect("lucebox", None, "no loader check at 62880e20: the target never captures "
                                                        "those layers and the draft reads wrong features"),
               "ggtools": Effect("ggtools", None, "the target has no such layer to tap")}
    broken = [r for r in runtimes if any(not 0 <= i <= last[r] for i in hf)]
    if not broken:
        return ok("target_layers", f"target layers {d.stored_ids} ({d.key('target_ids')}, HF {hf}) inside the "
                                   f"{t.n_layer}-layer target")
    bad = sorted({i for r in broken for i in hf if not 0 <= i <= last[r]})
    return Finding("target_layers", ERROR, f"{d.key('target_ids')} {d.stored_ids} (HF {hf}): HF ids {bad} are not "
                   f"layers the {t.n_layer}-layer target can give ({', '.join(f'{r}: 0..{last[r]}' for r in broken)})",
                   tuple(effects[r] for r in broken), f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT")


def _mask(d: DraftFile, t, runtimes) -> Finding | None:
    mask = d.mask[0]
    if mask is None:
        return None           # the loader rules report a missing mask id
    if t.vocab is None and runtimes == [LUCEBOX.runtime]:
        return None           # lucebox takes the mask id from the target: nothing to check it against
    if gap := _needs(t, "mask_token_id", vocabulary=t.vocab):
        return gap
    if mask < t.vocab:
        return ok("mask_token_id", f"mask token id {mask} < target vocabulary {t.vocab}")
    fix = f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT"
    effects = {LLAMACPP.runtime: Effect("llama.cpp", f"load: bad special token: '{LLAMACPP.key('mask')}' = {mask}, "
                                                    "using default id -1", "every draft is rejected"),
               LUCEBOX.runtime: None,
               "ggtools": Effect("ggtools", None, "the noise block embeds a token the target does not have")}
    picked = tuple(effects[r] for r in runtimes if effects[r])
    if not picked:          # lucebox takes the mask id from the target
        return Finding("mask_token_id", WARNING, f"stored mask token id {mask} is outside the target's "
                       f"{t.vocab}-token vocabulary (not read by lucebox, which takes the target's)", (), fix)
    return Finding("mask_token_id", ERROR, f"mask token id {mask} is outside the target's {t.vocab}-token "
                   "vocabulary", picked, fix)


def _taps(t: TargetInfo, runtime: str, archs, says: str | None, tap_archs: dict) -> Finding:
    check = f"target_arch[{runtime}]"
    if t.arch is None:
        return unchecked(check, f"the target {t.path} has no general.architecture")
    if t.arch in archs:
        return ok(check, f"{runtime} taps layer inputs of '{t.arch}' targets")
    if runtime == LLAMACPP.runtime:
        effect = Effect(runtime, LAYER_INPUT_ASSERT, f"llama.cpp's '{t.arch}' graph never sets t_layer_inp")
    elif runtime == LUCEBOX.runtime:
        effect = Effect(runtime, None if t.arch in LUCEBOX_BACKEND_ARCHS else
                        f"[backend_factory] unsupported architecture: {t.arch}",
                        f"lucebox has no DFlash target for '{t.arch}'")
    else:
        effect = Effect(runtime, says, f"ggtools' runtime does not run '{t.arch}' targets")
    others = [r for r, tapped in tap_archs.items() if t.arch in tapped]
    return Finding(check, ERROR, f"the target arch '{t.arch}' does not expose layer inputs in {runtime}",
                   (effect,), "no fix in the file: run the pair in a runtime that taps this arch ("
                              f"{', '.join(others) if others else 'none of ' + ', '.join(tap_archs)})")


def _vocab(d: DraftFile, t) -> Finding:
    a, b = d.file.kv.get("tokenizer.ggml.tokens"), t.file.kv.get("tokenizer.ggml.tokens")
    if a is None:
        return None           # the loader rules report a missing tokenizer
    if b is None:
        return unchecked("vocab", f"the target {t.path} has no tokenizer.ggml.tokens")
    if bytes(a.raw) == bytes(b.raw):
        return ok("vocab", f"same {a.count}-token vocabulary as the target")
    return Finding("vocab", ERROR, f"the drafter's vocabulary ({a.count} tokens) differs from the target's "
                   f"({b.count}): drafted token ids would mean other tokens",
                   (Effect("llama.cpp", None, "drafts are rejected or mean other tokens; acceptance near 0"),),
                   f"ggtools doctor {d.path} --target {t.path} --fix -o OUT")


def rope_against_target(d: DraftFile, t: TargetInfo, runtimes) -> Finding | None:
    """A drafter is trained with its target's RoPE base; a different one is reported, never rewritten from this
    evidence alone (only --hf, the checkpoint, can say which is right)."""
    mine, theirs = number(d.value("rope.freq_base")), number(t.file.get(f"{t.arch}.rope.freq_base"))
    if mine is None or theirs is None or abs(mine - theirs) <= 1e-6 * abs(theirs):
        return None         # a base of the wrong type or not finite: the model-file rules report it
    return Finding("rope_theta", WARNING, f"{d.key('rope.freq_base')} {mine:g} differs from the target's "
                   f"rope.freq_base {theirs:g}; only the checkpoint can say which is right (not rewritten)",
                   rope_effects(mine, runtimes), f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT")


def number(v) -> float | None:
    """A finite number the file states, else None (a string, an array, a NaN: the model-file rules report it)."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def rope_effects(stored: float, runtimes) -> tuple:
    says = {LLAMACPP.runtime: f"print_info: freq_base_train       = {stored:.1f}"}
    return tuple(Effect(r, says.get(r), "loads and drafts; acceptance falls as the context grows")
                 for r in runtimes)
