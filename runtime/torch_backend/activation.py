"""How llama.cpp's CPU backend rounds a matmul's input for each weight type (its vec_dot_type), in torch.

In float32 (the CPU cross-check against numba) a DeviceMatrix rounds its input this way before the product, so
the two backends differ only in summation order: F16 / BF16 weights take the input rounded to f16 / bf16;
32-value block types take it through Q8_0 (quantize_row_q8_0's AVX2 path: d = amax / 127, q = rint(x * 127 /
amax), d stored as f16); K-quants through Q8_K (quantize_row_q8_K: iscale = -127 / the value of largest
magnitude, q = min(127, rint(iscale x)), d = 1 / iscale). Q4_1 / Q5_1 take Q8_1, whose block sum s =
f16(d * sum(q)) (d before its rounding) multiplies the weight block's min: the product x' W'^T (W' the
dequantized weights) counts that term as f16(d) * sum(q), so `round_input` also returns the difference per
block, for the matrix to add times the weight blocks' mins.
"""

import torch
from gguf import GGMLQuantizationType as T

# scalar / tensor is computed by torch as tensor.reciprocal() * scalar, which rounds twice: divisions here take
# a tensor numerator

BLOCK32 = frozenset({T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.MXFP4})
KQUANTS = frozenset({T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K})
MIN_TYPES = frozenset({T.Q4_1, T.Q5_1})      # blocks with a min (m at byte 2), dotted with Q8_1


def round_input(qtype, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """x (T, n) float32 -> (x as llama.cpp's CPU matmul for weights of qtype sees it, the Q8_1 sum correction
    (T, n / 32) for weights with a min, else None)."""
    if qtype == T.F16:
        return x.half().float(), None
    if qtype == T.BF16:
        return x.bfloat16().float(), None
    if qtype in BLOCK32:
        return _q8(x, with_sums=qtype in MIN_TYPES)
    if qtype in KQUANTS:
        return _q8_k(x), None
    return x, None


def _q8(x: torch.Tensor, with_sums: bool):
    blocks = x.reshape(len(x), -1, 32)
    amax = blocks.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    d = amax / 127.0
    q = torch.round(blocks * inv)
    d16 = d.half().float()
    rounded = (q * d16).reshape(x.shape)
    if not with_sums:
        return rounded, None
    q_sum = q.sum(-1, keepdim=True)
    return rounded, ((d * q_sum).half().float() - d16 * q_sum)[..., 0]


def _q8_k(x: torch.Tensor) -> torch.Tensor:
    blocks = x.reshape(-1, 256)
    vmax = blocks.gather(-1, blocks.abs().argmax(-1, keepdim=True))
    safe = torch.where(vmax != 0, vmax, torch.ones_like(vmax))
    iscale = torch.full_like(safe, -127.0) / safe
    q = torch.round(blocks * iscale).clamp(max=127)
    out = q * (torch.ones_like(iscale) / iscale)
    return torch.where(vmax != 0, out, torch.zeros_like(out)).reshape(x.shape)
