"""TreeBatch: the rows of a tree verify (DDTree, runtime/ddtree.py) as the target runs them in one forward.

Row 0 is the root (the step's anchor) at cache position `start`; row i > 0 has a parent row parents[i] < i and sits
at position start + depth[i]. Row i sees the cache's positions 0..start-1 and its path from the root (its
ancestors and itself), nothing else: so its logits are those of one-token steps along that path. The rows' K/V are
written to cache rows start + i while the batch runs; `keep_path` (KVCache, HybridCache) then keeps the accepted
path's rows at positions start, start + 1, ... and the recurrent states after them.

A mixer that can run a tree batch says so with `tree_verify = True` and reads the batch from `kv.tree` (None for a
sequence batch): attention (and MLA over its latent cache) masks by path, each row's keys laid out as a one-token
step would see them (`path_layout`; numba's tree_attention_rows, torch's float32 attention), so the sums run in the
same order; a recurrent mixer (Gated DeltaNet, KDA) runs each row from its parent's state
(hybrid_cache.RecurrentState.walk_tree) and logs the rows' inputs so that keep_path can rebuild the accepted path's
state.
"""

import numpy as np


class TreeBatch:
    def __init__(self, parents, start: int):
        """parents: the parent row of each row, -1 for row 0 and only there, each below its child's row."""
        parents = np.asarray(parents, np.int64).reshape(-1)
        rows = np.arange(len(parents))
        if len(parents) == 0 or parents[0] != -1 or np.any(parents[1:] < 0) or np.any(parents[1:] >= rows[1:]):
            raise ValueError("tree parents must be -1 for row 0 and below each row's own index after it")
        self.parents, self.start = parents, start
        self.depths = np.zeros(len(parents), np.int64)
        for i in range(1, len(parents)):
            self.depths[i] = self.depths[parents[i]] + 1
        # paths[i, j]: the row at depth j on row i's path from the root (j <= depths[i]; -1 beyond)
        self.paths = np.full((len(parents), int(self.depths.max()) + 1), -1, np.int64)
        for i in range(len(parents)):
            row = i
            for j in range(self.depths[i], -1, -1):
                self.paths[i, j] = row
                row = parents[row]
        self._visible, self._layout = {}, None

    def __len__(self) -> int:
        return len(self.parents)

    @property
    def positions(self) -> np.ndarray:
        return self.start + self.depths

    def visible(self, window: int = 0) -> np.ndarray:
        """(rows, start + rows) bool: the cache rows each tree row attends to (a sliding window of n keeps the keys
        whose position lies within n of the row's)."""
        if window not in self._visible:
            n, start = len(self), self.start
            visible = np.zeros((n, start + n), bool)
            visible[:, :start] = True
            for i in range(n):
                visible[i, start + self.paths[i, :self.depths[i] + 1]] = True
            if window:
                key_positions = np.concatenate([np.arange(start), self.positions])
                visible &= self.positions[:, None] - key_positions[None] < window
            self._visible[window] = visible
        return self._visible[window]

    @property
    def width(self) -> int:
        """The keys of the deepest row's one-token step: start + the tree's depth + 1."""
        return self.start + int(self.depths.max()) + 1

    def path_layout(self) -> np.ndarray:
        """(rows, width) int64: the cache row at each key position of each row's one-token step (positions
        0..start-1 the cache's own, start + j its path's row at depth j); 0 beyond the row's own position (a
        masked key)."""
        if self._layout is None:
            layout = np.zeros((len(self), self.width), np.int64)
            layout[:, :self.start] = np.arange(self.start)
            for i in range(len(self)):
                layout[i, self.start:self.start + self.depths[i] + 1] = self.start + self.paths[i, :self.depths[i] + 1]
            self._layout = layout
        return self._layout
