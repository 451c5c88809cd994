"""The architecture table: for each `general.architecture` the runtime runs, the pieces its layers are made of.

Pieces are named by role and loaded as a backend's classes: `mixer(pieces, weights, hp, i)` with `pieces` the
backend's namespace (numba_pieces for numba, torch_backend's for torch), each piece a subclass of the description
in pieces.py. Adding an architecture is adding an entry here, plus any piece it needs that does not exist yet (its
tensors in pieces.py, its ops in each backend).
"""

from dataclasses import dataclass
from functools import partial
from typing import Callable

from ggtools.runtime.errors import ModelError
from ggtools.runtime.model.kimi_k3_hparams import read_kimi_k3_hparams
from ggtools.runtime.model.pieces import SOFTMAX, SOFTMAX_WEIGHT, SWIGLU, SWIGLU_OAI, Routing


@dataclass(frozen=True)
class Arch:
    mixer: Callable          # (pieces, weights, hp, layer) -> the layer's token mixer
    ffn: Callable            # (pieces, weights, hp, layer) -> the layer's FFN
    rope_neox: bool          # RoPE rotates (i, i + n_rot/2) pairs (llama.cpp's NEOX type), else (2i, 2i+1)
    ffn_norm: str = "ffn_norm"   # the RMS norm before the FFN (blk.i.<ffn_norm>.weight)
    swa_pattern: int | None = None   # sliding-window layers: llama.cpp's default period (None: none)
    hybrid: bool = False     # Gated DeltaNet layers: the cache keeps recurrent states besides the KV
    rope_sections: str = ""      # M-RoPE on text tokens: "imrope" (sections interleaved) or "mrope"; "": plain
    read_hparams: Callable | None = None   # (gguf, n_vocab, arch) -> HParams for keys of its own (kimi-k3)
    residual: Callable | None = None       # (pieces, weights, hp) -> the layers' residual stream (None: x += ...)


def attention(pieces, w, hp, i: int):
    return pieces.Attention.load(w, hp, i)


def hybrid_mixer(pieces, w, hp, i: int):
    """qwen35's layer i: Gated DeltaNet where attention.recurrent_layers says so, else gated attention."""
    if hp.recurrent_layers[i]:
        return pieces.GatedDeltaNet.load(w, hp, i)
    return pieces.Attention.load(w, hp, i, output_gate=True)


def kimi_k3_mixer(pieces, w, hp, i: int):
    """kimi-k3's layer i: KDA where attention.head_count_kv is 0, else MLA."""
    return (pieces.KDA if hp.recurrent_layers[i] else pieces.MLA).load(w, hp, i)


def kimi_k3_ffn(pieces, w, hp, i: int):
    """kimi-k3's leading dense layers (situ), then latent routed experts plus shared experts."""
    if i < hp.kimi_k3.n_dense_lead:
        return pieces.SituFFN.load(w, hp, i)
    return pieces.LatentMoE.load(w, hp, i, pieces)


def attn_residual(pieces, w, hp):
    """kimi-k3's cross-layer residual attention, where attn_res.block_size is set."""
    return pieces.AttnResidual.load(w, hp) if hp.kimi_k3.attn_res_block_size else None


def dense_ffn(pieces, w, hp, i: int):
    return pieces.DenseFFN.load(w, hp, i)


def routed_experts(pieces, w, hp, i: int, routing: Routing):
    return pieces.RoutedExperts.load(w, hp, i, routing=routing)


def shared_expert_moe(pieces, w, hp, i: int, routing: Routing):
    return pieces.SharedExpertMoE.load(w, hp, i, pieces, routing=routing)


ARCHS = {
    "llama": Arch(mixer=attention, ffn=dense_ffn, rope_neox=False),
    "qwen3": Arch(mixer=attention, ffn=dense_ffn, rope_neox=True),
    # Gated DeltaNet hybrid: linear-attention layers, gated full attention in the pattern the GGUF gives, IMROPE
    "qwen35": Arch(mixer=hybrid_mixer, ffn=dense_ffn, rope_neox=True, ffn_norm="post_attention_norm",
                   hybrid=True, rope_sections="imrope"),
    # the same layers with routed experts (softmax gating, normalized top-k weights) plus a gated shared expert
    "qwen35moe": Arch(mixer=hybrid_mixer, rope_neox=True, ffn_norm="post_attention_norm",
                      ffn=partial(shared_expert_moe, routing=Routing(SOFTMAX, normalize=True, activation=SWIGLU)),
                      hybrid=True, rope_sections="imrope"),
    # llama.cpp's qwen3moe graph: softmax gating, normalized top-k weights
    "qwen3moe": Arch(mixer=attention, rope_neox=True,
                     ffn=partial(routed_experts, routing=Routing(SOFTMAX, normalize=True, activation=SWIGLU))),
    # openai-moe: sinks and biases (loaded where present), every other layer sliding-window, YaRN (from the
    # GGUF's rope keys); softmax over the top-k logits, the clamped SwiGLU
    "gpt-oss": Arch(mixer=attention, rope_neox=True, ffn_norm="post_attention_norm", swa_pattern=2,
                    ffn=partial(routed_experts, routing=Routing(SOFTMAX_WEIGHT, activation=SWIGLU_OAI))),
    # KDA (linear attention) and nope-only MLA layers by attention.head_count_kv, situ FFNs, latent routed experts
    # with sigmoid routing, cross-layer residual attention; its own keys (kimi_k3_hparams)
    "kimi-k3": Arch(mixer=kimi_k3_mixer, ffn=kimi_k3_ffn, rope_neox=False, hybrid=True,
                    read_hparams=read_kimi_k3_hparams, residual=attn_residual),
}


def arch_of(gguf) -> Arch:
    """The table entry for a GGUF's architecture; ModelError when the runtime does not run it."""
    name = gguf.architecture
    if name not in ARCHS:
        raise ModelError(f"{gguf.path}: architecture '{name}' is not supported by the runtime "
                         f"(supported: {', '.join(ARCHS)})")
    return ARCHS[name]
