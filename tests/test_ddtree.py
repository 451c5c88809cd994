"""DDTree's tree (runtime/ddtree.py) against independent transcriptions of the reference algorithm (lucebox's
build_ddtree in server/src/common/ddtree.cpp, a port of liranringel/ddtree's build_ddtree_tree), written here
from the algorithm and sharing no code with the runtime:

- in Python (heapq, float32 weights summed as the algorithm sums them), on random distributions (no ties):
  identical tokens, parents, depths and visibility, with and without the chain seed, budgets 1..80;
- in C++ with libstdc++'s std::priority_queue (`oracle`: needs g++), on distributions full of exact ties, where
  only the heap's own order decides: identical trees, node for node; and the runtime's heap against
  std::priority_queue on a random push / pop sequence of tied keys.

Plus the top-K extraction, following the verified tree, and budget = depth with K = 1 giving the chain.
"""

import heapq
import shutil
import subprocess

import numpy as np
import pytest

from ggtools.runtime.ddtree import (StdPriorityQueue, build_tree, default_top_k, follow_verified_tree,
                                    top_k_log_probs)


def reference_tree(lp, ids, budget, chain_seed=True):
    """The reference algorithm, transcribed: returns (tokens, depths, parents incl. the root's -1)."""
    lp = np.asarray(lp, np.float32)
    depth_limit, k = lp.shape
    tokens, depths, parents = [], [], [-1]
    if budget <= 0 or depth_limit <= 0:
        return tokens, depths, parents
    queue, order = [], 0

    def push(weight, depth, rank, parent):
        nonlocal order
        heapq.heappush(queue, (-float(weight), order, np.float32(weight), depth, rank, parent))
        order += 1

    if chain_seed:
        cumulative, parent = np.float32(0), 0
        for depth in range(1, min(depth_limit, budget) + 1):
            cumulative = np.float32(cumulative + lp[depth - 1][0])
            tokens.append(int(ids[depth - 1][0]))
            depths.append(depth)
            parents.append(parent)
            if k > 1:
                push(np.float32(np.float32(cumulative - lp[depth - 1][0]) + lp[depth - 1][1]), depth, 1, parent)
            parent = len(tokens)
    else:
        push(lp[0][0], 1, 0, 0)
    while queue and len(tokens) < budget:
        _, _, weight, depth, rank, parent = heapq.heappop(queue)
        tokens.append(int(ids[depth - 1][rank]))
        depths.append(depth)
        parents.append(parent)
        me = len(tokens)
        if rank + 1 < k:
            push(np.float32(np.float32(weight - lp[depth - 1][rank]) + lp[depth - 1][rank + 1]), depth, rank + 1,
                 parent)
        if depth < depth_limit:
            push(np.float32(weight + lp[depth][0]), depth + 1, 0, me)
    return tokens, depths, parents


def reference_visibility(parents):
    n = len(parents)
    out = np.zeros((n, n), bool)
    for i in range(n):
        j = i
        while j >= 0:
            out[i, j] = True
            j = parents[j]
    return out


def random_distributions(rng, depth, k, vocab=500):
    """Per depth: k distinct token ids and their log-probabilities, sorted descending (random logits' top k)."""
    logits = rng.standard_normal((depth, vocab)) * rng.uniform(0.5, 4)
    log_probs = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
    order = np.argsort(-log_probs, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(log_probs, order, axis=1).astype(np.float32), order


@pytest.mark.parametrize("chain_seed", [True, False])
def test_tree_equals_the_reference_on_random_distributions(chain_seed):
    rng = np.random.default_rng(25)
    shapes = 0
    for trial in range(400):
        depth, k = int(rng.integers(1, 12)), int(rng.integers(1, 10))
        budget = [1, 4, 22, 64][trial % 4] if trial < 200 else int(rng.integers(1, 81))
        lp, ids = random_distributions(rng, depth, k)
        tree = build_tree(lp, ids, budget, chain_seed=chain_seed)
        tokens, depths, parents = reference_tree(lp, ids, budget, chain_seed)
        assert tree.tokens == tokens and tree.depths == depths and tree.parents == parents, (trial, depth, k, budget)
        assert np.array_equal(tree.visibility, reference_visibility(parents))
        assert tree.n_nodes == min(budget, sum(k ** d for d in range(1, depth + 1)))
        for row, token in enumerate(tree.tokens, 1):
            assert tree.children[tree.parents[row]][token] == row
        shapes += tree.n_nodes > depth
    assert shapes > 200       # most trees branch


def test_budget_at_most_the_depth_with_one_rank_is_the_top1_chain():
    rng = np.random.default_rng(1)
    lp, ids = random_distributions(rng, 7, 1)
    tree = build_tree(lp, ids, 7)
    assert tree.tokens == ids[:, 0].tolist() and tree.parents == list(range(-1, 7)) and tree.depths == list(range(1, 8))
    assert build_tree(lp, ids, 4).tokens == ids[:4, 0].tolist()
    assert default_top_k(22, 15) == 8 and default_top_k(15, 15) == 1 and default_top_k(4, 7) == 1
    empty = build_tree(lp, ids, 0)
    assert empty.n_nodes == 0 and empty.parents == [-1] and empty.visibility.tolist() == [[True]]


def test_top_k_log_probs():
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((5, 300)).astype(np.float32)
    logits[2, [7, 40, 90]] = 9.0                     # a three-way tie at the top: lower ids first
    logits[3, 100:] = -np.inf                        # a reduced vocabulary's row
    lp, ids = top_k_log_probs(logits, 6)
    wide = logits.astype(np.float64)
    top = wide.max(1, keepdims=True)
    log_softmax = wide - (top + np.log(np.exp(wide - top).sum(1, keepdims=True)))
    for i in range(5):
        want = sorted(range(300), key=lambda j: (-logits[i, j], j))[:6]
        assert ids[i].tolist() == want
        # float32 log-probabilities against float64: |lp| < 8 here, where float32's spacing is 4.8e-7; two spacings
        # for the rounding of the result and of the float32 log-sum-exp (measured: 2.4e-7)
        assert np.allclose(lp[i], log_softmax[i, want], rtol=0, atol=1e-6)
        assert lp.dtype == np.float32 and np.all(np.diff(lp[i]) <= 0)
    assert ids[2, :3].tolist() == [7, 40, 90]
    assert ids[:, 0].tolist() == np.argmax(logits, axis=1).tolist()


def test_follow_verified_tree():
    #        0
    #      / | \
    #     1  2  3        tokens 10 11 12
    #     |     |
    #     4     5        tokens 20 21
    #     |
    #     6              token 30
    lp = np.zeros((3, 1), np.float32)
    tree = build_tree(lp, np.zeros((3, 1), np.int64), 0)
    tree.tokens, tree.depths, tree.parents = [10, 11, 12, 20, 21, 30], [1, 1, 1, 2, 2, 3], [-1, 0, 0, 0, 1, 3, 4]
    tree.children = [{10: 1, 11: 2, 12: 3}, {20: 4}, {}, {21: 5}, {30: 6}, {}, {}]
    posterior = np.array([12, 99, 98, 21, 77, 55, 66])
    assert follow_verified_tree(tree, lambda r: int(posterior[r])) == ([0, 3, 5], 55)
    assert follow_verified_tree(tree, [10, 20, 0, 0, 30, 0, 44].__getitem__) == ([0, 1, 4, 6], 44)
    assert follow_verified_tree(tree, [13, 0, 0, 0, 0, 0, 0].__getitem__) == ([0], 13)


# ---- libstdc++'s heap: a C++ transcription of the algorithm, compiled ---------------------------------------------

CPP_TREE = r"""
#include <cstdio>
#include <queue>
#include <vector>
struct Entry { float neg; float w; int depth, rank, parent; };
struct Less { bool operator()(const Entry & a, const Entry & b) const { return a.neg > b.neg; } };
int main() {
    int n_cases; std::scanf("%d", &n_cases);
    while (n_cases--) {
        int L, K, B, seed; std::scanf("%d %d %d %d", &L, &K, &B, &seed);
        std::vector<float> lp(L * K); std::vector<int> ids(L * K);
        for (auto & v : lp) std::scanf("%f", &v);
        for (auto & v : ids) std::scanf("%d", &v);
        std::vector<int> tok, dep, par{-1};
        std::priority_queue<Entry, std::vector<Entry>, Less> q;
        if (seed) {
            float w = 0; int p = 0;
            for (int d = 1; d <= (L < B ? L : B); d++) {
                w += lp[(d - 1) * K];
                tok.push_back(ids[(d - 1) * K]); dep.push_back(d); par.push_back(p);
                if (K > 1) { float s = w - lp[(d - 1) * K] + lp[(d - 1) * K + 1]; q.push({-s, s, d, 1, p}); }
                p = (int)tok.size();
            }
        } else { q.push({-lp[0], lp[0], 1, 0, 0}); }
        while (!q.empty() && (int)tok.size() < B) {
            Entry e = q.top(); q.pop();
            tok.push_back(ids[(e.depth - 1) * K + e.rank]); dep.push_back(e.depth); par.push_back(e.parent);
            int me = (int)tok.size();
            if (e.rank + 1 < K) {
                float s = e.w - lp[(e.depth - 1) * K + e.rank] + lp[(e.depth - 1) * K + e.rank + 1];
                q.push({-s, s, e.depth, e.rank + 1, e.parent});
            }
            if (e.depth < L) { float c = e.w + lp[e.depth * K]; q.push({-c, c, e.depth + 1, 0, me}); }
        }
        std::printf("%d", (int)tok.size());
        for (size_t i = 0; i < tok.size(); i++) std::printf(" %d %d %d", tok[i], dep[i], par[i + 1]);
        std::printf("\n");
    }
}
"""

CPP_HEAP = r"""
#include <cstdio>
#include <queue>
#include <vector>
struct Item { int key, id; };
struct Less { bool operator()(const Item & a, const Item & b) const { return a.key < b.key; } };
int main() {
    int n; std::scanf("%d", &n);
    std::priority_queue<Item, std::vector<Item>, Less> q;
    for (int i = 0; i < n; i++) {
        int op, key; std::scanf("%d %d", &op, &key);
        if (op) q.push({key, i}); else { std::printf("%d ", q.top().id); q.pop(); }
    }
    std::printf("\n");
}
"""


@pytest.fixture(scope="module")
def compile_cpp(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not installed (the libstdc++ oracle)")
    out = tmp_path_factory.mktemp("cpp")

    def build(name, source):
        (out / f"{name}.cpp").write_text(source)
        subprocess.run([compiler, "-O2", "-std=c++17", "-o", str(out / name), str(out / f"{name}.cpp")], check=True)
        return str(out / name)
    return build


@pytest.mark.oracle
def test_heap_order_equals_libstdcxx(compile_cpp):
    program = compile_cpp("heap", CPP_HEAP)
    rng = np.random.default_rng(3)
    ops, size = [], 0
    for _ in range(3000):
        push = size == 0 or rng.random() < 0.55
        ops.append((int(push), int(rng.integers(0, 6))))       # six keys: ties everywhere
        size += 1 if push else -1
    run = subprocess.run([program], input=f"{len(ops)}\n" + "\n".join(f"{a} {b}" for a, b in ops), text=True,
                         capture_output=True, check=True)
    queue, popped = StdPriorityQueue(lambda a, b: a[0] < b[0]), []
    for i, (push, key) in enumerate(ops):
        if push:
            queue.push((key, i))
        else:
            popped.append(queue.pop()[1])
    assert popped == [int(v) for v in run.stdout.split()]


@pytest.mark.oracle
@pytest.mark.parametrize("chain_seed", [True, False])
def test_tree_equals_libstdcxx_transcription_with_ties(compile_cpp, chain_seed):
    """Log-probabilities on a coarse grid (multiples of 1/4, exact in float32, sums exact too): many paths of equal
    weight, so the heap's handling of equal entries decides the tree."""
    program = compile_cpp("tree", CPP_TREE)
    rng = np.random.default_rng(4)
    cases = []
    for trial in range(300):
        depth, k = int(rng.integers(1, 9)), int(rng.integers(1, 7))
        budget = [1, 4, 22, 64][trial % 4]
        lp = -np.sort(rng.integers(0, 6, (depth, k)), axis=1).astype(np.float32) / 4
        ids = np.array([rng.choice(1000, k, replace=False) for _ in range(depth)])
        cases.append((lp, ids, budget))
    text = [str(len(cases))]
    for lp, ids, budget in cases:
        text.append(f"{lp.shape[0]} {lp.shape[1]} {budget} {int(chain_seed)}")
        text.append(" ".join(f"{v:.2f}" for v in lp.ravel()))
        text.append(" ".join(str(v) for v in ids.ravel()))
    run = subprocess.run([program], input="\n".join(text), text=True, capture_output=True, check=True)
    tied = 0
    for (lp, ids, budget), line in zip(cases, run.stdout.splitlines()):
        values = [int(v) for v in line.split()]
        want = np.array(values[1:]).reshape(-1, 3)
        tree = build_tree(lp, ids, budget, chain_seed=chain_seed)
        assert tree.tokens == want[:, 0].tolist() and tree.depths == want[:, 1].tolist()
        assert tree.parents[1:] == want[:, 2].tolist()
        tied += tree.parents != reference_tree(lp, ids, budget, chain_seed)[2]
    assert tied > 0      # the ties do decide (heapq's order differs from libstdc++'s on some trees)
