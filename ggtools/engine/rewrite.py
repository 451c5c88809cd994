"""rewrite: execute one shard's plan in a single pass over its bytes.

One rewrite serves quantize, requant-trunk, patch, doctor --fix and the converters' layout moves. Per shard: KVs
copied verbatim (with the plan's edits), tensor infos re-emitted with new types and offsets, then every tensor's
bytes read once from its source (the shard's, or the file its action names: TensorAction.src_file) and written
once at its place in the output (output.py): copies as read, conversions by dequantize → quantize in bounded row
chunks. The copies run on one thread and the conversions on this one, at the same time (the conversion kernels
use the threads numba is given), each reading ahead of itself on a background thread (gguf/readahead.py); the
sha256 of every tensor the manifest records is taken from the buffer each write is handed. Output is atomic
(temp file + rename).

What is verified, and how (verify=True; docs/requant.md):
- copies: the bytes written are the bytes read from the source tensor, one buffer read, hashed and written, every
  write's count checked; their blocks scanned as ggml_validate_row_data does (NaN/inf scales or values);
- conversions: the source rows' values finite, every produced block's scales finite, the bytes hashed as
  written;
- the file: once every tensor is written, its header is read back from the temporary file and checked (container
  rules, planned types, shapes and sizes), every tensor's region in it being exactly the region its bytes were
  written to (so the bytes hashed are the bytes a reader of the output finds there), before the fsync and the
  rename (no unverified shard ever gets its final name).
The output is not read back: `--resume` re-reads every finished output and compares it with these digests.

Non-finite values are never hidden: a conversion whose source rows hold NaN or inf, and a verified copy whose
blocks have NaN/inf scales (or values), are refused naming the tensor and the first bad row, unless
allow_nonfinite; then they are written and counted in ShardResult.nonfinite.
"""

import contextlib
import hashlib
import itertools
import os
import threading

import numpy as np

from ggtools.engine.errors import NonFiniteError, RewriteError
from ggtools.engine.manifest import ShardResult
from ggtools.engine.output import ShardOutput
from ggtools.gguf import GGUFFile, GGUFWriter, ggml_type_name
from ggtools.gguf.check import check_file, check_tensors, refuse
from ggtools.gguf.hashing import combined_digest
from ggtools.gguf.outputs import copy_file
from ggtools.gguf.readahead import Piece, read_ahead, split
from ggtools.plan import COPY, ShardPlan
from ggtools.quants import (CHUNK_VALUES, block_size, can_check_row_data, check_row_data, dequantize, quantize,
                            row_bytes, use_threads)

COPY_CHUNK = 1 << 20        # bytes per read of a copied tensor: the buffers stay in the cores' caches


def rewrite_shard(plan: ShardPlan, *, force=False, verify=True, on_bytes=None, inputs=(), allow_nonfinite=False,
                  chunk_values=CHUNK_VALUES, threads=None) -> ShardResult:
    """Write plan.dst from plan.src; return the output's hashes (verified unless verify=False). inputs: every
    file the job reads (plan.src is always one): the output may be none of them. threads(): the cores the
    conversions may use, asked again at each tensor (None: numba's count as it is)."""
    on_bytes = _serialized(on_bytes or (lambda n: None))
    inputs = [plan.src, *inputs] if plan.dst != plan.src else inputs
    with _open_sources(plan) as sources:
        header, layout = _layout(plan, sources[plan.src])
        out = ShardOutput(plan.dst, header, layout, force=force, inputs=inputs)
        try:
            out.open()
            digests, nonfinite = _single_pass(plan, sources, out, on_bytes, chunk_values, allow_nonfinite, verify,
                                              threads)
            if verify:
                _verify(plan, out)
            digest = combined_digest(hashlib.sha256(header), [(a.name, digests[a.name]) for a in plan.tensors])
            result = ShardResult(plan.dst, layout.file_size, digest, {a.name: digests[a.name] for a in plan.tensors},
                                 verified=verify, nonfinite=nonfinite)
            out.commit()
        except BaseException:
            out.abort()
            raise
        return result


def _serialized(on_bytes):
    """on_bytes callable from the copying and the converting thread alike."""
    lock = threading.Lock()

    def report(n):
        with lock:
            on_bytes(n)
    return report


def _layout(plan: ShardPlan, src: GGUFFile) -> tuple[bytes, GGUFFile]:
    """The output's header bytes, and that header parsed: where every tensor's bytes go."""
    w = GGUFWriter(None, version=src.version)
    _declare(w, src, plan)
    header = w.header_bytes()
    return header, GGUFFile.from_header(plan.dst, header, w.data_size)


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
    return _layout(plan, src)[1]


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


def _single_pass(plan, sources, out: ShardOutput, on_bytes, chunk_values, allow_nonfinite, scan_copies, threads):
    """Every tensor read once and written once: the copies on a second thread while this one converts. Returns
    ({tensor: sha256 of its bytes}, {tensor: NaN/inf count written})."""
    copies = [a for a in plan.tensors if a.action == COPY]
    converts = [a for a in plan.tensors if a.action != COPY]
    digests, nonfinite = {}, {}
    stop = threading.Event()          # set by whichever side fails, so that the other stops at its next chunk

    def copy_all():
        _copy_stream(plan, copies, sources, out, on_bytes, allow_nonfinite, scan_copies, digests, nonfinite, stop)

    def convert_all():
        before = use_threads(threads()) if threads else None
        try:
            _convert_stream(plan, converts, sources, out, on_bytes, chunk_values, allow_nonfinite, digests,
                            nonfinite, stop, threads)
        finally:
            if before is not None:
                use_threads(before)

    if not copies or not converts:
        (copy_all if copies else convert_all)()
        return digests, nonfinite
    failed = []
    copier = threading.Thread(target=_catching(copy_all, failed, stop), name="ggtools-copy", daemon=True)
    copier.start()
    try:
        convert_all()
    except BaseException:
        stop.set()
        copier.join()
        raise
    copier.join()
    if failed:
        raise failed[0]
    return digests, nonfinite


def _catching(fn, failed, stop):
    def run():
        try:
            fn()
        except BaseException as e:      # raised again by the thread that joins this one
            failed.append(e)
            stop.set()
    return run


def _chunks(plan, actions, sources, piece_bytes):
    """(action, source tensor, source file, offset in the tensor, bytes) over the actions' source tensors, in
    order, each read once (ahead, on a background thread); piece_bytes(tensor): (bytes per piece, alignment)."""
    for path, run in itertools.groupby(actions, key=lambda a: a.src_file or plan.src):
        f = sources[path]
        pieces = []
        for a in run:
            t = f.tensor[a.source]
            size, align = piece_bytes(t)
            pieces += split(t.data_start, t.nbytes, size, (a, t), align) or [Piece(t.data_start, 0, (a, t))]
        for piece, view in read_ahead(f.fd, pieces, f.path):
            a, t = piece.tag
            yield a, t, f, piece.offset - t.data_start, view


def _copy_stream(plan, copies, sources, out, on_bytes, allow_nonfinite, scan, digests, nonfinite, stop):
    """Byte-copy tensors: each chunk as read scanned (scan: for NaN/inf), hashed and written."""
    sinks = {}
    for a, t, f, offset, view in _chunks(plan, copies, sources, lambda t: (COPY_CHUNK, t.block[1])):
        if stop.is_set():
            return
        sink = sinks.get(a.name)
        if sink is None:
            sink = sinks[a.name] = out.tensor_sink(a.name)
        if scan:
            _scan_copy(f.path, t, offset, view, allow_nonfinite, nonfinite)
        sink.write(view)
        on_bytes(len(view))
        if sink.done == sink.nbytes:
            digests[a.name] = sinks.pop(a.name).close()


def _convert_stream(plan, converts, sources, out, on_bytes, chunk_values, allow_nonfinite, digests, nonfinite,
                    stop, threads):
    """Dequantize → quantize in row chunks of at most chunk_values values, writing as it goes, on threads() cores
    (asked at each chunk: a worker left alone takes the cores the others had)."""
    sinks, scratch = {}, _Scratch()

    def rows_per_piece(t):
        per_row = t.nbytes // t.n_rows
        return max(1, chunk_values // t.row_length) * per_row, per_row

    for a, t, f, offset, view in _chunks(plan, converts, sources, rows_per_piece):
        if stop.is_set():
            return
        sink = sinks.get(a.name)
        if sink is None:
            sink = sinks[a.name] = out.tensor_sink(a.name)
        if threads:
            use_threads(threads())
        if len(view):
            per_row = t.nbytes // t.n_rows
            data = _convert_rows(f, t, a.dst_type, offset // per_row, view, scratch, allow_nonfinite, nonfinite)
            sink.write(memoryview(data).cast("B"))
        on_bytes(len(view))
        if sink.done == sink.nbytes:
            digests[a.name] = sinks.pop(a.name).close()


class _Scratch:
    """Reused arrays for the values and the bytes of a chunk of rows (no fresh pages to fault in per chunk)."""

    def __init__(self):
        self.arrays = {}

    def get(self, kind, dtype, rows, cols) -> np.ndarray:
        arr = self.arrays.get(kind)
        if arr is None or arr.size < rows * cols:
            arr = self.arrays[kind] = np.empty(rows * cols, dtype)
        return arr[:rows * cols].reshape(rows, cols)


def _convert_rows(src, t, dst_type, first_row, raw, scratch, allow_nonfinite, nonfinite) -> np.ndarray:
    """Rows of t (raw bytes, starting at row first_row) as dst_type, their values and the blocks made checked
    for NaN/inf."""
    n_rows = len(raw) // (t.nbytes // t.n_rows)
    values = dequantize(t.type_id, raw, t.row_length, out=scratch.get("values", np.float32, n_rows, t.row_length))
    bad_rows = np.flatnonzero(~np.isfinite(values).all(axis=1))
    if bad_rows.size:
        if not allow_nonfinite:
            raise NonFiniteError(src.path, t.name, first_row + bad_rows[0], "NaN or inf values; quantizing "
                                 f"them to {ggml_type_name(dst_type)} would hide them")
        nonfinite[t.name] = nonfinite.get(t.name, 0) + int((~np.isfinite(values)).sum())
    data = quantize(dst_type, values, out=scratch.get("bytes", np.uint8, n_rows, row_bytes(dst_type, t.row_length)))
    n_bad, first = check_row_data(dst_type, data)
    if n_bad and not allow_nonfinite:
        per_row = t.row_length // block_size(dst_type)
        raise NonFiniteError(src.path, t.name, first_row + first // per_row, f"the values are out of range "
                             f"for {ggml_type_name(dst_type)} ({n_bad} blocks with inf/NaN scales)")
    if n_bad and not bad_rows.size:
        nonfinite[t.name] = nonfinite.get(t.name, 0) + n_bad
    return data


def _verify(plan: ShardPlan, out: ShardOutput):
    """The written file's header read back: container rules, planned types, shapes and sizes, and every tensor's
    region exactly where its bytes were written, all of them."""
    with GGUFFile(out.temp_path) as f:
        bad = [p for p in check_file(f) if p.severity == "error"]
        if bad:
            raise RewriteError(f"{plan.dst}: output failed validation: {bad[0].where}: {bad[0].rule}")
        for a in plan.tensors:
            t = f.tensor.get(a.name)
            if t is None or t.type_id != a.dst_type or t.nbytes != a.bytes_out or t.ne != tuple(a.ne):
                raise RewriteError(f"{plan.dst}: tensor '{a.name}' is not the planned "
                                   f"{ggml_type_name(a.dst_type)} {list(a.ne)} of {a.bytes_out} bytes")
            if out.written.get(a.name) != (t.data_start, t.nbytes):
                raise RewriteError(f"{plan.dst}: tensor '{a.name}' was not written where the output's header "
                                   f"places it (bytes {t.data_start}..{t.data_start + t.nbytes})")


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
