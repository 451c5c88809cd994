"""The torch backend (f32, CPU) against the numba runtime, which is llama.cpp's CPU numerics bit for bit
(test_runtime_parity and the MoE / hybrid parity tests), on every target fixture the runtime runs: tiny qwen3,
qwen3moe, gpt-oss, qwen35, qwen35moe in f32 / f16 / their llama-quantize encodings (Q8_0, MXFP4_MOE), SmolLM2
Q4_1 and the demo target; and the drafters and speculative decoding on the demo pair.

In float32 the torch backend performs llama.cpp's operations in llama.cpp's order (runtime/torch_backend/
ggml_math.py, ggml_matmul.py): the 8-bit / f16 roundings of matmul inputs, the KV cache, q and the attention
probabilities; the integer block dots, fma chains and lane sums; ggml's vector exp and glibc's expf / logf. So:

- each layer fed numba's input (teacher-forced) gives numba's bits, with an f16 or an f32 KV cache;
- prompt logits (a batch, and one-token steps) are within PARITY = 1e-4 relative of numba's on every fixture
  (issue 21's goal), and measured equal. The bound names what may still differ on another CPU: the float64
  sums torch adds in its own order (rms_norm's squares, softmax's block sums) and the float64 emulation of a
  fused multiply-add, which rounds twice when the float64 sum is inexact and lands halfway between two float32
  (about 2^-29 of the sums): either moves a value by one float32 ulp (6e-8 relative). The bound admits such
  ulps and no flipped 8-bit or f16 rounding (one flip moves the logits ~1e-3 relative: what the backend did
  before it summed in ggml's order);
- greedy tokens are equal along every prompt whose numba greedy path keeps a top-1 / top-2 margin of at least
  2 * PARITY * max |logit| (logits within PARITY can only reorder a closer pair);
- drafters fed the same context give numba's logits and drafts; speculative decoding gives numba's steps, so
  tau is equal, not near;
- a Gated DeltaNet hybrid cropped and continued gives the bits of one never taken further.
"""

import os

import numpy as np
import pytest

from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.runtime import Drafter, TargetModel, Tokenizer, greedy, speculative_generate
from ggtools.runtime.stats import acceptance_stats
from tests.oracle_artifacts import (gpt_oss_target, qwen3moe_target, qwen35_target, qwen35moe_set,  # noqa: F401
                                    qwen35moe_target, ref_drafter_gguf, ref_drafter_quant)

torch = pytest.importorskip("torch")
from tests.backend_parity import (greedy_path, layer_errors, logit_parity, prompt_logits,  # noqa: E402
                                  random_prompt)

pytestmark = pytest.mark.oracle

FIXTURES = ["qwen3-f32", "qwen3-f16", "qwen3moe-f32", "qwen3moe-f16", "qwen3moe-Q8_0", "gpt-oss-f32", "gpt-oss-f16",
            "gpt-oss-MXFP4_MOE", "qwen35-f32", "qwen35-f16", "qwen35-q8_0", "qwen35moe-f32", "qwen35moe-f16",
            "qwen35moe-mxfp4_moe", "smollm2-q4_1", "demo-f16"]
PROMPT_TOKENS = 24
N_GREEDY = 24
PARITY = 1e-4


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


@pytest.mark.parametrize("name, kv_type", [(name, "f16") for name in FIXTURES] +
                         [(name, "f32") for name in FIXTURES if name.endswith("f32")])
def test_layers_equal_numba(targets, name, kv_type):
    """Each layer fed numba's residual stream gives numba's next stream bit for bit."""
    numba, on_torch = pair(targets, name, kv_type)
    errors = layer_errors(numba, on_torch, random_prompt(numba, 7, PROMPT_TOKENS))
    assert max(errors) == 0, [f"{e:.1e}" for e in errors]


@pytest.mark.parametrize("name", FIXTURES)
def test_prompt_logits_match_numba(targets, name):
    numba, on_torch = pair(targets, name)
    p = logit_parity(numba, on_torch, random_prompt(numba, 7, PROMPT_TOKENS))
    print(f"{name}: torch vs numba {p.rel_diff:.1e} (batch), {p.step_rel_diff:.1e} (one-token steps), bit for bit "
          f"{p.equal}; numba's own batch vs steps {p.own_rel_diff:.2e}")
    assert p.rel_diff <= PARITY and p.step_rel_diff <= PARITY


def check_greedy_on_clear_margins(numba, on_torch, seeds, n_tokens=N_GREEDY, enough=2) -> int:
    """Greedy ids equal along the seeded prompts whose numba greedy path keeps a clear margin (the first `enough`
    of them); returns how many prompts were checked."""
    checked = 0
    for seed in seeds:
        if checked == enough:
            break
        ids = random_prompt(numba, seed, 12)
        want, margins = greedy_path(numba, ids, n_tokens)
        threshold = 2 * PARITY * np.abs(prompt_logits(numba, ids)).max()
        if min(margins) < threshold:
            continue
        assert greedy_path(on_torch, ids, n_tokens)[0] == want, f"seed {seed}"
        checked += 1
    return checked


def test_greedy_ids_equal_numba_on_the_quantized_hybrid(targets):
    """The case of issue 21: on qwen35 Q8_0 (8-bit-rounded inputs, Gated DeltaNet state) torch's greedy path used
    to leave llama.cpp's within a few tokens where the top-1 / top-2 margin was 0.055."""
    assert check_greedy_on_clear_margins(*pair(targets, "qwen35-q8_0"), range(3)) >= 1


@pytest.mark.slow
@pytest.mark.parametrize("name", FIXTURES)
def test_greedy_ids_equal_numba_on_clear_margins(targets, name):
    assert check_greedy_on_clear_margins(*pair(targets, name), range(8)), \
        "no prompt keeps a clear margin along its greedy path"


@pytest.fixture(scope="module")
def demo_drafters(tmp_path_factory):
    work = tmp_path_factory.mktemp("demo-drafters")
    # the block drafters (EAGLE3 drafts token by token: its torch parity is tests/test_eagle3_mtp.py's)
    return {v.name: v.path for v in build_drafters(work, str(demo_data() / "target.gguf"))
            if not v.name.startswith("eagle3")}


@pytest.fixture(scope="module")
def demo_models(demo_drafters):
    """Made after the drafters: building them runs numba's parallel quantizers, whose thread setting (OpenMP's,
    per thread) also resets torch's thread count set here."""
    target = str(demo_data() / "target.gguf")
    return TargetModel(target, threads=1), TargetModel(target, backend="torch", threads=1)


def draft_block(model, drafter_path, ids):
    """A drafter's block logits and draft chain after the committed context `ids`."""
    drafter = Drafter(drafter_path, model)
    model.kv.clear()
    _, features = model.forward(ids, taps=drafter.taps, logits="none")
    kv = drafter.new_kv(ring_cap=64)
    kv.begin_step(len(ids), features.reshape(len(ids), -1))
    hidden = drafter.forward_block(kv, [ids[-1]] + [drafter.hp.mask_id] * (drafter.block_size - 1))[1:]
    return drafter.logits(hidden), drafter.propose(hidden, ids[-1]).tokens


def test_drafter_blocks_equal_numba(demo_models, demo_drafters):
    """Same committed context, same anchor: every encoding of the demo drafter (f16; q8_0, q4-mix and q2_k, whose
    K-quants take Q8_K-rounded inputs) gives numba's block logits bit for bit and the same draft chain."""
    numba, on_torch = demo_models
    _, ids = held_out_prompts(Tokenizer.from_gguf(numba.weights.meta), 1)[0]
    for name, path in demo_drafters.items():
        (want, want_chain), (got, got_chain) = (draft_block(model, path, ids) for model in demo_models)
        assert np.array_equal(got, want) and got_chain == want_chain, name


def test_dflash2_drafter_blocks_equal_numba(tiny_target, ref_drafter_gguf, ref_drafter_quant):
    """DFlash2 (dynamic convolution, candidate selector) and DFlash v1 drafters of the tiny qwen3 target, in
    llama.cpp's f16 conversion and llama-quantize's Q4_K_M: numba's logits and drafts."""
    models = [TargetModel(tiny_target.gguf["f32"], threads=1),
              TargetModel(tiny_target.gguf["f32"], backend="torch", threads=1)]
    ids = random_prompt(models[0], 5, 16)
    for path in (ref_drafter_gguf(2, "f16"), ref_drafter_quant(2, "Q4_K_M"), ref_drafter_quant(1, "Q4_K_M")):
        (want, want_chain), (got, got_chain) = (draft_block(model, path, ids) for model in models)
        assert np.array_equal(got, want) and got_chain == want_chain, path.name


def run_pair(model, drafter_path, prompts, ring_cap, n=64):
    tokenizer = Tokenizer.from_gguf(model.weights.meta)
    drafter = Drafter(drafter_path, model)
    kv = drafter.new_kv(ring_cap=ring_cap)
    steps, outputs = [], []
    for _, ids in prompts:
        out = speculative_generate(model, drafter, kv, ids, n, stop_ids=tokenizer.eog)
        model.kv.clear()
        outputs.append(out.tokens)
        steps.append(out.steps)
    return outputs, steps, acceptance_stats(steps, drafter.block_size)["tau_zlab"]


@pytest.mark.parametrize("drafter, ring_cap, n_prompts", [
    ("f16", 64, 3), pytest.param("f16", 64, 6, marks=pytest.mark.slow),
    pytest.param("q4-mix", 64, 6, marks=pytest.mark.slow), pytest.param("q2_k", 64, 6, marks=pytest.mark.slow),
    pytest.param("f16", None, 6, marks=pytest.mark.slow)])
def test_demo_pair_speculative_equals_numba(demo_models, demo_drafters, drafter, ring_cap, n_prompts):
    """Held-out prompts, the trained demo pair: torch's speculative decoding takes numba's steps (the same drafts
    accepted at every verify), so its outputs are numba's greedy decoding and tau is numba's, exactly."""
    numba, on_torch = demo_models
    prompts = held_out_prompts(Tokenizer.from_gguf(numba.weights.meta), n_prompts)
    outputs, steps, tau = run_pair(on_torch, demo_drafters[drafter], prompts, ring_cap)
    numba_outputs, numba_steps, numba_tau = run_pair(numba, demo_drafters[drafter], prompts, ring_cap)
    print(f"demo pair, drafter {drafter}, draft KV {ring_cap or 'full'}: tau torch {tau:.4f}, numba {numba_tau:.4f}")
    assert steps == numba_steps and tau == numba_tau
    assert outputs == numba_outputs == [greedy_output(numba, ids) for _, ids in prompts]


def greedy_output(model, ids, n=64):
    model.kv.clear()
    out = greedy(model, ids, n, Tokenizer.from_gguf(model.weights.meta).eog)[0]
    model.kv.clear()
    return out


def test_ring_equals_full_draft_kv_on_torch(demo_models, demo_drafters):
    """A ring at least as large as the context drafts the same bits as the full draft KV (stores on the device)."""
    _, on_torch = demo_models
    prompts = held_out_prompts(Tokenizer.from_gguf(on_torch.weights.meta), 2)
    drafter = Drafter(demo_drafters["f16"], on_torch)
    outs = []
    for kv in (drafter.new_kv(ring_cap=512), drafter.new_kv(None)):
        outs.append([speculative_generate(on_torch, drafter, kv, ids, 32).steps for _, ids in prompts])
    assert outs[0] == outs[1]
    assert isinstance(drafter.new_kv(ring_cap=8).k[0].data, torch.Tensor)


@pytest.mark.parametrize("batches", [[24], [21, 3]], ids=["inside-a-batch", "at-a-batch-boundary"])
def test_hybrid_crop_on_torch_is_bit_identical(qwen35_target, batches):
    """A Gated DeltaNet hybrid on torch: crop then continue gives the bits of never having gone further. The
    recurrent state is replayed from its checkpoint (shared code with numba) one token at a time, and every
    operation of a token's step has the same shapes in the replay as in a fresh pass of any batch size (issue 21:
    torch's own kernels, batch-shape dependent, made a crop inside a batch differ by 5e-4 relative on AVX-512)."""
    model = TargetModel(qwen35_target.gguf["f16"], backend="torch", threads=1)
    ids = random_prompt(model, 3, 20) + [5, 6, 7, 8]
    start = 0
    for size in batches:
        model.forward(ids[start:start + size])
        start += size
    model.kv.crop(21)
    after_crop, _ = model.forward([9, 10])
    model.kv.clear()
    model.forward(ids[:21])
    fresh, _ = model.forward([9, 10])
    assert np.array_equal(after_crop, fresh)


@pytest.mark.slow
def test_demo_command_on_torch(tmp_path):
    from click.testing import CliRunner

    from ggtools.cli import main
    r = CliRunner().invoke(main, ["demo", "--skip-requant", "--prompts", "2", "-n", "16", "--rounds", "1",
                                  "--backend", "torch", "--work-dir", str(tmp_path), "--json"])
    assert r.exit_code == 0, r.output
    assert os.path.exists(tmp_path / "drafter" / "drafter-f16.gguf")
