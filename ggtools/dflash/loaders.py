"""The rules each runtime's drafter loader applies to a drafter GGUF, with the message it prints when one fails.

llama.cpp at 0c1e570 (`src/models/dflash.cpp`, `llama-model.cpp`, `llama-model-loader.cpp`, `llama-vocab.cpp`,
`common/speculative.cpp`) for arch `dflash`; lucebox at 62880e20 (`server/src/draft/draft_gguf_loader.cpp`) for
`qwen35-dflash-draft` and its aliases. A check that fails is a Finding with the loader's own words (quoted) and
the fix. `Drafter` carries what the pair checks need (hidden size, layer ids, fc width, mask id).
"""

from dataclasses import dataclass, field

from ggtools.gguf import GGUFFile

LLAMA_ARCH = "dflash"
LUCEBOX_ARCHS = ("qwen35-dflash-draft", "dflash-draft", "gemma4-dflash-draft")
LLAMA_REQUIRED_KEYS = ("context_length", "embedding_length", "block_count", "attention.layer_norm_rms_epsilon")
LUCEBOX_LAYER = ("attn_norm", "ffn_norm|post_attention_norm", "attn_q", "attn_k", "attn_v", "attn_output",
                 "attn_q_norm", "attn_k_norm", "ffn_gate", "ffn_up", "ffn_down")
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh")


@dataclass
class Finding:
    check: str
    severity: str                    # "error" | "warning" | "ok"
    message: str
    loader_error: str | None = None  # what the runtime prints (or does) when it meets this
    fix: str | None = None

    def as_dict(self):
        return {k: v for k, v in vars(self).items() if v is not None}


@dataclass
class Drafter:
    profile: str                     # "llama.cpp" | "lucebox"
    arch: str
    hidden: int | None
    hf_ids: list[int] | None         # target layer ids in HF convention (stored - 1 for llama.cpp)
    stored_ids: list[int] | None
    fc_in: int | None                # fc.weight ne[0]
    mask_id: int | None
    n_vocab: int | None              # the drafter's own tokenizer size (llama.cpp profile)
    findings: list[Finding] = field(default_factory=list)


def profile_of(arch: str | None) -> str | None:
    if arch == LLAMA_ARCH:
        return "llama.cpp"
    if arch in LUCEBOX_ARCHS:
        return "lucebox"
    return None


def check_drafter(f: GGUFFile) -> Drafter:
    profile = profile_of(f.architecture)
    if profile == "llama.cpp":
        return check_llamacpp(f)
    if profile == "lucebox":
        return check_lucebox(f)
    d = Drafter("unknown", f.architecture or "?", None, None, None, None, None, None)
    d.findings.append(Finding(
        "arch", "error", f"general.architecture '{f.architecture}' is not a DFlash drafter arch",
        f"llama.cpp: \"unknown model architecture: '{f.architecture}'\"; lucebox: \"unexpected draft arch: "
        f"{f.architecture} (expected qwen35-dflash-draft, dflash-draft, or gemma4-dflash-draft)\"",
        "convert the HF drafter with `ggtools convert dflash --profile llama.cpp|lucebox`"))
    return d


# ---- llama.cpp -----------------------------------------------------------------------------------------------

def check_llamacpp(f: GGUFFile) -> Drafter:
    A = LLAMA_ARCH
    out = []
    for k in LLAMA_REQUIRED_KEYS:
        if f"{A}.{k}" not in f.kv:
            out.append(Finding("keys", "error", f"{A}.{k} is missing", f"key not found in model: {A}.{k}",
                               f"ggtools patch set DRAFT {A}.{k}=<type>:<value> --in-place"))
    stored = _int_array(f, f"{A}.target_layers")
    if stored is None:
        kv = f.kv.get(f"{A}.target_layers")
        out.append(Finding("target_layers", "error", f"{A}.target_layers is missing or not an integer array",
                           "DFlash model requires 'target_layers' in GGUF metadata" if kv is None or not kv.is_array
                           else f"{A}.target_layers has wrong array element type {kv.elem_type.name}",
                           f"ggtools patch set DRAFT '{A}.target_layers=i32[]:<HF target_layer_ids + 1>' --in-place"))
    act = f.get(f"{A}.hidden_activation")
    if act is not None and act not in ACTIVATIONS:
        out.append(Finding("activation", "error", f"hidden activation '{act}'",
                           f"unsupported DFlash hidden activation: {act}", "silu or gelu only"))
    if (f.get(f"{A}.attention.sliding_window") or 0) > 0 and f"{A}.attention.sliding_window_pattern" not in f.kv:
        out.append(Finding("sliding_window", "error", "sliding_window > 0 without sliding_window_pattern",
                           f"array key not found in model: {A}.attention.sliding_window_pattern",
                           "write the per-layer BOOL pattern, or remove the sliding window"))
    if f.get(f"{A}.block_size") is None:
        out.append(Finding("block_size", "warning", f"{A}.block_size is missing: llama.cpp assumes 16",
                           "DFlash: block_size=16 (log line; no error)",
                           f"ggtools patch set DRAFT {A}.block_size=u32:<trained block size> --in-place"))
    out += _llamacpp_tensors(f, stored)
    n_vocab = _count(f, "tokenizer.ggml.tokens")
    mask = f.get("tokenizer.ggml.mask_token_id")
    out += _llamacpp_mask(mask, n_vocab)
    _loader_ok(out, "llama.cpp dflash loader", len(f.tensors))
    fc = f.tensor.get("fc.weight")
    hf = [i - 1 for i in stored] if stored is not None else None
    return Drafter("llama.cpp", A, f.get(f"{A}.embedding_length"), hf, stored, fc.ne[0] if fc else None,
                   mask, n_vocab, out)


def _llamacpp_mask(mask, n_vocab) -> list[Finding]:
    fix = "ggtools patch mask-token DRAFT --id <mask token id of the target vocabulary> --in-place"
    if n_vocab is None:
        return [Finding("tokenizer", "error", "the drafter has no tokenizer (tokenizer.ggml.tokens)",
                        "mask token id -1: batch validation fails with \"invalid token[1] = -1\", no drafts",
                        "reconvert with `ggtools convert dflash --target-gguf TARGET` (embeds the target's tokenizer)")]
    if mask is None:
        return [Finding("mask_token_id", "error", "tokenizer.ggml.mask_token_id is missing: the noise block is "
                        "filled with token -1 and the drafter drafts nothing (llama.cpp#26761)",
                        "decode: invalid token[1] = -1", fix)]
    if not isinstance(mask, int) or mask >= n_vocab:
        return [Finding("mask_token_id", "error", f"mask token id {mask} is outside the drafter's {n_vocab}-token "
                        "vocabulary", f"bad special token: 'tokenizer.ggml.mask_token_id' = {mask}, using default "
                        "id -1", fix)]
    return [Finding("mask_token_id", "ok", f"mask token id {mask} in the drafter's {n_vocab}-token vocabulary")]


def _llamacpp_tensors(f, stored) -> list[Finding]:
    A = LLAMA_ARCH
    H, n_layer = f.get(f"{A}.embedding_length"), f.get(f"{A}.block_count")
    if not isinstance(H, int) or not isinstance(n_layer, int):
        return []
    n_head = f.get(f"{A}.attention.head_count") or 0
    n_kv = f.get(f"{A}.attention.head_count_kv") or n_head
    dk = f.get(f"{A}.attention.key_length") or (H // n_head if n_head else 0)
    dv = f.get(f"{A}.attention.value_length") or dk
    V = _count(f, "tokenizer.ggml.tokens") or 0
    n_ff = f.get(f"{A}.feed_forward_length")
    required = {"fc.weight": (len(stored or []) * H, H), "enc.output_norm.weight": (H,), "output_norm.weight": (H,)}
    optional = {"token_embd.weight": (H, V), "output.weight": (H, V), "fc.scale": (1,), "rope_freqs.weight": (dk // 2,),
                "d2t": None, "markov_w1.weight": None, "markov_w2.weight": None, "markov_w2.scale": None,
                "conf_proj.weight": None, "conf_proj.bias": None}
    layer = {"attn_norm": (H,), "attn_q": (H, dk * n_head), "attn_k": (H, dk * n_kv), "attn_output": (dk * n_head, H),
             "attn_q_norm": (dk,), "attn_k_norm": (dk,), "ffn_norm": (H,),
             "ffn_gate": (H, n_ff) if n_ff else None, "ffn_up": (H, n_ff) if n_ff else None,
             "ffn_down": (n_ff, H) if n_ff else None}
    layer_optional = {"attn_v": (H, dv * n_kv), "post_attention_norm": (H,), "post_ffw_norm": (H,),
                      "layer_output_scale": (1,), "attn_sinks": (n_head,)}
    for i in range(n_layer):
        required |= {f"blk.{i}.{t}.weight": ne for t, ne in layer.items()}
        optional |= {f"blk.{i}.{t}.weight": ne for t, ne in layer_optional.items()}
    out = _llamacpp_v2(f, H, n_layer, V, required)
    for name, ne in required.items():
        t = f.tensor.get(name)
        if t is None:
            out.append(Finding("tensors", "error", f"tensor {name} is missing", f"missing tensor '{name}'",
                               "reconvert the drafter with `ggtools convert dflash`"))
        elif ne is not None and tuple(t.ne) != tuple(ne):
            out.append(_wrong_shape(name, ne, t.ne))
    for name, ne in optional.items():
        t = f.tensor.get(name)
        if t is not None and ne is not None and tuple(t.ne) != tuple(ne):
            out.append(_wrong_shape(name, ne, t.ne))
    extra = [t.name for t in f.tensors if t.name not in required and t.name not in optional]
    if extra:
        n = len(f.tensors)
        out.append(Finding("tensors", "error", f"tensors the dflash loader does not take: {extra[:5]}",
                           f"done_getting_tensors: wrong number of tensors; expected {n}, got {n - len(extra)}",
                           "remove them (they belong to another arch or profile)"))
    return out


def _llamacpp_v2(f, H, n_layer, V, required) -> list[Finding]:
    """DFlash2 iff selector_hidden.weight exists: metadata, lattice constraints, and its tensors become required."""
    A = LLAMA_ARCH
    if "selector_hidden.weight" not in f.tensor:
        return []
    keys = {k: f.get(f"{A}.{k}") or 0 for k in ("selector_rank", "block_size", "selector_top_k",
                                                    "conv_kernel_size", "conv_group_size")}
    if min(keys.values()) <= 0:
        missing = [k for k, v in keys.items() if v <= 0]
        return [Finding("dflash2", "error", f"DFlash2 metadata missing or zero: {missing}",
                        "DFlash2 model is missing conv/selector metadata",
                        "reconvert with `ggtools convert dflash` (all four of conv_kernel_size, conv_group_size, "
                        "selector_rank, selector_top_k, and block_size)")]
    gs, kt, R, K = keys["conv_group_size"], keys["selector_top_k"], keys["selector_rank"], keys["conv_kernel_size"]
    if H % gs:
        return [Finding("dflash2", "error", f"hidden size {H} is not divisible by conv_group_size {gs}",
                        "DFlash2 hidden size must be divisible by conv_group_size", "fix conv_group_size")]
    if H < kt * (kt + 1):
        return [Finding("dflash2", "error", f"hidden size {H} < selector_top_k {kt} x {kt + 1}",
                        "DFlash2 hidden size is too small for the selector lattice", "fix selector_top_k")]
    required |= {"selector_predecessor.weight": (R, V), "selector_successor.weight": (R, V),
                 "selector_hidden.weight": (H, R)}
    for i in range(n_layer):
        for side in ("attn", "ffn"):
            required[f"blk.{i}.{side}_conv_base"] = (H, K, 2)
            required[f"blk.{i}.{side}_conv_proj.weight"] = (H, 2 * K * (H // gs))
    return [Finding("dflash2", "ok", f"DFlash2 lattice: H {H} % group {gs} == 0, H >= top_k {kt} x {kt + 1}")]


def _wrong_shape(name, want, got) -> Finding:
    return Finding("tensors", "error", f"tensor {name} has ne {list(got)}, the loader wants {list(want)}",
                   f"check_tensor_dims: tensor '{name}' has wrong shape; expected {_shape(want)}, got "
                   f"{_shape(tuple(got) + (1,) * (4 - len(got)))}",
                   "reconvert the drafter with `ggtools convert dflash` for this target")


def _shape(ne) -> str:
    return ", ".join(f"{d:6d}" for d in ne)


# ---- lucebox -------------------------------------------------------------------------------------------------

def check_lucebox(f: GGUFFile) -> Drafter:
    A = f.architecture
    u32 = {k: _u32(f, f"{A}.{k}") for k in ("embedding_length", "block_count", "feed_forward_length",
                                            "attention.head_count", "attention.head_count_kv",
                                            "attention.key_length", "dflash.block_size", "dflash.n_target_layers")}
    H, L, ff = u32["embedding_length"], u32["block_count"], u32["feed_forward_length"]
    nh, nkv, hd = u32["attention.head_count"], u32["attention.head_count_kv"], u32["attention.key_length"]
    dims = f"n_embd={H} n_layer={L} n_ff={ff} n_head={nh} n_head_kv={nkv} head_dim={hd}"
    out = []
    if 0 in (H, L, ff, nh, nkv, hd):
        out.append(Finding("hparams", "error", "a hyperparameter is missing or zero",
                           f"draft GGUF: missing hparams: {dims}", f"write the missing {A}.* u32 keys"))
    elif L > 1024 or H > 1 << 17 or ff > 1 << 19 or nh > 1024 or nkv > 1024 or hd > 1024 or nkv > nh or nh % nkv:
        out.append(Finding("hparams", "error", "hyperparameters out of range",
                           f"draft GGUF: hparams out of range: {dims}", "fix the head counts"))
    ids = _int_array(f, f"{A}.dflash.target_layer_ids", int32_only=True)
    out += _lucebox_tensors(f, L, nh, nkv, hd, H)
    out += _lucebox_ids(f, A, ids, u32["dflash.n_target_layers"], H)
    if u32["dflash.block_size"] == 0:
        out.append(Finding("block_size", "error", f"{A}.dflash.block_size is missing or zero",
                           "no loader error; draft init fails later (block_size 0)",
                           f"ggtools patch set DRAFT {A}.dflash.block_size=u32:16 --in-place"))
    if not f.get(f"{A}.rope.freq_base"):
        out.append(Finding("rope", "error", f"{A}.rope.freq_base is missing",
                           "[draft-gguf] WARNING: rope.freq_base not found in GGUF, draft RoPE will be wrong",
                           f"ggtools patch set DRAFT {A}.rope.freq_base=f32:<rope_theta> --in-place"))
    if "selector_hidden.weight" in f.tensor or any("conv_base" in t.name for t in f.tensors):
        out.append(Finding("dflash2", "error", "DFlash2 tensors in a lucebox drafter",
                           "ignored by the loader: lucebox has no DFlash2 support (drafts as v1, ~0% acceptance)",
                           "use the llama.cpp profile for DFlash2 drafters"))
    _loader_ok(out, "lucebox draft_gguf_loader", len(f.tensors))
    fc = f.tensor.get("dflash.fc.weight") or f.tensor.get("dflash_fc.weight")
    mask = f.get(f"{A}.dflash.mask_token_id")
    return Drafter("lucebox", A, H or None, ids, ids, fc.ne[0] if fc else None, mask, None, out)


def _lucebox_tensors(f, L, nh, nkv, hd, H) -> list[Finding]:
    def has(*names):
        return any(n in f.tensor for n in names)

    out = []
    if not (has("dflash.fc.weight", "dflash_fc.weight") and has("dflash.hidden_norm.weight", "dflash_hidden_norm.weight")
            and has("output_norm.weight")):
        out.append(Finding("tensors", "error", "fc, hidden_norm or output_norm is missing",
                           "draft GGUF: missing top-level tensors (dflash.fc|dflash_fc / dflash.hidden_norm|"
                           "dflash_hidden_norm / output_norm)", "reconvert with `ggtools convert dflash --profile lucebox`"))
    for i in range(L):
        if not all(has(*(f"blk.{i}.{a}.weight" for a in t.split("|"))) for t in LUCEBOX_LAYER):
            out.append(Finding("tensors", "error", f"layer {i} lacks one of {list(LUCEBOX_LAYER)}",
                               f"draft GGUF: layer {i} missing tensors", "reconvert with `ggtools convert dflash`"))
            return out
    gates = sum(f"blk.{i}.attn_gate.weight" in f.tensor for i in range(L))
    if gates not in (0, L):
        out.append(Finding("tensors", "error", f"attn_gate in {gates} of {L} layers",
                           f"draft GGUF: incomplete attention gate tensors: {gates}/{L} layers", "all layers or none"))
    q, k = f.tensor.get("blk.0.attn_q.weight"), f.tensor.get("blk.0.attn_k.weight")
    if q is not None and k is not None and L:
        for got, want, what in ((q.ne[1], nh * hd, "attn_q.weight->ne[1]={} != expected_q_dim={}"),
                                (k.ne[1], nkv * hd, "attn_k.weight->ne[1]={} != expected_kv_dim={}"),
                                (q.ne[0], H, "attn_q.weight->ne[0]={} != n_embd={}")):
            if got != want:
                out.append(Finding("tensors", "error", f"blk.0 shapes do not match the head counts",
                                   "GGUF shape mismatch: blk.0 " + what.format(got, want), "fix the hparams"))
                break
    return out


def _lucebox_ids(f, A, ids, n_tgt, H) -> list[Finding]:
    out = []
    fc = f.tensor.get("dflash.fc.weight") or f.tensor.get("dflash_fc.weight")
    kv = f.kv.get(f"{A}.dflash.target_layer_ids")
    if ids is None:
        why = "missing" if kv is None else f"not an INT32 array ({kv.type_label}), so the loader ignores it"
        out.append(Finding("target_layer_ids", "error", f"{A}.dflash.target_layer_ids is {why}: lucebox then "
                           "derives ids 1 + k*((n_layer-2)/(N-1)), silently wrong for most drafters",
                           "no loader error", f"ggtools patch set DRAFT '{A}.dflash.target_layer_ids=i32[]:<HF ids>' "
                           "--in-place"))
    n = n_tgt or (len(ids) if ids else 0)
    if fc is not None and H and n and fc.ne[0] != n * H:
        if fc.ne[0] % H == 0:
            out.append(Finding("fc", "warning", f"n_target_layers {n} disagrees with fc width {fc.ne[0]}",
                               f"[draft] dflash.n_target_layers metadata ({n}) != fc-derived capture count "
                               f"({fc.ne[0] // H}); using the weights", "fix dflash.n_target_layers"))
        else:
            out.append(Finding("fc", "error", f"fc width {fc.ne[0]} is not n_target_layers x n_embd",
                               f"GGUF shape mismatch: dflash.fc.weight->ne[0]={fc.ne[0]} != n_target_layers*n_embd"
                               f"={n}*{H}={n * H}", "reconvert the drafter"))
    if ids is not None and fc is not None and H and fc.ne[0] != len(ids) * H:
        out.append(Finding("target_layer_ids", "error", f"{len(ids)} target layer ids but fc takes "
                           f"{fc.ne[0]} = {fc.ne[0] / H:g} x {H} inputs", "no loader error at 62880e20",
                           "write the ids the drafter was trained with"))
    return out


# ---- helpers -------------------------------------------------------------------------------------------------

def _loader_ok(findings, loader, n_tensors):
    if not any(f.severity == "error" for f in findings):
        findings.insert(0, Finding("loader", "ok", f"{loader}: required keys and all {n_tensors} tensors as it wants"))

def _int_array(f, key, int32_only=False) -> list[int] | None:
    kv = f.kv.get(key)
    if kv is None or not kv.is_array:
        return None
    allowed = ("INT32",) if int32_only else ("INT32", "UINT32")
    if kv.elem_type.name not in allowed:
        return None
    return [int(v) for v in kv.value]


def _u32(f, key) -> int:
    v = f.get(key)
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else 0


def _count(f, key) -> int | None:
    kv = f.kv.get(key)
    return kv.count if kv is not None and kv.is_array else None
