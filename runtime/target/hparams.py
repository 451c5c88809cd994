"""Model hyperparameters from a target GGUF's `<arch>.*` keys, with llama.cpp's defaults."""

from dataclasses import dataclass

import numpy as np

from ggtools.runtime.errors import ModelError


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
    rope_freq_scale: float  # 1 / linear scaling factor
    attn_scale: float
    rope_sections: tuple = ()     # M-RoPE sections (rope.dimension_sections); empty: plain RoPE
    delta_net: DeltaNetShape | None = None
    recurrent_layers: tuple = ()  # per layer: True for a Gated DeltaNet layer

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


def read_hparams(gguf, n_vocab: int, rope_neox: bool) -> HParams:
    """gguf: the GGUFFile holding the metadata (shard 1 of a split model); rope_neox: from the arch table."""
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
    scaling = key("rope.scaling.type", "none")
    factor = float(key("rope.scaling.factor", 0.0) or key("rope.scale_linear", 0.0) or 1.0)
    if scaling not in ("none", "linear") and factor != 1.0:
        raise ModelError(f"{gguf.path}: rope scaling '{scaling}' is not supported yet")
    attn_scale = float(key("attention.scale", 0.0)) or float(np.float32(1.0) / np.sqrt(np.float32(head_dim)))
    # MTP / NextN blocks (stored after the trunk, counted in block_count) are not run by the main graph
    n_layer = int(key("block_count", required=True)) - int(key("nextn_predict_layers", 0))
    return HParams(
        arch=arch,
        n_layer=n_layer,
        n_embd=n_embd,
        n_ff=int(key("feed_forward_length", required=True)),
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_vocab=n_vocab,
        n_ctx_train=int(key("context_length", 4096)),
        rms_eps=float(key("attention.layer_norm_rms_epsilon", required=True)),
        rope_base=float(key("rope.freq_base", 10000.0)),
        rope_dims=int(key("rope.dimension_count", head_dim)),
        rope_neox=rope_neox,
        rope_freq_scale=1.0 / factor,
        attn_scale=attn_scale,
        rope_sections=tuple(int(v) for v in _get(gguf, f"{arch}.rope.dimension_sections", ())),
        **_delta_net(gguf, arch, n_layer),
    )


def _delta_net(gguf, arch: str, n_layer: int) -> dict:
    """The Gated DeltaNet fields of a hybrid (qwen35) model, as llama.cpp reads them; none otherwise."""
    if _get(gguf, f"{arch}.ssm.conv_kernel") is None:
        return {}

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
    if len(recurrent) < n_layer:
        raise ModelError(f"{gguf.path}: '{arch}.attention.recurrent_layers' has {len(recurrent)} entries for "
                         f"{n_layer} layers")
    return {"delta_net": shape, "recurrent_layers": tuple(bool(r) for r in recurrent[:n_layer])}
