"""Tree verify in the target (TargetModel.forward(..., tree=parents), kv.keep_path): on every architecture the
runtime runs (llama, qwen3, qwen3moe, gpt-oss with its sliding window and sinks, the Gated DeltaNet hybrids qwen35
and qwen35moe, kimi-k3 with KDA, MLA over its latent cache and the cross-layer residual attention), a DDTree's rows
give, bit for bit, the logits and feature taps of one-token steps along each row's path (numba), and keeping a path
then decoding on equals never having left it (the recurrent states rebuilt from the path's rows). The truth is the
runtime's own one-token step, which the parity tests prove bit for bit against libllama. The refusals of a misused
tree batch, and the torch backend in float32 (numba's arithmetic: its rows bit-identical to its own one-token steps
and to numba's rows).
"""

import numpy as np
import pytest

from ggtools.jobs.demo import demo_data
from ggtools.runtime import ModelError, TargetModel
from ggtools.runtime.ddtree import build_tree, top_k_log_probs

TAPS = [1, 2]


def random_tree(seed, depth=7, k=4, budget=22, vocab=1000):
    """A DDTree built from random distributions (its shape is what a drafter gives: a chain and side branches)."""
    rng = np.random.default_rng(seed)
    lp, ids = top_k_log_probs((rng.standard_normal((depth, vocab)) * 2).astype(np.float32), k)
    return build_tree(lp, ids + 3, budget)


def path_of(parents, row):
    path = []
    while row >= 0:
        path.append(row)
        row = parents[row]
    return path[::-1]


def check_rows_equal_one_token_steps(model, prompt, tree, anchor=5):
    """Every row of the tree batch against one-token steps along its path; then keep the longest path, decode one
    more token, and compare with decoding that path from scratch."""
    model.kv.clear()
    model.forward(prompt, logits="none")
    start = model.kv.n_tokens
    tokens = [anchor] + tree.tokens
    logits, features = model.forward(tokens, taps=TAPS, stepwise=True, tree=tree.parents)
    assert model.kv.n_tokens == start + len(tokens)
    for row in range(len(tokens)):
        model.kv.crop(start)
        for r in path_of(tree.parents, row):
            step_logits, step_features = model.forward([tokens[r]], taps=TAPS)
        assert np.array_equal(step_logits[0], logits[row]), row
        assert np.array_equal(step_features[0], features[row]), row
    off_chain = [path_of(tree.parents, r) for r in range(len(tokens))]
    path = max((p for p in off_chain if p != list(range(len(p)))), key=len)     # the deepest path off the chain
    assert len(path) > 2
    model.kv.crop(start)
    model.forward(tokens, stepwise=True, tree=tree.parents)
    model.kv.keep_path(path)
    assert model.kv.n_tokens == start + len(path)
    kept, _ = model.forward([7, 8], logits="all")
    model.kv.crop(start)
    model.forward([tokens[r] for r in path], logits="none", stepwise=True)   # the rows as a verify computes them
    direct, _ = model.forward([7, 8], logits="all")
    assert np.array_equal(kept, direct)


def prompt_of(seed, n, vocab):
    return [1] + np.random.default_rng(seed).integers(3, min(vocab, 1000), n - 1).tolist()


@pytest.fixture(scope="module")
def demo_target():
    model = TargetModel(demo_data() / "target.gguf", threads=1)
    yield model
    model.close()


def test_demo_target_rows_equal_one_token_steps(demo_target):
    check_rows_equal_one_token_steps(demo_target, prompt_of(0, 40, 2048), random_tree(1))
    check_rows_equal_one_token_steps(demo_target, prompt_of(1, 3, 2048), random_tree(2, depth=3, k=8, budget=64))


def test_misuse_is_refused(demo_target):
    model = demo_target
    model.kv.clear()
    model.forward([1, 2, 3], logits="none")
    with pytest.raises(ValueError, match="parents"):
        model.forward([4, 5, 6], tree=[-1, 2, 0])           # a parent after its child
    with pytest.raises(ValueError, match="parents"):
        model.forward([4, 5], tree=[0, 0])                  # no root
    with pytest.raises(ValueError, match="rows for 2 tokens"):
        model.forward([4, 5], tree=[-1, 0, 0])
    model.forward([4, 5, 6, 7], tree=[-1, 0, 0, 1], stepwise=True)
    with pytest.raises(ValueError, match="keep_path"):
        model.forward([9])                                  # the tree's rows are not a sequence
    with pytest.raises(ValueError, match="crop into a verified tree"):
        model.kv.crop(5)
    with pytest.raises(ValueError, match="not a path"):
        model.kv.keep_path([0, 2, 3])                       # 3's parent is 1
    with pytest.raises(ValueError, match="not a path"):
        model.kv.keep_path([1, 3])
    with pytest.raises(ValueError, match="not a path"):
        model.kv.keep_path([0, 9])
    model.kv.keep_path([0, 1, 3])
    assert model.kv.n_tokens == 6
    with pytest.raises(ValueError, match="follows a tree verify"):
        model.kv.keep_path([0])
    model.forward([4, 5, 6], tree=[-1, 0, 0], stepwise=True)
    model.kv.crop(6)                                        # back to where the tree began: allowed
    model.forward([9])


def test_a_mixer_without_tree_support_is_refused(demo_target):
    model = demo_target
    model.no_tree_verify = ["FutureMixer"]     # every mixer the runtime has runs trees; a new one may not
    try:
        model.kv.clear()
        with pytest.raises(ModelError, match="FutureMixer mixer cannot verify a draft tree"):
            model.forward([1, 2], tree=[-1, 0])
    finally:
        model.no_tree_verify = []


@pytest.fixture(scope="module")
def targets(request):
    """{name: GGUF path} of the converter-built tiny targets of every architecture (built on first use)."""
    get = request.getfixturevalue
    return {
        "qwen3-f16": lambda: get("tiny_target").gguf["f16"],
        "qwen3moe-Q8_0": lambda: get("qwen3moe_target").gguf["Q8_0"],
        "gpt-oss-MXFP4_MOE": lambda: get("gpt_oss_target").gguf["MXFP4_MOE"],
        "gpt-oss-f16": lambda: get("gpt_oss_target").gguf["f16"],
        "qwen35-f16": lambda: get("qwen35_target").gguf["f16"],
        "qwen35-q8_0": lambda: get("qwen35_target").gguf["q8_0"],
        "qwen35moe-mxfp4_moe": lambda: get("qwen35moe_target").gguf["mxfp4_moe"],
        "llama-smollm2-q4_1": lambda: get("smollm2_path"),
        "kimi-k3-f16": lambda: get("kimi_k3_target").gguf["f16"],
        "kimi-k3-q8_0": lambda: get("kimi_k3_target").gguf["q8_0"],
        "kimi-k3-plain-f32": lambda: get("kimi_k3_target").gguf["plain-f32"],
    }


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["qwen3-f16", "qwen3moe-Q8_0", "gpt-oss-MXFP4_MOE", "qwen35-f16",
                                  "qwen35moe-mxfp4_moe", "llama-smollm2-q4_1", "kimi-k3-q8_0", "kimi-k3-plain-f32",
                                  pytest.param("kimi-k3-f16", marks=pytest.mark.slow),
                                  pytest.param("gpt-oss-f16", marks=pytest.mark.slow),
                                  pytest.param("qwen35-q8_0", marks=pytest.mark.slow)])
def test_every_arch_rows_equal_one_token_steps(targets, name):
    """Prompts of 40 tokens: past gpt-oss's sliding window of 16 (a path's rows near the window's edge) and one
    whole 32 positions of the cache (the lanes every row shares). kimi-k3-q8_0: Q8_0 trunk, MXFP4 experts;
    plain-f32: no q_lora, no latent experts, softplus decay, no residual attention."""
    model = TargetModel(targets[name](), threads=2)
    try:
        check_rows_equal_one_token_steps(model, prompt_of(3, 40, model.n_vocab), random_tree(4))
    finally:
        model.close()


def test_torch_tree_rows_equal_one_token_steps(demo_target):
    """torch in float32 is numba's arithmetic (docs/torch.md): with stepwise, its tree rows lay each path out as
    numba's do (TreeBatch.path_layout), so they too are bit-identical to one-token steps along their paths, and
    to numba's own rows; a chain-shaped tree equals a sequence batch."""
    pytest.importorskip("torch")
    model = TargetModel(demo_data() / "target.gguf", backend="torch", dtype="f32", threads=1)
    try:
        prompt = prompt_of(5, 45, 2048)    # past one whole 32 positions: the sums every row shares run once
        model.forward(prompt, logits="none")
        chain, _ = model.forward([5, 6, 7, 8], tree=[-1, 0, 1, 2], stepwise=True)
        model.kv.crop(len(prompt))
        sequence, _ = model.forward([5, 6, 7, 8], stepwise=True)
        assert np.array_equal(chain, sequence)
        check_rows_equal_one_token_steps(model, prompt, random_tree(6))
        tree = random_tree(7, depth=3, k=8, budget=40)
        for on in (model, demo_target):
            on.kv.clear()
            on.forward(prompt, logits="none")
        rows = [on.forward([5] + tree.tokens, taps=TAPS, stepwise=True, tree=tree.parents)
                for on in (model, demo_target)]
        assert np.array_equal(rows[0][0], rows[1][0]) and np.array_equal(rows[0][1], rows[1][1])
    finally:
        model.close()


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["kimi-k3-q8_0", "kimi-k3-plain-f32", "qwen35-f16"])
def test_torch_hybrid_rows_equal_one_token_steps_and_numba(targets, name):
    """torch's KDA, MLA and Gated DeltaNet in float32: tree rows bit-identical to torch's one-token steps along their
    paths, keep_path as on numba, and the rows equal to numba's."""
    pytest.importorskip("torch")
    path = targets[name]()
    model, numba = TargetModel(path, backend="torch", threads=1), TargetModel(path, threads=2)
    try:
        prompt = prompt_of(3, 40, model.n_vocab)
        tree = random_tree(4)
        check_rows_equal_one_token_steps(model, prompt, tree)
        rows = []
        for on in (model, numba):
            on.kv.clear()
            on.forward(prompt, logits="none")
            rows.append(on.forward([5] + tree.tokens, taps=TAPS, stepwise=True, tree=tree.parents))
        assert np.array_equal(rows[0][0], rows[1][0]) and np.array_equal(rows[0][1], rows[1][1])
    finally:
        model.close()
        numba.close()
