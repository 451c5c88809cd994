"""Speculative decoding at temperature > 0 with llama.cpp's exact-match rule: for every drafter family the output
equals target-only sampled decoding with the same seed (one draw per committed token, the draws in the same order);
a draft tree too; and the expected acceptance a step records is what many seeds' draws average to."""

import numpy as np
import pytest

from ggtools.runtime import DraftSettings, TargetModel, greedy, open_drafter, speculative_generate
from ggtools.runtime.expected_acceptance import expected_acceptance
from ggtools.runtime.sampling import Sampler, SamplingParams

N = 32
PROMPTS = [[1, 415, 29, 88, 301, 7], [5, 9, 200, 17, 33, 44, 100, 12, 640]]
SETTINGS = [SamplingParams(temp=0.6, seed=3), SamplingParams(temp=1.0, seed=11),
            SamplingParams(temp=0.8, seed=5, top_k=0, top_p=0.9, min_p=0.0, penalty_repeat=1.1)]


def assert_sampled_speculation_equals_sampled_decoding(target_path, draft, tree_budget=None, trained=True,
                                                       backend="numba"):
    """trained: the drafter drafts what the target says often enough that some drafts are accepted (a random one
    still shows that every step's rejection and rollback keep the output: 2 prompts x 3 settings x ~30 steps)."""
    model = TargetModel(target_path, threads=2, backend=backend)
    drafter = open_drafter(draft, model)
    n_vocab = model.hp.n_vocab
    accepted = 0
    for params in SETTINGS:
        for prompt in PROMPTS:
            model.kv.clear()
            want, _ = greedy(model, prompt, N, sampler=Sampler(params, n_vocab))
            out = speculative_generate(model, drafter, drafter.new_kv(None), prompt, N,
                                       settings=DraftSettings(tree_budget=tree_budget),
                                       sampler=Sampler(params, n_vocab))
            assert out.tokens == want, (draft, params)
            accepted += sum(s.accepted for s in out.steps)
            if tree_budget is None:
                assert all(s.expected is not None and 0 <= s.expected.exact_match <= s.drafted for s in out.steps)
    assert accepted > 0 or not trained, "no draft was ever accepted: the test would not see a wrong acceptance"
    drafter.close()
    model.close()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from ggtools.jobs.demo import build_drafters, demo_data
    work = tmp_path_factory.mktemp("demo")
    target = str(demo_data() / "target.gguf")
    return target, {v.name: v.path for v in build_drafters(work, target)}


@pytest.mark.parametrize("name", ["f16", "q4-mix"])
def test_dflash(demo, name):
    target, drafters = demo
    assert_sampled_speculation_equals_sampled_decoding(target, drafters[name])


def test_dflash_torch(demo):
    """The torch backend (CPU, f32) verifies and samples as numba does: the same output, chain and tree."""
    pytest.importorskip("torch")
    target, drafters = demo
    assert_sampled_speculation_equals_sampled_decoding(target, drafters["f16"], backend="torch")
    assert_sampled_speculation_equals_sampled_decoding(target, drafters["f16"], tree_budget=22, backend="torch")


def test_dflash_draft_tree(demo):
    target, drafters = demo
    assert_sampled_speculation_equals_sampled_decoding(target, drafters["f16"], tree_budget=22)


@pytest.mark.oracle
def test_dflash2(tiny_target, ref_drafter_gguf):
    assert_sampled_speculation_equals_sampled_decoding(tiny_target.gguf["f32"], ref_drafter_gguf(2, "f16"))


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["dspark-anchor", "dspark-speculators"])
def test_dspark(dspark_demo, name):
    from ggtools.jobs.demo import demo_data
    assert_sampled_speculation_equals_sampled_decoding(demo_data() / "target.gguf", dspark_demo[name])


@pytest.mark.oracle
def test_eagle3(eagle3_demo):
    from ggtools.jobs.demo import demo_data
    assert_sampled_speculation_equals_sampled_decoding(demo_data() / "target.gguf", eagle3_demo["ref"], trained=False)


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_mtp(mtp_targets, arch):
    assert_sampled_speculation_equals_sampled_decoding(mtp_targets[arch]("default", "f16"), "mtp", trained=False)


def _walk_exact_match(sampler, logits, drafts) -> int:
    n = 0
    while n < len(drafts) and sampler.sample(logits[n]) == drafts[n]:
        n += 1
    return n


def _walk_rejection(rng, sampler, logits, drafts, draft_rows) -> int:
    """Rejection sampling along the drafted chain: x ~ Q_j, accepted with probability min(1, P_j(x) / Q_j(x))."""
    n = 0
    for j in range(len(drafts)):
        p, q = sampler.probabilities(logits[j]), sampler.probabilities(draft_rows[j])
        x = rng.choice(q.size, p=q / q.sum())           # float64 sums of float32 probabilities: ~1e-8 off 1
        if rng.random() >= min(1.0, p[x] / q[x]):
            break
        n += 1
    return n


def test_expected_acceptance_is_the_mean_over_draws():
    """A verified batch of 5 drafts and the drafter's rows: the expected accepted drafts under each rule against the
    mean of 4000 simulated steps (different seeds; rejection sampling simulated with numpy's generator). The mean of
    n draws of a count in 0..5 with standard deviation s lies within 4.5 s / sqrt(n) of its expectation but about
    once in 150000 runs."""
    rng = np.random.default_rng(0)
    vocab, n_drafts, draws = 64, 5, 4000
    logits = (rng.standard_normal((n_drafts + 1, vocab)) * 4).astype(np.float32)
    draft_rows = (logits[:n_drafts] + rng.standard_normal((n_drafts, vocab)).astype(np.float32) * 0.5).astype(np.float32)
    drafts = [int(np.argmax(r)) for r in draft_rows]
    params = SamplingParams(temp=0.9, top_k=20)
    want = expected_acceptance(Sampler(params, vocab), logits, drafts, draft_rows)
    exact = np.array([_walk_exact_match(Sampler(params.with_options(seed=s), vocab), logits, drafts)
                      for s in range(draws)])
    sampler = Sampler(params, vocab)
    rejection = np.array([_walk_rejection(rng, sampler, logits, drafts, draft_rows) for _ in range(draws)])
    for got, expected in ((exact, want.exact_match), (rejection, want.rejection)):
        assert abs(got.mean() - expected) <= 4.5 * got.std() / np.sqrt(draws)
    assert min(want.exact_match, want.rejection) > 0.2, "the drafts are accepted often enough to test the sums"
