"""rewrite: execute one shard's plan by streaming tensors from the input shard to the output shard.

One rewrite serves quantize, requant-trunk and patch. Per shard: KVs copied verbatim (with the plan's
edits), tensor infos re-emitted with new types and offsets, copies done by kernel copy, conversions by
dequantize → quantize in bounded row chunks. A tensor is read from the shard's source, or from the file its
action names (TensorAction.src_file: an output gathering tensors from several shards, convert mtp's sidecar). Output is atomic (temp file + rename). Verification re-reads
the finished temporary file once, before it is fsync'ed and renamed (so it overlaps the disk writes, and no
unverified shard ever has a final name): container rules, every copied tensor byte for byte against the
source, every converted tensor's sha256 against the bytes produced (whose scales were checked finite as they
were made).

Non-finite values are never hidden: a conversion whose source rows hold NaN or inf, and a verified copy whose
blocks have NaN/inf scales (or values), are refused naming the tensor and the first bad row, unless
allow_nonfinite; then they are written and counted in ShardResult.nonfinite.
"""

import contextlib
import ctypes
import hashlib
import os

import numpy as np

from ggtools.engine.errors import NonFiniteError, RewriteError
from ggtools.engine.manifest import ShardResult, describe_output
from ggtools.gguf import GGUFFile, GGUFWriter, ggml_type_name
from ggtools.gguf.check import check_file, check_tensors, refuse
from ggtools.gguf.hashing import HASH_CHUNK, content_digest
from ggtools.gguf.outputs import copy_file
from ggtools.plan import COPY, ShardPlan
from ggtools.quants import CHUNK_VALUES, block_size, can_check_row_data, check_row_data, dequantize, iter_row_chunks, quantize


def rewrite_shard(plan: ShardPlan, *, force=False, verify=True, on_bytes=None, inputs=(), allow_nonfinite=False,
                  chunk_values=CHUNK_VALUES) -> ShardResult:
    """Write plan.dst from plan.src; return the output's hashes (verified unless verify=False). inputs: every
    file the job reads (plan.src is always one): the output may be none of them."""
    on_bytes = on_bytes or (lambda n: None)
    inputs = [plan.src, *inputs] if plan.dst != plan.src else inputs
    with _open_sources(plan) as sources:
        src = sources[plan.src]
        produced, nonfinite = {}, {}
        with GGUFWriter(plan.dst, force=force, version=src.version, inputs=inputs) as w:
            _declare(w, src, plan)
            for action in plan.tensors:
                f = sources[action.src_file or plan.src]
                t = f.tensor[action.source]
                if action.action == COPY:
                    w.copy_from(f.fd, t.data_start, t.nbytes)
                    on_bytes(t.nbytes)
                else:
                    produced[action.name] = _convert(w, f, t, action.dst_type, on_bytes, chunk_values,
                                                     allow_nonfinite, nonfinite)
            w.finish()
            result = (_verify(plan, sources, produced, w.temp_path, allow_nonfinite, nonfinite) if verify
                      else describe_output(w.temp_path, name=plan.dst))
        result.nonfinite = nonfinite
        return result


@contextlib.contextmanager
def _open_sources(plan: ShardPlan):
    """path -> GGUFFile of every file the shard's tensors are read from (its source first: its KVs are the output's),
    each refused unless its tensor infos are valid."""
    paths = dict.fromkeys([plan.src] + [a.src_file for a in plan.tensors if a.src_file])
    with contextlib.ExitStack() as stack:
        sources = {p: stack.enter_context(GGUFFile(p)) for p in paths}
        for f in sources.values():
            refuse(check_tensors(f), "refusing an invalid input")
        yield sources


def copy_shard(plan: ShardPlan, *, force=False, inputs=()) -> ShardResult:
    """Copy a verbatim shard whole (kernel copy, atomic); not re-read, so not hashed (digest None)."""
    copy_file(plan.src, plan.dst, inputs=inputs, force=force)
    return ShardResult(plan.dst, os.path.getsize(plan.dst), None)


def planned_header(plan: ShardPlan, src: GGUFFile) -> GGUFFile:
    """The output's header as a reader will see it, before anything is written (to check its rules)."""
    w = GGUFWriter(None, version=src.version)
    _declare(w, src, plan)
    return GGUFFile.from_header(plan.dst, w.header_bytes(), w.data_size)


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


def _convert(w, src, t, dst_type, on_bytes, chunk_values, allow_nonfinite, nonfinite) -> str:
    """Dequantize → quantize in row chunks, writing as it goes; returns the sha256 of the bytes written."""
    h = hashlib.sha256()
    buf = None
    for part in iter_row_chunks(t.n_rows, t.row_length, chunk_values):
        rows = src.read_rows(t, part.start, part.stop - part.start, buf)
        buf = rows if buf is None else buf
        values = dequantize(t.type_id, rows, t.row_length)
        bad_rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
        if bad_rows.size:
            if not allow_nonfinite:
                raise NonFiniteError(src.path, t.name, part.start + bad_rows[0], "NaN or inf values; quantizing "
                                     f"them to {ggml_type_name(dst_type)} would hide them")
            nonfinite[t.name] = nonfinite.get(t.name, 0) + int((~np.isfinite(values)).sum())
        data = quantize(dst_type, values)
        n_bad, first = check_row_data(dst_type, data)
        if n_bad and not allow_nonfinite:
            per_row = t.row_length // block_size(dst_type)
            raise NonFiniteError(src.path, t.name, part.start + first // per_row, f"the values are out of range "
                                 f"for {ggml_type_name(dst_type)} ({n_bad} blocks with inf/NaN scales)")
        if n_bad and not bad_rows.size:
            nonfinite[t.name] = nonfinite.get(t.name, 0) + n_bad
        h.update(data)
        w.write(data)
        on_bytes(rows.nbytes)
    return h.hexdigest()


def _verify(plan: ShardPlan, sources: dict[str, GGUFFile], produced: dict[str, str], path, allow_nonfinite,
            nonfinite) -> ShardResult:
    """Re-read the output (written to path, to become plan.dst) once: container rules, planned types and
    sizes, copies equal to the source byte for byte and free of NaN/inf, conversions equal to the bytes
    produced."""
    actions = {a.name: a for a in plan.tensors}
    source = bytearray(HASH_CHUNK)

    def compare_copy(t, offset, chunk):
        a = actions[t.name]
        if a.action == COPY:
            src = sources[a.src_file or plan.src]
            s = src.tensor[a.source]
            n = os.preadv(src.fd, [memoryview(source)[:len(chunk)]], s.data_start + offset)
            if n != len(chunk) or not same_bytes(source, chunk, n):
                raise RewriteError(f"{plan.dst}: copied tensor '{t.name}' differs from the source near byte "
                                   f"{offset} of the tensor")
            _scan_copy(src.path, s, offset, chunk, allow_nonfinite, nonfinite)

    with GGUFFile(path) as out:
        bad = [p for p in check_file(out) if p.severity == "error"]
        if bad:
            raise RewriteError(f"{plan.dst}: output failed validation: {bad[0].where}: {bad[0].rule}")
        for a in plan.tensors:
            t = out.tensor.get(a.name)
            if t is None or t.type_id != a.dst_type or t.nbytes != a.bytes_out or t.ne != tuple(a.ne):
                raise RewriteError(f"{plan.dst}: tensor '{a.name}' is not the planned "
                                   f"{ggml_type_name(a.dst_type)} {list(a.ne)} of {a.bytes_out} bytes")
        digest, tensors = content_digest(out, compare_copy)
        for name, sha in produced.items():
            if tensors[name] != sha:
                raise RewriteError(f"{plan.dst}: converted tensor '{name}' was not written intact")
        return ShardResult(plan.dst, out.file_size, digest, tensors, verified=True)


def _scan_copy(path, t, offset, chunk, allow_nonfinite, nonfinite):
    """Count what ggml_validate_row_data rejects in a block-aligned chunk of a copied tensor."""
    if not can_check_row_data(t.type_id):
        return
    n_bad, first = check_row_data(t.type_id, chunk)
    if not n_bad:
        return
    block_elems, block_bytes = t.block
    first_row = (offset // block_bytes + first) * block_elems // t.row_length
    if not allow_nonfinite:
        raise NonFiniteError(path, t.name, first_row, f"{n_bad} {t.type_name} {'values' if block_elems == 1 else 'blocks'}"
                             " are NaN or inf (or have NaN/inf scales); refusing to copy them as verified")
    nonfinite[t.name] = nonfinite.get(t.name, 0) + n_bad


_libc = ctypes.CDLL(None)
_libc.memcmp.restype = ctypes.c_int
_libc.memcmp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t]


def same_bytes(a, b, n) -> bool:
    """memcmp of the first n bytes of two writable-or-not buffers, without copying them."""
    pa = np.frombuffer(a, np.uint8, n).ctypes.data
    pb = np.frombuffer(b, np.uint8, n).ctypes.data
    return _libc.memcmp(pa, pb, n) == 0
