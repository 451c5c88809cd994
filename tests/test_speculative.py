"""Speculative decoding on the embedded demo pair: the output equals target-only greedy decoding for every
drafter variant (f16, q8_0, q4-mix, q2_k, lucebox profile), draft KV and early cut; acceptance statistics;
the demo pair's acceptance on held-out prompts."""

import pytest

from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.runtime import TargetModel, Tokenizer, greedy
from ggtools.runtime.drafter.families import open_drafter
from ggtools.jobs.run import run_speculative
from ggtools.runtime.speculative import DraftSettings, Step, speculative_generate
from ggtools.runtime.expected_acceptance import ExpectedAcceptance
from ggtools.runtime.stats import DEFINITIONS, EXPECTED_DEFINITIONS, acceptance_stats

EOS = 2046
N = 48


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo")
    target_path = str(demo_data() / "target.gguf")
    paths = {v.name: v.path for v in build_drafters(work, target_path)}
    convert_dflash(demo_data() / "drafter", work / "lucebox.gguf", profile="lucebox", force=True)
    paths["lucebox"] = str(work / "lucebox.gguf")
    target = TargetModel(target_path, threads=1)
    drafters = {name: open_drafter(path, target) for name, path in paths.items()}
    yield target, drafters, paths
    for d in drafters.values():
        d.close()
    target.close()


@pytest.fixture(scope="module")
def prompts(pair):
    return [ids for _, ids in held_out_prompts(Tokenizer.from_gguf(pair[0].weights.meta), 3, 96)]


@pytest.fixture(scope="module")
def reference(pair, prompts):
    target = pair[0]
    out = []
    for p in prompts:
        target.kv.clear()
        out.append(greedy(target, p, N, {EOS})[0])
    return out


def _decode(pair, name, prompts, ring_cap=None, settings=None, kv_type="f16"):
    target, drafters, _ = pair
    kv = drafters[name].new_kv(ring_cap, kv_type)
    return [speculative_generate(target, drafters[name], kv, p, N, {EOS}, settings) for p in prompts]


@pytest.mark.parametrize("name", ["f16", "q8_0", "q4-mix", "q2_k", "lucebox"])
@pytest.mark.parametrize("ring_cap", [None, 4096, 16])
def test_output_equals_greedy(pair, prompts, reference, name, ring_cap):
    outs = _decode(pair, name, prompts, ring_cap)
    assert [o.tokens for o in outs] == reference
    assert all(sum(s.produced for s in o.steps) + 1 == len(o.tokens) for o in outs)
    assert sum(s.accepted for o in outs for s in o.steps) > 0


@pytest.mark.parametrize("cut, p_min, n_min", [("prob", 0.3, 0), ("prob", 0.6, 2), ("margin", 0.35, 1),
                                                ("margin", 1.0, 3)])
def test_cuts_keep_greedy_output_and_verify_less(pair, prompts, reference, cut, p_min, n_min):
    plain = _decode(pair, "f16", prompts, 64)
    cut_outs = _decode(pair, "f16", prompts, 64, DraftSettings(cut=cut, p_min=p_min, n_min=n_min))
    assert [o.tokens for o in cut_outs] == reference
    verified = lambda outs: sum(1 + s.drafted for o in outs for s in o.steps) / sum(len(o.steps) for o in outs)  # noqa: E731
    assert verified(cut_outs) < verified(plain)
    assert all(s.drafted == 0 or s.drafted >= n_min for o in cut_outs for s in o.steps)


@pytest.mark.parametrize("n_max", [0, 1, 3])
def test_n_max(pair, prompts, reference, n_max):
    outs = _decode(pair, "q8_0", prompts, 32, DraftSettings(n_max=n_max))
    assert [o.tokens for o in outs] == reference
    assert max(s.drafted for o in outs for s in o.steps) == n_max


def test_stop_token_ends_output_as_greedy_does(pair, prompts, reference):
    target, drafters, _ = pair
    stop = reference[0][len(reference[0]) // 2]
    target.kv.clear()
    want, why = greedy(target, prompts[0], N, {stop})
    out = speculative_generate(target, drafters["f16"], drafters["f16"].new_kv(32), prompts[0], N, {stop})
    assert (out.tokens, out.stop) == (want, why) == (want, "end-of-generation")


def test_n_max_beyond_the_block_is_refused(pair, prompts):
    target, drafters, _ = pair
    with pytest.raises(ValueError, match="n_max"):
        speculative_generate(target, drafters["f16"], drafters["f16"].new_kv(), prompts[0], 8, (), DraftSettings(n_max=8))


def test_acceptance_statistics():
    runs = [[Step(7, 2, 3), Step(7, 0, 1), Step(3, 3, 4)], [Step(7, 7, 8)]]
    s = acceptance_stats(runs, block=8)
    assert set(s) == set(DEFINITIONS) - set(EXPECTED_DEFINITIONS)        # greedy steps expect nothing
    assert (s["steps"], s["drafted_tokens"], s["accepted_tokens"], s["generated_tokens"]) == (4, 24, 12, 16)
    assert s["acceptance_rate"] == 12 / 24
    assert s["mean_accepted_length_incl_bonus"] == 1 + 12 / 4
    assert s["tau_zlab"] == ((1 + 5 / 3) + (1 + 7)) / 2
    assert s["per_position_accept_rate"] == [3 / 4, 3 / 4, 2 / 4, 1 / 4, 1 / 4, 1 / 4, 1 / 4]
    assert s["steps_with_any_accept"] == 3
    assert s["accept_length_histogram"] == [1 / 4, 0, 1 / 4, 1 / 4, 0, 0, 0, 1 / 4]
    assert s["lucebox_accept_rate"] == (3 + 1 + 4 + 8) / (4 * 8)
    assert s["verified_per_step"] == (8 + 8 + 4 + 8) / 4
    assert (s["accepted_per_step"], s["avg_commit_per_step"]) == (12 / 4, 16 / 4)


def test_expected_acceptance_statistics():
    """Sampled steps: the expected accepted drafts summed over steps, per drafted token and per step."""
    e = lambda exact, rejection: ExpectedAcceptance(exact, rejection)  # noqa: E731
    runs = [[Step(7, 2, 3, e(1.5, 2.0)), Step(7, 0, 1, e(0.25, 0.5))], [Step(3, 3, 4, e(2.25, 2.5))]]
    s = acceptance_stats(runs, block=8)
    assert set(s) == set(DEFINITIONS)
    assert s["expected_acceptance_rate"] == 4.0 / 17
    assert s["expected_mean_accepted_length_incl_bonus"] == 1 + 4.0 / 3
    assert s["expected_acceptance_rate_rejection"] == 5.0 / 17
    runs[0][0].expected = e(1.5, None)                 # a drafter without a distribution: no rejection figure
    assert "expected_acceptance_rate_rejection" not in acceptance_stats(runs, block=8)


def test_demo_pair_acceptance(pair):
    """tau >= 2 with the f16 drafter on held-out prompts; q8_0 within 2% (relative) of f16's acceptance. Not a
    float tolerance: Q8_0 rounds each drafter weight by up to 1/254 of its block's largest, which changes some
    drafts; measured: f16 0.2833, q8_0 0.2850 (0.6%). numba's numerics are llama.cpp's on any CPU, so the
    figures do not move with the machine; 2% is the claim the demo makes about q8_0."""
    target, _, paths = pair
    prompts = [ids for _, ids in held_out_prompts(Tokenizer.from_gguf(target.weights.meta), 8)]
    f16, q8 = (run_speculative(target, paths[v], prompts, 96, ring_cap=256, compare=False) for v in ("f16", "q8_0"))
    assert f16.stats["tau_zlab"] >= 2.0
    assert abs(q8.acceptance_rate - f16.acceptance_rate) <= 0.02 * f16.acceptance_rate


@pytest.mark.slow
def test_demo_pair_acceptance_on_all_held_out_prompts(pair):
    """The recipe of demo_pair.json (36 held-out windows x 128 tokens): tau as recorded by the torch reference
    (3.39: z-lab's loop in torch, bf16 drafter weights, float32 arithmetic). This runs the f16 conversion with
    llama.cpp's roundings (f16 weights and cache, f16-rounded matmul inputs), which decide some drafts the other
    way: measured 3.412; 0.15 is 4% of tau for those different roundings."""
    target, _, paths = pair
    prompts = [ids for _, ids in held_out_prompts(Tokenizer.from_gguf(target.weights.meta), 36)]
    run = run_speculative(target, paths["f16"], prompts, 128, ring_cap=None)
    assert run.outputs_match_target
    assert run.stats["tau_zlab"] >= 2.0
    assert abs(run.stats["tau_zlab"] - 3.39) < 0.15
