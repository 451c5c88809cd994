"""Speculative decoding with the tiny Kimi K3 target: DFlash v1 and DFlash2 drafters built for it with z-lab's
classes and converted by llama.cpp's converter, tapping a KDA layer's input and an MLA layer's input (the layer
inputs llama.cpp's kimi-k3 graph does not expose: there such a pair asserts), with a ring of 8 context slots and
with the full draft KV, and a drafter that knows the answer but errs at scattered positions (accepted lengths
from 0 up). Every verify batch is followed by a crop of the target cache, which rolls the KDA states back to the
accepted prefix: the output must equal plain greedy decoding exactly. The same for tiny DSpark drafters (both block
layouts: anchor-first with a confidence head, bonus-anchor with a reduced draft vocabulary) converted by llama.cpp's
converter."""

import numpy as np
import pytest

from ggtools.runtime import TargetModel
from ggtools.runtime.drafter import Drafter
from ggtools.runtime.speculative import speculative_generate
from tests.speculative_checks import assert_output_equals_greedy, assert_rollback_to_every_prefix, speculative_pair

pytestmark = pytest.mark.oracle

N = 48       # prompts + output exceed the recurrent rollback window (64): the checkpoint moves mid-run
DSPARK_VARIANTS = ["anchor-conf", "bonus-reduced"]


@pytest.fixture(scope="module", params=["f16", "q8_0"])
def pair(request, kimi_k3_target, kimi_k3_drafters, kimi_k3_dspark):
    """The K3 target with its DFlash v1 / DFlash2 drafters ("v1", "v2") and DSpark drafters ("dspark-<variant>")."""
    paths = dict(kimi_k3_drafters["refs"]) | {f"dspark-{v}": kimi_k3_dspark["refs"][v] for v in DSPARK_VARIANTS}
    pair = speculative_pair(kimi_k3_target.gguf[request.param], paths, N)
    yield pair
    pair.close()


def test_drafters_tap_the_targets_layers(pair, kimi_k3_drafters, kimi_k3_dspark):
    taps = [j + 1 for j in kimi_k3_drafters["target_layer_ids"]]      # HF id j: the input of layer j + 1
    assert [pair.model.hp.recurrent_layers[j] for j in taps] == [True, False]    # a KDA layer's and an MLA layer's
    assert taps == [j + 1 for j in kimi_k3_dspark["target_layer_ids"]]
    for name, drafter in pair.drafters.items():
        assert drafter.taps == taps
        assert (drafter.family == "dspark") == name.startswith("dspark-")


@pytest.mark.parametrize("name, ring_cap", [("v1", 8), ("v2", 8), ("v2", None),
                                            pytest.param("v1", None, marks=pytest.mark.slow),
                                            *[(f"dspark-{v}", cap) for v in DSPARK_VARIANTS for cap in (8, None)]])
def test_output_equals_greedy(pair, name, ring_cap):
    assert_output_equals_greedy(pair, name, ring_cap)


def test_partial_acceptance_rolls_the_kda_state_back_to_every_prefix(pair):
    assert_rollback_to_every_prefix(pair, "v2")


def llama_layer_inputs(path, layer: int, tokens):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "tests/llama_layer_inputs.py", str(path), str(layer),
                           ",".join(map(str, tokens))], capture_output=True, text=True, timeout=300)


def test_llama_cpp_taps_nothing_for_kimi_k3(kimi_k3_target, qwen35_target):
    """What llama.cpp (libllama 0.3.36) does when a drafter asks for a layer input: for qwen35, whose graph sets
    t_layer_inp, the rows ggtools taps (layer 1's input, token for token); for kimi-k3, whose graph never sets it,
    the GGML_ASSERT the field report quotes, aborting the process."""
    pytest.importorskip("llama_cpp")
    tokens = [1, 5, 9]
    qwen = llama_layer_inputs(qwen35_target.gguf["f32"], 1, tokens)
    assert qwen.returncode == 0, qwen.stderr[-2000:]
    model = TargetModel(qwen35_target.gguf["f32"], threads=2)
    _, features = model.forward(tokens, taps=[1], logits="none")
    import json
    assert np.array_equal(np.array(json.loads(qwen.stdout), np.float32), features[:, 0])
    k3 = llama_layer_inputs(kimi_k3_target.gguf["f32"], 1, tokens)
    assert k3.returncode != 0
    assert 'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed' in k3.stderr


def test_doctor_says_the_pair_runs_in_ggtools_and_asserts_in_llama_cpp(kimi_k3_target, kimi_k3_drafters):
    from click.testing import CliRunner

    from ggtools.cli import main as cli

    result = CliRunner().invoke(cli, ["doctor", str(kimi_k3_drafters["refs"]["v2"]), "--target",
                                      str(kimi_k3_target.gguf["q8_0"]), "--runtime", "llama.cpp", "--runtime",
                                      "ggtools"])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    assert any(ln.strip().startswith("ok   target_arch[ggtools]: ggtools taps layer inputs of 'kimi-k3'")
               for ln in lines)
    failed = [ln.strip() for ln in lines if ln.strip().startswith("FAIL")]
    assert failed == ["FAIL target_arch[llama.cpp]: the target arch 'kimi-k3' does not expose layer inputs in "
                      "llama.cpp"]
    assert 'breaks llama.cpp: "GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed"' \
        in result.output
    assert "fix: no fix in the file: run the pair in a runtime that taps this arch (ggtools)" in result.output


@pytest.mark.parametrize("variant", DSPARK_VARIANTS)
def test_dspark_drafts_equal_libllamas_dspark_graph(kimi_k3_target, kimi_k3_dspark, variant):
    """What llama.cpp would draft once its kimi-k3 graph exposes the layer inputs: libllama's own DSpark graph
    (tests/dspark_replay.py), fed the K3 layer inputs ggtools taps and the blocks of the runtime's speculative runs,
    gives the runtime's Markov-biased logits, drafted tokens and confidences (as test_dspark_runtime checks them on
    the qwen3 target)."""
    from tests.dspark_replay import assert_drafts_equal_libllama, record_run

    target = TargetModel(kimi_k3_target.gguf["f32"], threads=1, kv_type="f32")
    d = Drafter(kimi_k3_dspark["refs"][variant], target)
    runs = []
    for ids in ([1] + list(range(5, 30)), [1, 141, 59, 26, 535, 897, 93, 238, 462, 643, 383]):
        target.kv.clear()
        runs.append(record_run(lambda *a, **k: speculative_generate(target, *a, **k), d, d.new_kv(None, "f16"),
                               ids, 24)[1])
    assert_drafts_equal_libllama(target.path, d, runs)
    d.close()
