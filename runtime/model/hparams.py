"""Model hyperparameters from a target GGUF's `<arch>.*` keys, with llama.cpp's defaults.

Every key, and every tensor's shape, is checked by the model-file rules (ggtools.hparam_rules, which validate and
doctor apply too) before anything here reads it; what remains here is what this runtime cannot run although the
file is valid."""

from dataclasses import dataclass

import numpy as np

from ggtools.hparam_rules import model_violations
from ggtools.runtime.errors import ModelError, refuse_violations
from ggtools.runtime.kernels.ops import yarn_attn_factor, yarn_corr_dims

F32 = np.float32
# YaRN's correction range in rotation counts: llama.cpp's defaults (its generic loader does not read the GGUF's
# yarn_beta_fast / yarn_beta_slow keys, and llama-cpp-python passes these same values)
YARN_BETA_FAST, YARN_BETA_SLOW = 32.0, 1.0


@dataclass(frozen=True)
class DeltaNetShape:
    """Gated DeltaNet layers' sizes (`<arch>.ssm.*`, as llama.cpp's converter writes them for qwen35)."""
    conv_kernel: int      # ssm.conv_kernel
    head_dim: int         # ssm.state_size: k and v head size
    n_k_heads: int        # ssm.group_count
    n_v_heads: int        # ssm.time_step_rank


@dataclass(frozen=True)
class HParams:
    arch: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    rms_eps: float
    rope_base: float
    rope_dims: int        # leading dims of each head that RoPE rotates
    rope_neox: bool
    rope_freq_scale: float  # 1 / scaling factor (linear or YaRN)
    attn_scale: float
    # YaRN (ext_factor 0: none): ramp between interpolated and extrapolated angles over the dims corr_dims, cos
    # and sin scaled by attn_factor * (1 + 0.1 ln(1 / freq_scale))
    rope_ext_factor: float = 0.0
    rope_attn_factor: float = 1.0
    rope_corr_dims: tuple = (0.0, 0.0)
    # routed experts (n_expert 0: a dense FFN)
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0         # qwen35moe's shared expert (0: n_ff)
    expert_weights_scale: float = 0.0
    # sliding-window attention: a layer i with swa_layers[i] sees the last n_swa positions
    n_swa: int = 0
    swa_layers: tuple = ()
    # Gated DeltaNet hybrids (qwen35): M-RoPE sections, the recurrent layers' sizes, which layers are recurrent
    rope_sections: tuple = ()
    delta_net: DeltaNetShape | None = None
    recurrent_layers: tuple = ()
    kimi_k3: object = None      # kimi_k3_hparams.KimiK3Shape of a kimi-k3 model (which reads its own keys)

    @property
    def n_gqa(self) -> int:
        return self.n_head // self.n_head_kv


def _get(gguf, key, default=None, required=False):
    kv = gguf.kv.get(key)
    if kv is None:
        if required:
            raise ModelError(f"{gguf.path}: missing key '{key}'")
        return default
    return kv.value


def _one_value(value, key):
    """Per-layer arrays (some models vary n_ff / n_head_kv by layer) are accepted only when uniform."""
    if hasattr(value, "__len__") and not isinstance(value, str):
        values = set(int(v) for v in value)
        if len(values) != 1:
            raise ModelError(f"'{key}' varies by layer ({sorted(values)}); not supported")
        return values.pop()
    return value


def _swa_layers(gguf, key, n_layer: int, default_pattern: int) -> tuple:
    """llama.cpp's load_swa_pattern: a per-layer bool array, or a period n (layer i slides when
    i % n < n - 1; 0: every layer), else the arch's default period; None: the arch has no SWA layers."""
    if default_pattern is None:
        return (False,) * n_layer
    value = _get(gguf, key, default_pattern)
    if hasattr(value, "__len__"):
        if len(value) != n_layer:
            raise ModelError(f"{gguf.path}: '{key}' has {len(value)} entries for {n_layer} layers")
        return tuple(bool(v) for v in value)
    n = int(value)
    return tuple(n == 0 or i % n < n - 1 for i in range(n_layer))


def read_hparams(gguf, n_vocab: int, arch_entry, locate=None) -> HParams:
    """gguf: the GGUFFile holding the metadata (shard 1 of a split model); arch_entry: its archs.Arch; locate(name)
    -> (GGUFFile, TensorInfo): where a tensor lies (default: in gguf), so that every shard's shapes are checked."""
    refuse_violations(gguf.path, model_violations(gguf, locate))
    if arch_entry.read_hparams is not None:     # an architecture with keys of its own (kimi-k3)
        return arch_entry.read_hparams(gguf, n_vocab, arch_entry)
    arch = gguf.architecture

    def key(name, default=None, required=False):
        return _one_value(_get(gguf, f"{arch}.{name}", default, required), f"{arch}.{name}")

    n_embd = int(key("embedding_length", required=True))
    n_head = int(key("attention.head_count", required=True))
    n_head_kv = int(key("attention.head_count_kv", n_head))
    head_dim = int(key("attention.key_length", n_embd // n_head))
    if int(key("attention.value_length", head_dim)) != head_dim:
        raise ModelError(f"{gguf.path}: key and value head sizes differ; not supported")
    if n_head % n_head_kv:
        raise ModelError(f"{gguf.path}: {n_head} heads is not a multiple of {n_head_kv} KV heads")
    # MTP / NextN blocks (stored after the trunk, counted in block_count) are not run by the main graph
    n_layer = int(key("block_count", required=True)) - int(key("nextn_predict_layers", 0))
    rope_base = float(key("rope.freq_base", 10000.0))
    rope_dims = int(key("rope.dimension_count", head_dim))
    scaling = key("rope.scaling.type", "linear")
    factor = float(key("rope.scaling.factor", 0.0) or key("rope.scale_linear", 0.0) or 1.0)
    if scaling not in ("none", "linear", "yarn") and factor != 1.0:
        raise ModelError(f"{gguf.path}: rope scaling '{scaling}' is not supported yet")
    freq_scale = F32(1.0) if scaling == "none" else F32(1.0) / F32(factor)
    yarn = {}
    if scaling == "yarn":
        n_ctx_orig = int(key("rope.scaling.original_context_length", key("context_length", 4096)))
        yarn = dict(rope_ext_factor=1.0,
                    rope_attn_factor=float(yarn_attn_factor(freq_scale) * F32(key("rope.scaling.attn_factor", 1.0))),
                    rope_corr_dims=tuple(float(v) for v in yarn_corr_dims(rope_dims, n_ctx_orig, F32(rope_base),
                                                                          F32(YARN_BETA_FAST), F32(YARN_BETA_SLOW))))
    if float(key("rope.freq_base_swa", rope_base)) != rope_base:
        raise ModelError(f"{gguf.path}: a separate RoPE base for sliding-window layers is not supported yet")
    n_expert = int(key("expert_count", 0))
    n_expert_used = int(key("expert_used_count", 0))
    n_ff = int(key("feed_forward_length", 0))
    attn_scale = float(key("attention.scale", 0.0)) or float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))
    return HParams(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=n_ff,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_vocab=n_vocab,
        n_ctx_train=int(key("context_length", 4096)),
        rms_eps=float(key("attention.layer_norm_rms_epsilon", required=True)),
        rope_base=rope_base,
        rope_dims=rope_dims,
        rope_neox=arch_entry.rope_neox,
        rope_freq_scale=float(freq_scale),
        attn_scale=attn_scale,
        **yarn,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_ff_exp=int(key("expert_feed_forward_length", n_ff // n_expert_used if n_expert_used else 0)),
        expert_weights_scale=float(key("expert_weights_scale", 0.0)),
        n_ff_shexp=int(key("expert_shared_feed_forward_length", 0)) or n_ff,
        n_swa=int(key("attention.sliding_window", 0)),
        swa_layers=_swa_layers(gguf, f"{arch}.attention.sliding_window_pattern", n_layer, arch_entry.swa_pattern),
        rope_sections=tuple(int(v) for v in _get(gguf, f"{arch}.rope.dimension_sections", ())),
        **(_delta_net(gguf, arch, n_layer) if arch_entry.hybrid else {}),
    )


def _delta_net(gguf, arch: str, n_layer: int) -> dict:
    """The Gated DeltaNet fields of a hybrid (qwen35) model, as llama.cpp reads them."""
    def key(name):
        return int(_get(gguf, f"{arch}.ssm.{name}", required=True))

    shape = DeltaNetShape(conv_kernel=key("conv_kernel"), head_dim=key("state_size"),
                          n_k_heads=key("group_count"), n_v_heads=key("time_step_rank"))
    if key("inner_size") != shape.n_v_heads * shape.head_dim:
        raise ModelError(f"{gguf.path}: '{arch}.ssm.inner_size' is not time_step_rank x state_size; not supported")
    if shape.n_v_heads % shape.n_k_heads:
        raise ModelError(f"{gguf.path}: {shape.n_v_heads} value heads is not a multiple of {shape.n_k_heads} key heads")
    recurrent = _get(gguf, f"{arch}.attention.recurrent_layers")
    if recurrent is None:   # llama.cpp's fallback: every full_attention_interval-th layer is attention
        interval = int(_get(gguf, f"{arch}.full_attention_interval", 4))
        recurrent = [(i + 1) % interval != 0 for i in range(n_layer)]
    elif not hasattr(recurrent, "__len__"):     # one flag for every layer (get_key_or_arr's scalar form)
        recurrent = [recurrent] * n_layer
    if len(recurrent) < n_layer:
        raise ModelError(f"{gguf.path}: '{arch}.attention.recurrent_layers' has {len(recurrent)} entries for "
                         f"{n_layer} layers")
    return {"delta_net": shape, "recurrent_layers": tuple(bool(r) for r in recurrent[:n_layer])}
