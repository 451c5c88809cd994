"""doctor and convert gguf-layout on z-lab's tiny drafters, against libllama and llama.cpp's own converter.

- A lucebox-layout file with lucebox's converter's faults (RoPE base 1e6 for a checkpoint that keeps its base
  under rope_parameters, mask id 248070 for one that keeps it under dflash_config): doctor --hf finds both and
  --fix writes the checkpoint's values; moved to the llama.cpp layout it equals ggtools' llama.cpp-profile
  conversion tensor for tensor and loads in libllama; the reverse move equals the lucebox-profile conversion.
- A mainline drafter (llama.cpp's converter's output) with the mask id only under dflash.mask_token_id: the
  finding, the fix, and the fixed file loads in libllama and passes pair-check.
- Target layer ids stored without the + 1: found with --hf and fixed.
"""

import os
import shutil
import subprocess
import sys

import pytest
from gguf import GGUFValueType as VT

from ggtools.errors import GGToolsError
from ggtools.gguf import GGUFFile
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.doctor import doctor, doctor_fix, move_layout, pair_check
from tests.oracle_artifacts import llama_loads, ref_drafter_gguf, tiny_drafters, tiny_target  # noqa: F401
from tests.test_convert_support import rewrite_gguf

pytestmark = pytest.mark.oracle
LB = "qwen35-dflash-draft"
MASK, THETA = 1000, 10000.0          # the tiny drafters' dflash_config.mask_token_id and rope_parameters.rope_theta


def tensors(path) -> dict:
    with GGUFFile(path) as f:
        return {t.name: (t.type_id, tuple(t.ne), bytes(f.tensor_data(t))) for t in f.tensors}


def kvs(path, prefix="") -> dict:
    with GGUFFile(path) as f:
        return {kv.key: (v.tolist() if hasattr(v := kv.value, "tolist") else v) for kv in f.kvs
                if kv.key.startswith(prefix)}


@pytest.fixture(scope="module", params=["described", "lucebox-converter"])
def faulty_lucebox(request, tmp_path_factory, tiny_drafters):
    """The lucebox-layout file lucebox's converter writes for the tiny v1 drafter: with GGTOOLS_LUCEBOX_CONVERTER,
    its own output; else ggtools' lucebox-profile conversion with the two values that converter writes."""
    d = tmp_path_factory.mktemp("faulty")
    path = d / "lucebox-faulty.gguf"
    if request.param == "lucebox-converter":
        script = os.environ.get("GGTOOLS_LUCEBOX_CONVERTER")
        if not script or not os.path.isfile(script):
            pytest.skip("oracle missing: set GGTOOLS_LUCEBOX_CONVERTER to lucebox's convert_dflash_to_gguf.py")
        src = d / "src"
        shutil.copytree(tiny_drafters["v1"], src)
        subprocess.run([sys.executable, script, str(src / "model.safetensors"), str(path), "--no-aux-heads"],
                       check=True, capture_output=True)
        return path
    ours = d / "lucebox.gguf"
    convert_dflash(tiny_drafters["v1"], ours, profile="lucebox")
    return rewrite_gguf(ours, path, set_keys=[(f"{LB}.rope.freq_base", VT.FLOAT32, 1e6, None),
                                              (f"{LB}.dflash.mask_token_id", VT.UINT32, 248070, None)])


def test_the_faulty_file_has_the_converters_faults(faulty_lucebox):
    values = kvs(faulty_lucebox, LB)
    assert values[f"{LB}.rope.freq_base"] == 1e6 and values[f"{LB}.dflash.mask_token_id"] == 248070


def test_doctor_hf_finds_both_faults_and_fix_writes_the_right_values(faulty_lucebox, tiny_drafters, tmp_path):
    hf = tiny_drafters["v1"]
    report = doctor(faulty_lucebox, hf=hf, runtimes=["lucebox", "ggtools"])
    by_check = {f.check: f for f in report.findings}
    assert by_check["rope_theta"].severity == "error" and "rope_parameters.rope_theta is 10000" in \
        by_check["rope_theta"].message
    assert by_check["mask_token_id"].severity == "error" and "248070" in by_check["mask_token_id"].message
    assert report.fixes == {"rope.freq_base": THETA, "mask": MASK}
    out = tmp_path / "fixed.gguf"
    result = doctor_fix(faulty_lucebox, out, hf=hf, runtimes=["lucebox", "ggtools"])
    assert result.exit_code == 0, [(f.check, f.message) for f in result.after.errors]
    values = kvs(out, LB)
    assert values[f"{LB}.rope.freq_base"] == THETA and values[f"{LB}.dflash.mask_token_id"] == MASK
    assert tensors(out) == tensors(faulty_lucebox)


def test_move_to_llama_cpp_equals_the_llama_cpp_conversion_and_loads(faulty_lucebox, tiny_drafters, tiny_target,
                                                                    tmp_path):
    target = tiny_target.gguf["f16"]
    moved = tmp_path / "moved.gguf"
    # a move keeps the values, and lucebox's default mask id is outside this vocabulary: validate would fail the file
    with pytest.raises(GGToolsError, match="refusing to write an output that ggtools validate would fail: mask "
                                           "token id 248070 is outside"):
        move_layout(faulty_lucebox, moved, "llama.cpp", target=target)
    assert not moved.exists()
    ours = tmp_path / "ours-llama.gguf"
    convert_dflash(tiny_drafters["v1"], ours, target=target, outtype="f16")
    # with the checkpoint, the values are repaired on the way: the file then passes pair-check
    fixed = tmp_path / "moved-fixed.gguf"
    result = doctor_fix(faulty_lucebox, fixed, hf=tiny_drafters["v1"], to="llama.cpp", target=target)
    assert result.exit_code == 0, [(f.check, f.message) for f in result.after.errors]
    assert {a.action for a in result.plan.shards[0].tensors} == {"copy"}   # llama.cpp takes F16 and F32 as they are
    assert list(tensors(fixed)) == list(tensors(ours)) and tensors(fixed) == tensors(ours)   # the converter's order
    assert llama_loads(fixed)
    assert pair_check(target, fixed).exit_code == 0
    want = kvs(ours, "dflash.")
    assert {k: v for k, v in kvs(fixed, "dflash.").items()} == want
    assert kvs(fixed)["tokenizer.ggml.mask_token_id"] == MASK


@pytest.mark.parametrize("outtype", ["auto", "f16"])
def test_reverse_move_equals_the_lucebox_conversion(tiny_drafters, tiny_target, tmp_path, outtype):
    """llama.cpp layout (BF16 as llama.cpp's converter keeps it, or F16) -> lucebox: ggtools' lucebox conversion."""
    llama = tmp_path / "llama.gguf"
    convert_dflash(tiny_drafters["v1"], llama, target=tiny_target.gguf["f16"], outtype=outtype)
    moved, ours = tmp_path / "moved.gguf", tmp_path / "ours-lb.gguf"
    plan, notes = move_layout(llama, moved, "lucebox")
    convert_dflash(tiny_drafters["v1"], ours, profile="lucebox")
    assert tensors(moved) == tensors(ours)
    assert kvs(moved) == kvs(ours)
    converted = [a for a in plan.shards[0].tensors if a.action == "convert"]
    assert bool(converted) == (outtype == "auto") and all("does not take BF16" in a.reason for a in converted)
    assert any("tokenizer" in n for n in notes)


@pytest.fixture(scope="module")
def mainline_legacy_mask(tmp_path_factory, ref_drafter_gguf):
    """llama.cpp's converter's output with the mask id only where the converter kept it before its refactor."""
    return rewrite_gguf(ref_drafter_gguf("v1", "f16"), tmp_path_factory.mktemp("legacy") / "legacy-mask.gguf",
                        drop_keys=["tokenizer.ggml.mask_token_id"],
                        set_keys=[("dflash.mask_token_id", VT.UINT32, MASK, None)])


def test_mainline_mask_under_the_old_key(mainline_legacy_mask, tiny_target, tmp_path):
    target = tiny_target.gguf["f16"]
    report = pair_check(target, mainline_legacy_mask)
    mask = [f for f in report.findings if f.check == "mask_token_id"]
    assert report.exit_code == 1 and mask[0].severity == "error"
    assert mask[0].says("llama.cpp") == "init: invalid token[1] = -1"
    assert "only in dflash.mask_token_id" in mask[0].message
    assert llama_loads(mainline_legacy_mask)          # it loads; it just never drafts
    fixed = tmp_path / "fixed.gguf"
    result = doctor_fix(mainline_legacy_mask, fixed, target=target)
    assert result.fixed == {"mask": MASK} and result.exit_code == 0
    assert kvs(fixed)["tokenizer.ggml.mask_token_id"] == MASK
    assert tensors(fixed) == tensors(mainline_legacy_mask)
    assert llama_loads(fixed)
    assert pair_check(target, fixed).exit_code == 0


def test_off_by_one_ids_found_with_hf_and_fixed(ref_drafter_gguf, tiny_drafters, tiny_target, tmp_path):
    """HF ids [1, 5] stored where llama.cpp wants HF id + 1: loads, passes the file-alone rules, drafts badly."""
    off = rewrite_gguf(ref_drafter_gguf("v1", "f16"), tmp_path / "off.gguf",
                       set_keys=[("dflash.target_layers", VT.ARRAY, [1, 5], VT.INT32)])
    assert pair_check(tiny_target.gguf["f16"], off).exit_code == 0      # nothing but the checkpoint can tell
    report = doctor(off, hf=tiny_drafters["v1"])
    ids = [f for f in report.findings if f.check == "target_layers"][0]
    assert ids.severity == "error" and "off by one" in ids.message
    fixed = tmp_path / "fixed.gguf"
    result = doctor_fix(off, fixed, hf=tiny_drafters["v1"])
    assert result.fixed == {"target_ids": [1, 5]} and result.exit_code == 0
    assert kvs(fixed)["dflash.target_layers"] == [2, 6]
    assert fixed.read_bytes() == ref_drafter_gguf("v1", "f16").read_bytes()     # back to the converter's file
    assert llama_loads(fixed)


def test_llama_cpp_converter_outputs_pass_doctor_with_hf(ref_drafter_gguf, tiny_drafters):
    """llama.cpp's own converter's files are what doctor expects, values and tensors (v1 and DFlash2)."""
    for version, outtype in (("v1", "f16"), ("v1", "q8_0"), ("v2", "bf16")):
        report = doctor(ref_drafter_gguf(version, outtype), hf=tiny_drafters[version])
        assert report.exit_code == 0, (version, outtype, [(f.check, f.message) for f in report.errors])
