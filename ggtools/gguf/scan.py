"""scan_tensor: a check over a tensor's rows, read in bounded chunks with pread (validate --deep, and the runtime
naming the tensor that holds NaN/inf)."""

from ggtools.gguf.reader import GGUFFile, TensorInfo

CHUNK_BYTES = 16 << 20


def scan_tensor(f: GGUFFile, t: TensorInfo, check, chunk_bytes: int = CHUNK_BYTES) -> tuple[int, int]:
    """check(type, rows) -> (bad items, first bad item) over a tensor in row chunks read with pread (bounded
    memory); returns (bad items, index of the first bad item) where an item is a block, or a value for float
    types."""
    row_bytes = t.nbytes // t.n_rows
    items_per_row = row_bytes // t.block[1]
    step = max(1, chunk_bytes // row_bytes)
    total, first, buf = 0, -1, None
    for start in range(0, t.n_rows, step):
        rows = f.read_rows(t, start, min(step, t.n_rows - start), buf)
        buf = rows if buf is None else buf
        n_bad, at = check(t.type_id, rows)
        if n_bad and first < 0:
            first = start * items_per_row + at
        total += n_bad
    return total, first
