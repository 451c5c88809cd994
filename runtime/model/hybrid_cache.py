"""HybridCache: the KV cache of a hybrid model's attention layers plus the recurrent state of its Gated
DeltaNet layers, cropped together, so `crop(n)` then generating gives what never going further gives.

A recurrent state cannot be cut back like a KV cache, so each layer keeps a checkpoint (its state at
position `base`) and the inputs of positions base..n_tokens-1 (the qkv rows before the conv, the decay g and
beta: what the recurrence consumes). crop(n) restores the checkpoint and replays positions base..n-1 through
the same kernels, which gives the state bit for bit. Before a batch (`reserve`), when the logged positions
plus the batch would exceed `window`, the checkpoint moves to the current end; so the last batch (a verify)
and at least the last `window` positions can always be rolled back; crop(0) always can (the initial state
is zero).

A tree verify (tree_batch.py) runs each row from its parent row's state (`walk_tree`), leaves the state at the
cache's end as it was and logs the tree's rows as one batch; `keep_path` then advances the state over the accepted
path's rows, the same inputs one-token steps along that path would have consumed.
"""

from ggtools.runtime.model.kimi_k3_pieces import KDATensors
from ggtools.runtime.model.kvcache import HOST_ARRAYS, KVCache, check_path
from ggtools.runtime.model.pieces import DeltaNetTensors

RECURRENT = (DeltaNetTensors, KDATensors)     # the mixers whose state rolls back through RecurrentState

DEFAULT_WINDOW = 64


class RecurrentState:
    """One recurrent (Gated DeltaNet or KDA) layer: its conv rows and delta-rule matrices at the cache's end, the
    checkpoint, and the logged inputs since the checkpoint. `mixer.recur(conv, ssm, qkv, g, beta)` advances a
    state."""

    def __init__(self, mixer, arrays=HOST_ARRAYS):
        """mixer: the layer's Gated DeltaNet; arrays: its backend's zeros / copy / cat (kvcache.HOST_ARRAYS)."""
        self.mixer, self.arrays = mixer, arrays
        self.conv = arrays.zeros((mixer.conv.shape[0] - 1, mixer.conv.shape[1]))
        self.ssm = arrays.zeros((mixer.n_v_heads, mixer.head_dim, mixer.head_dim))
        self.checkpoint()

    def checkpoint(self) -> None:
        """Make the current state the one rollbacks start from."""
        self.base_conv, self.base_ssm = self.arrays.copy(self.conv), self.arrays.copy(self.ssm)
        self.log: list[tuple] = []

    def append(self, qkv, g, beta) -> None:
        """Log the inputs of the positions the mixer is about to consume."""
        self.log.append((qkv, g, beta))

    def rollback(self, n_keep: int) -> None:
        """The state after the first n_keep logged positions."""
        qkv, g, beta = (self.arrays.cat(parts)[:n_keep] for parts in zip(*self.log))
        self.conv, self.ssm = self.arrays.copy(self.base_conv), self.arrays.copy(self.base_ssm)
        self.mixer.recur(self.conv, self.ssm, qkv, g, beta)
        self.log = [(qkv, g, beta)]

    @property
    def tensors(self) -> tuple:
        """The arrays the state is made of, in the order `mixer.recur` takes them."""
        return self.conv, self.ssm

    def advance(self, qkv, g, beta, recur_rows, tree=None) -> None:
        """Log the inputs and move the state over their rows: recur_rows(conv, ssm, rows) advances a state over
        the rows (a slice) and writes their outputs; a sequence in order, a tree batch (tree_batch.TreeBatch) each
        row from its parent row's state (walk_tree)."""
        self.append(qkv, g, beta)
        if tree is None:
            recur_rows(*self.tensors, slice(None))
        else:
            self.walk_tree(tree.parents, lambda conv, ssm, i: recur_rows(conv, ssm, slice(i, i + 1)))

    def walk_tree(self, parents, advance) -> None:
        """A tree batch: advance(*tensors, i) moves a state over row i (writing row i's output), each row from the
        state after its parent row (parents[i] < i; row 0, parents[0] = -1, from the state at the cache's end, which
        is left as it is). Depth first: a copy per branch, the last child continues its parent's own copy."""
        children = [[] for _ in parents]
        for i in range(1, len(parents)):
            children[parents[i]].append(i)
        stack = [(0, self.tensors, False)]
        while stack:
            row, state, own = stack.pop()
            if not own:
                state = tuple(self.arrays.copy(t) for t in state)
            advance(*state, row)
            stack += [(child, state, child == children[row][-1]) for child in reversed(children[row])]

    def keep_tree_rows(self, rows) -> None:
        """After walk_tree: the state after the tree's rows `rows` (a path from its root), whose inputs replace the
        tree's in the log."""
        kept = tuple(x[rows] for x in self.log.pop())
        self.log.append(kept)
        self.mixer.recur(*self.tensors, *kept)

    def clear(self) -> None:
        self.conv[:] = 0
        self.ssm[:] = 0
        self.checkpoint()

    @property
    def nbytes(self) -> int:
        logged = sum(a.nbytes for entry in self.log for a in entry)
        return 2 * (self.conv.nbytes + self.ssm.nbytes) + logged


class HybridCache(KVCache):
    """KVCache over the attention layers (slots 0..n_attention-1) plus `recurrent[i]`, the state of the i-th
    Gated DeltaNet layer."""

    def __init__(self, n_attention: int, n_head_kv: int, head_dim: int, recurrent: list[RecurrentState],
                 type: str = "f16", window: int = DEFAULT_WINDOW, arrays=HOST_ARRAYS):
        self.recurrent, self.window, self.base = recurrent, window, 0
        super().__init__(n_attention, n_head_kv, head_dim, type=type, arrays=arrays)

    @classmethod
    def for_layers(cls, layers, hp, type: str = "f16", arrays=HOST_ARRAYS) -> "HybridCache":
        """The cache of a model whose layers mix attention and recurrent (Gated DeltaNet, KDA) mixers (slots in
        layer order)."""
        recurrent = [RecurrentState(layer.mixer, arrays) for layer in layers
                     if isinstance(layer.mixer, RECURRENT)]
        return cls(len(layers) - len(recurrent), hp.n_head_kv, hp.head_dim, recurrent, type=type, arrays=arrays)

    def reserve(self, n_tokens: int) -> None:
        """Make room for positions up to n_tokens - 1, the next batch; moves the checkpoint when the log
        would grow past the window."""
        super().reserve(n_tokens)
        if n_tokens - self.base > self.window and self.base < self.n_tokens:
            for state in self.recurrent:
                state.checkpoint()
            self.base = self.n_tokens

    def crop(self, n_tokens: int) -> None:
        self.check_crop(n_tokens)
        if n_tokens == 0:
            return self.clear()
        if n_tokens < self.base:
            raise ValueError(f"cannot crop to {n_tokens} tokens: the recurrent state rolls back only to position "
                             f"{self.base} (the last {self.window} positions or the last batch)")
        if n_tokens < self.n_tokens:
            for state in self.recurrent:
                state.rollback(n_tokens - self.base)
        super().crop(n_tokens)

    def keep_path(self, rows) -> None:
        rows = check_path(self.verified_tree, rows).tolist()
        for state in self.recurrent:
            state.keep_tree_rows(rows)
        super().keep_path(rows)

    def clear(self) -> None:
        super().clear()
        for state in self.recurrent:
            state.clear()
        self.base = 0

    @property
    def nbytes(self) -> int:
        return super().nbytes + sum(state.nbytes for state in self.recurrent)
