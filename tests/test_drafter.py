"""Drafter loading on the embedded demo pair: both GGUF profiles read to the same hyperparameters and draft the
same tokens, quantized variants stay close to f16, and drafters that cannot work are refused with a clear error."""

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.demo import demo_data
from ggtools.jobs.patch import patch
from ggtools.jobs.quantize import plan_quantize
from ggtools.plan import KVEdits
from ggtools.runtime import ModelError, TargetModel
from ggtools.runtime.drafter.chain import DraftChain, cut_length, top_candidates
from ggtools.runtime.drafter import Drafter
from ggtools.engine import run_plan


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    work = tmp_path_factory.mktemp("drafters")
    target = str(demo_data() / "target.gguf")
    out = {"target": target}
    for profile, outtype in (("llama.cpp", "f16"), ("lucebox", "auto")):
        out[profile] = str(work / f"{profile}.gguf")
        convert_dflash(demo_data() / "drafter", out[profile], profile=profile, target=target, outtype=outtype)
    for qtype in ("q8_0", "q2_k", "q6_k", "q4_k"):
        out[qtype] = str(work / f"{qtype}.gguf")
        run_plan(plan_quantize(out["llama.cpp"], out[qtype], qtype), jobs=1, progress=False)
    return out


@pytest.fixture(scope="module")
def target(files):
    model = TargetModel(files["target"], threads=1)
    yield model
    model.close()


@pytest.fixture(scope="module")
def context(target):
    ids = list(range(300, 360))
    target.kv.clear()
    _, features = target.forward(ids, taps=[2, 3], logits="none")
    return features.reshape(len(ids), -1)


def _block(drafter, target, context, anchor=258):
    kv = drafter.new_kv()
    kv.begin_step(len(context), context)
    return drafter.forward_block(kv, [anchor] + [drafter.hp.mask_id] * (drafter.block_size - 1))


def test_both_profiles_read_the_same_drafter(files, target, context):
    a, b = Drafter(files["llama.cpp"], target), Drafter(files["lucebox"], target)
    assert (a.hp.profile, b.hp.profile) == ("llama.cpp", "lucebox")
    for hp in (a.hp, b.hp):
        assert (hp.taps, hp.mask_id, hp.block_size, hp.n_layer, hp.n_head, hp.n_head_kv, hp.head_dim, hp.v2) == \
               ((2, 3), 2047, 8, 2, 4, 2, 64, None)
    ha, hb = _block(a, target, context), _block(b, target, context)
    assert np.array_equal(ha, hb)       # both profiles store the same F16 / F32 tensors: the same bits
    assert a.propose(ha[1:], 258).tokens == b.propose(hb[1:], 258).tokens


@pytest.mark.parametrize("qtype, min_cos", [("q8_0", 0.999), ("q6_k", 0.999), ("q4_k", 0.99), ("q2_k", 0.9)])
def test_quantized_drafters_stay_close_to_f16(files, target, context, qtype, min_cos):
    ref = _block(Drafter(files["llama.cpp"], target), target, context)[1:]
    got = _block(Drafter(files[qtype], target), target, context)[1:]
    cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
    assert cos.min() > min_cos


def _patched(files, tmp_path, edits: KVEdits):
    out = str(tmp_path / "patched.gguf")
    patch(files["llama.cpp"], edits, out=out, force=True)
    return out


def test_refusals(files, target, tmp_path):
    with pytest.raises(ModelError, match="not a DFlash drafter"):
        Drafter(files["target"], target)
    no_mask = KVEdits()
    no_mask.drop("tokenizer.ggml.mask_token_id")
    with pytest.raises(ModelError, match="mask token"):
        Drafter(_patched(files, tmp_path, no_mask), target)
    bad_taps = KVEdits()
    bad_taps.put("dflash.target_layers", VT.ARRAY, [2, 9], VT.INT32)
    with pytest.raises(ModelError, match="outside 1..4"):
        Drafter(_patched(files, tmp_path, bad_taps), target)
    assert Drafter(files["llama.cpp"], target, mask_id=2046).hp.mask_id == 2046
    with pytest.raises(ModelError, match="outside the 2048-token"):
        Drafter(files["llama.cpp"], target, mask_id=5000)


def test_top_candidates_break_ties_toward_the_lower_id():
    row = np.array([0.5, 2.0, 1.0, 2.0, 1.0, -3.0], np.float32)
    assert top_candidates(row, 2).tolist() == [1, 3]
    assert top_candidates(row, 3).tolist() == [1, 3, 2]
    assert top_candidates(row, 4).tolist() == [1, 3, 2, 4]


def test_cut_length():
    chain = DraftChain([1, 2, 3, 4], p=[0.9, 0.7, 0.2, 0.9], margin=[5.0, 0.5, 3.0, 0.1])
    assert cut_length(chain) == 4
    assert cut_length(chain, "prob", 0.5) == 2                    # stops before p 0.2
    assert cut_length(chain, "margin", 0.35) == 1                 # 0.5 < 3 * 0.35
    assert cut_length(chain, "margin", 0.35, n_min=2) == 0        # fewer than n_min: none (llama.cpp)
    assert cut_length(chain, "prob", 0.0) == 4
    with pytest.raises(ValueError):
        cut_length(chain, "entropy", 0.1)
