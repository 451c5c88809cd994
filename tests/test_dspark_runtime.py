"""DSpark drafters in the runtime (reference §13): tiny random DSpark drafters in both config layouts, converted by
llama.cpp's own converter (scripts/fixtures/dspark_drafters.py), drafting for the tiny qwen3 target.

The truth is libllama's own DSpark graph (src/models/dflash.cpp, build_dspark_markov_head) driven through
llama-cpp-python as common/speculative.cpp drives it (tests/dspark_replay.py): on the features and blocks of the
runtime's own speculative runs, every drafting row's Markov-biased logits, the drafted tokens and the confidences
agree, and llama.cpp's draft-dspark rule over libllama's outputs offers the runtime's drafts at every step, with and
without the confidence cut, so the acceptance lengths and τ are the same. The loop's output equals greedy decoding
for every layout, n_max, a small ring and the end-of-generation shrink.
"""

import numpy as np
import pytest

from ggtools.jobs.run import run_speculative
from ggtools.runtime import DEFINITIONS, DraftSettings, Drafter, TargetModel, check_settings, greedy
from ggtools.runtime.errors import SettingsError
from ggtools.runtime.speculative import NO_CONFIDENCE_HEAD, speculative_generate
from ggtools.runtime.stats import EXPECTED_DEFINITIONS
from tests.dspark_replay import (CONFIDENCE_ATOL, accepted_lengths, agreeing_rows, assert_drafts_equal_libllama,
                                 libllama_blocks, llama_cpp_drafts, logit_bound, record_run)

pytestmark = pytest.mark.oracle

VARIANTS = ("anchor-conf", "anchor-noconf", "bonus-reduced", "bonus-full")
PROMPTS = [list(range(5, 40)), [3, 141, 59, 26, 535, 897, 93, 238, 462, 643, 383, 279, 502, 88, 419, 716, 939, 937]]
N = 32


@pytest.fixture(scope="module")
def target(tiny_target):
    model = TargetModel(tiny_target.gguf["f32"], threads=1, kv_type="f32")
    yield model
    model.close()


@pytest.fixture(scope="module")
def greedy_outputs(target):
    out = []
    for p in PROMPTS:
        target.kv.clear()
        out.append(greedy(target, p, N)[0])
    return out


def _drafter(dspark_drafters, target, variant, outtype="f32"):
    return Drafter(dspark_drafters(variant, outtype), target)


def test_layouts_from_the_files(dspark_drafters, target):
    """What the converter wrote from each config layout: the block layout, the heads, the draft vocabulary."""
    recipe = dspark_drafters.manifest["variants"]
    for variant in VARIANTS:
        d = _drafter(dspark_drafters, target, variant)
        spec = recipe[variant]
        assert d.family == "dspark"
        assert d.anchor_first == (spec["layout"] == "flat")
        assert d.max_drafts == (8 if d.anchor_first else 7) == dspark_drafters.manifest["block_size"] - (not d.anchor_first)
        assert (d.markov.conf is not None) == d.hp.dspark.confidence_head == spec["confidence"]
        assert d.markov.rank == dspark_drafters.manifest["markov_rank"]
        assert (None if d.d2t is None else len(d.d2t)) == spec["draft_vocab"]
        d.close()


@pytest.mark.parametrize("outtype", ["f32", "f16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_drafts_equal_libllama(dspark_drafters, target, greedy_outputs, variant, outtype):
    """Per step of speculative runs: logits, drafted tokens and confidences as libllama's DSpark graph gives them."""
    path = dspark_drafters(variant, outtype)
    d = Drafter(path, target)
    runs = []
    for p in PROMPTS:
        out, rec = record_run(lambda *a, **k: speculative_generate(target, *a, **k), d, d.new_kv(None, "f16"), p, N)
        runs.append(rec)
    assert_drafts_equal_libllama(target.path, d, runs)
    d.close()


@pytest.mark.parametrize("p_min,n_min", [(0.0, 0), (0.4, 0), (0.5, 2)])
@pytest.mark.parametrize("variant", ["anchor-conf", "bonus-reduced"])
def test_confidence_cut_as_llama_cpp(dspark_drafters, target, greedy_outputs, variant, p_min, n_min):
    """llama.cpp's draft-dspark rule over libllama's outputs offers the runtime's drafts at every step; the
    acceptance lengths and τ follow."""
    path = dspark_drafters(variant, "f32")
    d = Drafter(path, target)
    settings = DraftSettings(cut="confidence", p_min=p_min, n_min=n_min)
    outs, runs = [], []
    for p in PROMPTS:
        out, rec = record_run(lambda *a, **k: speculative_generate(target, *a, **k), d, d.new_kv(None, "f16"), p, N,
                              settings=settings)
        outs.append(out)
        runs.append(rec)
    cut_steps = near_ties = 0
    for prompt, want, out, rec, ref in zip(PROMPTS, greedy_outputs, outs, runs, libllama_blocks(target.path, path,
                                                                                                runs)):
        assert out.tokens == want
        drafts = []
        for step, b, (logits, conf) in zip(out.steps, rec.blocks, ref):
            theirs = llama_cpp_drafts(logits, conf, p_min, n_min)
            decided = min(len(theirs) + 1, len(conf))             # the rows the cut read
            if (agreeing_rows(b.chain.tokens, b.biased, logits, logit_bound(logits)) < len(theirs)
                    or (p_min > 0 and np.any(np.abs(conf[:decided] - p_min) <= CONFIDENCE_ATOL))):
                near_ties += 1
                theirs = b.chain.tokens[:step.drafted]            # a near-tie: libllama may go either way
            assert step.drafted == len(theirs)
            assert b.chain.tokens[:len(theirs)] == theirs
            cut_steps += len(theirs) < len(b.biased)
            drafts.append(theirs)
        assert [s.accepted for s in out.steps] == accepted_lengths(want, len(prompt), rec.blocks, drafts, N)
    assert (cut_steps > 0) == (p_min > 0)
    assert near_ties <= 0.05 * sum(len(o.steps) for o in outs)
    d.close()


@pytest.mark.parametrize("variant", VARIANTS)
def test_output_equals_greedy(dspark_drafters, target, greedy_outputs, variant):
    """Every layout, default and smaller n_max, a ring smaller than the context, n not a multiple of the block."""
    d = _drafter(dspark_drafters, target, variant, "f16")
    for n_max, ring in ((None, None), (3, 12), (d.max_drafts, 7)):
        for p, want in zip(PROMPTS, greedy_outputs):
            for n in (N, 21):
                out = speculative_generate(target, d, d.new_kv(ring), p, n, settings=DraftSettings(n_max=n_max))
                assert out.tokens == want[:n]
                assert max(s.drafted for s in out.steps) == (n_max or d.max_drafts)
                assert out.steps[-1].drafted <= n - sum(s.produced for s in out.steps[:-1]) - 1
    d.close()


def test_n_max_and_cut_refusals(dspark_drafters, target, tiny_target, ref_drafter_gguf):
    anchor = _drafter(dspark_drafters, target, "anchor-conf")
    check_settings(anchor, DraftSettings(n_max=8))                   # block_size drafts, the anchor's row too
    with pytest.raises(SettingsError, match="at most 8 tokens per step, the anchor's row included"):
        check_settings(anchor, DraftSettings(n_max=9))
    bonus = _drafter(dspark_drafters, target, "bonus-full")
    with pytest.raises(SettingsError, match="--n-max 8: the drafter's block of 8 drafts at most 7 tokens per step$"):
        check_settings(bonus, DraftSettings(n_max=8))
    with pytest.raises(SettingsError, match=NO_CONFIDENCE_HEAD):
        check_settings(bonus, DraftSettings(cut="confidence", p_min=0.5))
    check_settings(bonus, DraftSettings(cut="confidence", p_min=0.0))   # p_min 0: llama.cpp reads no confidence
    dflash = Drafter(ref_drafter_gguf(1, "f32"), target)
    with pytest.raises(SettingsError, match="is a dflash drafter; the confidence cut needs a DSpark drafter"):
        check_settings(dflash, DraftSettings(cut="confidence", p_min=0.5))
    for d in (anchor, bonus, dflash):
        d.close()


def test_statistics_count_block_size_drafts(dspark_drafters, tiny_target):
    """An anchor-first drafter offers up to block_size drafts: the default n_max, per-position rates and the
    histogram have room for all of them, and acceptance = accepted / drafted over them."""
    r = run_speculative(tiny_target.gguf["f32"], dspark_drafters("anchor-conf", "f16"), PROMPTS, N, threads=1,
                        stop_at_eog=False)
    assert r.outputs_match_target and r.family == "dspark"
    assert r.settings["n_max"] == 8
    assert len(r.stats["per_position_accept_rate"]) == 8 and len(r.stats["accept_length_histogram"]) == 9
    assert r.stats["drafted_tokens"] / r.stats["steps"] > 7           # more than rows 1.. of a block could give
    assert r.stats["verified_per_step"] == 1 + r.stats["drafted_tokens"] / r.stats["steps"]
    assert set(r.stats) == set(DEFINITIONS) - set(EXPECTED_DEFINITIONS)      # greedy: nothing expected


def test_torch_backend_drafts_as_numba(dspark_drafters, tiny_target):
    """The torch backend (CPU, f32) runs the same heads: the same chains, confidences within the named bound."""
    pytest.importorskip("torch")
    models = [TargetModel(tiny_target.gguf["f32"], threads=1, kv_type="f32", backend=b) for b in ("numba", "torch")]
    for variant in ("anchor-conf", "bonus-reduced"):
        chains = []
        for m in models:
            d = Drafter(dspark_drafters(variant, "f16"), m)
            out, rec = record_run(lambda *a, **k: speculative_generate(m, *a, **k), d, d.new_kv(None, "f32"),
                                  PROMPTS[0], N)
            chains.append(rec.blocks)
            d.close()
        for a, b in zip(*chains):
            bound = logit_bound(a.biased)
            assert agreeing_rows(a.chain.tokens, a.biased, b.biased, bound) == len(a.biased)
            finite = np.isfinite(a.biased)
            assert np.abs(a.biased[finite] - b.biased[finite]).max() <= bound
            assert np.abs(np.asarray(a.chain.confidence) - np.asarray(b.chain.confidence)).max() <= CONFIDENCE_ATOL
    for m in models:
        m.close()
