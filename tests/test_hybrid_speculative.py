"""Speculative decoding with Gated DeltaNet hybrid targets (qwen35, qwen35moe): tiny DFlash v1 and DFlash2
drafters built for each target with z-lab's classes, converted by llama.cpp's converter (profile llama.cpp)
and by ggtools (profile lucebox, v1: the only version that profile has), with a ring of 8 context slots and
with the full draft KV, and a drafter that knows the answer but errs at scattered positions (accepted lengths
from 0 up). Every verify batch is followed by a crop of the target cache, which rolls the recurrent state
back to the accepted prefix: the output must equal plain greedy decoding exactly."""

import pytest

from ggtools.jobs.convert import convert_dflash
from tests.speculative_checks import assert_output_equals_greedy, assert_rollback_to_every_prefix, speculative_pair

pytestmark = pytest.mark.oracle

N = 48       # prompts + output exceed the recurrent rollback window (64): the checkpoint moves mid-run
ENCODING = {"qwen35": "f16", "qwen35moe": "mxfp4_moe"}


@pytest.fixture(scope="module", params=["qwen35", "qwen35moe"])
def pair(request, tmp_path_factory):
    target = request.getfixturevalue(f"{request.param}_target")
    lucebox = tmp_path_factory.mktemp(request.param) / "v1-lucebox.gguf"
    convert_dflash(target.drafter_dirs["v1"], lucebox, profile="lucebox", force=True)
    paths = {"v1": target.drafter_refs["v1"], "v2": target.drafter_refs["v2"], "v1-lucebox": lucebox}
    pair = speculative_pair(target.gguf[ENCODING[request.param]], paths, N)
    yield pair
    pair.close()


def test_drafters_tap_the_targets_layers(pair, request):
    target = request.getfixturevalue(f"{pair.model.hp.arch}_target")
    for drafter in pair.drafters.values():
        assert drafter.taps == [j + 1 for j in target.drafter_layer_ids]


@pytest.mark.parametrize("name, ring_cap", [("v1", 8), ("v2", 8), ("v1-lucebox", 8), ("v2", None),
                                            pytest.param("v1", None, marks=pytest.mark.slow),
                                            pytest.param("v1-lucebox", None, marks=pytest.mark.slow)])
def test_output_equals_greedy(pair, name, ring_cap):
    assert_output_equals_greedy(pair, name, ring_cap)


def test_partial_acceptance_rolls_the_recurrent_state_back_to_every_prefix(pair):
    assert_rollback_to_every_prefix(pair, "v2")
