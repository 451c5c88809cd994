"""The architecture table: for each `general.architecture` the runtime runs, the pieces its layers are made of.

Adding an architecture is adding an entry here, plus any piece it needs that does not exist yet (a mixer
under mixers/, an FFN under ffn/), each with a `load(weights, hp, layer) -> piece` class method.
"""

from dataclasses import dataclass
from functools import partial
from typing import Callable

from ggtools.runtime.errors import ModelError
from ggtools.runtime.target.ffn.dense import DenseFFN
from ggtools.runtime.target.ffn.moe import SOFTMAX, SOFTMAX_WEIGHT, SWIGLU, SWIGLU_OAI, RoutedExperts, Routing
from ggtools.runtime.target.ffn.shared_expert import SharedExpertMoE
from ggtools.runtime.target.hybrid_cache import HybridCache
from ggtools.runtime.target.kvcache import KVCache
from ggtools.runtime.target.mixers.attention import Attention
from ggtools.runtime.target.mixers.gated_delta_net import GatedDeltaNet


@dataclass(frozen=True)
class Arch:
    mixer: Callable          # load(weights, hp, layer) -> the layer's token mixer
    ffn: Callable            # load(weights, hp, layer) -> the layer's FFN
    rope_neox: bool          # RoPE rotates (i, i + n_rot/2) pairs (llama.cpp's NEOX type), else (2i, 2i+1)
    ffn_norm: str = "ffn_norm"   # the RMS norm before the FFN (blk.i.<ffn_norm>.weight)
    swa_pattern: int | None = None   # sliding-window layers: llama.cpp's default period (None: none)
    cache: Callable = KVCache.for_layers     # for_layers(layers, hp, kv_type) -> the model's cache
    rope_sections: str = ""      # M-RoPE on text tokens: "imrope" (sections interleaved) or "mrope"; "": plain


def hybrid_mixer(w, hp, i: int):
    """qwen35's layer i: Gated DeltaNet where attention.recurrent_layers says so, else gated attention."""
    if hp.recurrent_layers[i]:
        return GatedDeltaNet.load(w, hp, i)
    return Attention.load(w, hp, i, output_gate=True)


ARCHS = {
    "llama": Arch(mixer=Attention.load, ffn=DenseFFN.load, rope_neox=False),
    "qwen3": Arch(mixer=Attention.load, ffn=DenseFFN.load, rope_neox=True),
    # Gated DeltaNet hybrid: linear-attention layers, gated full attention in the pattern the GGUF gives, IMROPE
    "qwen35": Arch(mixer=hybrid_mixer, ffn=DenseFFN.load, rope_neox=True, ffn_norm="post_attention_norm",
                   cache=HybridCache.for_layers, rope_sections="imrope"),
    # the same layers with routed experts (softmax gating, normalized top-k weights) plus a gated shared expert
    "qwen35moe": Arch(mixer=hybrid_mixer, rope_neox=True, ffn_norm="post_attention_norm",
                      ffn=partial(SharedExpertMoE.load, routing=Routing(SOFTMAX, normalize=True, activation=SWIGLU)),
                      cache=HybridCache.for_layers, rope_sections="imrope"),
    # llama.cpp's qwen3moe graph: softmax gating, normalized top-k weights
    "qwen3moe": Arch(mixer=Attention.load, rope_neox=True,
                     ffn=partial(RoutedExperts.load, routing=Routing(SOFTMAX, normalize=True, activation=SWIGLU))),
    # openai-moe: sinks and biases (loaded where present), every other layer sliding-window, YaRN (from the
    # GGUF's rope keys); softmax over the top-k logits, the clamped SwiGLU
    "gpt-oss": Arch(mixer=Attention.load, rope_neox=True, ffn_norm="post_attention_norm", swa_pattern=2,
                    ffn=partial(RoutedExperts.load, routing=Routing(SOFTMAX_WEIGHT, activation=SWIGLU_OAI))),
}


def arch_of(gguf) -> Arch:
    """The table entry for a GGUF's architecture; ModelError when the runtime does not run it."""
    name = gguf.architecture
    if name not in ARCHS:
        raise ModelError(f"{gguf.path}: architecture '{name}' is not supported by the runtime "
                         f"(supported: {', '.join(ARCHS)})")
    return ARCHS[name]
