"""Drafter parity with z-lab's reference classes (PyPI dflash): tiny random DFlash v1 and DFlash2 drafters and the
tiny qwen3 target (docs/fixtures.md). Our drafter on the GGUF that `ggtools convert dflash` makes of the HF
checkpoint gives the same hidden states (to float32 rounding, measured against z-lab's float64 run) and the same
draft tokens as z-lab's model on the
checkpoint, both fed the same target features; also with DFlash2's logit scale, softcap and embedding scale.
Quantized drafters made by llama.cpp's own quantizer (Q8_0, Q4_K_M, Q2_K) run, and decode exactly as the
target alone does."""

import copy
import json
import shutil

import numpy as np
import pytest

from ggtools.jobs.convert import convert_dflash
from ggtools.runtime import TargetModel, greedy
from ggtools.runtime.drafter import Drafter
from ggtools.runtime.speculative import speculative_generate
from tests.float_reference import assert_within_reference_rounding

pytestmark = pytest.mark.oracle

torch = pytest.importorskip("torch")
dflash = pytest.importorskip("dflash")
transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_target(tiny_target):
    return transformers.AutoModelForCausalLM.from_pretrained(tiny_target.hf_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def target(tiny_target):
    model = TargetModel(tiny_target.gguf["f32"], threads=1, kv_type="f32")
    yield model
    model.close()


def _context(target, taps, n, seed=0):
    ids = np.random.default_rng(seed).integers(0, 1000, n).tolist()
    target.kv.clear()
    _, features = target.forward(ids, taps=taps, logits="none")
    return features.reshape(n, -1)


def _reference(hf_dir, version):
    cls = dflash.DFlash2DraftModel if version == 2 else dflash.DFlashDraftModel
    return cls.from_pretrained(hf_dir, dtype=torch.float32).eval()


@torch.inference_mode()
def _compare(hf_dir, version, target, hf_target, tiny_target, gguf_path, context_lengths=(40, 43, 57)):
    convert_dflash(hf_dir, gguf_path, profile="llama.cpp", target=tiny_target.gguf["f32"], outtype="f32", force=True)
    ours, ref = Drafter(gguf_path, target), _reference(hf_dir, version)
    scale = ours.hp.embedding_scale
    embed = hf_target.get_input_embeddings().weight
    features = _context(target, ours.taps, max(context_lengths))
    kv = ours.new_kv(None, "f32")
    ref64 = copy.deepcopy(ref).double()
    for n_ctx, anchor in zip(context_lengths, (17, 500, 3)):      # growing context: appends to the draft KV
        block = [anchor] + [ours.hp.mask_id] * (ours.block_size - 1)
        kv.begin_step(n_ctx, features[:n_ctx])
        hidden = ours.forward_block(kv, block)
        want, want64 = (model(target_hidden=torch.tensor(features[:n_ctx])[None].to(dtype),
                              noise_embedding=torch.nn.functional.embedding(torch.tensor([block]), embed.to(dtype))
                              * scale, position_ids=torch.arange(n_ctx + len(block))[None], use_cache=False)[0]
                        for model, dtype in ((ref, torch.float32), (ref64, torch.float64)))
        # float32 rounding only: no further from z-lab's float64 run than its own float32 run is
        assert_within_reference_rounding(hidden, want.numpy(), want64.numpy(), f"context {n_ctx}")
        want = want.float()
        chain = ours.propose(hidden[1:], anchor)
        if version == 2:
            tokens = ref.propose(want[None, 1:], torch.tensor([anchor]), hf_target.lm_head, 0.0)[0][0].tolist()
        else:
            tokens = ref.compute_logits(want[None, 1:], hf_target.lm_head).argmax(-1)[0].tolist()
        assert chain.tokens == tokens
    ours.close()


@pytest.mark.parametrize("version", [1, 2])
def test_parity_with_zlab(tiny_drafters, tiny_target, target, hf_target, tmp_path, version):
    _compare(tiny_drafters[f"v{version}"], version, target, hf_target, tiny_target, tmp_path / "d.gguf")


def test_parity_with_zlab_dflash2_scaled_softcapped(tiny_drafters, tiny_target, target, hf_target, tmp_path):
    hf = tmp_path / "dflash2-scaled"
    shutil.copytree(tiny_drafters["v2"], hf)
    config = json.loads((hf / "config.json").read_text())
    config["dflash_config"] |= {"output_multiplier": 0.196, "final_logit_softcapping": 2.0,
                                "input_embedding_scale": 1.5}
    (hf / "config.json").write_text(json.dumps(config))
    _compare(hf, 2, target, hf_target, tiny_target, tmp_path / "d.gguf")
    d = Drafter(tmp_path / "d.gguf", target)
    # the GGUF stores them as float32
    assert (d.hp.v2.logit_scale, d.hp.v2.softcap, d.hp.embedding_scale) == (float(np.float32(0.196)), 2.0, 1.5)


@pytest.mark.parametrize("causal", [False, True])
def test_parity_with_zlab_sliding_window(tiny_drafters, tiny_target, target, hf_target, tmp_path, causal):
    """A sliding layer (window 6, smaller than the block) beside a full one, non-causal or causal."""
    hf = tmp_path / "dflash-swa"
    shutil.copytree(tiny_drafters["v1"], hf)
    config = json.loads((hf / "config.json").read_text())
    config |= {"use_sliding_window": True, "sliding_window": 6, "is_causal": causal,
               "layer_types": ["sliding_attention", "full_attention"]}
    (hf / "config.json").write_text(json.dumps(config))
    _compare(hf, 1, target, hf_target, tiny_target, tmp_path / "d.gguf")
    d = Drafter(tmp_path / "d.gguf", target)
    assert (d.hp.sliding_window, d.hp.sliding_layers, d.hp.causal) == (6, (True, False), causal)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("ftype", ["Q8_0", "Q4_K_M", "Q2_K"])
def test_llama_cpp_quantized_drafters_decode_as_the_target(ref_drafter_quant, tiny_target, version, ftype):
    model = TargetModel(tiny_target.gguf["f16"], threads=1)
    drafter = Drafter(ref_drafter_quant(version, ftype), model)
    prompt = np.random.default_rng(1).integers(0, 1000, 30).tolist()
    want, _ = greedy(model, prompt, 40)
    for ring_cap in (None, 8):
        out = speculative_generate(model, drafter, drafter.new_kv(ring_cap), prompt, 40, settings=None)
        assert out.tokens == want
    drafter.close()
    model.close()


@pytest.mark.parametrize("version", [1, 2])
def test_ring_equals_full_and_window_recompute(tiny_drafters, tiny_target, tmp_path, version):
    """DFlash2 (conv, lattice) and v1 on the tiny pair: ring cap >= context = full KV, small ring = recompute."""
    from tests.test_ring import Recording, WindowRecompute
    path = tmp_path / "d.gguf"
    convert_dflash(tiny_drafters[f"v{version}"], path, profile="llama.cpp", target=tiny_target.gguf["f16"],
                   outtype="f16")
    model = TargetModel(tiny_target.gguf["f16"], threads=1)
    drafter = Drafter(path, model)
    prompt = np.random.default_rng(2).integers(0, 1000, 120).tolist()
    runs = {}
    for name, kv in (("full", drafter.new_kv()), ("ring", drafter.new_kv(4096)), ("ring8", drafter.new_kv(8)),
                     ("recompute8", WindowRecompute(drafter, 8))):
        rec = Recording(drafter)
        runs[name] = rec, speculative_generate(model, rec, kv, prompt, 40)
    for a, b in (("full", "ring"), ("ring8", "recompute8")):
        assert len(runs[a][0].hidden) == len(runs[b][0].hidden) > 20
        assert all(np.array_equal(x, y) for x, y in zip(runs[a][0].hidden, runs[b][0].hidden))
        assert [c.tokens for c in runs[a][0].chains] == [c.tokens for c in runs[b][0].chains]
    model.kv.clear()
    assert runs["full"][1].tokens == greedy(model, prompt, 40)[0]
    drafter.close()
    model.close()
