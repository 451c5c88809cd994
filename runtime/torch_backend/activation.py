"""How llama.cpp's CPU backend rounds a matmul's input for each weight type (its vec_dot_type), in torch float32.

32-value block types take the input through Q8_0 (quantize_row_q8_0's AVX2 path: d = amax / 127, q = rint(x *
127 / amax), d stored as f16) or, for Q4_1 / Q5_1, Q8_1 (the same plus the f16 block sum s = f16(d * sum(q)), d
before its rounding); their dots then run on the integers (ggml_matmul.py). F16 / BF16 weights take the input
rounded to f16 / bf16; K-quants through Q8_K (quantize_row_q8_K: iscale = -127 / the value of largest magnitude,
q = min(127, rint(iscale x)), d = 1 / iscale): the integers for Q6_K and repacked Q4_K, which are dotted on them,
float values q * d for the others, as the numba runtime dots them.
"""

import torch
from gguf import GGMLQuantizationType as T

from ggtools.runtime.torch_backend.ggml_math import div

BLOCK32 = frozenset({T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4})
KQUANTS = frozenset({T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K})
MIN_TYPES = frozenset({T.Q4_1, T.Q5_1})      # blocks with a min (m at byte 2), dotted with Q8_1


def quantize_q8(x: torch.Tensor, with_sums: bool):
    """x (T, n) float32 -> Q8_0 / Q8_1 blocks: the integers q (T, n / 32, 32) as float32, the f16 scales d (T,
    n / 32) as float32, and with_sums the Q8_1 block sums s (T, n / 32) (else None)."""
    blocks = x.reshape(len(x), -1, 32)
    amax = blocks.abs().amax(-1)
    d = div(amax, 127.0)
    inv = torch.where(amax > 0, div(torch.full_like(amax, 127.0), amax), torch.zeros_like(amax))
    q = torch.round(blocks * inv[..., None])
    s = (d * q.sum(-1)).half().float() if with_sums else None
    return q, d.half().float(), s


def round_input(qtype, x: torch.Tensor) -> torch.Tensor:
    """x (T, n) float32 as llama.cpp's CPU matmul for weights of a float-dotted type (F32, F16, BF16, K-quants)
    sees it."""
    if qtype == T.F16:
        return x.half().float()
    if qtype == T.BF16:
        return x.bfloat16().float()
    if qtype in KQUANTS:
        return _q8_k(x)
    return x


def quantize_q8_k(x: torch.Tensor):
    """x (T, n) float32 -> Q8_K blocks: the integers q (T, n / 256, 256) as float32 and d (T, n / 256) float32
    (0 for a block of zeros)."""
    blocks = x.reshape(len(x), -1, 256)
    vmax = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    safe = torch.where(vmax != 0, vmax, torch.ones_like(vmax))
    iscale = div(torch.full_like(safe, -127.0), safe)
    q = torch.round(blocks * iscale).clamp(max=127)
    d = torch.where(vmax != 0, div(torch.ones_like(iscale), iscale), torch.zeros_like(iscale))
    return q, d[..., 0]


def _q8_k(x: torch.Tensor) -> torch.Tensor:
    q, d = quantize_q8_k(x)
    out = q * d[..., None]
    return torch.where(d[..., None] != 0, out, torch.zeros_like(out)).reshape(x.shape)
