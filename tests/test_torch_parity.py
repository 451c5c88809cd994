"""The torch backend (f32 on the CPU) against the numba runtime, which is llama.cpp's CPU numerics bit for bit
(test_runtime_parity and the MoE / hybrid parity tests), on every target fixture the runtime runs: tiny qwen3,
qwen3moe, gpt-oss, qwen35, qwen35moe in f32 / f16 / their llama-quantize encodings, SmolLM2 Q4_1 and the demo
target; and the drafters and speculative decoding on the demo pair.

What the two can share is bounded by llama.cpp's own arithmetic: it rounds a matmul's input to the weight's
vec_dot type (f16, Q8_0, Q8_1, Q8_K) and attention's q and probabilities to f16, and torch reproduces those
roundings, but a value one float ulp apart on either side of a rounding boundary lands one step (an f16 ulp, a
Q8 step of max/127) apart, and the difference grows from there. So the bounds are:

- each layer fed numba's own input (teacher-forced): within 1e-3 relative for float weights (f16 ulps), 2e-2 for
  8-bit-rounded inputs (two Q8 steps); with an f32 KV cache and f32 weights (no rounding left) within 1e-5;
- prompt logits end to end: within 1e-3 relative, or twice numba's own batch-against-one-token difference where
  that is larger (llama.cpp's logits move that much with the summation order alone); quantized fixtures report
  theirs and stay within 5%; routed-expert targets on a prompt whose routing keeps a clear margin (k-th against
  (k+1)-th router logit >= 5e-3: closer, any difference swaps experts);
- greedy tokens: equal on float fixtures along prompts whose numba greedy path keeps a top-1 / top-2 margin of 4x
  the logit difference measured on the prompt.
"""

import os

import numpy as np
import pytest

from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.runtime import Drafter, TargetModel, Tokenizer, greedy, speculative_generate
from ggtools.runtime.stats import acceptance_stats
from tests.oracle_artifacts import (gpt_oss_target, qwen3moe_target, qwen35_target, qwen35moe_set,  # noqa: F401
                                    qwen35moe_target)

torch = pytest.importorskip("torch")
from tests.backend_parity import greedy_path, layer_errors, logit_parity, random_prompt, routing_margin  # noqa: E402

pytestmark = pytest.mark.oracle

FIXTURES = ["qwen3-f32", "qwen3-f16", "qwen3moe-f32", "qwen3moe-f16", "qwen3moe-Q8_0", "gpt-oss-f32", "gpt-oss-f16",
            "gpt-oss-MXFP4_MOE", "qwen35-f32", "qwen35-f16", "qwen35-q8_0", "qwen35moe-f32", "qwen35moe-f16",
            "qwen35moe-mxfp4_moe", "smollm2-q4_1", "demo-f16"]
FLOAT = [name for name in FIXTURES if name.rsplit("-", 1)[1] in ("f32", "f16")]
PROMPT_TOKENS = 24
N_GREEDY = 24


@pytest.fixture(scope="module")
def targets(tiny_target, qwen3moe_target, gpt_oss_target, qwen35_target, qwen35moe_target, smollm2_path):
    paths = {f"qwen3-{k}": p for k, p in tiny_target.gguf.items()}
    for t in (qwen3moe_target, gpt_oss_target, qwen35_target, qwen35moe_target):
        paths |= {f"{t.arch}-{k}": p for k, p in t.gguf.items()}
    return paths | {"smollm2-q4_1": smollm2_path, "demo-f16": str(demo_data() / "target.gguf")}


def pair(targets, name, kv_type="f16"):
    path = targets[name]
    return TargetModel(path, threads=2, kv_type=kv_type), TargetModel(path, backend="torch", threads=1,
                                                                      kv_type=kv_type)


@pytest.mark.parametrize("name", FIXTURES)
def test_layers_match_numba(targets, name):
    numba, on_torch = pair(targets, name)
    errors = layer_errors(numba, on_torch, random_prompt(numba, 7, PROMPT_TOKENS))
    print(f"{name}: teacher-forced layers, max relative difference {max(errors):.2e}")
    bound = 1e-3 if name in FLOAT else 2e-2
    assert max(errors) <= bound, [f"{e:.1e}" for e in errors]


@pytest.mark.parametrize("name", [name for name in FIXTURES if name.endswith("f32")])
def test_f32_layers_without_roundings_match_numba_to_float_precision(targets, name):
    """f32 weights and an f32 KV cache: nothing is rounded to f16 or 8 bits, so only summation order differs."""
    numba, on_torch = pair(targets, name, kv_type="f32")
    errors = layer_errors(numba, on_torch, random_prompt(numba, 7, PROMPT_TOKENS))
    assert max(errors) <= 1e-5, [f"{e:.1e}" for e in errors]


MIN_ROUTING_MARGIN = 5e-3


def clear_routing_prompt(model) -> list[int]:
    """The first of the seeded prompts whose routing keeps a clear margin (any prompt for a dense model)."""
    for seed in range(7, 27):
        ids = random_prompt(model, seed, PROMPT_TOKENS)
        if routing_margin(model, ids) >= MIN_ROUTING_MARGIN:
            return ids
    raise AssertionError("no prompt keeps a clear routing margin")


@pytest.mark.parametrize("name", FIXTURES)
def test_prompt_logits_match_numba(targets, name):
    numba, on_torch = pair(targets, name)
    p = logit_parity(numba, on_torch, clear_routing_prompt(numba))
    print(f"{name}: max |torch - numba| = {p.abs_diff:.3g} ({p.rel_diff:.2e} relative); numba batch vs one-token "
          f"steps {p.own_rel_diff:.2e}")
    bound = max(1e-3, 2 * p.own_rel_diff) if name in FLOAT else 0.05
    assert p.rel_diff <= bound


@pytest.mark.slow
@pytest.mark.parametrize("name", FLOAT)
def test_greedy_tokens_match_numba_on_clear_margins(targets, name):
    numba, on_torch = pair(targets, name)
    checked = 0
    for seed in range(8):
        ids = random_prompt(numba, seed, 12)
        threshold = 4 * logit_parity(numba, on_torch, ids).abs_diff
        want, margins = greedy_path(numba, ids, N_GREEDY)
        if min(margins) < threshold:
            continue
        assert greedy_path(on_torch, ids, N_GREEDY)[0] == want, f"seed {seed}"
        checked += 1
    assert checked, "no prompt keeps a clear margin along its greedy path"


@pytest.fixture(scope="module")
def demo_drafters(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo-drafters")
    return {v.name: v.path for v in build_drafters(work, str(demo_data() / "target.gguf"))}


@pytest.fixture(scope="module")
def demo_models():
    target = str(demo_data() / "target.gguf")
    return TargetModel(target, threads=1), TargetModel(target, backend="torch", threads=1)


def test_drafter_blocks_match_numba(demo_models, demo_drafters):
    """Same committed context, same anchor: the drafters' logits agree (f16 weights within 1e-3, 8-bit-rounded
    inputs of quantized weights within 1e-2) and their draft chains are equal."""
    numba, on_torch = demo_models
    tokenizer = Tokenizer.from_gguf(numba.weights.meta)
    _, ids = held_out_prompts(tokenizer, 1)[0]
    for name, bound in (("f16", 1e-3), ("q8_0", 1e-2), ("q4-mix", 1e-2)):
        chains, logits = [], []
        for model in demo_models:
            drafter = Drafter(demo_drafters[name], model)
            model.kv.clear()
            _, features = model.forward(ids, taps=drafter.taps, logits="none")
            kv = drafter.new_kv(ring_cap=64)
            kv.begin_step(len(ids), features.reshape(len(ids), -1))
            hidden = drafter.forward_block(kv, [ids[-1]] + [drafter.hp.mask_id] * (drafter.block_size - 1))[1:]
            logits.append(drafter.logits(hidden))
            chains.append(drafter.propose(hidden, ids[-1]).tokens)
        assert np.abs(logits[1] - logits[0]).max() <= bound * np.abs(logits[0]).max(), name
        assert chains[0] == chains[1], name


def run_pair(model, drafter_path, prompts, ring_cap):
    tokenizer = Tokenizer.from_gguf(model.weights.meta)
    drafter = Drafter(drafter_path, model)
    kv = drafter.new_kv(ring_cap=ring_cap)
    steps, matches = [], []
    for _, ids in prompts:
        out = speculative_generate(model, drafter, kv, ids, 64, stop_ids=tokenizer.eog)
        model.kv.clear()
        matches.append(out.tokens == greedy(model, ids, 64, tokenizer.eog)[0])
        steps.append(out.steps)
    return matches, acceptance_stats(steps, drafter.block_size)["tau_zlab"]


@pytest.mark.parametrize("drafter, ring_cap", [("f16", 64), pytest.param("q4-mix", 64, marks=pytest.mark.slow),
                                               pytest.param("f16", None, marks=pytest.mark.slow)])
def test_demo_pair_speculative_on_torch(demo_models, demo_drafters, drafter, ring_cap):
    """Held-out prompts: torch's speculative output equals its own greedy decoding, and tau is numba's within 1%."""
    numba, on_torch = demo_models
    prompts = held_out_prompts(Tokenizer.from_gguf(numba.weights.meta), 6)
    matches, tau = run_pair(on_torch, demo_drafters[drafter], prompts, ring_cap)
    assert all(matches)
    numba_matches, numba_tau = run_pair(numba, demo_drafters[drafter], prompts, ring_cap)
    print(f"demo pair, drafter {drafter}, draft KV {ring_cap or 'full'}: tau torch {tau:.4f}, numba {numba_tau:.4f}")
    assert all(numba_matches)
    assert abs(tau - numba_tau) <= 0.01 * numba_tau


def test_ring_equals_full_draft_kv_on_torch(demo_models, demo_drafters):
    """A ring at least as large as the context drafts the same bits as the full draft KV (stores on the device)."""
    _, on_torch = demo_models
    prompts = held_out_prompts(Tokenizer.from_gguf(on_torch.weights.meta), 2)
    drafter = Drafter(demo_drafters["f16"], on_torch)
    outs = []
    for kv in (drafter.new_kv(ring_cap=512), drafter.new_kv(None)):
        outs.append([speculative_generate(on_torch, drafter, kv, ids, 48).steps for _, ids in prompts])
    assert outs[0] == outs[1]
    assert isinstance(drafter.new_kv(ring_cap=8).k[0].data, torch.Tensor)


def test_hybrid_crop_on_torch(qwen35_target):
    """A Gated DeltaNet hybrid on torch: crop then continue equals never having gone further (the recurrent
    state replayed from its checkpoint, shared code with numba)."""
    model = TargetModel(qwen35_target.gguf["f16"], backend="torch", threads=1)
    ids = random_prompt(model, 3, 20)
    model.forward(ids + [5, 6, 7, 8])
    model.kv.crop(len(ids) + 1)
    after_crop, _ = model.forward([9, 10])
    model.kv.clear()
    model.forward(ids + [5])
    fresh, _ = model.forward([9, 10])
    assert np.abs(after_crop - fresh).max() <= 1e-5 * np.abs(fresh).max()


@pytest.mark.slow
def test_demo_command_on_torch(tmp_path):
    from click.testing import CliRunner

    from ggtools.cli import main
    r = CliRunner().invoke(main, ["demo", "--skip-requant", "--prompts", "2", "-n", "16", "--rounds", "1",
                                  "--backend", "torch", "--work-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    assert os.path.exists(tmp_path / "drafter" / "drafter-f16.gguf")
