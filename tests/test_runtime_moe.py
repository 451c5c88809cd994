"""The routed-expert targets (qwen3moe, gpt-oss) against their oracles, on the tiny models of
scripts/fixtures/moe_targets.py in every encoding (f32, f16, and Q8_0 / MXFP4_MOE made by llama-quantize):

- llama.cpp (llama-cpp-python, flash attention off, f16 KV cache): prompt logits bit for bit, including
  prompts longer than gpt-oss's sliding window; greedy tokens on prompts whose greedy path keeps a clear
  top-1 / top-2 margin, with the logits of every step compared;
- transformers' hidden_states for the feature taps (f32 GGUF, f32 cache);
- rollback: crop then generate equals never having gone further, a stepwise batch equals one-token steps;
- speculative decoding with tiny DFlash v1 / DFlash2 drafters (llama.cpp profile; v1 also lucebox's, which has
  no DFlash2), a ring of 8 slots and the full draft KV, and with a drafter that knows the answer but errs (partial acceptance):
  output equal to greedy decoding.
"""

import json

import numpy as np
import pytest

from ggtools.jobs.convert import convert_dflash
from ggtools.runtime import Drafter, TargetModel, greedy, speculative_generate
from tests.float_reference import assert_within_reference_rounding, hf_hidden_states
from ggtools.runtime.model.ffn import moe
from ggtools.runtime.model.mixers import attention
from tests.llama_runner import LlamaCpp, assert_one_call_steps_identical, avx2_llama_cpp
from tests.speculative_checks import KnowingDrafter

pytestmark = pytest.mark.oracle

ENCODINGS = [("qwen3moe", "f32"), ("qwen3moe", "f16"), ("qwen3moe", "Q8_0"),
             ("gpt-oss", "f32"), ("gpt-oss", "f16"), ("gpt-oss", "MXFP4_MOE")]
IDS = [f"{arch}-{kind}" for arch, kind in ENCODINGS]
N_GREEDY = 32
# top-1 minus top-2 logit along llama.cpp's whole greedy path, for a prompt to count: the tiny models' logits
# span about +-3.5 over 1024 tokens, so 32 steps rarely keep more; float-level differences are ~1e-6
MIN_MARGIN = 0.01
N_PROMPTS = 3
# the drafter files a target can be paired with (lucebox's loader has no DFlash2)
DRAFTER_KINDS = [("v1", "llama.cpp"), ("v1", "lucebox"), ("v2", "llama.cpp")]


@pytest.fixture(scope="module")
def llama_cpp():
    return avx2_llama_cpp()


@pytest.fixture(scope="module")
def targets(qwen3moe_target, gpt_oss_target):
    return {"qwen3moe": qwen3moe_target, "gpt-oss": gpt_oss_target}


def random_prompt(seed, n):
    return [1] + np.random.default_rng(seed).integers(3, 1024, n - 1).tolist()


def margins(logits):
    top2 = np.sort(logits, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


@pytest.mark.parametrize("arch, kind", ENCODINGS, ids=IDS)
def test_prompt_logits_are_bit_identical(targets, llama_cpp, arch, kind):
    path = targets[arch].gguf[kind]
    oracle, model = LlamaCpp(llama_cpp, path), TargetModel(path, threads=2)
    for ids in (random_prompt(7, 14), random_prompt(8, 61)):      # 61: past gpt-oss's window of 16
        model.kv.clear()
        ours, _ = model.forward(ids)
        want = oracle.prompt_logits(ids)
        print(f"{arch} {kind}: {len(ids)} prompt tokens, max abs logit difference {np.abs(ours - want).max()}")
        assert np.array_equal(ours.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("arch, kind", ENCODINGS, ids=IDS)
def test_one_call_steps_are_bit_identical(targets, llama_cpp, monkeypatch, arch, kind, threads):
    """A one-token step's attention and routed experts, each with the layer's norm before it and the residual after
    it, run as one kernel call each (attention.one_token_attention, moe.one_token_experts) for every weight type
    here; on 2 threads their larger matmuls are shared with the worker from inside those calls."""
    path = targets[arch].gguf[kind]
    oracle, model = LlamaCpp(llama_cpp, path), TargetModel(path, threads=threads)
    n_layer = len(model.layers)
    assert_one_call_steps_identical(monkeypatch, oracle, model, random_prompt(101, 13), 8,
                                    [(attention, "one_token_attention", n_layer), (moe, "one_token_experts", n_layer)],
                                    f"{arch} {kind}, {threads} thread(s)", shared=threads > 1)


@pytest.mark.slow
@pytest.mark.parametrize("arch, kind", ENCODINGS, ids=IDS)
def test_greedy_tokens_are_identical(targets, llama_cpp, arch, kind):
    """Prompts are taken in a fixed order and kept when llama.cpp's greedy path has a clear margin at every
    step, so that no float-level difference could decide the test; every step's logits are compared too."""
    path = targets[arch].gguf[kind]
    oracle, model = LlamaCpp(llama_cpp, path), TargetModel(path, threads=2)
    kept = []
    for seed in range(100, 140):
        ids = random_prompt(seed, 12 + seed % 20)
        want, want_logits = oracle.greedy_logits(ids, N_GREEDY)
        margin = margins(want_logits).min()
        if margin < MIN_MARGIN:
            continue
        model.kv.clear()
        logits, _ = model.forward(ids)          # all rows, as the oracle (logits_all) computes its prompt
        ours, rows = [], []
        while len(ours) < N_GREEDY:
            rows.append(logits[-1])
            ours.append(int(np.argmax(logits[-1])))
            logits, _ = model.forward([ours[-1]], logits="last")
        diff = np.abs(np.array(rows) - want_logits).max()
        print(f"{arch} {kind} prompt seed {seed} ({len(ids)} tokens): min margin {margin:.3f}, "
              f"max abs logit difference over {N_GREEDY} steps {diff}")
        assert ours == want
        kept.append(diff)
        if len(kept) == N_PROMPTS:
            break
    assert len(kept) == N_PROMPTS, f"only {len(kept)} of 40 prompts keep a margin of {MIN_MARGIN}"


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_feature_taps_equal_transformers_hidden_states(targets, arch):
    """hidden_states[j] is the residual entering layer j (the last one the final normed state): MoE layers,
    sliding-window layers, sinks and YaRN included. f32 GGUF, f32 cache: float32 rounding only, no further from
    transformers' float64 run than its own float32 run allows (float_reference.py)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ids = random_prompt(1, 40)
    hidden = hf_hidden_states(targets[arch].hf_dir, ids)
    model = TargetModel(targets[arch].gguf["f32"], kv_type="f32")
    taps = list(range(model.hp.n_layer + 1))
    _, features = model.forward(ids, taps=taps, logits="none")
    for j in taps:
        assert_within_reference_rounding(features[:, j], hidden["f32"][j], hidden["f64"][j], f"{arch} tap {j}")


@pytest.mark.parametrize("arch, kind", [("qwen3moe", "Q8_0"), ("gpt-oss", "MXFP4_MOE"), ("gpt-oss", "f16")])
def test_crop_then_generate_equals_never_going_further(targets, arch, kind):
    """Past the sliding window: generate, crop back into the middle, generate again: the same tokens and the
    same logits, bit for bit. A stepwise verify batch equals one-token steps."""
    model = TargetModel(targets[arch].gguf[kind], threads=2)
    prompt = random_prompt(3, 20)

    def generate(first_input, n):
        logits, tokens, rows = model.forward(first_input, logits="last")[0], [], []
        while len(tokens) < n:
            rows.append(logits[-1])
            tokens.append(int(np.argmax(logits[-1])))
            logits = model.forward([tokens[-1]], logits="last")[0]
        return tokens, np.array(rows)

    first, first_logits = generate(prompt, 24)
    model.kv.crop(len(prompt) + 5)
    again, again_logits = generate([first[5]], 18)
    assert again == first[6:24]
    assert np.array_equal(again_logits, first_logits[6:24])
    model.kv.crop(len(prompt))
    batch, _ = model.forward(first[:8], logits="all", stepwise=True)
    model.kv.crop(len(prompt))
    for i, t in enumerate(first[:8]):
        step, _ = model.forward([t], logits="last")
        assert np.array_equal(step[0], batch[i])


@pytest.fixture(scope="module")
def drafter_ggufs(targets, moe_drafters, tmp_path_factory):
    """{(arch, version, profile): drafter GGUF} converted by ggtools from the z-lab checkpoints."""
    d = tmp_path_factory.mktemp("moe-drafters")
    out = {}
    for arch in targets:
        for version, profile in DRAFTER_KINDS:
            path = d / f"{arch}-{version}-{profile}.gguf"
            convert_dflash(moe_drafters[arch][version], path, profile=profile, target=targets[arch].gguf["f16"])
            out[arch, version, profile] = path
    return out


def _speculative_equals_greedy(targets, drafter_ggufs, arch, kind, version, profile):
    model = TargetModel(targets[arch].gguf[kind], threads=2)
    drafter = Drafter(drafter_ggufs[arch, version, profile], model)
    prompt = random_prompt(5, 30)
    want, _ = greedy(model, prompt, 40)
    for ring_cap in (None, 8):
        out = speculative_generate(model, drafter, drafter.new_kv(ring_cap), prompt, 40)
        assert out.tokens == want
    knowing = speculative_generate(model, KnowingDrafter(drafter, len(prompt), want), drafter.new_kv(8), prompt, 40)
    assert knowing.tokens == want
    accepted = {s.accepted for s in knowing.steps}
    assert 0 in accepted and max(accepted) >= 3, accepted
    drafter.close()
    model.close()


@pytest.mark.parametrize("arch, kind", [("qwen3moe", "Q8_0"), ("gpt-oss", "MXFP4_MOE")])
def test_speculative_output_equals_greedy(targets, drafter_ggufs, arch, kind):
    _speculative_equals_greedy(targets, drafter_ggufs, arch, kind, "v2", "llama.cpp")


@pytest.mark.slow
@pytest.mark.parametrize("arch, kind", ENCODINGS, ids=IDS)
@pytest.mark.parametrize("version, profile", DRAFTER_KINDS)
def test_speculative_output_equals_greedy_every_pair(targets, drafter_ggufs, arch, kind, version, profile):
    _speculative_equals_greedy(targets, drafter_ggufs, arch, kind, version, profile)


@pytest.mark.parametrize("llama_cpp_taps_gpt_oss", [True, False])
def test_run_draft_warns_about_llama_cpp_but_runs_the_pair(targets, drafter_ggufs, monkeypatch, llama_cpp_taps_gpt_oss):
    """Where llama.cpp's graph for the target arch sets no layer inputs, `ggtools run --draft` says so and runs
    the pair anyway. Every arch this runtime runs is tapped by today's llama.cpp (gpt-oss included: its graph sets
    t_layer_inp), so the other case is made by taking gpt-oss out of the profile's list."""
    import dataclasses

    from click.testing import CliRunner

    from ggtools.cli import main
    from ggtools.dflash.profiles import LLAMACPP

    if not llama_cpp_taps_gpt_oss:
        monkeypatch.setattr("ggtools.jobs.run.LLAMACPP",
                            dataclasses.replace(LLAMACPP, tap_archs=LLAMACPP.tap_archs - {"gpt-oss"}))
    warned = not llama_cpp_taps_gpt_oss
    args = ["run", "--target", str(targets["gpt-oss"].gguf["MXFP4_MOE"]), "--draft",
            str(drafter_ggufs["gpt-oss", "v2", "llama.cpp"]), "--prompt-ids", "1,5,77,300,12,9", "-n", "12",
            "--threads", "2"]
    result = CliRunner().invoke(main, args + ["--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["outputs_match_target"] and bool(out["warnings"]) == warned
    text = CliRunner().invoke(main, args)
    assert text.exit_code == 0 and ("does not expose layer inputs in llama.cpp" in text.stderr) == warned


def test_split_target_runs_from_its_first_shard(targets, tmp_path):
    """The MXFP4 gpt-oss as 3 shards (gguf-py's split writer): experts spread over shards, same logits."""
    from scripts.fixtures import tiny_models

    path = targets["gpt-oss"].gguf["MXFP4_MOE"]
    shards = tiny_models.split_gguf(path, tmp_path / "tiny-gpt-oss", 3)
    ids = random_prompt(9, 30)
    want, _ = TargetModel(path, threads=2).forward(ids)
    got, _ = TargetModel(shards[0], threads=2).forward(ids)
    assert len(shards) == 3 and np.array_equal(got.view(np.uint32), want.view(np.uint32))
