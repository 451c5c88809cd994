"""Speculative decoding with a draft tree (DDTree, DraftSettings.tree_budget): the output equals the target's greedy
decoding, always, and a tree of K = 1 with the budget n_max is the chain, exactly.

- The embedded demo pair (DFlash v1, both draft KVs) and its trained DSpark drafters (anchor-first and bonus
  anchor, llama.cpp's conversions), tree budgets 1, 4, 22, 64; the chain's steps equal the K = 1 tree's.
- Every target architecture (llama, qwen3, qwen3moe, gpt-oss, qwen35, qwen35moe, kimi-k3) with a drafter that
  knows the greedy continuation but ranks it anywhere in its top K (or leaves it out), so that the tree accepts
  along side branches: the recurrent states of the hybrids (Gated DeltaNet, KDA) follow paths off the chain. Also
  the tiny DFlash v1 / DFlash2 drafters of the hybrid targets, kimi-k3's DFlash v1 / DFlash2 / DSpark drafters
  (alone and behind a knowing drafter, so that their draft KV takes the features of side branches), and the torch
  backend (float32: numba's bits, so its output equals the same greedy decoding).
- The settings a tree refuses.
"""

import types

import numpy as np
import pytest

from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.runtime import Drafter, TargetModel, Tokenizer, greedy
from ggtools.runtime.errors import SettingsError
from ggtools.runtime.speculative import DraftSettings, check_settings, speculative_generate, tree_top_k
from ggtools.runtime.stats import acceptance_stats

EOS = 2046
N = 40
BUDGETS = [1, 4, 22, 64]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo")
    target = TargetModel(demo_data() / "target.gguf", threads=1)
    paths = {v.name: v.path for v in build_drafters(work, str(demo_data() / "target.gguf"))}
    drafter = Drafter(paths["f16"], target)
    prompts = [ids for _, ids in held_out_prompts(Tokenizer.from_gguf(target.weights.meta), 3, 96)]
    reference = []
    for p in prompts:
        target.kv.clear()
        reference.append(greedy(target, p, N, {EOS})[0])
    yield target, drafter, prompts, reference
    drafter.close()
    target.close()


def decode(target, drafter, prompts, settings, ring_cap=64, kv=None, n=N, stop=(EOS,)):
    kv = kv or drafter.new_kv(ring_cap)
    return [speculative_generate(target, drafter, kv, p, n, set(stop), settings) for p in prompts]


def mean_length(outs):
    return acceptance_stats([o.steps for o in outs], 8)["mean_accepted_length_incl_bonus"]


@pytest.mark.parametrize("budget", BUDGETS)
@pytest.mark.parametrize("ring_cap", [64, None])
def test_demo_pair_tree_equals_greedy(demo, budget, ring_cap):
    target, drafter, prompts, reference = demo
    outs = decode(target, drafter, prompts, DraftSettings(tree_budget=budget), ring_cap)
    assert [o.tokens for o in outs] == reference
    steps = [s for o in outs for s in o.steps]
    assert all(sum(s.produced for s in o.steps) + 1 == len(o.tokens) for o in outs)
    assert max(s.drafted for s in steps) == min(budget, 7) if budget <= 7 else max(s.drafted for s in steps) <= budget
    assert max(s.accepted for s in steps) <= 7


def test_demo_pair_tree_lengthens_the_accepted_length(demo):
    target, drafter, prompts, reference = demo
    chain = mean_length(decode(target, drafter, prompts, DraftSettings()))
    lengths = {b: mean_length(decode(target, drafter, prompts, DraftSettings(tree_budget=b))) for b in (22, 64)}
    print(f"demo pair: chain AL {chain:.3f}, tree 22 {lengths[22]:.3f}, tree 64 {lengths[64]:.3f}")
    assert chain < lengths[22] <= lengths[64]


@pytest.mark.parametrize("n_max", [7, 3])
def test_k1_tree_of_budget_n_max_is_the_chain(demo, n_max):
    target, drafter, prompts, _ = demo
    chain = decode(target, drafter, prompts, DraftSettings(n_max=n_max))
    tree = decode(target, drafter, prompts, DraftSettings(n_max=n_max, tree_budget=n_max, tree_top_k=1))
    lucebox_k = decode(target, drafter, prompts, DraftSettings(n_max=n_max, tree_budget=n_max))   # K = 1 by default
    assert [o.steps for o in tree] == [o.steps for o in chain] == [o.steps for o in lucebox_k]
    assert [o.tokens for o in tree] == [o.tokens for o in chain]


def test_top_k_defaults_to_lucebox_rule(demo):
    _, drafter, _, _ = demo
    assert tree_top_k(drafter, DraftSettings(tree_budget=22), 7) == 8
    assert tree_top_k(drafter, DraftSettings(tree_budget=7), 7) == 1
    assert tree_top_k(drafter, DraftSettings(tree_budget=22, tree_top_k=3), 7) == 3


@pytest.mark.parametrize("name", ["dspark-anchor", "dspark-speculators"])
def test_dspark_tree_equals_greedy_and_k1_is_the_chain(demo, dspark_demo, name):
    target, _, prompts, reference = demo
    drafter = Drafter(dspark_demo[name], target)
    try:
        n_max = drafter.max_drafts
        for budget in (4, 22):
            outs = decode(target, drafter, prompts, DraftSettings(tree_budget=budget))
            assert [o.tokens for o in outs] == reference
        chain = decode(target, drafter, prompts, DraftSettings())
        tree = decode(target, drafter, prompts, DraftSettings(tree_budget=n_max, tree_top_k=1))
        assert [o.steps for o in tree] == [o.steps for o in chain]
    finally:
        drafter.close()


def test_tree_settings_are_refused(demo, tiny_target, ref_drafter_gguf, dspark_drafters):
    target, drafter, _, _ = demo
    for settings, match in [
            (DraftSettings(tree_budget=22, cut="margin", p_min=0.35), "--cut margin"),
            (DraftSettings(tree_budget=22, n_min=1), "--n-min 1"),
            (DraftSettings(tree_budget=0), "at least one node"),
            (DraftSettings(tree_top_k=4), "needs --tree-budget"),
            (DraftSettings(tree_budget=22, tree_top_k=2049), r"1\.\.2048")]:
        with pytest.raises(SettingsError, match=match):
            check_settings(drafter, settings)
    check_settings(drafter, DraftSettings(tree_budget=22, tree_top_k=2048))
    tiny = TargetModel(tiny_target.gguf["f16"], threads=1)
    try:
        v2 = Drafter(ref_drafter_gguf(2, "f16"), tiny)
        limit = v2.selector.top_k
        with pytest.raises(SettingsError, match=f"DFlash2 drafter: its lattice scores {limit} candidates"):
            check_settings(v2, DraftSettings(tree_budget=22, tree_top_k=limit + 1))
        check_settings(v2, DraftSettings(tree_budget=22, tree_top_k=limit))
        reduced = Drafter(dspark_drafters("bonus-reduced", "f16"), tiny)
        with pytest.raises(SettingsError, match=f"vocabulary of {len(reduced.d2t)} tokens"):
            check_settings(reduced, DraftSettings(tree_budget=22, tree_top_k=len(reduced.d2t) + 1))
        with pytest.raises(SettingsError, match="--cut confidence"):
            check_settings(reduced, DraftSettings(tree_budget=22, cut="confidence", p_min=0.5))
    finally:
        tiny.close()


# ---- every architecture: a drafter that knows the answer and ranks it anywhere ----------------------------------

class NullKV:
    """A draft KV for a drafter that needs no context."""
    committed = nbytes = 0

    def reset(self):
        self.committed = 0

    def begin_step(self, committed, features, tokens=None):
        self.committed = committed


class KnowingTreeDrafter:
    """Per position, K distinct tokens with falling log-probabilities; the target's greedy token among them at a
    random rank (rank 0 in about half the positions, missing in a fifth), so a tree accepts along side branches
    where the chain (rank 0) stops. The same distributions whatever K (a K = 1 tree and the chain agree)."""

    taps = [1]
    block_size, max_drafts = 8, 7
    tree_top_k_limit = 8

    def __init__(self, prompt_len, want, vocab, seed=0, drafter=None):
        """drafter: a real drafter whose block runs first on the draft KV (its distributions are not used), so the
        draft KV takes the features of paths off the chain."""
        self.prompt_len, self.want, self.vocab, self.seed, self.drafter = prompt_len, want, vocab, seed, drafter
        if drafter:
            self.taps, self.block_size, self.max_drafts = drafter.taps, drafter.block_size, drafter.max_drafts

    def draft_top_k(self, kv, anchor, n_drafts, k):
        if self.drafter:
            self.drafter.draft_top_k(kv, anchor, n_drafts, min(k, self.drafter.tree_top_k_limit))
        start = kv.committed - self.prompt_len + 1           # want's index of the first drafted position
        ids = np.empty((n_drafts, self.tree_top_k_limit), np.int64)
        for d in range(n_drafts):
            rng = np.random.default_rng([self.seed, start + d])
            truth = self.want[start + d] if start + d < len(self.want) else -1
            row = [t for t in rng.choice(self.vocab, 12, replace=False).tolist() if t != truth]
            u = rng.random()
            if u < 0.8 and truth >= 0:
                rank = 0 if u < 0.45 else int(rng.integers(1, self.tree_top_k_limit))
                row.insert(rank, truth)
            ids[d] = row[:self.tree_top_k_limit]
        log_probs = -np.cumsum(np.random.default_rng([self.seed, start, 1]).uniform(0.2, 1.5, ids.shape), axis=1)
        return log_probs[:, :k].astype(np.float32), ids[:, :k]

    def draft(self, kv, anchor, n_drafts):
        return types.SimpleNamespace(tokens=self.draft_top_k(kv, anchor, n_drafts, 1)[1][:, 0].tolist())


ARCHS = {
    "llama-smollm2": lambda get: get("smollm2_path"),
    "qwen3": lambda get: get("tiny_target").gguf["f16"],
    "qwen3moe": lambda get: get("qwen3moe_target").gguf["Q8_0"],
    "gpt-oss": lambda get: get("gpt_oss_target").gguf["MXFP4_MOE"],
    "qwen35": lambda get: get("qwen35_target").gguf["f16"],
    "qwen35moe": lambda get: get("qwen35moe_target").gguf["mxfp4_moe"],
    "kimi-k3": lambda get: get("kimi_k3_target").gguf["q8_0"],
}


@pytest.mark.oracle
@pytest.mark.parametrize("arch", [pytest.param(a, marks=pytest.mark.slow) if a == "llama-smollm2" else a
                                  for a in ARCHS])
def test_every_arch_tree_equals_greedy(request, arch):
    """The prompt plus output pass the hybrids' recurrent rollback window (64) and gpt-oss's sliding window (16)."""
    model = TargetModel(ARCHS[arch](request.getfixturevalue), threads=2)
    try:
        prompts = [[1] + np.random.default_rng(seed).integers(3, 1000, 44).tolist() for seed in range(1)]
        n = 40
        accepted = {}
        for i, prompt in enumerate(prompts):
            model.kv.clear()
            want, _ = greedy(model, prompt, n)
            knowing = KnowingTreeDrafter(len(prompt), want, min(model.n_vocab, 1000), seed=i)
            chain = speculative_generate(model, knowing, NullKV(), prompt, n)
            assert chain.tokens == want
            k1 = speculative_generate(model, knowing, NullKV(), prompt, n, settings=DraftSettings(tree_budget=7,
                                                                                                  tree_top_k=1))
            assert k1.steps == chain.steps
            accepted.setdefault("chain", []).extend(s.accepted for s in chain.steps)
            for budget in BUDGETS:
                out = speculative_generate(model, knowing, NullKV(), prompt, n,
                                           settings=DraftSettings(tree_budget=budget))
                assert out.tokens == want, (arch, budget)
                accepted.setdefault(budget, []).extend(s.accepted for s in out.steps)
        mean = {key: np.mean(v) for key, v in accepted.items()}
        print(arch, {key: round(float(v), 2) for key, v in mean.items()})
        assert mean[64] > mean["chain"] and mean[22] > mean["chain"]     # accepted along side branches
    finally:
        model.close()


@pytest.mark.oracle
@pytest.mark.parametrize("arch, version", [("qwen35", "v1"), ("qwen35moe", "v2"),
                                           pytest.param("qwen35", "v2", marks=pytest.mark.slow),
                                           pytest.param("qwen35moe", "v1", marks=pytest.mark.slow)])
def test_hybrid_real_drafters_tree_equals_greedy(request, arch, version):
    target = request.getfixturevalue(f"{arch}_target")
    model = TargetModel(target.gguf["f16" if arch == "qwen35" else "mxfp4_moe"], threads=2)
    drafter = Drafter(target.drafter_refs[version], model)
    try:
        prompt = [1] + np.random.default_rng(9).integers(3, 1000, 30).tolist()
        model.kv.clear()
        want, _ = greedy(model, prompt, 40)
        for budget, ring_cap in [(4, 8), (22, None), (64, 8)]:
            out = speculative_generate(model, drafter, drafter.new_kv(ring_cap), prompt, 40,
                                       settings=DraftSettings(tree_budget=budget))
            assert out.tokens == want, (budget, ring_cap)
        chain = speculative_generate(model, drafter, drafter.new_kv(8), prompt, 40)
        k1 = speculative_generate(model, drafter, drafter.new_kv(8), prompt, 40,
                                  settings=DraftSettings(tree_budget=drafter.max_drafts, tree_top_k=1))
        assert k1.steps == chain.steps
    finally:
        drafter.close()
        model.close()


def test_torch_backend_tree_equals_greedy(demo):
    pytest.importorskip("torch")
    _, _, prompts, reference = demo
    target = TargetModel(demo_data() / "target.gguf", backend="torch", threads=1)
    drafter = Drafter(demo[1].path, target)
    try:
        for budget in (4, 22):
            outs = decode(target, drafter, prompts[:2], DraftSettings(tree_budget=budget))
            assert [o.tokens for o in outs] == reference[:2]
    finally:
        drafter.close()
        target.close()


@pytest.mark.oracle
def test_torch_hybrid_tree_with_side_branches(qwen35_target):
    """The torch backend's Gated DeltaNet along paths off the chain, in float32 (numba's bits): the output equals
    numba's greedy decoding, near ties or not."""
    pytest.importorskip("torch")
    path = qwen35_target.gguf["f32"]
    model = TargetModel(path, backend="torch", kv_type="f32", threads=1)
    try:
        prompt = [1] + np.random.default_rng(0).integers(3, 1000, 30).tolist()
        numba = TargetModel(path, kv_type="f32", threads=2)
        want, _ = greedy(numba, prompt, 32)
        numba.close()
        knowing = KnowingTreeDrafter(len(prompt), want, 1000)
        for budget in (4, 22):
            out = speculative_generate(model, knowing, NullKV(), prompt, 32, settings=DraftSettings(tree_budget=budget))
            assert out.tokens == want
    finally:
        model.close()

K3_DRAFTERS = ["dflash-v1", "dflash-v2", "dspark-anchor-conf", "dspark-bonus-reduced"]


@pytest.fixture(scope="module")
def kimi_k3_greedy(kimi_k3_target):
    """The tiny kimi-k3 target's f16 file, a prompt and its greedy continuation (numba, one-token steps)."""
    path = kimi_k3_target.gguf["f16"]
    model = TargetModel(path, threads=2)
    prompt = [1] + np.random.default_rng(9).integers(3, 1000, 30).tolist()
    want, _ = greedy(model, prompt, 40)
    model.close()
    return path, prompt, want


@pytest.mark.oracle
@pytest.mark.parametrize("backend, name", [("numba", name) for name in K3_DRAFTERS] + [
    pytest.param("torch", name, marks=pytest.mark.slow) for name in K3_DRAFTERS])
def test_kimi_k3_drafters_tree_equals_greedy(kimi_k3_greedy, kimi_k3_drafters, kimi_k3_dspark, backend, name):
    """kimi-k3's tiny drafters (converted by llama.cpp's converter; they tap a KDA and an MLA layer's input) with
    trees of budget 1, 4, 22, 64, each alone (random tiny drafters: their trees are rarely accepted) and behind a
    knowing drafter (paths off the chain accepted: KDA states kept by keep_path, the draft KV fed the side branch's
    features), ring 8 and full draft KV; the K = 1 tree of n_max is the chain. torch in float32 (numba's bits): the
    same greedy output (torch about 100 s a drafter on CPU: slow; test_tree_verify's torch rows, bit-identical to
    numba's, run by default). The prompt plus output pass the recurrent rollback window (64)."""
    if backend == "torch":
        pytest.importorskip("torch")
    path, prompt, want = kimi_k3_greedy
    n = len(want) if backend == "numba" else 24
    family, variant = name.split("-", 1)
    refs = (kimi_k3_drafters if family == "dflash" else kimi_k3_dspark)["refs"]
    model = TargetModel(path, backend=backend, threads=2 if backend == "numba" else 1)
    drafter = Drafter(refs[variant], model)
    try:
        accepted = 0
        for i, budget in enumerate(BUDGETS):
            ring_cap = 8 if i % 2 == 0 else None
            out = speculative_generate(model, drafter, drafter.new_kv(ring_cap), prompt, n,
                                       settings=DraftSettings(tree_budget=budget))
            assert out.tokens == want[:n], (budget, ring_cap)
            knowing = KnowingTreeDrafter(len(prompt), want, 1000, seed=i, drafter=drafter)
            out = speculative_generate(model, knowing, drafter.new_kv(ring_cap), prompt, n,
                                       settings=DraftSettings(tree_budget=budget))
            assert out.tokens == want[:n], (budget, ring_cap)
            accepted += sum(s.accepted for s in out.steps)
        assert accepted > 0
        chain = speculative_generate(model, drafter, drafter.new_kv(8), prompt, n)
        k1 = speculative_generate(model, drafter, drafter.new_kv(8), prompt, n,
                                  settings=DraftSettings(tree_budget=drafter.max_drafts, tree_top_k=1))
        assert k1.steps == chain.steps and chain.tokens == want[:n]
    finally:
        drafter.close()
        model.close()
