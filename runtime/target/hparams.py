"""Model hyperparameters from a target GGUF's `<arch>.*` keys, with llama.cpp's defaults."""

from dataclasses import dataclass

import numpy as np

from ggtools.runtime.errors import ModelError


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
    return HParams(
        arch=arch,
        n_layer=int(key("block_count", required=True)),
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
    )
