"""KVCache: per attention layer, the keys and values of positions 0..n_tokens-1, croppable.

Values are stored rounded to f16 (llama.cpp's default cache type; or kept exact with type "f32")
but held as float32, so attention reads them without conversion. Keys are (n_head_kv, capacity,
head_dim); values are kept transposed, (n_head_kv, head_dim, capacity), as llama.cpp keeps them
without flash attention, so each output dimension is a contiguous dot over positions. Capacity is a multiple of 32 and grows by doubling.
The attention layer writes the rows of new positions (attention.prepare_attention).
"""

import numpy as np

from ggtools.runtime.target.mixers.attention import KV_PAD


class KVCache:
    def __init__(self, n_layers: int, n_head_kv: int, head_dim: int, capacity: int = 256, type: str = "f16"):
        if type not in ("f16", "f32"):
            raise ValueError(f"KV cache type must be 'f16' or 'f32', not {type!r}")
        self.n_layers, self.n_head_kv, self.head_dim = n_layers, n_head_kv, head_dim
        self.f16 = type == "f16"
        self.n_tokens = 0
        self.capacity = 0
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.reserve(capacity)

    @classmethod
    def for_layers(cls, layers, hp, type: str = "f16") -> "KVCache":
        """The cache of a model whose every layer is attention."""
        return cls(len(layers), hp.n_head_kv, hp.head_dim, type=type)

    def reserve(self, n_tokens: int) -> None:
        """Make room for positions 0..n_tokens-1."""
        if n_tokens <= self.capacity:
            return
        capacity = -(-max(n_tokens, 2 * self.capacity) // KV_PAD) * KV_PAD
        k = [np.zeros((self.n_head_kv, capacity, self.head_dim), np.float32) for _ in range(self.n_layers)]
        v = [np.zeros((self.n_head_kv, self.head_dim, capacity), np.float32) for _ in range(self.n_layers)]
        for layer in range(len(self.k)):
            k[layer][:, :self.n_tokens] = self.k[layer][:, :self.n_tokens]
            v[layer][:, :, :self.n_tokens] = self.v[layer][:, :, :self.n_tokens]
        self.k, self.v, self.capacity = k, v, capacity

    def crop(self, n_tokens: int) -> None:
        """Forget every position >= n_tokens (rollback after a rejected draft)."""
        if not 0 <= n_tokens <= self.n_tokens:
            raise ValueError(f"cannot crop a cache of {self.n_tokens} tokens to {n_tokens}")
        self.n_tokens = n_tokens

    def clear(self) -> None:
        self.n_tokens = 0

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)
