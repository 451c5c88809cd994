"""DraftHParams: a DFlash drafter GGUF's hyperparameters and tensor names, from either profile.

- llama.cpp profile (arch `dflash`): keys `dflash.*`, target layers stored as HF id + 1, mask id in
  `tokenizer.ggml.mask_token_id`, `fc.weight` / `enc.output_norm.weight`; DFlash2 iff `selector_hidden.weight`.
- lucebox profile (arch `qwen35-dflash-draft` and aliases): keys `<arch>.*`, raw HF ids in
  `<arch>.dflash.target_layer_ids`, mask id in `<arch>.dflash.mask_token_id`, `dflash.fc.weight` /
  `dflash.hidden_norm.weight` (or the `dflash_` aliases); v1 only.

`taps` are in the runtime's convention (TargetModel.forward: the residual stream entering layer j), which is
HF id + 1: the llama.cpp ids as stored, the lucebox ids + 1.
"""

from dataclasses import dataclass, field

from ggtools.runtime.errors import ModelError

LLAMA_ARCH = "dflash"
LUCEBOX_ARCHS = ("qwen35-dflash-draft", "dflash-draft", "gemma4-dflash-draft")


@dataclass(frozen=True)
class DFlash2Params:
    conv_kernel: int
    conv_group: int
    selector_rank: int
    selector_top_k: int
    logit_scale: float          # output_multiplier; 1 when absent
    softcap: float              # final_logit_softcapping; 0 = none


@dataclass(frozen=True)
class DraftHParams:
    profile: str                # "llama.cpp" | "lucebox"
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    rms_eps: float
    rope_base: float
    rope_dims: int
    rope_freq_scale: float
    block_size: int
    mask_id: int
    taps: tuple                 # target tap ids (HF target_layer_ids + 1)
    embedding_scale: float = 1.0
    causal: bool = False        # noise block causal (dflash.attention.causal); context always visible
    sliding_window: int = 0
    sliding_layers: tuple = ()  # per layer: does the sliding window apply
    rope_sections: tuple = ()   # M-RoPE sections (drafters of qwen35 targets; llama.cpp runs them as MROPE)
    v2: DFlash2Params | None = None
    names: dict = field(default_factory=dict)   # role -> tensor name (fc, hidden_norm, ffn_norm suffix)

    @property
    def fc_in(self) -> int:
        return len(self.taps) * self.n_embd


def profile_of(arch: str | None) -> str:
    if arch == LLAMA_ARCH:
        return "llama.cpp"
    if arch in LUCEBOX_ARCHS:
        return "lucebox"
    raise ModelError(f"architecture '{arch}' is not a DFlash drafter (expected {LLAMA_ARCH} or one of "
                     f"{', '.join(LUCEBOX_ARCHS)})")


def read_draft_hparams(gguf, tensor_names, mask_id: int | None = None) -> DraftHParams:
    """gguf: the drafter's GGUFFile; tensor_names: the names it holds; mask_id overrides the stored one."""
    arch = gguf.architecture
    profile = profile_of(arch)

    def key(name, default=None, required=False):
        value = gguf.get(f"{arch}.{name}")
        if value is None:
            if required:
                raise ModelError(f"{gguf.path}: missing key '{arch}.{name}'")
            return default
        return value

    n_embd = int(key("embedding_length", required=True))
    n_head = int(key("attention.head_count", required=True))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise ModelError(f"{gguf.path}: key and value head sizes differ; not supported")
    scaling = key("rope.scaling.type", "none")
    factor = float(key("rope.scaling.factor", 0.0) or 1.0)
    if scaling not in ("none", "linear") and factor != 1.0:
        raise ModelError(f"{gguf.path}: rope scaling '{scaling}' is not supported yet")
    n_layer = int(key("block_count", required=True))
    window = int(key("attention.sliding_window", 0) or 0)
    pattern = key("attention.sliding_window_pattern") if window else None
    if pattern is not None and len(pattern) != n_layer:
        raise ModelError(f"{gguf.path}: sliding_window_pattern has {len(pattern)} entries for {n_layer} layers")
    if profile == "llama.cpp":
        taps, block, stored_mask, names = _llamacpp(gguf, key)
    else:
        taps, block, stored_mask, names = _lucebox(gguf, key, tensor_names)
    mask = stored_mask if mask_id is None else mask_id
    if mask is None:
        raise ModelError(f"{gguf.path}: no mask token id (llama.cpp profile: tokenizer.ggml.mask_token_id; "
                         "lucebox: <arch>.dflash.mask_token_id); the noise block cannot be built")
    if not block or block < 2:
        raise ModelError(f"{gguf.path}: block size {block}: a drafter needs at least 2 (anchor + one mask)")
    names["ffn_norm"] = "ffn_norm"
    if profile == "lucebox" and "blk.0.ffn_norm.weight" not in tensor_names:
        names["ffn_norm"] = "post_attention_norm"
    return DraftHParams(
        profile=profile, n_layer=n_layer, n_embd=n_embd, n_ff=int(key("feed_forward_length", required=True)),
        n_head=n_head, n_head_kv=int(key("attention.head_count_kv", n_head)), head_dim=head_dim,
        rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=float(key("rope.freq_base", 10000.0)), rope_dims=int(key("rope.dimension_count", head_dim)),
        rope_freq_scale=1.0 / factor, block_size=int(block), mask_id=int(mask), taps=tuple(taps),
        embedding_scale=float(key("embedding_scale", 1.0)), causal=bool(key("attention.causal", False)),
        sliding_window=window,
        rope_sections=tuple(int(v) for v in key("rope.dimension_sections", ())),
        sliding_layers=tuple(bool(p) for p in pattern) if pattern is not None else (bool(window),) * n_layer,
        v2=_dflash2(gguf, key, tensor_names), names=names)


def _llamacpp(gguf, key):
    stored = key("target_layers", required=True)
    mask = gguf.get("tokenizer.ggml.mask_token_id", key("mask_token_id"))
    return [int(i) for i in stored], key("block_size", 16), mask, {"fc": "fc", "hidden_norm": "enc.output_norm"}


def _lucebox(gguf, key, tensor_names):
    ids = key("dflash.target_layer_ids")
    if ids is None:
        raise ModelError(f"{gguf.path}: missing '{gguf.architecture}.dflash.target_layer_ids' (lucebox would "
                         "derive ids, silently wrong for most drafters)")
    names = {}
    for role, options in (("fc", ("dflash.fc", "dflash_fc")),
                          ("hidden_norm", ("dflash.hidden_norm", "dflash_hidden_norm"))):
        names[role] = next((n for n in options if f"{n}.weight" in tensor_names), options[0])
    return [int(i) + 1 for i in ids], key("dflash.block_size"), key("dflash.mask_token_id"), names


def _dflash2(gguf, key, tensor_names) -> DFlash2Params | None:
    if "selector_hidden.weight" not in tensor_names:
        return None
    values = {k: int(key(k, 0) or 0) for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                "selector_top_k")}
    if min(values.values()) <= 0:
        raise ModelError(f"{gguf.path}: DFlash2 model is missing conv/selector metadata ({values})")
    return DFlash2Params(values["conv_kernel_size"], values["conv_group_size"], values["selector_rank"],
                         values["selector_top_k"], float(key("logit_scale", 0.0) or 1.0),
                         float(key("final_logit_softcapping", 0.0) or 0.0))
