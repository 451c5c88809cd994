"""GGUF value types: sizes, struct formats, and encoding of KV records."""

import struct

import numpy as np
from gguf import GGUFValueType as VT

SCALAR_FORMAT = {
    VT.UINT8: "<B", VT.INT8: "<b", VT.UINT16: "<H", VT.INT16: "<h",
    VT.UINT32: "<I", VT.INT32: "<i", VT.FLOAT32: "<f", VT.BOOL: "<?",
    VT.UINT64: "<Q", VT.INT64: "<q", VT.FLOAT64: "<d",
}
NUMPY_DTYPE = {
    VT.UINT8: "<u1", VT.INT8: "<i1", VT.UINT16: "<u2", VT.INT16: "<i2",
    VT.UINT32: "<u4", VT.INT32: "<i4", VT.FLOAT32: "<f4", VT.BOOL: "<u1",
    VT.UINT64: "<u8", VT.INT64: "<i8", VT.FLOAT64: "<f8",
}
SCALAR_SIZE = {vt: struct.calcsize(fmt) for vt, fmt in SCALAR_FORMAT.items()}
TYPE_NAMES = {vt.name.lower(): vt for vt in VT}
TYPE_NAMES.update({"u8": VT.UINT8, "i8": VT.INT8, "u16": VT.UINT16, "i16": VT.INT16, "u32": VT.UINT32,
                   "i32": VT.INT32, "f32": VT.FLOAT32, "u64": VT.UINT64, "i64": VT.INT64, "f64": VT.FLOAT64,
                   "str": VT.STRING})


def value_type(name_or_id) -> VT:
    """A GGUFValueType from a name ('u32', 'uint32', 'string') or an id."""
    if isinstance(name_or_id, str):
        try:
            return TYPE_NAMES[name_or_id.lower()]
        except KeyError:
            raise ValueError(f"unknown GGUF value type {name_or_id!r} "
                             f"(one of {', '.join(sorted(TYPE_NAMES))})") from None
    return VT(name_or_id)


def encode_string(s) -> bytes:
    data = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    return struct.pack("<Q", len(data)) + data


def encode_scalar(vtype: VT, value) -> bytes:
    if vtype == VT.STRING:
        return encode_string(value)
    if vtype == VT.BOOL:
        return struct.pack("<B", 1 if value else 0)
    try:
        return struct.pack(SCALAR_FORMAT[vtype], value)
    except (struct.error, OverflowError) as e:
        raise ValueError(f"value {value!r} does not fit {vtype.name}: {e}") from None


def encode_value(vtype: VT, value, elem_type: VT | None = None) -> bytes:
    """The bytes of a value (without key): scalar, string, or typed array (elem_type required)."""
    if vtype != VT.ARRAY:
        return encode_scalar(vtype, value)
    if elem_type is None or elem_type == VT.ARRAY:
        raise ValueError("an array needs a scalar or string element type")
    head = struct.pack("<iQ", int(elem_type), len(value))
    if elem_type == VT.STRING:
        return head + b"".join(encode_string(s) for s in value)
    if elem_type == VT.BOOL:
        return head + bytes(1 if v else 0 for v in value)
    arr = np.asarray(value)
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(NUMPY_DTYPE[elem_type], casting="unsafe")
        if out.dtype.kind in "iu":
            fits = np.array_equal(out.astype(arr.dtype), arr)
        else:       # a finite value that becomes inf overflows the type
            fits = np.array_equal(np.isfinite(out), np.isfinite(arr.astype(np.float64)))
    if arr.size and not fits:
        raise ValueError(f"array values do not fit {elem_type.name}")
    return head + out.tobytes()


def encode_kv(key: str, vtype: VT, value, elem_type: VT | None = None) -> bytes:
    """A whole KV record: key string, i32 value type, value."""
    return encode_string(key) + struct.pack("<i", int(vtype)) + encode_value(vtype, value, elem_type)
