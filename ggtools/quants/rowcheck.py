"""Row data checks for `validate --deep`: what ggml_validate_row_data rejects.

Block types: a scale field that is fp16 inf/NaN (d, and dmin/m where the type has one), an
MXFP4 E8M0 scale of 0xFF, a Q8_K float32 d that is inf/NaN. Float types: any inf/NaN value.
F64 values are checked as ggml does, after conversion to float32 (so values beyond float32 range
are rejected too). Integer types (I8..I64) and NVFP4 have nothing to check.
"""

from typing import NamedTuple

import numpy as np
from gguf import GGMLQuantizationType as T
from numba import njit, prange

from .errors import QuantError
from .floatbits import JIT
from .registry import parse_qtype, type_size
from .rows import launch

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
CHUNK = 1 << 16  # items per parallel work item


class RowCheck(NamedTuple):
    n_bad: int  # bad blocks (bad values for F16/BF16/F32/F64)
    first_bad: int  # index of the first bad block / value, -1 when none


@njit(**JIT)
def u16_at(data, o):
    return np.int64(data[o]) | (np.int64(data[o + 1]) << 8)


@njit(**JIT)
def field_is_bad(kind, data, o):
    if kind == HALF:
        return (u16_at(data, o) & 0x7C00) == 0x7C00
    if kind == FLOAT:
        return (u16_at(data, o + 2) & 0x7F80) == 0x7F80
    if kind == E8M0:
        return data[o] == 0xFF
    sc0, sc1, sc2, sc3 = u16_at(data, o), u16_at(data, o + 2), u16_at(data, o + 4), u16_at(data, o + 6)
    h = (sc0 >> 12) | ((sc1 >> 8) & 0x00F0) | ((sc2 >> 4) & 0x0F00) | (sc3 & 0xF000)
    return (h & 0x7C00) == 0x7C00


@njit(parallel=True, **JIT)
def _bad_blocks(data, tsize, fields, counts, firsts):
    nb = data.size // tsize
    for c in prange(counts.size):
        n, first = 0, -1
        for b in range(c * CHUNK, min(nb, (c + 1) * CHUNK)):
            bad = False
            for f in range(fields.shape[0]):
                bad |= field_is_bad(fields[f, 0], data, b * tsize + fields[f, 1])
            if bad:
                n += 1
                if first < 0:
                    first = b
        counts[c], firsts[c] = n, first


@njit(parallel=True, **JIT)
def _bad_values(bits, mask, counts, firsts):
    """Values whose exponent bits (mask) are all set: inf or NaN. A branch-free count (it vectorizes),
    then, only where there is one, the search for the first."""
    for c in prange(counts.size):
        lo, hi = c * CHUNK, min(bits.size, (c + 1) * CHUNK)
        n = 0
        for i in range(lo, hi):
            n += np.int32((bits[i] & mask) == mask)
        first = -1
        if n:
            for i in range(lo, hi):
                if bits[i] & mask == mask:
                    first = i
                    break
        counts[c], firsts[c] = n, first


@njit(parallel=True, **JIT)
def _bad_doubles(values, counts, firsts):
    """F64 values ggml rejects: it checks them as float32, so |v| beyond float32 range too."""
    for c in prange(counts.size):
        n, first = 0, -1
        for i in range(c * CHUNK, min(values.size, (c + 1) * CHUNK)):
            if not np.isfinite(np.float32(values[i])):
                n += 1
                if first < 0:
                    first = i
        counts[c], firsts[c] = n, first


FLOAT_MASKS = {
    T.F32: (np.uint32, 0x7F800000),
    T.F16: (np.uint16, 0x7C00),
    T.BF16: (np.uint16, 0x7F80),
}


def _small_check_supported(t) -> bool:
    return t in FLOAT_MASKS or (t in FIELDS and all(kind in (HALF, E8M0) for kind, _ in FIELDS[t]))


def _check_small(t, raw, tsize) -> RowCheck:
    """The same rules in numpy: a parallel kernel launch costs more than it saves on a few blocks."""
    if t in FLOAT_MASKS:
        dtype, mask = FLOAT_MASKS[t]
        bad = (raw.view(dtype) & dtype(mask)) == mask
    else:
        blocks = raw.reshape(-1, tsize)
        bad = np.zeros(len(blocks), bool)
        for kind, offset in FIELDS[t]:
            if kind == E8M0:
                bad |= blocks[:, offset] == 0xFF
            else:
                half = blocks[:, offset].astype(np.uint16) | (blocks[:, offset + 1].astype(np.uint16) << 8)
                bad |= (half & 0x7C00) == 0x7C00
    hit = np.flatnonzero(bad)
    return RowCheck(int(hit.size), int(hit[0]) if hit.size else -1)


def can_check_row_data(type_id) -> bool:
    """Whether check_row_data knows the rules of this type."""
    try:
        t = T(type_id)
    except ValueError:
        return False
    return t in FIELDS or t in FLOAT_MASKS or t == T.F64 or t in NOTHING_TO_CHECK


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
    nitems = raw.size // tsize
    if nitems <= CHUNK and _small_check_supported(t):
        return _check_small(t, raw, tsize)
    counts = np.zeros((nitems + CHUNK - 1) // CHUNK, np.int64)
    firsts = np.full(counts.size, -1, np.int64)
    if t == T.F64:
        launch(_bad_doubles, raw.view(np.float64), counts, firsts)
    elif t in FLOAT_MASKS:
        dtype, mask = FLOAT_MASKS[t]
        launch(_bad_values, raw.view(dtype), dtype(mask), counts, firsts)
    elif t in FIELDS:
        launch(_bad_blocks, raw, tsize, np.array(FIELDS[t], np.int64), counts, firsts)
    else:
        raise QuantError(f"ggml cannot validate {t.name} data")
    hit = firsts[firsts >= 0]
    return RowCheck(int(counts.sum()), int(hit[0]) if hit.size else -1)
