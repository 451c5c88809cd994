"""Vectorized torch dequantizers for every ggml type the runtime runs, bit-exact with `ggtools.quants.dequantize`.

Weights stay uint8 blocks on the device; `dequantize(qtype, rows, n_cols)` decodes rows of blocks to float32.
Each type follows ggml's dequantize_row_* (the same statements as ggtools.quants, in float32 with one rounding
per operation: torch runs each operation as its own kernel, so nothing is contracted into a fused multiply-add).
Where a value's quant bits and scale sit in a block is a fixed map per type, built once per device as index
tensors: element e of a block reads byte `index[e]` shifted right by `shift[e]`.
"""

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as T

QK_K = 256
KVALUES_MXFP4 = (0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12)


def dequantize(qtype, rows: torch.Tensor, n_cols: int) -> torch.Tensor:
    """rows: uint8 (n_rows, row_bytes) of one ggml type -> float32 (n_rows, n_cols) on the same device."""
    qtype = T(qtype)
    block_values, block_bytes = GGML_QUANT_SIZES[qtype]
    blocks = rows.reshape(-1, block_bytes)
    return DECODERS[qtype](blocks).reshape(-1, n_cols)


def block_values(qtype, rows: torch.Tensor):
    """Rows (n_rows, row_bytes) of a 32-value block type -> what ggml's integer dots read: the blocks' integer
    values (n_rows, n_blocks, 32) as float32 (MXFP4: kvalues_mxfp4, the e2m1 values doubled), their scales d
    (n_rows, n_blocks) float32 (MXFP4: 2^(e - 128), half the E8M0 scale) and, for Q4_1 / Q5_1, their mins m
    (else None). A block dequantizes to values * d (+ m)."""
    qtype = T(qtype)
    blocks = rows.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    values, d = INTEGER_DECODERS[qtype](blocks)
    n_rows = len(rows)
    m = _half(blocks, 2).reshape(n_rows, -1) if qtype in (T.Q4_1, T.Q5_1) else None
    return values.float().reshape(n_rows, -1, 32), d.reshape(n_rows, -1), m


def _ints(b: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    return b[:, start:stop].to(torch.int32)


def _half(b: torch.Tensor, at: int) -> torch.Tensor:
    """The little-endian f16 at byte `at` of each block, as float32 (n_blocks, 1)."""
    return b[:, at:at + 2].contiguous().view(torch.float16).float()


def _float(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float32)


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _bf16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.bfloat16).float()


def _nibbles(q: torch.Tensor) -> torch.Tensor:
    """Bytes (n, 16) -> their low nibbles then their high nibbles (n, 32), ggml's 32-value block order."""
    return torch.cat([q & 15, q >> 4], 1)


def _q4_0_ints(b):
    return _nibbles(_ints(b, 2, 18)) - 8, _half(b, 0)


def _q4_0(b):
    q, d = _q4_0_ints(b)
    return q.float() * d


def _q4_1_ints(b):
    return _nibbles(_ints(b, 4, 20)), _half(b, 0)


def _q4_1(b):
    q, d = _q4_1_ints(b)
    return q.float() * d + _half(b, 2)


def _fifth_bits(b, at):
    """The 32 high bits of a Q5 block (a little-endian uint32 at byte `at`), each moved to bit 4 (n, 32)."""
    qh = sum(b[:, at + i].to(torch.int64) << (8 * i) for i in range(4))
    return ((qh[:, None] >> _maps(b.device)["q5_bit"]) & 1).to(torch.int32) << 4


def _q5_0_ints(b):
    return (_nibbles(_ints(b, 6, 22)) | _fifth_bits(b, 2)) - 16, _half(b, 0)


def _q5_0(b):
    q, d = _q5_0_ints(b)
    return q.float() * d


def _q5_1_ints(b):
    return _nibbles(_ints(b, 8, 24)) | _fifth_bits(b, 4), _half(b, 0)


def _q5_1(b):
    q, d = _q5_1_ints(b)
    return q.float() * d + _half(b, 2)


def _q8_0_ints(b):
    return b[:, 2:].contiguous().view(torch.int8), _half(b, 0)


def _q8_0(b):
    q, d = _q8_0_ints(b)
    return q.float() * d


def _mxfp4_ints(b):
    e = b[:, :1].to(torch.int32)
    # ggml_e8m0_to_fp32_half: 2^(e - 128), a denormal for e < 2
    d = torch.where(e < 2, 0x00200000 << e, (e - 1) << 23).view(torch.float32)
    return _maps(b.device)["mxfp4"][_nibbles(_ints(b, 1, 17))], d


def _mxfp4(b):
    q, d = _mxfp4_ints(b)
    return q * d


def _q2_k(b):
    m = _maps(b.device)
    scales = _ints(b, 0, 16)
    dl = _half(b, 80) * (scales & 15).float()
    ml = _half(b, 82) * (scales >> 4).float()
    q = (_ints(b, 16, 80)[:, m["q2_byte"]] >> m["q2_shift"]) & 3
    return dl[:, m["sub16"]] * q.float() - ml[:, m["sub16"]]


def _q3_k(b):
    m = _maps(b.device)
    s = _ints(b, 96, 108)
    low = (s[:, m["q3_scale_low"]] >> m["q3_scale_low_shift"]) & 15
    high = (s[:, m["q3_scale_high"]] >> m["q3_scale_high_shift"]) & 3
    dl = _half(b, 108) * ((low | (high << 4)) - 32).float()
    q = (_ints(b, 32, 96)[:, m["q2_byte"]] >> m["q2_shift"]) & 3
    hm = (_ints(b, 0, 32)[:, m["q3_hmask_byte"]] >> m["q3_hmask_shift"]) & 1
    return dl[:, m["sub16"]] * (q - ((hm ^ 1) << 2)).float()


def _k4_scale_ints(b):
    """get_scale_min_k4 for the 8 sub-blocks of Q4_K / Q5_K blocks: the 6-bit scales and mins (n, 8) int32."""
    q = _ints(b, 4, 16)
    sc = torch.cat([q[:, 0:4] & 63, (q[:, 8:12] & 15) | ((q[:, 0:4] >> 6) << 4)], 1)
    mn = torch.cat([q[:, 4:8] & 63, (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)], 1)
    return sc, mn


def _k4_scales(b):
    """d * scale, dmin * min (n, 8) of Q4_K / Q5_K blocks."""
    sc, mn = _k4_scale_ints(b)
    return _half(b, 0) * sc.float(), _half(b, 2) * mn.float()


def _q4_k_values(b):
    m = _maps(b.device)
    return (_ints(b, 16, 144)[:, m["k4_byte"]] >> m["k4_shift"]) & 15


def _q4_k(b):
    m = _maps(b.device)
    dl, ml = _k4_scales(b)
    return dl[:, m["sub32"]] * _q4_k_values(b).float() - ml[:, m["sub32"]]


def _q5_k(b):
    m = _maps(b.device)
    dl, ml = _k4_scales(b)
    low = (_ints(b, 48, 176)[:, m["k4_byte"]] >> m["k4_shift"]) & 15
    high = (_ints(b, 16, 48)[:, m["k5_high_byte"]] >> m["sub32"]) & 1
    return dl[:, m["sub32"]] * (low | (high << 4)).float() - ml[:, m["sub32"]]


def _q6_k_values(b):
    """Q6_K's unsigned 6-bit values (n, 256), before the - 32."""
    m = _maps(b.device)
    low = (_ints(b, 0, 128)[:, m["q6_low_byte"]] >> m["q6_low_shift"]) & 15
    high = (_ints(b, 128, 192)[:, m["q6_high_byte"]] >> m["q6_high_shift"]) & 3
    return low | (high << 4)


def _q6_k_scale_ints(b):
    return b[:, 192:208].contiguous().view(torch.int8).to(torch.int32)


def _q6_k(b):
    m = _maps(b.device)
    dl = _half(b, 208) * _q6_k_scale_ints(b).float()
    return dl[:, m["sub16"]] * (_q6_k_values(b) - 32).float()


def k_quant_ints(qtype, rows: torch.Tensor) -> dict:
    """Rows (n_rows, row_bytes) of Q4_K or Q6_K -> what llama.cpp's integer dots read, per super-block (n_rows,
    n_blocks, ...): "values" (256 unsigned quants), "scales" (Q4_K: 8 six-bit sub-block scales, Q6_K: 16 int8),
    "d" float32; Q4_K also "mins" (8) and "dmin"."""
    qtype = T(qtype)
    b = rows.reshape(-1, GGML_QUANT_SIZES[qtype][1])
    shape = (len(rows), -1)
    if qtype == T.Q4_K:
        sc, mn = _k4_scale_ints(b)
        return {"values": _q4_k_values(b).reshape(*shape, 256), "scales": sc.reshape(*shape, 8),
                "mins": mn.reshape(*shape, 8), "d": _half(b, 0).reshape(shape), "dmin": _half(b, 2).reshape(shape)}
    return {"values": _q6_k_values(b).reshape(*shape, 256), "scales": _q6_k_scale_ints(b).reshape(*shape, 16),
            "d": _half(b, 208).reshape(shape)}


def _element_maps() -> dict:
    """Per element of a block: which byte holds its bits and how far to shift them (numpy, device-free)."""
    e = np.arange(QK_K)
    sub16, l16 = e // 16, e % 16
    h, k, half = sub16 // 8, (sub16 // 2) % 4, sub16 % 2           # Q2_K / Q3_K sub-block j = 8h + 2k + half
    chunk, within = e // 64, e % 64                                 # Q4_K / Q5_K: 64-value chunks
    upper = within // 32
    j = np.arange(16)
    h6, n6 = e // 128, e % 128                                      # Q6_K: two halves of 128
    k6, l6 = n6 // 32, n6 % 32
    return {
        "sub16": sub16, "sub32": 2 * chunk + upper,
        "q5_bit": np.concatenate([np.arange(16), np.arange(16) + 16]),
        "q2_byte": 32 * h + 16 * half + l16, "q2_shift": 2 * k,
        "q3_hmask_byte": 16 * half + l16, "q3_hmask_shift": 4 * h + k,
        "q3_scale_low": j % 8, "q3_scale_low_shift": 4 * (j // 8),
        "q3_scale_high": 8 + j % 4, "q3_scale_high_shift": 2 * (j // 4),
        "k4_byte": 32 * chunk + within % 32, "k4_shift": 4 * upper, "k5_high_byte": within % 32,
        "q6_low_byte": 64 * h6 + 32 * (k6 % 2) + l6, "q6_low_shift": 4 * (k6 // 2),
        "q6_high_byte": 32 * h6 + l6, "q6_high_shift": 2 * k6,
    }


_MAPS_NP = _element_maps()
_MAPS: dict = {}


def _maps(device) -> dict:
    if device not in _MAPS:
        maps = {name: torch.as_tensor(a, dtype=torch.int64, device=device) for name, a in _MAPS_NP.items()}
        for name in ("q2_shift", "q3_hmask_shift", "q3_scale_low_shift", "q3_scale_high_shift", "k4_shift",
                     "q6_low_shift", "q6_high_shift"):
            maps[name] = maps[name].to(torch.int32)
        maps["mxfp4"] = torch.tensor(KVALUES_MXFP4, dtype=torch.float32, device=device)
        _MAPS[device] = maps
    return _MAPS[device]


DECODERS = {
    T.F32: _float, T.F16: _f16, T.BF16: _bf16,
    T.Q4_0: _q4_0, T.Q4_1: _q4_1, T.Q5_0: _q5_0, T.Q5_1: _q5_1, T.Q8_0: _q8_0, T.MXFP4: _mxfp4,
    T.Q2_K: _q2_k, T.Q3_K: _q3_k, T.Q4_K: _q4_k, T.Q5_K: _q5_k, T.Q6_K: _q6_k,
}
SUPPORTED_TYPES = frozenset(DECODERS)
INTEGER_DECODERS = {T.Q4_0: _q4_0_ints, T.Q4_1: _q4_1_ints, T.Q5_0: _q5_0_ints, T.Q5_1: _q5_1_ints,
                    T.Q8_0: _q8_0_ints, T.MXFP4: _mxfp4_ints}
