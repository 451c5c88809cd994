"""The rules each runtime's drafter loader applies to a drafter GGUF, as findings quoting what it prints.

llama.cpp at 0c1e570 (`src/models/dflash.cpp`, `llama-model.cpp`, `llama-model-loader.cpp`, `llama-vocab.cpp`,
`llama-batch.cpp`, `common/speculative.cpp`) for arch `dflash`; lucebox at 62880e20
(`server/src/draft/draft_gguf_loader.cpp`) for `qwen35-dflash-draft` and its aliases. Quotes are the runtime's
format strings filled in, so a test can find each one in the runtime's source.

The hyperparameter rules (required keys and their types, block size, target layer ids, mask id range, ...) are
ggtools.hparam_rules' (doctor reports them through dflash/file_rules.py, quoting llama.cpp where it refuses);
these are the rest of each loader.
"""

from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.dspark_rules import llamacpp_findings, llamacpp_shapes, lucebox_findings, lucebox_stray
from ggtools.dflash.findings import ERROR, WARNING, Effect, Finding, failed, ok
from ggtools.dflash.profiles import LLAMACPP, LUCEBOX, PROFILES, V2_KEYS

LUCEBOX_LAYER = ("attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
                 "ffn_gate", "ffn_up", "ffn_down")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")
LAYER_INPUT_ASSERT = 'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed'
RECONVERT = "ggtools convert dflash HF_DIR -o OUT --profile {profile}"
DFLASH_SPEC = "common_speculative_impl_draft_dflash"     # the __func__ llama.cpp's DFlash drafter logs under


def loader_findings(d: DraftFile, runtime: str, violations=()) -> list[Finding]:
    """What `runtime`'s drafter loader (llama.cpp or lucebox) does with this file; violations: the hyperparameter
    rules it breaks (reported apart), those llama.cpp's loader refuses with its own words among them."""
    if d.profile is None or d.profile.runtime != runtime:
        return [arch_finding(d, runtime)]
    out = _llamacpp(d) if runtime == LLAMACPP.runtime else _lucebox(d)
    if not failed(out) and not any(v.says for v in violations):
        out.insert(0, ok("loader", f"{runtime}'s drafter loader takes its keys and all {len(d.file.tensors)} "
                                   "tensors"))
    return out


def arch_finding(d: DraftFile, runtime: str) -> Finding:
    said = {LLAMACPP.runtime: f"unknown model architecture: '{d.arch}'",
            LUCEBOX.runtime: f"unexpected draft arch: {d.arch} (expected {', '.join(LUCEBOX.archs[:-1])}, or "
                             f"{LUCEBOX.archs[-1]})"}[runtime]
    dest = next(p for p in PROFILES.values() if p.runtime == runtime)
    if d.profile is None:
        return Finding("arch", ERROR, f"general.architecture '{d.arch}' is not a DFlash drafter arch",
                       (Effect(runtime, said),), RECONVERT.format(profile=dest.name))
    target = " --target TARGET.gguf" if dest.tokenizer else ""
    return Finding("arch", ERROR, f"arch '{d.arch}' is the {d.profile.name} layout; {runtime} reads the {dest.name} "
                   f"layout (arch {dest.arch})", (Effect(runtime, said),),
                   f"ggtools convert gguf-layout {d.path} --to {dest.name} -o OUT{target}")


def _finding(runtime, check, message, says, fix, symptom=None, severity=ERROR) -> Finding:
    return Finding(check, severity, message, (Effect(runtime, says, symptom),), fix)


# ---- llama.cpp -----------------------------------------------------------------------------------------------

def _llama(check, message, says, fix, symptom=None, severity=ERROR) -> Finding:
    return _finding(LLAMACPP.runtime, check, message, says, fix, symptom, severity)


def _llamacpp(d: DraftFile) -> list[Finding]:
    f, A = d.file, d.arch
    out = []
    act = f.get(f"{A}.hidden_activation")
    if act is not None and (not isinstance(act, str) or act not in ACTIVATIONS):
        out.append(_llama("activation", f"hidden activation '{act}'", f"unsupported DFlash hidden activation: {act}",
                          "silu or gelu only: reconvert the drafter"))
    if _u32(f, f"{A}.attention.sliding_window") > 0 and f"{A}.attention.sliding_window_pattern" not in f.kv:
        out.append(_llama("sliding_window", "sliding_window > 0 without sliding_window_pattern",
                          f"array key not found in model: {A}.attention.sliding_window_pattern",
                          RECONVERT.format(profile=LLAMACPP.name)))
    if d.value("block_size") is None and "markov_w1.weight" not in f.tensor:     # DSpark: an error (dspark_rules)
        out.append(_llama("block_size", f"{d.key('block_size')} is missing: llama.cpp assumes "
                          f"{LLAMACPP.default_block_size}",
                          speculative_log_line(d, LLAMACPP.default_block_size),
                          f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT", "a drafter trained with another "
                          "block size drafts from untrained positions", WARNING))
    out += _llamacpp_tensors(d)
    out += llamacpp_tokenizer(d)
    out += llamacpp_findings(d)
    return out


def speculative_log_line(d: DraftFile, block_size) -> str:
    """The line llama.cpp's DFlash drafter logs when it starts (common/speculative.cpp)."""
    mask = d.mask[0] if d.mask[1] == d.key("mask") else -1
    anchor = str(d.file.get("dflash.sample_from_anchor", True)).lower()
    return (f"{DFLASH_SPEC}: - block_size={block_size}, mask_token_id={mask}, "
            f"n_extract={len(d.stored_ids or [])}, sample_from_anchor={anchor}")


def llamacpp_tokenizer(d: DraftFile) -> list[Finding]:
    """The drafter's own vocabulary, and the mask id in it: llama.cpp fills the noise block with that id."""
    if d.n_vocab is None or "tokenizer.ggml.model" not in d.file.kv:
        return [_llama("tokenizer", "the drafter has no tokenizer (tokenizer.ggml.model / tokens): llama.cpp reads "
                       "the mask token from the drafter's own vocabulary", "key not found in model: "
                       "tokenizer.ggml.model", f"ggtools doctor {d.path} --target TARGET.gguf --fix -o OUT",
                       "the drafter does not load")]
    mask, where = d.mask
    key = d.key("mask")
    if where != key:
        found = f"; the id {mask} is only in {where}, where the converter kept it before its refactor" if where else ""
        fix = (f"ggtools doctor {d.path} --fix -o OUT" if where else
               f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT (or ggtools patch mask-token {d.path} --id N "
               "-o OUT)")
        return [_llama("mask_token_id", f"{key} is missing{found}", "init: invalid token[1] = -1", fix,
                       "every draft batch is rejected: the drafter silently drafts nothing (llama.cpp#26761)")]
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 <= mask < d.n_vocab:
        return []               # the hyperparameter rules report it (its type, its range)
    return [ok("mask_token_id", f"mask token id {mask} in the drafter's {d.n_vocab}-token vocabulary")]


def _llamacpp_tensors(d: DraftFile) -> list[Finding]:
    f, A = d.file, d.arch
    H, n_layer = _u32(f, f"{A}.embedding_length"), _u32(f, f"{A}.block_count")
    if not H or not 0 < n_layer <= 1024:
        return []             # the hyperparameter rules report them
    n_head = _u32(f, f"{A}.attention.head_count")
    n_kv = _u32(f, f"{A}.attention.head_count_kv") or n_head
    dk = _u32(f, f"{A}.attention.key_length") or (H // n_head if n_head else 0)
    dv = _u32(f, f"{A}.attention.value_length") or dk
    V = d.n_vocab or 0
    n_ff = _u32(f, f"{A}.feed_forward_length")
    required = {"fc.weight": (len(d.stored_ids or []) * H, H), "enc.output_norm.weight": (H,),
                "output_norm.weight": (H,)}
    optional = {"token_embd.weight": (H, V), "fc.scale": (1,), "rope_freqs.weight": (dk // 2,)}
    dspark_required, dspark_optional = llamacpp_shapes(d, H, V)
    required |= dspark_required
    optional |= dspark_optional
    layer = {"attn_norm": (H,), "attn_q": (H, dk * n_head), "attn_k": (H, dk * n_kv), "attn_output": (dk * n_head, H),
             "attn_q_norm": (dk,), "attn_k_norm": (dk,), "ffn_norm": (H,),
             "ffn_gate": (H, n_ff) if n_ff else None, "ffn_up": (H, n_ff) if n_ff else None,
             "ffn_down": (n_ff, H) if n_ff else None}
    layer_optional = {"attn_v": (H, dv * n_kv), "post_attention_norm": (H,), "post_ffw_norm": (H,),
                      "layer_output_scale": (1,), "attn_sinks": (n_head,)}
    for i in range(n_layer):
        required |= {f"blk.{i}.{t}.weight": ne for t, ne in layer.items()}
        optional |= {f"blk.{i}.{t}.weight": ne for t, ne in layer_optional.items()}
    out = _llamacpp_v2(d, H, n_layer, V, required)
    reconvert = RECONVERT.format(profile=LLAMACPP.name)
    dspark = set(dspark_required) | set(dspark_optional) if (dspark_required or "d2t" in f.tensor) else set()
    for name, ne in required.items():
        t = f.tensor.get(name)
        check = "dspark" if name in dspark else "tensors"
        if t is None:
            out.append(_llama(check, f"tensor {name} is missing", f"check_tensor_dims: tensor '{name}' not found", reconvert))
        elif ne is not None and _ne4(t.ne) != _ne4(ne):
            out.append(_wrong_shape(name, ne, t.ne, check))
    for name, ne in optional.items():
        t = f.tensor.get(name)
        if t is not None and ne is not None and _ne4(t.ne) != _ne4(ne):
            out.append(_wrong_shape(name, ne, t.ne, "dspark" if name in dspark else "tensors"))
    extra = [t.name for t in f.tensors if t.name not in required and t.name not in optional]
    if extra:
        n = len(f.tensors)
        heads = any(name in ("markov_w2.weight", "markov_w2.scale", "conf_proj.weight", "conf_proj.bias")
                    for name in extra)        # DSpark heads without markov_w1: the loader takes none of them
        out.append(_llama("dspark" if heads else "tensors", f"tensors the dflash loader does not take: {extra[:5]}"
                          + (" (no markov_w1.weight: the DSpark heads are not loaded)" if heads else ""),
                          f"done_getting_tensors: wrong number of tensors; expected {n}, got {n - len(extra)}",
                          reconvert))
    return out


def _llamacpp_v2(d: DraftFile, H, n_layer, V, required) -> list[Finding]:
    """DFlash2 iff selector_hidden.weight exists: its keys, lattice constraints, and its tensors become required."""
    if not d.is_dflash2:
        return []
    f, A = d.file, d.arch
    keys = {k: _u32(f, f"{A}.{k}") for k in ("selector_rank", "block_size", "selector_top_k", "conv_kernel_size",
                                               "conv_group_size")}
    if min(keys.values()) <= 0:
        missing = [k for k, v in keys.items() if v <= 0]
        return [_llama("dflash2", f"DFlash2 keys missing or zero: {missing}", "DFlash2 model is missing "
                       "conv/selector metadata", f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT")]
    gs, kt, R, K = keys["conv_group_size"], keys["selector_top_k"], keys["selector_rank"], keys["conv_kernel_size"]
    if H % gs:
        return [_llama("dflash2", f"hidden size {H} is not divisible by conv_group_size {gs}",
                       "DFlash2 hidden size must be divisible by conv_group_size",
                       f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT")]
    if H < kt * (kt + 1):
        return [_llama("dflash2", f"hidden size {H} < selector_top_k {kt} x {kt + 1}",
                       "DFlash2 hidden size is too small for the selector lattice",
                       f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT")]
    required |= {"selector_predecessor.weight": (R, V), "selector_successor.weight": (R, V),
                 "selector_hidden.weight": (H, R)}
    for i in range(n_layer):
        for side in ("attn", "ffn"):
            required[f"blk.{i}.{side}_conv_base"] = (H, K, 2)
            required[f"blk.{i}.{side}_conv_proj.weight"] = (H, 2 * K * (H // gs))
    return [ok("dflash2", f"DFlash2 keys {', '.join(V2_KEYS)}; lattice: H {H} % group {gs} == 0, "
                          f"H >= top_k {kt} x {kt + 1}")]


def _wrong_shape(name, want, got, check="tensors") -> Finding:
    return _llama(check, f"tensor {name} has ne {list(got)}, the loader wants {list(want)}",
                  f"check_tensor_dims: tensor '{name}' has wrong shape; expected {_shape(want)}, got "
                  f"{_shape(tuple(got) + (1,) * (4 - len(got)))}", RECONVERT.format(profile=LLAMACPP.name))


def _ne4(ne) -> tuple:
    """ne as check_tensor_dims compares it: all four dimensions, the missing ones 1."""
    return tuple(int(x) for x in ne) + (1,) * (4 - len(ne))


def _shape(ne) -> str:
    return ", ".join(f"{d:6d}" for d in ne)


# ---- lucebox -------------------------------------------------------------------------------------------------

def _lb(check, message, says, fix, symptom=None, severity=ERROR) -> Finding:
    return _finding(LUCEBOX.runtime, check, message, says, fix, symptom, severity)


def _lucebox(d: DraftFile) -> list[Finding]:
    f, A = d.file, d.arch
    u32 = {k: _u32(f, f"{A}.{k}") for k in ("embedding_length", "block_count", "feed_forward_length",
                                            "attention.head_count", "attention.head_count_kv",
                                            "attention.key_length")}
    H, L, ff = u32["embedding_length"], u32["block_count"], u32["feed_forward_length"]
    nh, nkv, hd = u32["attention.head_count"], u32["attention.head_count_kv"], u32["attention.key_length"]
    dims = f"n_embd={H} n_layer={L} n_ff={ff} n_head={nh} n_head_kv={nkv} head_dim={hd}"
    out = []
    if 0 in (H, L, ff, nh, nkv, hd):
        out.append(_lb("hparams", "a hyperparameter is missing or zero", f"draft GGUF: missing hparams: {dims}",
                       f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT"))
    elif L > 1024 or H > 1 << 17 or ff > 1 << 19 or nh > 1024 or nkv > 1024 or hd > 1024 or nkv > nh or nh % nkv:
        out.append(_lb("hparams", "hyperparameters out of range", f"draft GGUF: hparams out of range: {dims}",
                       f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT"))
    out += _lucebox_tensors(d, L, nh, nkv, hd, H)
    out += _lucebox_ids(d, H)
    if _u32(f, d.key("block_size")) <= 0:
        out.append(_lb("block_size", f"{d.key('block_size')} is missing or zero", None,
                       f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT", "no loader error; drafting with block "
                       "size 0 fails when the draft step is set up"))
    if f"{A}.rope.freq_base" not in f.kv:
        out.append(_lb("rope_theta", f"{A}.rope.freq_base is missing",
                       "[draft-gguf] WARNING: rope.freq_base not found in GGUF, draft RoPE will be wrong",
                       f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT"))
    if d.file.tensor.get("selector_hidden.weight") or any("conv_base" in t.name for t in f.tensors):
        out.append(_lb("dflash2", "DFlash2 tensors in a lucebox drafter", None,
                       RECONVERT.format(profile=LLAMACPP.name), "the loader ignores them: lucebox has no DFlash2 "
                       "support and drafts it as v1 (about 0% acceptance)"))
    out += lucebox_findings(d, H) + lucebox_stray(d)
    return out


def _lucebox_tensors(d: DraftFile, L, nh, nkv, hd, H) -> list[Finding]:
    f, p = d.file, d.profile
    reconvert = RECONVERT.format(profile=LUCEBOX.name)
    out = []
    if None in (d.tensor("fc.weight"), d.tensor("hidden_norm.weight"), d.tensor("norm.weight")):
        out.append(_lb("tensors", "fc, hidden_norm or output_norm is missing",
                       "draft GGUF: missing top-level tensors (dflash.fc|dflash_fc / dflash.hidden_norm|"
                       "dflash_hidden_norm / output_norm)", reconvert))
    for i in range(L):
        if any(p.find_tensor(f.tensor, f"blk.{i}.{t}.weight") is None for t in LUCEBOX_LAYER):
            out.append(_lb("tensors", f"layer {i} lacks one of {list(LUCEBOX_LAYER)}",
                           f"draft GGUF: layer {i} missing tensors", reconvert))
            return out
    gates = sum(f"blk.{i}.attn_gate.weight" in f.tensor for i in range(L))
    if gates not in (0, L):
        out.append(_lb("tensors", f"attn_gate in {gates} of {L} layers",
                       f"draft GGUF: incomplete attention gate tensors: {gates}/{L} layers", reconvert))
    q, k = f.tensor.get("blk.0.attn_q.weight"), f.tensor.get("blk.0.attn_k.weight")
    if q is not None and k is not None and L:
        for got, want, what in ((q.ne[1], nh * hd, "attn_q.weight->ne[1]={} != expected_q_dim={}"),
                                (k.ne[1], nkv * hd, "attn_k.weight->ne[1]={} != expected_kv_dim={}"),
                                (q.ne[0], H, "attn_q.weight->ne[0]={} != n_embd={}")):
            if got != want:
                out.append(_lb("tensors", "blk.0 shapes do not match the head counts",
                               "GGUF shape mismatch: blk.0 " + what.format(got, want),
                               f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT"))
                break
    return out


def _lucebox_ids(d: DraftFile, H) -> list[Finding]:
    f = d.file
    out = []
    fc_in = d.fc_in
    kv = f.kv.get(d.key("target_ids"))
    ids = d.stored_ids if kv is not None and kv.is_array and kv.elem_type.name == "INT32" else None
    if ids is None:
        why = "missing" if kv is None else f"not an INT32 array ({kv.type_label}), so the loader ignores it"
        out.append(_lb("target_layers", f"{d.key('target_ids')} is {why}", None,
                       f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT", "no loader error: lucebox derives ids "
                       "1 + k*((n_layer-2)/(N-1)), silently wrong for most drafters"))
    n = _u32(f, d.key("n_target_ids")) or (len(ids) if ids else 0)
    if fc_in is not None and H and n and fc_in != n * H:
        if fc_in % H == 0:
            out.append(_lb("fc", f"n_target_layers {n} disagrees with fc width {fc_in}",
                           f"[draft] dflash.n_target_layers metadata ({n}) != fc-derived capture count "
                           f"({fc_in // H}); using the weights", f"ggtools doctor {d.path} --fix -o OUT",
                           severity=WARNING))
        else:
            out.append(_lb("fc", f"fc width {fc_in} is not n_target_layers x n_embd",
                           f"GGUF shape mismatch: dflash.fc.weight->ne[0]={fc_in} != n_target_layers*n_embd"
                           f"={n}*{H}={n * H}", RECONVERT.format(profile=LUCEBOX.name)))
    if ids is not None and fc_in is not None and H and fc_in != len(ids) * H:
        out.append(_lb("target_layers", f"{len(ids)} target layer ids but fc takes {fc_in} = {fc_in / H:g} x {H} "
                       "inputs", None, f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT",
                       "no loader error at 62880e20: the draft reads the wrong features"))
    return out


def _u32(f, key) -> int:
    v = f.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0


# ---- DSpark --------------------------------------------------------------------------------------------------

# the DSpark heads, d2t, the block size the Markov head asserts, and the mask id its draft batch is filled with (the
# K3 field report: without tokenizer.ggml.mask_token_id every draft step fails with "invalid token[1] = -1")
DSPARK_CHECKS = ("dspark", "d2t", "block_size", "confidence_head", "sample_from_anchor", "mask_token_id")


def dspark_findings(d: DraftFile) -> list[Finding]:
    """The loader rules of the file's own runtime about its DSpark heads, d2t, block size and mask id (what
    `validate` reports for a DSpark drafter); [] for a file that is none."""
    if d.profile is None or not (d.is_dspark or d.tensor("d2t") is not None):
        return []
    return [f for f in loader_findings(d, d.profile.runtime) if f.check in DSPARK_CHECKS]


# ---- draft size ----------------------------------------------------------------------------------------------

LLAMACPP_DEFAULT_N_MAX = 3       # common.h: common_params_speculative_draft.n_max (--spec-draft-n-max)


def draft_size_findings(d: DraftFile, n_max: int | None, runtimes) -> list[Finding]:
    """A draft size above what a block drafts (block size - 1; an anchor-first DSpark block: block size): llama.cpp
    clamps it (and says so), ggtools' runtime refuses it."""
    block = d.int_value("block_size") or d.profile.default_block_size
    if not block:
        return []             # the block-size rules report it
    out = []
    asked = n_max if n_max is not None else LLAMACPP_DEFAULT_N_MAX
    most = block if d.is_dspark and d.sample_from_anchor else block - 1
    what = f"block size {block}" if most == block else f"block size {block} - 1"
    if LLAMACPP.runtime in runtimes and asked > most:
        out.append(_llama("n_max", f"draft size n_max {asked}{'' if n_max is not None else ' (llama.cpp default)'} "
                          f"> {what}", f"{DFLASH_SPEC}: requested draft size (n_max={asked}, n_min=0) exceeds the "
                          f"trained block size {block} -- clamping to {most}",
                          f"--spec-draft-n-max {most} (or fix the block size: ggtools doctor {d.path} --hf "
                          "HF_DIR --fix -o OUT)", f"drafts {most} tokens per step, not {asked}", WARNING))
    if "ggtools" in runtimes and n_max is not None and n_max > block - 1:
        out.append(_finding("ggtools", "n_max", f"draft size n_max {n_max} > block size {block} - 1",
                            f"--n-max {n_max}: the drafter's block of {block} drafts at most {block - 1} tokens "
                            "per step", f"ggtools run ... --n-max {block - 1}"))
    return out
