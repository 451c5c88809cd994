"""Draft KV caches: the drafter's per-layer context K/V, `FullKV` (every committed position) and `RingKV`
(the last `cap` positions, lucebox's ring, reference §9).

Only committed positions (target-verified: prompt, accepted drafts, the anchor) ever enter a cache;
`begin_step(committed, features)` appends the rows the cache lacks, projecting them with the drafter
(`project(features, positions) -> [(k, v) per layer]`, batch-invariant, K normed and rotated at its
absolute position). A `committed` below what the cache holds is a rewind: the cache resets and is
rebuilt from the features given. The noise block's K/V of a step are written to scratch rows
(`write_noise`) and never become context. The stores are the drafter's backend's arrays (`zeros(shape, kv_type)`:
numpy, or torch tensors on the device); the bookkeeping (positions, slots, the ring's mask) stays on the host.

`visible(layer)` gives the stores and the rows to attend: the visible context in absolute-position order,
then the noise rows, which is what makes the attention independent of slot layout (draft_attention.py). K/V are stored as
f16 (lucebox's type; "f32" keeps them exact).
"""

import numpy as np

BULK_CHUNK = 1024      # rows projected per call when a large gap is filled (lucebox's bulk append)
STORE_TYPES = {"f16": np.float16, "f32": np.float32}
STORE_BYTES = {"f16": 2, "f32": 4}


def host_zeros(shape, kv_type: str) -> np.ndarray:
    return np.zeros(shape, STORE_TYPES[kv_type])


def _align(n: int, to: int) -> int:
    return -(-n // to) * to


class DraftKV:
    """What FullKV and RingKV share: stores of (rows, n_kv, d) per layer, the window, the noise rows."""

    def __init__(self, project, n_layer: int, n_kv: int, head_dim: int, block_size: int, kv_type: str = "f16",
                 zeros=host_zeros):
        if kv_type not in STORE_TYPES:
            raise ValueError(f"draft KV type must be one of {', '.join(STORE_TYPES)}, not {kv_type!r}")
        self.project = project
        self.n_layer, self.n_kv, self.head_dim, self.block_size = n_layer, n_kv, head_dim, block_size
        self.kv_type, self.zeros = kv_type, zeros
        self.k: list[np.ndarray] = []
        self.v: list[np.ndarray] = []
        self.committed = 0              # positions 0..committed-1 are context
        self.next_pos = 0               # first position not yet appended
        self._order = np.zeros(0, np.int64)     # visible context slots in position order
        self._positions = np.zeros(0, np.int64)
        self._noise = (np.zeros(0, np.int64), np.zeros(0, np.int64))   # noise slots, positions

    def _allocate(self, rows: int):
        shape = (rows, self.n_kv, self.head_dim)
        self.k = [self.zeros(shape, self.kv_type) for _ in range(self.n_layer)]
        self.v = [self.zeros(shape, self.kv_type) for _ in range(self.n_layer)]

    def reset(self) -> None:
        self.committed = self.next_pos = 0

    def begin_step(self, committed: int, features: np.ndarray, tokens=None) -> None:
        """Make positions [lo, committed) visible; features: the rows of positions
        [committed - len(features), committed), covering at least those not yet appended. tokens (the sequence so
        far, which an EAGLE3 / MTP draft KV pairs with the features) are not needed by a DFlash context."""
        if committed <= 0:
            raise ValueError("a draft step needs at least one committed position")
        if self.next_pos > committed:
            self.reset()
        lo = self.window_start(committed)
        start = max(self.next_pos, lo)
        first = committed - len(features)
        if first > start:
            raise ValueError(f"features from position {first} leave positions {start}..{first - 1} out")
        for p in range(start, committed, BULK_CHUNK):
            end = min(p + BULK_CHUNK, committed)
            self._append(p, self.project(features[p - first:end - first], np.arange(p, end)))
        self.committed = self.next_pos = committed
        self._order, self._positions = self._visible(lo, committed)
        self._noise = (np.zeros(0, np.int64), np.zeros(0, np.int64))

    def _append(self, first: int, rows) -> None:
        slots = self._slots(np.arange(first, first + len(rows[0][0])))
        for layer, (k, v) in enumerate(rows):
            self.k[layer][slots] = k
            self.v[layer][slots] = v

    def write_noise(self, layer: int, k: np.ndarray, v: np.ndarray) -> None:
        """The noise block's rows (positions committed, committed + 1, ...) for this step."""
        n = len(k)
        if n > self.block_size:
            raise ValueError(f"noise block of {n} rows exceeds the block size {self.block_size}")
        slots = self._noise_slots(n)
        self.k[layer][slots] = k
        self.v[layer][slots] = v
        self._noise = (slots, self.committed + np.arange(n))

    def visible(self, layer: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(k store, v store, rows, positions): the visible context rows in position order, then the noise rows."""
        return (self.k[layer], self.v[layer], np.concatenate([self._order, self._noise[0]]),
                np.concatenate([self._positions, self._noise[1]]))

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.k + self.v)

    @property
    def bytes_per_row(self) -> int:
        return 2 * self.n_layer * self.n_kv * self.head_dim * STORE_BYTES[self.kv_type]


class FullKV(DraftKV):
    """Every committed position, row = position; the noise block goes to the rows after the context
    (z-lab's cache: written during the step, cropped away after). Grows in steps of 256 rows."""

    GROW = 256

    def __init__(self, project, n_layer, n_kv, head_dim, block_size, kv_type="f16", zeros=host_zeros):
        super().__init__(project, n_layer, n_kv, head_dim, block_size, kv_type, zeros)
        self._allocate(self.GROW)

    def window_start(self, committed: int) -> int:
        return 0

    def _slots(self, positions):
        self._reserve(int(positions[-1]) + 1 + self.block_size)
        return positions

    def _noise_slots(self, n):
        return np.arange(self.committed, self.committed + n)

    def _reserve(self, rows):
        if rows <= len(self.k[0]):
            return
        old_k, old_v = self.k, self.v
        self._allocate(_align(rows, self.GROW))
        for layer in range(self.n_layer):
            self.k[layer][:len(old_k[layer])] = old_k[layer]
            self.v[layer][:len(old_v[layer])] = old_v[layer]

    def _visible(self, lo, committed):
        positions = np.arange(lo, committed)
        return positions, positions

    def bytes_for(self, context: int) -> int:
        """What this cache holds once a sequence reaches `context` positions."""
        return self.bytes_per_row * _align(context + self.block_size, self.GROW)


class RingKV(DraftKV):
    """lucebox's ring: `cap` context slots, slot = position % cap, rows [cap, cap + q) noise scratch,
    row cap + q a trash slot for padding rows (unused here: appends are exact), kv_total =
    align32(cap + q + 1) rows. Visibility is an explicit mask over the slots: 0 iff the slot's position
    lies in [committed - min(committed, cap), committed), -inf otherwise."""

    def __init__(self, project, n_layer, n_kv, head_dim, block_size, cap: int, kv_type="f16", zeros=host_zeros):
        if cap < 1:
            raise ValueError("ring capacity must be at least 1")
        super().__init__(project, n_layer, n_kv, head_dim, block_size, kv_type, zeros)
        self.cap = cap
        self.kv_total = _align(cap + block_size + 1, 32)
        self._allocate(self.kv_total)
        self.slot_pos = np.full(cap, -1, np.int64)
        self.mask = np.full(cap, -np.inf, np.float32)

    def reset(self) -> None:
        super().reset()
        self.slot_pos[:] = -1

    def window_start(self, committed: int) -> int:
        return committed - min(committed, self.cap)

    def _slots(self, positions):
        slots = positions % self.cap
        self.slot_pos[slots] = positions
        return slots

    def _noise_slots(self, n):
        return np.arange(self.cap, self.cap + n)

    def _visible(self, lo, committed):
        inside = (self.slot_pos >= lo) & (self.slot_pos < committed)
        self.mask[:] = np.where(inside, np.float32(0.0), np.float32(-np.inf))
        slots = np.flatnonzero(self.mask == 0)
        slots = slots[np.argsort(self.slot_pos[slots], kind="stable")]
        return slots, self.slot_pos[slots]
