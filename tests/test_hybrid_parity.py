"""Gated DeltaNet hybrid targets (qwen35, qwen35moe) against their oracles: llama.cpp (llama-cpp-python,
non-flash attention, f16 KV cache) logit for logit and token for token on the tiny models its own converter
and quantizer made, transformers' hidden states for the feature taps, and the recurrent state's rollback
against never having gone further.

Prompts are random id sequences whose llama.cpp greedy path keeps a clear top-1/top-2 margin (checked
here and printed with the logit differences), so that float-level differences could not decide a token.
"""

import numpy as np
import pytest

from ggtools.runtime import TargetModel, greedy
from ggtools.runtime.model.ffn import dense, shared_expert
from ggtools.runtime.model.mixers import attention, gated_delta_net
from tests.float_reference import assert_within_reference_rounding, hf_hidden_states
from tests.llama_runner import (LlamaCpp, assert_greedy_identical, assert_one_call_steps_identical,
                                assert_prompt_logits_identical, avx2_llama_cpp)
from tests.target_checks import assert_crop_equals_never_going_further, assert_run_refuses_patched

pytestmark = pytest.mark.oracle

N_GREEDY = 40
MIN_MARGIN = 0.005      # logits of these models span about +-7; float-level differences are ~1e-6
# seeds of prompts whose llama.cpp greedy paths keep a margin of at least 0.01 in every encoding
PROMPT_SEEDS = {"qwen35": [3, 13, 17, 21, 24], "qwen35moe": [4, 12, 29, 36, 11]}
ENCODINGS = [("qwen35", "f32"), ("qwen35", "f16"), ("qwen35", "q8_0"),
             ("qwen35moe", "f32"), ("qwen35moe", "f16"), ("qwen35moe", "mxfp4_moe")]


def prompt(seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return [1] + rng.integers(3, 1000, int(rng.integers(4, 40))).tolist()


@pytest.fixture(scope="module")
def llama_cpp():
    return avx2_llama_cpp()


@pytest.fixture(scope="module")
def targets(qwen35_target, qwen35moe_target):
    return {"qwen35": qwen35_target, "qwen35moe": qwen35moe_target}


@pytest.fixture(scope="module")
def models(targets):
    """One loaded TargetModel per (arch, encoding), shared by the tests of this module."""
    loaded = {}

    def get(arch, encoding, kv_type="f16"):
        key = (arch, encoding, kv_type)
        if key not in loaded:
            loaded[key] = TargetModel(targets[arch].gguf[encoding], threads=2, kv_type=kv_type)
        loaded[key].kv.clear()
        return loaded[key]

    yield get
    for model in loaded.values():
        model.close()


@pytest.mark.parametrize("arch, encoding", ENCODINGS)
def test_prompt_logits_are_bit_identical(targets, models, llama_cpp, arch, encoding):
    oracle, model = LlamaCpp(llama_cpp, targets[arch].gguf[encoding]), models(arch, encoding)
    assert_prompt_logits_identical(oracle, model, [prompt(seed) for seed in PROMPT_SEEDS[arch][:2]],
                                   f"{arch} {encoding}")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("arch, encoding", ENCODINGS)
def test_one_call_steps_are_bit_identical(targets, llama_cpp, monkeypatch, arch, encoding, threads):
    """Each half of a one-token step's layers, with the layer's norm before it and the residual after it, runs as
    one kernel call: the gated attention (attention.one_token_attention), the Gated DeltaNet
    (gated_delta_net.one_token_delta_net), the dense FFN (dense.one_token_ffn) or the routed and shared experts
    (shared_expert.one_token_shared_moe); on 2 threads their larger matmuls are shared with the worker from inside
    those calls."""
    path = targets[arch].gguf[encoding]
    oracle, model = LlamaCpp(llama_cpp, path), TargetModel(path, threads=threads)
    n_recurrent, n_layer = sum(model.hp.recurrent_layers), len(model.layers)
    ffn = (shared_expert, "one_token_shared_moe") if arch == "qwen35moe" else (dense, "one_token_ffn")
    assert_one_call_steps_identical(monkeypatch, oracle, model, prompt(PROMPT_SEEDS[arch][0]), 6,
                                    [(attention, "one_token_attention", n_layer - n_recurrent),
                                     (gated_delta_net, "one_token_delta_net", n_recurrent), (*ffn, n_layer)],
                                    f"{arch} {encoding}, {threads} thread(s)", shared=threads > 1)


@pytest.mark.slow
@pytest.mark.parametrize("arch, encoding", ENCODINGS)
def test_greedy_tokens_are_identical(targets, models, llama_cpp, arch, encoding):
    oracle, model = LlamaCpp(llama_cpp, targets[arch].gguf[encoding]), models(arch, encoding)
    for seed in PROMPT_SEEDS[arch]:
        assert_greedy_identical(oracle, model, prompt(seed), N_GREEDY, MIN_MARGIN, f"{arch} {encoding} seed {seed}")


@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
def test_feature_taps_equal_transformers_hidden_states(targets, models, arch):
    """hidden_states[j] is the residual entering layer j (the last one the final normed state), linear and
    full attention layers alike; f32 GGUF with an f32 cache: float32 rounding only, no further from transformers'
    float64 run than its own float32 run allows (float_reference.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ids = [1] + np.random.default_rng(1).integers(3, 1024, 30).tolist()
    hidden = hf_hidden_states(targets[arch].hf_dir, ids)
    model = models(arch, "f32", kv_type="f32")
    taps = list(range(model.hp.n_layer + 1))
    _, features = model.forward(ids, taps=taps, logits="none")
    for j in taps:
        assert_within_reference_rounding(features[:, j], hidden["f32"][j], hidden["f64"][j], f"{arch} tap {j}")


@pytest.mark.parametrize("arch, encoding", ENCODINGS)
def test_crop_then_generate_equals_never_going_further(models, arch, encoding):
    """Crop back into the generated tokens and into the prompt (the recurrent state rolls back with the KV
    cache), then go on: the same logits, bit for bit, as a fresh run that made the same calls up to there."""
    assert_crop_equals_never_going_further(models(arch, encoding), prompt(PROMPT_SEEDS[arch][0]))


def test_split_target_runs_from_its_first_shard(targets, models):
    """The MXFP4_MOE qwen35moe as 3 shards, loaded from the first: the single file's logits and greedy tokens."""
    split = TargetModel(targets["qwen35moe"].split[0], threads=2)
    whole = models("qwen35moe", "mxfp4_moe")
    ids = prompt(PROMPT_SEEDS["qwen35moe"][0])
    assert len(split.weights.shards.files) == 3
    assert np.array_equal(split.forward(ids)[0], whole.forward(ids)[0])
    assert greedy(split, [5], 8)[0] == greedy(whole, [5], 8)[0]
    split.close()


@pytest.mark.parametrize("edit, message", [
    ("qwen35.ssm.inner_size=u32:100", "'qwen35.ssm.inner_size' is not time_step_rank x state_size"),
    ("qwen35.attention.recurrent_layers=bool[]:1,1,1,1,1,1",
     "tensor 'blk.1.attn_qkv.weight': is missing: llama.cpp's loader requires it"),
    ("qwen35.attention.recurrent_layers=bool[]:1,0", "key 'qwen35.attention.recurrent_layers': has 2 entries for 6 "
                                                     "layers"),
    ("qwen35.ssm.group_count=u32:3", "key 'qwen35.ssm.time_step_rank': 4 value heads are not a multiple of "
                                     "ssm.group_count 3 key heads"),
])
def test_inconsistent_hybrid_keys_are_one_line_errors(targets, tmp_path, edit, message):
    """A qwen35 GGUF whose Gated DeltaNet keys disagree with its tensors: `ggtools run` names the file and the
    rule in one line and exits 2, no traceback; the input is not modified."""
    assert_run_refuses_patched(targets["qwen35"].gguf["q8_0"], edit, message, tmp_path)
