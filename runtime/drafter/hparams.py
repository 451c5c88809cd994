"""DraftHParams: a DFlash drafter GGUF's hyperparameters and tensor names, from either profile.

Where each value lives (key names, the target-layer id convention, the mask id's key, tensor names and their
aliases) is the profile's fact (ggtools.dflash.profiles): llama.cpp (arch `dflash`) or lucebox
(`qwen35-dflash-draft` and aliases). DFlash2 iff `selector_hidden.weight`; DSpark iff `markov_w1.weight` (llama.cpp's
rule: the Markov head makes a `dflash` file a draft-dspark one).

`taps` are in the runtime's convention (TargetModel.forward: the residual stream entering layer j), which is
HF id + 1.

Every key, every tensor's shape (and DSpark's d2t table) is checked by the model-file rules (ggtools.hparam_rules:
the drafter's and DSpark's, the ones validate and doctor apply) before it is read here.
"""

from dataclasses import dataclass, field

from ggtools.dflash.profiles import DSPARK_HEADS, LUCEBOX, PROFILES, profile_of
from ggtools.hparam_rules import dspark_violations, model_violations
from ggtools.runtime.errors import ModelError, refuse_violations


@dataclass(frozen=True)
class DFlash2Params:
    conv_kernel: int
    conv_group: int
    selector_rank: int
    selector_top_k: int
    logit_scale: float          # output_multiplier; 1 when absent
    softcap: float              # final_logit_softcapping; 0 = none


@dataclass(frozen=True)
class DSparkParams:
    sample_from_anchor: bool    # dflash.sample_from_anchor (absent: true): anchor-first block, every row drafts;
                                # false: bonus anchor, rows 1.. draft (as DFlash)
    confidence_head: bool       # dflash.has_confidence_head (absent: true), llama.cpp's test for p_min > 0


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
    dspark: DSparkParams | None = None
    names: dict = field(default_factory=dict)   # role -> tensor name (fc, hidden_norm, ffn_norm suffix)

    @property
    def fc_in(self) -> int:
        return len(self.taps) * self.n_embd


def read_draft_hparams(gguf, tensor_names, mask_id: int | None = None, n_vocab: int | None = None,
                       locate=None) -> DraftHParams:
    """gguf: the drafter's GGUFFile (shard 1 of a set); tensor_names: the names its files hold; mask_id overrides
    the stored one; n_vocab: the target's vocabulary, which d2t's ids index (None: the drafter's own tokenizer);
    locate(name) -> (GGUFFile, TensorInfo): where a tensor lies (default: in gguf)."""
    arch = gguf.architecture
    p = profile_of(arch)
    if p is None:
        raise ModelError(f"architecture '{arch}' is not a DFlash drafter (expected one of "
                         f"{', '.join(a for p in PROFILES.values() for a in p.archs)})")
    refuse_violations(gguf.path, model_violations(gguf, locate, mask_id) + dspark_violations(gguf, n_vocab, locate))

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
    stored = gguf.get(p.key("target_ids", arch))
    if stored is None:
        raise ModelError(f"{gguf.path}: missing '{p.key('target_ids', arch)}' (the target layers the drafter "
                         "was trained on)")
    block = gguf.get(p.key("block_size", arch), p.default_block_size)
    stored_mask = next((gguf.get(k) for k in (p.key("mask", arch), *p.legacy_mask_keys) if k in gguf.kv), None)
    mask = stored_mask if mask_id is None else mask_id
    if mask is None:
        raise ModelError(f"{gguf.path}: no mask token id ({p.name} profile: {p.key('mask', arch)}); the noise "
                         "block cannot be built")
    if not block or block < 2:
        raise ModelError(f"{gguf.path}: block size {block}: a drafter needs at least 2 (anchor + one mask)")
    names = {role: _stem(p.find_tensor(tensor_names, p.gguf_name(hf)) or p.gguf_name(hf))
             for role, hf in (("fc", "fc.weight"), ("hidden_norm", "hidden_norm.weight"))}
    ffn_norm = p.find_tensor(tensor_names, "blk.0.ffn_norm.weight") or "blk.0.ffn_norm.weight"
    names["ffn_norm"] = _stem(ffn_norm.removeprefix("blk.0."))
    taps = [i + 1 for i in p.hf_ids(stored)]
    return DraftHParams(
        profile=p.name, n_layer=n_layer, n_embd=n_embd, n_ff=int(key("feed_forward_length", required=True)),
        n_head=n_head, n_head_kv=int(key("attention.head_count_kv", n_head)), head_dim=head_dim,
        rms_eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_base=float(key("rope.freq_base", 10000.0)), rope_dims=int(key("rope.dimension_count", head_dim)),
        rope_freq_scale=1.0 / factor, block_size=int(block), mask_id=int(mask), taps=tuple(taps),
        embedding_scale=float(key("embedding_scale", 1.0)), causal=bool(key("attention.causal", False)),
        sliding_window=window,
        rope_sections=tuple(int(v) for v in key("rope.dimension_sections", ())),
        sliding_layers=tuple(bool(sliding) for sliding in pattern) if pattern is not None else (bool(window),) * n_layer,
        v2=_dflash2(gguf, key, tensor_names), dspark=_dspark(gguf, key, tensor_names), names=names)


def _stem(name: str) -> str:
    return name.removesuffix(".weight")


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


# lucebox's names of DSpark's heads (dflash.dspark.markov.w1, ...): this runtime runs DSpark as llama.cpp's graph
# does, from llama.cpp-profile files
LUCEBOX_DSPARK_HEADS = frozenset(LUCEBOX.gguf_name(n) for n in DSPARK_HEADS) - {None}


def _dspark(gguf, key, tensor_names) -> DSparkParams | None:
    """The heads' flags (the model-file rules have checked the block size and the flags' types)."""
    if LUCEBOX_DSPARK_HEADS & set(tensor_names):
        raise ModelError(f"{gguf.path}: DSpark heads in the lucebox layout (dflash.dspark.*): this runtime drafts "
                         "with DSpark from llama.cpp-profile files (ggtools convert gguf-layout --to llama.cpp); "
                         "run as a plain DFlash drafter it would draft without its Markov head")
    if "markov_w1.weight" not in tensor_names:
        return None
    return DSparkParams(key("sample_from_anchor", True), key("has_confidence_head", True))
