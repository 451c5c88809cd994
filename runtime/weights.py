"""Weights of a target GGUF as memory-mapped views: matrices stay in their ggml block layout.

A `Matrix` is one 2-D weight (ne = [n_cols, n_rows]): `matmul` runs the dequantize-on-the-fly kernel,
`rows` dequantizes selected rows (embedding lookup); or a stack of experts (ne = [n_cols, n_rows, n_expert]),
run through `MatrixGroup.run_experts`. Vectors (norms, biases) are small and become float32 arrays.
"""

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ggtools import quants
from ggtools.errors import GGToolsError
from ggtools.gguf import ShardSet
from ggtools.gguf.scan import scan_tensor
from ggtools.runtime.kernels import matmul
from ggtools.runtime.errors import ModelError


class Matrix:
    def __init__(self, name: str, qtype: GGMLQuantizationType, n_rows: int, n_cols: int, buf: np.ndarray,
                 offset: int = 0, n_expert: int = 1):
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

    def matmul(self, prepared: matmul.PreparedInput, stepwise: bool = False) -> np.ndarray:
        """prepared: input rows (rows, n_cols) rounded for this matrix's activation kind -> (rows, n_rows)."""
        return self.plan.run(prepared, stepwise)[0]

    def __call__(self, x: np.ndarray, stepwise: bool = False) -> np.ndarray:
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
        for f in files:
            for t in f.tensors:
                self._where.setdefault(t.name, (f, t))

    def has(self, name: str) -> bool:
        return name in self._where

    @property
    def names(self) -> set[str]:
        return set(self._where)

    @property
    def ordered_names(self) -> list[str]:
        """Every tensor name, in file (and shard) order."""
        return list(self._where)

    def shape(self, name: str) -> list[int]:
        """The tensor's ne (ne[0] the row length)."""
        return [int(n) for n in self._lookup(name)[1].ne]

    def locate(self, name: str):
        """(GGUFFile, TensorInfo) of the tensor: the file of the set it lies in; None when absent."""
        return self._where.get(name)

    def _lookup(self, name):
        try:
            return self._where[name]
        except KeyError:
            raise ModelError(f"{self.meta.path}: tensor '{name}' is missing") from None

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
        f, t = self._lookup(name)
        if n is not None and t.n_elements != n:
            raise ModelError(f"{f.path}: tensor '{name}' has {t.n_elements} values, expected {n}")
        return quants.dequantize(t.type_id, f.tensor_data(t), t.row_length).reshape(-1)

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
        (ggml_validate_row_data's rules), as (name, where: 'value N' or 'block N'); None when all are finite."""
        for name in names:
            if name not in self._where:
                continue
            f, t = self._where[name]
            try:
                n_bad, first = scan_tensor(f, t, quants.check_row_data)
            except GGToolsError:
                continue                # a type ggml has no row rule for
            if n_bad:
                return name, f"{'value' if t.block[0] == 1 else 'block'} {first}"
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

    def __call__(self, x: np.ndarray, stepwise: bool = False) -> list[np.ndarray]:
        return self._each_plan(x, None, lambda plan, prepared: plan.run(prepared, stepwise))

    def run_experts(self, x: np.ndarray, rows: np.ndarray, experts: np.ndarray, groups: np.ndarray) -> list:
        """Stacks of experts: input rows x[rows[j]] for j in groups[g]..groups[g + 1]-1 through expert experts[g]
        (each input row rounded once, however many experts it goes to; rows None: x's rows in order) ->
        outputs in the order of `rows`."""
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
