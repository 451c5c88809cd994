"""Row data checks for `validate --deep` and verified copies: what ggml_validate_row_data rejects.

Block types: a scale field that is fp16 inf/NaN (d, and dmin/m where the type has one), an
MXFP4 E8M0 scale of 0xFF, a Q8_K float32 d that is inf/NaN. Float types: any inf/NaN value.
F64 values are checked as ggml does, after conversion to float32 (so values beyond float32 range
are rejected too). Integer types (I8..I64) and NVFP4 have nothing to check.

Plain numpy, a piece of the data at a time (the temporaries stay in the core's cache): a few strided
byte compares per block, faster than a numba kernel's launch and with nothing to load, so `validate
--deep` starts without numba.
"""

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T

from .errors import QuantError
from .geometry import parse_qtype, type_size

# field kinds
HALF, FLOAT, E8M0, IQ1M_SCALE = 0, 1, 2, 3

# type -> [(kind, byte offset in the block)], from the block structs in ggml-common.h
FIELDS = {
    **{t: [(HALF, 0)] for t in (T.Q4_0, T.Q5_0, T.Q8_0, T.IQ2_XXS, T.IQ2_XS, T.IQ2_S, T.IQ3_XXS, T.IQ3_S, T.IQ1_S,
                                T.IQ4_NL, T.IQ4_XS, T.Q1_0)},
    **{t: [(HALF, 0), (HALF, 2)] for t in (T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K)},
    T.Q2_K: [(HALF, 80), (HALF, 82)],
    T.Q3_K: [(HALF, 108)],
    T.Q6_K: [(HALF, 208)],
    T.TQ1_0: [(HALF, 52)],
    T.TQ2_0: [(HALF, 64)],
    T.Q8_K: [(FLOAT, 0)],
    T.MXFP4: [(E8M0, 0)],
    T.IQ1_M: [(IQ1M_SCALE, 48)],
}
NOTHING_TO_CHECK = {T.I8, T.I16, T.I32, T.I64, T.NVFP4}
FLOAT_MASKS = {     # the exponent bits of the raw values: all set is inf or NaN
    T.F16: 0x7C00,
    T.BF16: 0x7F80,
}
PIECE_BYTES = 1 << 20       # bytes checked at once


class RowCheck(NamedTuple):
    n_bad: int  # bad blocks (bad values for F16/BF16/F32/F64)
    first_bad: int  # index of the first bad block / value, -1 when none


def can_check_row_data(type_id) -> bool:
    """Whether check_row_data knows the rules of this type."""
    try:
        t = T(type_id)
    except ValueError:
        return False
    return t in FIELDS or t in FLOAT_MASKS or t in (T.F32, T.F64) or t in NOTHING_TO_CHECK


def check_row_data(qtype, data) -> RowCheck:
    """Count the blocks (values, for float types) of data that ggml_validate_row_data would
    reject. data: any buffer of whole blocks."""
    t = parse_qtype(qtype)
    if isinstance(data, np.ndarray):
        raw = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    else:
        raw = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    tsize = type_size(t)
    if raw.size % tsize:
        raise QuantError(f"{raw.size} bytes is not a whole number of {t.name} blocks ({tsize} bytes)")
    if t in NOTHING_TO_CHECK:
        return RowCheck(0, -1)
    if not can_check_row_data(t):
        raise QuantError(f"ggml cannot validate {t.name} data")
    n_bad, first = 0, -1
    step = max(1, PIECE_BYTES // tsize) * tsize
    for start in range(0, raw.size, step):
        bad = _bad_items(t, raw[start:start + step], tsize)
        n = int(np.count_nonzero(bad))
        if n and first < 0:
            first = start // tsize + int(np.argmax(bad))
        n_bad += n
    return RowCheck(n_bad, first)


def _bad_items(t, raw, tsize) -> np.ndarray:
    """One bool per block (value, for float types) of raw: whether ggml rejects it."""
    if t == T.F32:
        return ~np.isfinite(raw.view(np.float32))
    if t == T.F64:              # ggml converts to float32 first: beyond its range is inf
        with np.errstate(over="ignore", invalid="ignore"):
            return ~np.isfinite(raw.view(np.float64).astype(np.float32))
    if t in FLOAT_MASKS:
        mask = np.uint16(FLOAT_MASKS[t])
        return (raw.view(np.uint16) & mask) == mask
    blocks = raw.reshape(-1, tsize)
    bad = None
    for kind, offset in FIELDS[t]:
        hit = _bad_field(kind, blocks, offset)
        bad = hit if bad is None else bad | hit
    return bad


def _bad_field(kind, blocks, o) -> np.ndarray:
    if kind == HALF:            # fp16 exponent bits 0x7C00 all set: they all lie in the high byte
        return (blocks[:, o + 1] & 0x7C) == 0x7C
    if kind == E8M0:
        return blocks[:, o] == 0xFF
    if kind == FLOAT:           # float32 exponent bits 0x7F800000 all set: its high half's 0x7F80
        return (_u16(blocks, o + 2) & 0x7F80) == 0x7F80
    # IQ1_M: the fp16 scale is the top nibbles of four 16-bit scale words
    sc0, sc1, sc2, sc3 = (_u16(blocks, o + 2 * k) for k in range(4))
    h = (sc0 >> 12) | ((sc1 >> 8) & 0x00F0) | ((sc2 >> 4) & 0x0F00) | (sc3 & 0xF000)
    return (h & 0x7C00) == 0x7C00


def _u16(blocks, o) -> np.ndarray:
    return blocks[:, o].astype(np.uint16) | (blocks[:, o + 1].astype(np.uint16) << 8)
