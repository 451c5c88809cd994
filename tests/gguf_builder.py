"""Hand-assembled GGUF bytes for tests, independent of ggtools' writer, with every field under control."""

import struct

import numpy as np

STRING, ARRAY, UINT32, UINT16, INT32, FLOAT32 = 8, 9, 4, 2, 5, 6


def s(text) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def kv_u32(key, v):
    return s(key) + struct.pack("<iI", UINT32, v)


def kv_u16(key, v):
    return s(key) + struct.pack("<iH", UINT16, v)


def kv_i32(key, v):
    return s(key) + struct.pack("<ii", INT32, v)


def kv_f32(key, v):
    return s(key) + struct.pack("<if", FLOAT32, v)


def kv_str(key, v):
    return s(key) + struct.pack("<i", STRING) + s(v)


def kv_f32_array(key, values):
    return s(key) + struct.pack("<iiQ", ARRAY, FLOAT32, len(values)) + np.asarray(values, "<f4").tobytes()


def kv_str_array(key, values):
    return s(key) + struct.pack("<iiQ", ARRAY, STRING, len(values)) + b"".join(s(v) for v in values)


def tensor_info(name, ne, type_id, offset):
    return s(name) + struct.pack(f"<I{len(ne)}qiQ", len(ne), *ne, type_id, offset)


def pad(n, a):
    return (n + a - 1) // a * a


def build(kvs, tensors, *, version=3, alignment=32, data=None, n_kv=None, n_tensors=None):
    """tensors: list of (name, ne, type_id, offset, nbytes). Data is random bytes at the given offsets
    unless `data` (the whole data section) is passed."""
    header = b"GGUF" + struct.pack("<Iqq", version, len(tensors) if n_tensors is None else n_tensors,
                                   len(kvs) if n_kv is None else n_kv)
    header += b"".join(kvs) + b"".join(tensor_info(n, ne, t, off) for n, ne, t, off, _ in tensors)
    header += bytes(pad(len(header), alignment) - len(header))
    if data is None:
        end = max([pad(off + nb, alignment) for _, _, _, off, nb in tensors], default=0)
        buf = bytearray(end)
        rng = np.random.default_rng(0)
        for _, _, type_id, off, nb in tensors:
            chunk = rng.standard_normal(nb // 4 + 1).astype("<f4").tobytes()[:nb] if type_id == 0 \
                else rng.integers(0, 120, nb, dtype=np.uint8).tobytes()
            buf[off:off + nb] = chunk
        data = bytes(buf)
    return header + data


def sample_tensors():
    """A small valid layout: F32 norm, F16 matrix, Q8_0 matrix (offsets dense at alignment 32)."""
    out, off = [], 0
    for name, ne, t, nb in [("output_norm.weight", [64], 0, 256), ("blk.0.attn_q.weight", [64, 8], 1, 1024),
                            ("blk.0.ffn_up.weight", [64, 4], 8, 4 * 2 * 34)]:
        out.append((name, ne, t, off, nb))
        off = pad(off + nb, 32)
    return out


def sample_kvs(arch="llama"):
    """The keys llama.cpp's loader requires of a llama model (the model-file rules check them), and a tokenizer."""
    return [kv_str("general.architecture", arch), kv_u32(f"{arch}.block_count", 1),
            kv_u32(f"{arch}.context_length", 256), kv_u32(f"{arch}.embedding_length", 64),
            kv_u32(f"{arch}.attention.head_count", 8), kv_f32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
            kv_str_array("tokenizer.ggml.tokens", ["<s>", "</s>", "a", "b"]),
            kv_f32_array("tokenizer.ggml.scores", [0.0, 0.0, -1.0, -2.0])]


def sample_file(**kw) -> bytes:
    return build(sample_kvs(), sample_tensors(), **kw)
