"""engine: execute a Plan by streaming tensors from input shards to output shards.

One rewrite serves quantize, requant-trunk and patch. Per shard: KVs copied verbatim (with the plan's
edits), tensor infos re-emitted with new types and offsets, copies done by kernel copy, conversions by
dequantize → quantize in bounded row chunks. Output is atomic (temp file + rename). Verification re-reads
the finished temporary file once, before it is fsync'ed and renamed (so it overlaps the disk writes, and no
unverified shard ever has a final name): container rules, every copied tensor byte for byte against the
source, every converted tensor's sha256 against the bytes produced (whose scales were checked finite as they
were made).
"""

import ctypes
import hashlib
import os
from dataclasses import dataclass, field

import numpy as np

from ggtools.errors import GGToolsError
from ggtools.gguf import GGUFFile, GGUFWriter, ggml_type_name
from ggtools.gguf.check import check_file
from ggtools.gguf.hashing import HASH_CHUNK, content_digest
from ggtools.plan import COPY, ShardPlan
from ggtools.quants import CHUNK_VALUES, check_row_data, dequantize, iter_row_chunks, quantize


class RewriteError(GGToolsError):
    """A rewrite that could not be done, or whose output failed verification."""

    exit_code = 1


@dataclass
class ShardResult:
    dst: str
    size: int
    digest: str                       # content digest: header bytes + every tensor's sha256
    tensors: dict[str, str] = field(default_factory=dict)   # tensor sha256 in the output
    verified: bool = False


def rewrite_shard(plan: ShardPlan, *, force=False, verify=True, on_bytes=None,
                  chunk_values=CHUNK_VALUES) -> ShardResult:
    """Write plan.dst from plan.src; return the output's hashes (verified unless verify=False)."""
    on_bytes = on_bytes or (lambda n: None)
    with GGUFFile(plan.src) as src:
        bad = [p for p in check_file(src) if p.severity == "error"]
        if bad:
            raise RewriteError(f"refusing to rewrite an invalid input: {bad[0]}")
        produced = {}
        with open(plan.src, "rb") as fh, GGUFWriter(plan.dst, force=force, version=src.version) as w:
            _declare(w, src, plan)
            for action in plan.tensors:
                t = src.tensor[action.source]
                if action.action == COPY:
                    w.copy_from(fh.fileno(), t.data_start, t.nbytes)
                    on_bytes(t.nbytes)
                else:
                    produced[action.name] = _convert(w, src, t, action.dst_type, on_bytes, chunk_values)
            w.finish()
            result = (_verify(plan, src, produced, w.temp_path) if verify
                      else describe_output(w.temp_path, name=plan.dst))
        return result


def _declare(w: GGUFWriter, src: GGUFFile, plan: ShardPlan):
    edits = plan.kv_edits
    for kv in src.kvs:
        if kv.key in edits.removed:
            continue
        if kv.key in edits.changes:
            _add_change(w, kv.key, edits.changes[kv.key])
        else:
            w.add_kv_record(kv)
    for key, change in edits.changes.items():
        if key not in src.kv:
            _add_change(w, key, change)
    for a in plan.tensors:
        w.add_tensor_info(a.name, a.ne, a.dst_type, a.bytes_out)


def _add_change(w: GGUFWriter, key, change):
    if len(change) == 1:
        w.add_kv_record(change[0])
    else:
        w.add_kv(key, *change)


def _convert(w, src, t, dst_type, on_bytes, chunk_values) -> str:
    """Dequantize → quantize in row chunks, writing as it goes; returns the sha256 of the bytes written."""
    h = hashlib.sha256()
    buf = None
    for part in iter_row_chunks(t.n_rows, t.row_length, chunk_values):
        rows = src.read_rows(t, part.start, part.stop - part.start, buf)
        buf = rows if buf is None else buf
        data = quantize(dst_type, dequantize(t.type_id, rows, t.row_length))
        n_bad, first = check_row_data(dst_type, data)
        if n_bad:
            raise RewriteError(f"tensor '{t.name}': {n_bad} {ggml_type_name(dst_type)} blocks with non-finite "
                               f"scales (first at block {first} of rows {part.start}..); the source values "
                               "are out of range for the type")
        h.update(data)
        w.write(data)
        on_bytes(rows.nbytes)
    return h.hexdigest()


def _verify(plan: ShardPlan, src: GGUFFile, produced: dict[str, str], path) -> ShardResult:
    """Re-read the output (written to path, to become plan.dst) once: container rules, planned types and
    sizes, copies equal to the source byte for byte, conversions equal to the bytes produced."""
    actions = {a.name: a for a in plan.tensors}
    source = bytearray(HASH_CHUNK)

    def compare_copy(t, offset, chunk):
        if actions[t.name].action == COPY:
            s = src.tensor[actions[t.name].source]
            n = os.preadv(src.fd, [memoryview(source)[:len(chunk)]], s.data_start + offset)
            if n != len(chunk) or not same_bytes(source, chunk, n):
                raise RewriteError(f"{plan.dst}: copied tensor '{t.name}' differs from the source near byte "
                                   f"{offset} of the tensor")

    with GGUFFile(path) as out:
        bad = [p for p in check_file(out) if p.severity == "error"]
        if bad:
            raise RewriteError(f"{plan.dst}: output failed validation: {bad[0].where}: {bad[0].rule}")
        for a in plan.tensors:
            t = out.tensor.get(a.name)
            if t is None or t.type_id != a.dst_type or t.nbytes != a.bytes_out:
                raise RewriteError(f"{plan.dst}: tensor '{a.name}' is not the planned "
                                   f"{ggml_type_name(a.dst_type)} of {a.bytes_out} bytes")
        digest, tensors = content_digest(out, compare_copy)
        for name, sha in produced.items():
            if tensors[name] != sha:
                raise RewriteError(f"{plan.dst}: converted tensor '{name}' was not written intact")
        return ShardResult(plan.dst, out.file_size, digest, tensors, verified=True)


_libc = ctypes.CDLL(None)
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


def same_bytes(a, b, n) -> bool:
    """memcmp of the first n bytes of two writable-or-not buffers, without copying them."""
    pa = np.frombuffer(a, np.uint8, n).ctypes.data
    pb = np.frombuffer(b, np.uint8, n).ctypes.data
    return _libc.memcmp(pa, pb, n) == 0


def describe_output(path, name=None) -> ShardResult:
    """Size and content digest of an output (what the resume manifest records and re-checks); name: the
    path to report, when path is still the temporary file."""
    with GGUFFile(path) as f:
        digest, tensors = content_digest(f)
        return ShardResult(name or path, f.file_size, digest, tensors)


def source_identity(path) -> dict:
    """What must not have changed for a finished output to still count: size, mtime, header hash."""
    st = os.stat(path)
    with GGUFFile(path) as f:
        header = hashlib.sha256(np.frombuffer(f.buf, np.uint8, count=f.data_offset)).hexdigest()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_sha256": header}
