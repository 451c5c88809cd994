"""KVCache: per attention layer, the keys and values of positions 0..n_tokens-1, croppable.

Values are stored rounded to f16 (llama.cpp's default cache type; or kept exact with type "f32"), by numba
held as float32, so attention reads them without conversion (torch keeps f16 tensors). Keys are (n_head_kv, capacity,
head_dim); values are kept transposed, (n_head_kv, head_dim, capacity), as llama.cpp keeps them
without flash attention, so each output dimension is a contiguous dot over positions. Capacity is a multiple of 32 and grows by doubling.
The attention layer writes the rows of new positions (attention.prepare_attention).
A tree verify (tree_batch.py) writes its rows at start + row and is followed by `keep_path` (or a crop to its start).
"""

from types import SimpleNamespace

import numpy as np

from ggtools.runtime.model.mixers.attention import KV_PAD

# How a backend makes the arrays of its caches: numba's are host arrays, float32 also for an f16 cache (the
# values are rounded to f16 by the kernels that write them); torch's are tensors on its device.
HOST_ARRAYS = SimpleNamespace(cache_zeros=lambda shape, kv_type: np.zeros(shape, np.float32),
                              zeros=lambda shape: np.zeros(shape, np.float32), copy=np.copy, cat=np.concatenate)


class KVCache:
    def __init__(self, n_layers: int, n_head_kv: int, head_dim: int, capacity: int = 256, type: str = "f16",
                 arrays=HOST_ARRAYS):
        if type not in ("f16", "f32"):
            raise ValueError(f"KV cache type must be 'f16' or 'f32', not {type!r}")
        self.n_layers, self.n_head_kv, self.head_dim = n_layers, n_head_kv, head_dim
        self.type, self.arrays = type, arrays
        self.f16 = type == "f16"
        self.n_tokens = 0
        self.capacity = 0
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.tree = None            # the TreeBatch being run (mixers read it); None for a sequence batch
        self.verified_tree = None   # the last batch's TreeBatch, until keep_path or a crop
        self.reserve(capacity)

    @classmethod
    def for_layers(cls, layers, hp, type: str = "f16", arrays=HOST_ARRAYS) -> "KVCache":
        """The cache of a model whose every layer is attention."""
        return cls(len(layers), hp.n_head_kv, hp.head_dim, type=type, arrays=arrays)

    def reserve(self, n_tokens: int) -> None:
        """Make room for positions 0..n_tokens-1."""
        if n_tokens <= self.capacity:
            return
        capacity = -(-max(n_tokens, 2 * self.capacity) // KV_PAD) * KV_PAD
        zeros = self.arrays.cache_zeros
        k = [zeros((self.n_head_kv, capacity, self.head_dim), self.type) for _ in range(self.n_layers)]
        v = [zeros((self.n_head_kv, self.head_dim, capacity), self.type) for _ in range(self.n_layers)]
        for layer in range(len(self.k)):
            k[layer][:, :self.n_tokens] = self.k[layer][:, :self.n_tokens]
            v[layer][:, :, :self.n_tokens] = self.v[layer][:, :, :self.n_tokens]
        self.k, self.v, self.capacity = k, v, capacity

    def crop(self, n_tokens: int) -> None:
        """Forget every position >= n_tokens (rollback after a rejected draft)."""
        self.check_crop(n_tokens)
        self.n_tokens = n_tokens
        self.verified_tree = None

    def check_crop(self, n_tokens: int) -> None:
        if not 0 <= n_tokens <= self.n_tokens:
            raise ValueError(f"cannot crop a cache of {self.n_tokens} tokens to {n_tokens}")
        if self.verified_tree is not None and n_tokens > self.verified_tree.start:
            raise ValueError(f"cannot crop into a verified tree's rows (it starts at {self.verified_tree.start}): "
                             "keep_path keeps one of its paths")

    def keep_path(self, rows) -> None:
        """After a tree verify: keep its rows `rows` (the root, row 0, then each row a child of the one before) at
        positions start, start + 1, ... and forget every other row."""
        tree = self.verified_tree
        rows = check_path(tree, rows)
        src, dst = tree.start + rows, tree.start + np.arange(len(rows))
        moved = src != dst
        if moved.any():
            src, dst = src[moved].tolist(), dst[moved].tolist()
            for keys, values in zip(self.k, self.v):
                keys[:, dst] = keys[:, src]
                values[:, :, dst] = values[:, :, src]
        self.n_tokens = tree.start + len(rows)
        self.verified_tree = None

    def clear(self) -> None:
        self.n_tokens = 0
        self.verified_tree = None

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)


def check_path(tree, rows) -> np.ndarray:
    """rows as an array, refused unless they are a path of the verified tree `tree` from its root."""
    if tree is None:
        raise ValueError("keep_path follows a tree verify (TargetModel.forward with tree=...)")
    rows = np.asarray(rows, np.int64).reshape(-1)
    if (len(rows) == 0 or rows[0] != 0 or rows.min() < 0 or rows.max() >= len(tree)
            or np.any(tree.parents[rows[1:]] != rows[:-1])):
        raise ValueError(f"rows {rows.tolist()} are not a path from the root of the verified tree")
    return rows
