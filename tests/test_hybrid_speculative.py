"""Speculative decoding with Gated DeltaNet hybrid targets (qwen35, qwen35moe): tiny DFlash v1 and DFlash2
drafters built for each target with z-lab's classes, converted by llama.cpp's converter (profile llama.cpp)
and by ggtools (profile lucebox, v1: the only version that profile has), with a ring of 8 context slots and
with the full draft KV, and a drafter that knows the answer but errs at scattered positions (accepted lengths
from 0 up). Every verify batch is followed by a crop of the target cache, which rolls the recurrent state
back to the accepted prefix: the output must equal plain greedy decoding exactly."""

import numpy as np
import pytest

from ggtools.jobs.convert import convert_dflash
from ggtools.runtime import TargetModel, greedy
from ggtools.runtime.drafter import Drafter
from ggtools.runtime.speculative import speculative_generate
from tests.test_runtime_moe import KnowingDrafter

pytestmark = pytest.mark.oracle

N = 48       # prompts + output exceed the recurrent rollback window (64): the checkpoint moves mid-run
ENCODING = {"qwen35": "f16", "qwen35moe": "mxfp4_moe"}


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def pair(request, tmp_path_factory):
    target = request.getfixturevalue(f"{request.param}_target")
    lucebox = tmp_path_factory.mktemp(request.param) / "v1-lucebox.gguf"
    convert_dflash(target.drafter_dirs["v1"], lucebox, profile="lucebox", force=True)
    paths = {"v1": target.drafter_refs["v1"], "v2": target.drafter_refs["v2"], "v1-lucebox": lucebox}
    model = TargetModel(target.gguf[ENCODING[request.param]], threads=2)
    drafters = {name: Drafter(path, model) for name, path in paths.items()}
    prompts = [[1] + np.random.default_rng(seed).integers(3, 1000, 6 + 11 * seed).tolist() for seed in range(3)]
    reference = []
    for ids in prompts:
        model.kv.clear()
        reference.append(greedy(model, ids, N)[0])
    yield model, drafters, prompts, reference
    for d in drafters.values():
        d.close()
    model.close()


def test_drafters_tap_the_targets_layers(pair, request):
    model, drafters, _, _ = pair
    target = request.getfixturevalue(f"{model.hp.arch}_target")
    for drafter in drafters.values():
        assert drafter.taps == [j + 1 for j in target.drafter_layer_ids]


@pytest.mark.parametrize("name, ring_cap", [("v1", 8), ("v2", 8), ("v1-lucebox", 8), ("v2", None),
                                            pytest.param("v1", None, marks=pytest.mark.slow),
                                            pytest.param("v1-lucebox", None, marks=pytest.mark.slow)])
def test_output_equals_greedy(pair, name, ring_cap):
    model, drafters, prompts, reference = pair
    kv = drafters[name].new_kv(ring_cap)
    outs = [speculative_generate(model, drafters[name], kv, ids, N) for ids in prompts]
    assert [o.tokens for o in outs] == reference
    steps = [s for o in outs for s in o.steps]
    assert all(sum(s.produced for s in o.steps) + 1 == len(o.tokens) for o in outs)
    # random drafters of a random target: rejections (rollbacks of the recurrent state) in most steps
    assert sum(s.drafted > s.accepted for s in steps) > len(steps) // 2


def test_partial_acceptance_rolls_the_recurrent_state_back_to_every_prefix(pair):
    model, drafters, prompts, reference = pair
    accepted = set()
    for ids, want in zip(prompts, reference):
        # wrong at outputs 0, 1, 5, 6, 10, 11, ...: after a rejection at 5k the next draft is wrong at once
        knowing = KnowingDrafter(drafters["v2"], len(ids), want, wrong=lambda i: i % 5 < 2)
        out = speculative_generate(model, knowing, drafters["v2"].new_kv(8), ids, N)
        assert out.tokens == want
        accepted |= {s.accepted for s in out.steps}
    assert 0 in accepted and max(accepted) >= 3, accepted
