"""Weights of a target GGUF as memory-mapped views: matrices stay in their ggml block layout.

A `Matrix` is one 2-D weight (ne = [n_cols, n_rows]): `matmul` runs the dequantize-on-the-fly kernel,
`rows` dequantizes selected rows (embedding lookup); or a stack of experts (ne = [n_cols, n_rows, n_expert]),
run through `MatrixGroup.run_experts`. Vectors (norms, biases) are small and become float32 arrays.

Memory model (docs/runtime.md, "Memory"): files are mapped read-only, without MAP_POPULATE or MADV_WILLNEED on the
whole file (llama.cpp's default prefetch, which faults every expert of a model larger than RAM in at load), so
pages come in as a forward touches them and stay in the page cache, which can drop them. When the routed experts
are too large to stay cached (expert stacks over half of the available memory, or GGTOOLS_EXPERT_PAGING=on), the
experts are paged: their ranges are MADV_RANDOM (a fault reads its page, not the kernel's read-around window of
read_ahead_kb, which would pull in neighbouring experts no token routes to) and each routed expert's bytes are
asked for with MADV_WILLNEED as soon as the router has picked it (one large asynchronous read per expert and
matrix, all in flight together, before the matmul faults on them).
"""

import contextlib
import ctypes
import os

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ggtools import quants
from ggtools.environment import setting
from ggtools.errors import GGToolsError
from ggtools.gguf import ShardSet
from ggtools.gguf.scan import scan_tensor
from ggtools.quants.rowcheck import E8M0, FIELDS, FLOAT
from ggtools.runtime.kernels import matmul, workers
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.kernels.fixed_args import fixed_args
from ggtools.runtime.errors import ModelError, NonFiniteError


MADV_RANDOM, MADV_WILLNEED = 1, 3      # Linux <sys/mman.h>
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_LIBC = ctypes.CDLL(None, use_errno=True)
_madvise = getattr(_LIBC, "madvise", None)
if _madvise is not None:
    _madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)


def madvise(buf: np.ndarray, offset: int, length: int, advice: int) -> None:
    """madvise the pages holding buf[offset:offset + length] (a mapped file); errors ignored (advice only)."""
    if _madvise is None or length <= 0:
        return
    start = buf.ctypes.data + offset
    first = start - start % PAGE
    _madvise(first, start + length - first, advice)


def available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 when unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def experts_paged(expert_bytes: int) -> bool:
    """Whether expert stacks of expert_bytes in all are paged (module docstring): GGTOOLS_EXPERT_PAGING on / off, or
    auto (the default): when they exceed half of the available memory."""
    mode = setting("GGTOOLS_EXPERT_PAGING")
    if mode != "auto":
        return mode
    available = available_memory()
    return bool(available) and expert_bytes > available // 2


def bad_scale(type_id) -> str:
    """What ggml_validate_row_data finds wrong in a block of this type (quants.rowcheck.FIELDS): the scale that is
    NaN/inf, or MXFP4's exponent byte 0xFF (E8M0's NaN)."""
    kinds = {kind for kind, _ in FIELDS.get(type_id, [])}
    if E8M0 in kinds:
        return "MXFP4 exponent 0xFF"
    return "a NaN/inf float32 scale" if FLOAT in kinds else "a NaN/inf fp16 scale"


class Matrix:
    def __init__(self, name: str, qtype: GGMLQuantizationType, n_rows: int, n_cols: int, buf: np.ndarray,
                 offset: int = 0, n_expert: int = 1, paged: bool = False):
        self.name, self.qtype = name, qtype
        self.n_rows = n_rows    # outputs (ne[1])
        self.n_cols = n_cols    # inputs (ne[0], the row length)
        self.n_expert = n_expert    # ne[2] of a stack of experts
        self.layout = matmul.Layout(qtype, n_rows, n_cols)
        self.buf, self.offset = buf, offset   # uint8 array holding the matrix (a whole mapped file) and where
        self.data = buf[offset:offset + n_expert * n_rows * int(self.layout.row_bytes)]
        # how llama.cpp rounds this matrix's input (kernels.matmul.ACT_*); equal kinds share one rounding
        self.activation = self.layout.activation
        self.plan = matmul.MatmulPlan([self.layout], buf, [offset]) if self.activation is not None else None
        self._one_row = None      # matmul.one_row's plan (call_args for one row, a FixedArgs), made by its first call
        self._one_row_call = DirectCall(matmul.one_row)
        self.paged = paged and n_expert > 1     # an expert stack read as the router asks for its experts
        if self.paged:
            madvise(buf, offset, self.data.size, MADV_RANDOM)

    def prefetch(self, experts) -> None:
        """Ask for the bytes of these experts (a paged stack; nothing otherwise) without waiting for them."""
        if self.paged:
            per_expert = self.data.size // self.n_expert
            for e in experts:
                madvise(self.buf, self.offset + int(e) * per_expert, per_expert, MADV_WILLNEED)

    def matmul(self, prepared: matmul.PreparedInput, stepwise: bool = False) -> np.ndarray:
        """prepared: input rows (rows, n_cols) rounded for this matrix's activation kind -> (rows, n_rows)."""
        return self.plan.run(prepared, stepwise)[0]

    def __call__(self, x: np.ndarray, stepwise: bool = False) -> np.ndarray:
        if len(x) == 1 and self.n_expert == 1 and self.plan is not None and self.plan.one_call:
            if self._one_row is None:
                self._one_row = fixed_args(self.plan.call_args(1))
            return self._one_row_call(self._one_row, np.ascontiguousarray(x, np.float32), workers.one_call_counter())
        return self.matmul(matmul.PreparedInput(x, self.activation), stepwise)

    def rows(self, ids) -> np.ndarray:
        return matmul.dequantize_rows(self.layout, self.data, ids)

    def __repr__(self):
        return f"Matrix({self.name!r}, {self.qtype.name}, {self.n_rows}x{self.n_cols})"


class WeightFile:
    """The tensors of a model (one file or a split set), looked up by name."""

    def __init__(self, path, make_matrix=Matrix):
        """make_matrix(name, qtype, n_rows, n_cols, buf, offset, n_expert): the backend's matrix over the bytes at
        buf[offset:] (buf: a whole mapped file as uint8); Matrix for numba."""
        self.make_matrix = make_matrix
        self.shards = ShardSet(path)
        files = self.shards.files
        self.meta = files[0]
        self._buffers = {}
        self._where = {}
        self._read = {}             # every tensor a loader looked up, in that order (a dict as an ordered set)
        self._recorders = []        # the lists of recording() blocks that are open
        for f in files:
            for t in f.tensors:
                self._where.setdefault(t.name, (f, t))
        self.paged_experts = experts_paged(sum(t.nbytes or 0 for f, t in self._where.values() if len(t.ne) == 3))

    def has(self, name: str) -> bool:
        return name in self._where

    @property
    def names(self) -> set[str]:
        return set(self._where)

    @property
    def ordered_names(self) -> list[str]:
        """Every tensor name, in file (and shard) order."""
        return list(self._where)

    @property
    def read_names(self) -> list[str]:
        """Every tensor the loaders have read (looked up by name: matrix, vector, shape ...), in the order read:
        what a forward computes with, and so what a non-finite check scans."""
        return list(self._read)

    @contextlib.contextmanager
    def recording(self):
        """Yields a list that, when the block ends, names every tensor read inside it (in the order first read):
        the tensors of the piece the block loads."""
        names = []
        self._recorders.append(names)
        try:
            yield names
        finally:
            self._recorders.remove(names)

    def shape(self, name: str) -> list[int]:
        """The tensor's ne (ne[0] the row length)."""
        return [int(n) for n in self._lookup(name)[1].ne]

    def locate(self, name: str):
        """(GGUFFile, TensorInfo) of the tensor: the file of the set it lies in; None when absent."""
        return self._where.get(name)

    def _lookup(self, name):
        try:
            found = self._where[name]
        except KeyError:
            raise ModelError(f"{self.meta.path}: tensor '{name}' is missing") from None
        self._read[name] = None
        for names in self._recorders:
            if name not in names:
                names.append(name)
        return found

    def matrix(self, name: str, n_cols: int | None = None, n_rows: int | None = None,
               n_expert: int | None = None) -> Matrix:
        """A 2-D weight, or with n_expert a 3-D stack of n_expert matrices (ne [n_cols, n_rows, n_expert]); a 1-D
        weight asked for as one row (n_rows 1) is that row (qwen35moe's shared-expert gate)."""
        f, t = self._lookup(name)
        want = [n_cols, n_rows] + ([n_expert] if n_expert is not None else [])
        ne = list(t.ne) + ([1] if len(t.ne) == 1 and n_rows == 1 and n_expert is None else [])
        if len(ne) != len(want) or any(w is not None and int(n) != w for n, w in zip(ne, want)):
            raise ModelError(f"{f.path}: tensor '{name}' has ne {list(t.ne)}, expected {want}")
        try:
            qtype = GGMLQuantizationType(t.type_id)
        except ValueError:
            qtype = None
        if qtype not in matmul.SUPPORTED_TYPES:
            raise ModelError(f"{f.path}: tensor '{name}' has type {t.type_name}, which the runtime cannot run")
        if t.ne[0] % GGML_QUANT_SIZES[qtype][0]:
            raise ModelError(f"{f.path}: tensor '{name}' rows of {t.ne[0]} values are not whole {qtype.name} blocks")
        f.tensor_data(t)   # checks the size and that the data lies inside the file
        if n_expert is not None and self.paged_experts and self.make_matrix is Matrix:
            return Matrix(name, qtype, int(ne[1]), int(ne[0]), self._buffer(f), t.data_start, int(ne[2]), paged=True)
        return self.make_matrix(name, qtype, int(ne[1]), int(ne[0]), self._buffer(f), t.data_start,
                                int(ne[2]) if n_expert is not None else 1)

    def slices(self, name: str, n_cols: int, n_rows: int, n: int) -> list:
        """A 3-D weight (ne [n_cols, n_rows, n]) as n matrices of n_rows x n_cols over its bytes, one per slice
        (a weight llama.cpp multiplies with the slice as a batch dimension: MLA's per-head attn_k_b / attn_v_b)."""
        stack = self.matrix(name, n_cols, n_rows, n)
        f, t = self._lookup(name)
        step = t.nbytes // n
        return [self.make_matrix(name, stack.qtype, n_rows, n_cols, self._buffer(f), t.data_start + h * step, 1)
                for h in range(n)]

    def _buffer(self, f) -> np.ndarray:
        """The whole mapped file as one uint8 array (matrices are addressed by offset into it)."""
        if f.path not in self._buffers:
            self._buffers[f.path] = np.frombuffer(f.buf, np.uint8)
        return self._buffers[f.path]

    def vector(self, name: str, n: int | None = None) -> np.ndarray:
        """A small tensor (a norm, a bias, a scale, a score vector) read whole as float32; NonFiniteError when it
        holds NaN/inf: in memory anyway, it is checked as it is read, so that NaN/inf in one never decides what the
        forward computes (a routing bias picks experts without reaching the logits; a sigmoid makes inf finite)."""
        f, t = self._lookup(name)
        if n is not None and t.n_elements != n:
            raise ModelError(f"{f.path}: tensor '{name}' has {t.n_elements} values, expected {n}")
        values = quants.dequantize(t.type_id, f.tensor_data(t), t.row_length).reshape(-1)
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            raise NonFiniteError(f"{f.path}: tensor '{name}' holds NaN/inf (first at value {bad[0]}): the runtime "
                                 "refuses it as it loads it (a norm, bias or scale must be finite)")
        return values

    def id_vector(self, name: str, n_dims: int = 1) -> np.ndarray:
        """An I64 tensor of n_dims dimensions (token ids: DSpark's d2t) as int64."""
        f, t = self._lookup(name)
        if t.type_id != GGMLQuantizationType.I64 or len(t.ne) != n_dims:
            raise ModelError(f"{f.path}: tensor '{name}' is {t.type_name} with ne {list(t.ne)}, expected a "
                             f"{n_dims}-D I64 tensor")
        return f.tensor_data(t).view(np.int64).copy()

    def optional_vector(self, name: str, n: int | None = None) -> np.ndarray | None:
        return self.vector(name, n) if self.has(name) else None

    def nonfinite(self, names) -> tuple[str, str] | None:
        """The first of `names` (in that order; absent ones skipped) whose data holds NaN/inf values or scales
        (ggml_validate_row_data's rules), as (name, where and what: 'value N', or 'block N: <its bad scale>');
        None when all are finite."""
        for name in names:
            if name not in self._where:
                continue
            f, t = self._where[name]
            try:
                n_bad, first = scan_tensor(f, t, quants.check_row_data)
            except GGToolsError:
                continue                # a type ggml has no row rule for
            if n_bad:
                return name, f"value {first}" if t.block[0] == 1 else f"block {first}: {bad_scale(t.type_id)}"
        return None

    def close(self):
        self.shards.close()


class MatrixGroup:
    """Matrices applied to one input (Q, K, V; gate, up): the input is rounded once per activation
    kind and each run of same-type, same-width matrices is one parallel kernel."""

    def __init__(self, *matrices: Matrix):
        self.matrices = matrices
        parts = {}
        for i, m in enumerate(matrices):
            parts.setdefault((m.qtype, m.n_cols, m.layout.tinyblas, id(m.buf)), []).append(i)
        self.parts = [(idx, matmul.MatmulPlan([matrices[i].layout for i in idx], matrices[idx[0]].buf,
                                              [matrices[i].offset for i in idx], matrices[idx[0]].n_expert))
                      for idx in parts.values()]
        self.paged = any(getattr(m, "paged", False) for m in matrices)

    def one_token_args(self):
        """matmul.group_rows' plans and where for one input row, with the first column of each matrix in its output;
        None where a plan has no one_call."""
        plans = [plan for _, plan in self.parts]
        if not all(plan.one_call for plan in plans):
            return None
        starts = np.cumsum([0] + [m.n_rows for m in self.matrices])
        where = np.zeros((len(self.matrices), 4), np.int64)
        for j, (idx, plan) in enumerate(self.parts):
            for i, m in enumerate(idx):
                where[m] = (j, *plan.columns[i], starts[m])
        return (tuple(plan.call_args(1) for plan in plans), where), starts

    def __call__(self, x: np.ndarray, stepwise: bool = False) -> list[np.ndarray]:
        return self._each_plan(x, None, lambda plan, prepared: plan.run(prepared, stepwise))

    def prefetch(self, experts) -> None:
        """Ask for these experts' bytes of every (paged) stack of the group, without waiting."""
        for m in self.matrices:
            m.prefetch(experts)

    def run_experts(self, x: np.ndarray, rows: np.ndarray, experts: np.ndarray, groups: np.ndarray) -> list:
        """Stacks of experts: input rows x[rows[j]] for j in groups[g]..groups[g + 1]-1 through expert experts[g]
        (each input row rounded once, however many experts it goes to; rows None: x's rows in order) ->
        outputs in the order of `rows`. Paged stacks are asked for their experts first (Matrix.prefetch)."""
        self.prefetch(experts)
        return self._each_plan(x, rows, lambda plan, prepared: plan.run_experts(prepared, experts, groups))

    def _each_plan(self, x, rows, run) -> list:
        prepared, outs = {}, [None] * len(self.matrices)
        for idx, plan in self.parts:
            kind = plan.layout.activation
            if kind not in prepared:
                prepared[kind] = matmul.PreparedInput(x, kind)
                if rows is not None:
                    prepared[kind] = prepared[kind].take(rows)
            for i, out in zip(idx, run(plan, prepared[kind])):
                outs[i] = out
        return outs
