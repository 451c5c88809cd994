"""DDTree, the dynamic draft tree (reference §15): lucebox's `build_ddtree` (server/src/common/ddtree.cpp, a port
of liranringel/ddtree's `build_ddtree_tree`), node for node.

From one drafter pass, the per-position top-K log-probabilities lp[d][r] (depth d + 1, rank r, ranks sorted by
log-probability descending) give every path a weight, the sum of its nodes' log-probabilities. Under a budget of
B non-root nodes:

    chain seed: the top-1 chain to depth min(L, B) is added first; each chain node's rank-1 sibling goes on a heap
    best-first: pop the heaviest entry (depth d, rank r under parent p) and add it as the next node; push its next
                sibling (rank r + 1, weight - lp[d][r] + lp[d][r + 1]) and, below depth L, its first child (rank 0,
                weight + lp[d + 1][0]); stop at B nodes or an empty heap

Nodes are numbered in the order they are added (row 0 is the root, the step's anchor), so a parent's number is
below its children's; lucebox's comments call this "DFS order", but it is the expansion order, as in
liranringel's code. Weights are float32 and summed in lucebox's order; the heap is libstdc++'s std::priority_queue
(push_heap / pop_heap), so entries of equal weight leave it in lucebox's order too. The visibility matrix is
ancestor-only: row i sees the root, its ancestors and itself.

After the target has verified the flattened tree, `follow_verified_tree` walks it from the root by the target's
token at each row (its argmax, or its sampler's draw): the accepted path and the bonus token (lucebox's `follow_verified_tree`).

`top_k_log_probs` is lucebox's `extract_draft_topk` at temperature 1 (log-softmax of each row, its K largest,
ties to the lower token id); `default_top_k` is lucebox's choice of K (8 when the budget exceeds the depth, else 1).
"""

from dataclasses import dataclass

import numpy as np

LUCEBOX_TOP_K = 8       # lucebox's K when the budget exceeds the tree's depth (qwen35_backend.cpp)
LUCEBOX_BUDGET = 22     # lucebox's default --ddtree-budget


@dataclass
class DraftTree:
    """A flattened draft tree: row 0 the root, rows 1..n_nodes the nodes in expansion order."""
    tokens: list[int]               # token of each node (row i + 1)
    depths: list[int]               # depth of each node, 1..L
    parents: list[int]              # parent row of each row; parents[0] = -1 (the root)
    children: list[dict]            # per row: {token id: child row}
    visibility: np.ndarray          # (1 + n_nodes)^2 bool: row i sees row j (ancestors and itself)

    @property
    def n_nodes(self) -> int:
        return len(self.tokens)

    @classmethod
    def chain(cls, tokens: list[int]) -> "DraftTree":
        """A chain as a tree to walk: node i + 1 the only child of row i (no visibility: a chain is verified as one)."""
        return cls(tokens=list(tokens), depths=list(range(1, len(tokens) + 1)), parents=list(range(-1, len(tokens))),
                   children=[{t: i + 1} for i, t in enumerate(tokens)] + [{}], visibility=None)

    @classmethod
    def root_only(cls) -> "DraftTree":
        return cls(tokens=[], depths=[], parents=[-1], children=[{}], visibility=np.ones((1, 1), bool))


def default_top_k(budget: int, depth: int) -> int:
    """lucebox's K: LUCEBOX_TOP_K when the budget exceeds the block's depth L (its drafts per step), else 1 (the
    tree is the top-1 chain)."""
    return LUCEBOX_TOP_K if budget > depth else 1


def most_tree_nodes(k: int, depth: int, cap: int) -> int:
    """The most nodes build_tree can add from `depth` positions of k ranks, or cap + 1 when that is more than cap:
    each node of depth d < depth gets the k ranks of position d + 1 as children, so there are k^d nodes at depth
    d, k + k^2 + ... + k^depth in all (depth for k = 1: the top-1 chain). Counted up to cap only, so a huge depth
    or k costs nothing."""
    if k == 1:
        return min(depth, cap + 1)
    total, level = 0, 1
    for _ in range(depth):
        level *= k
        total += level
        if total > cap:
            return cap + 1
    return total


def top_k_log_probs(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k largest log-softmax values (float32) and their ids (int32), by value descending, ties to the
    lower id. logits: (L, V) with V >= k finite entries per row."""
    logits = np.asarray(logits, np.float32)
    wide = logits.astype(np.float64)
    top = wide.max(axis=1, keepdims=True)
    log_z = top + np.log(np.exp(wide - top).sum(axis=1, keepdims=True))
    ids = np.empty((len(logits), k), np.int32)
    for i, row in enumerate(logits):
        part = np.argpartition(-row, k - 1)[:k] if k < row.size else np.arange(row.size)
        threshold = row[part].min()
        above = np.flatnonzero(row > threshold)
        chosen = np.concatenate([above, np.flatnonzero(row == threshold)[:k - above.size]])
        ids[i] = chosen[np.lexsort((chosen, -row[chosen]))]
    log_probs = (np.take_along_axis(wide, ids.astype(np.int64), axis=1) - log_z).astype(np.float32)
    return log_probs, ids


def build_tree(top_log_probs: np.ndarray, top_ids: np.ndarray, budget: int, chain_seed: bool = True) -> DraftTree:
    """lucebox's build_ddtree: top_log_probs, top_ids (L, K), rank 0 the most likely; budget: non-root nodes."""
    lp = np.asarray(top_log_probs, np.float32)
    ids = np.asarray(top_ids)
    depth_limit, k = lp.shape
    tree = DraftTree.root_only()
    if budget <= 0 or depth_limit <= 0:
        return tree

    def add(token: int, depth: int, parent: int) -> int:
        row = len(tree.parents)
        tree.tokens.append(int(token))
        tree.depths.append(depth)
        tree.parents.append(parent)
        tree.children.append({})
        tree.children[parent][int(token)] = row
        return row

    # an entry: (weight, depth, rank, parent row); the queue ranks it by -weight, as lucebox's HeapCmp
    heap = StdPriorityQueue(lambda a, b: -a[0] > -b[0])
    if chain_seed:
        weight, parent = np.float32(0.0), 0
        for d in range(1, min(depth_limit, budget) + 1):
            weight = weight + lp[d - 1, 0]
            row = add(ids[d - 1, 0], d, parent)
            if k > 1:
                heap.push((weight - lp[d - 1, 0] + lp[d - 1, 1], d, 1, parent))
            parent = row
    else:
        heap.push((lp[0, 0], 1, 0, 0))
    while heap and tree.n_nodes < budget:
        weight, depth, rank, parent = heap.pop()
        row = add(ids[depth - 1, rank], depth, parent)
        if rank + 1 < k:
            heap.push((weight - lp[depth - 1, rank] + lp[depth - 1, rank + 1], depth, rank + 1, parent))
        if depth < depth_limit:
            heap.push((weight + lp[depth, 0], depth + 1, 0, row))
    tree.visibility = ancestor_visibility(tree.parents)
    return tree


def ancestor_visibility(parents) -> np.ndarray:
    """(N, N) bool: row i sees row j when j is i or one of its ancestors (parents[i] < i, parents[0] = -1)."""
    n = len(parents)
    visible = np.zeros((n, n), bool)
    visible[0, 0] = True
    for i in range(1, n):
        visible[i, :i] = visible[parents[i], :i]
        visible[i, i] = True
    return visible


def follow_verified_tree(tree: DraftTree, target_token, stop_ids=()) -> tuple[list[int], int]:
    """Walk the verified tree from the root: while the target's token at the current row (target_token(row): its
    argmax, or its sampler's draw) is one of its children, step to that child; a stop token ends the walk. Returns
    (the accepted rows, root first; the bonus token: the target's token at the last accepted row)."""
    row, accepted = 0, [0]
    token = target_token(row)
    while token not in stop_ids and token in tree.children[row]:
        row = tree.children[row][token]
        accepted.append(row)
        token = target_token(row)
    return accepted, token


class StdPriorityQueue:
    """std::priority_queue over a vector as libstdc++ implements it (push_heap, pop_heap with __adjust_heap), so
    that entries the comparison cannot order leave it in the same order as in a GCC build. less(a, b): a ranks
    below b (the top is the greatest)."""

    def __init__(self, less):
        self.items, self.less = [], less

    def __len__(self) -> int:
        return len(self.items)

    def push(self, value) -> None:
        self.items.append(value)
        self._push_heap(len(self.items) - 1, 0, value)

    def pop(self):
        items = self.items
        top = items[0]
        if len(items) > 1:
            value, items[-1] = items[-1], items[0]
            self._adjust_heap(0, len(items) - 1, value)
        items.pop()
        return top

    def _push_heap(self, hole: int, top: int, value) -> None:
        items = self.items
        parent = (hole - 1) // 2
        while hole > top and self.less(items[parent], value):
            items[hole] = items[parent]
            hole = parent
            parent = (hole - 1) // 2
        items[hole] = value

    def _adjust_heap(self, hole: int, length: int, value) -> None:
        items, top, child = self.items, hole, hole
        while child < (length - 1) // 2:
            child = 2 * (child + 1)
            if self.less(items[child], items[child - 1]):
                child -= 1
            items[hole] = items[child]
            hole = child
        if length % 2 == 0 and child == (length - 2) // 2:
            child = 2 * (child + 1)
            items[hole] = items[child - 1]
            hole = child - 1
        self._push_heap(hole, top, value)
