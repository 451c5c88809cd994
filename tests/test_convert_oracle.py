"""convert dflash against the reference converters: llama.cpp's own `convert_hf_to_gguf.py` (same KVs, types,
order; byte-identical tensors and files) on tiny drafters built with z-lab's classes, libllama loading the
outputs, and (when GGTOOLS_LUCEBOX_CONVERTER names a copy of lucebox's convert_dflash_to_gguf.py) lucebox's
converter."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from ggtools.gguf import GGUFFile
from ggtools.jobs.convert import convert_dflash
from tests.oracle_artifacts import llama_cpp_src, llama_load_info, ref_drafter_gguf, tiny_drafters, tiny_target  # noqa: F401
from tests.test_convert_support import kv_table

pytestmark = pytest.mark.oracle
NAMES = {1: "tiny-dflash", 2: "tiny-dflash2"}


def same_kvs_and_tensors(a, b) -> list:
    """Differences between two GGUFs: KV (key, type, value) lists in order, then tensor name/ne/type/bytes."""
    diffs = []
    ka, kb = kv_table(a), kv_table(b)
    if ka != kb:
        diffs.append(("kv", [x for x in ka if x not in kb], [x for x in kb if x not in ka]))
    with GGUFFile(a) as fa, GGUFFile(b) as fb:
        if [(t.name, t.ne, t.type_id) for t in fa.tensors] != [(t.name, t.ne, t.type_id) for t in fb.tensors]:
            diffs.append("tensor names, shapes, types or order")
        for t in fa.tensors:
            u = fb.tensor.get(t.name)
            if u is not None and bytes(fa.tensor_data(t)) != bytes(fb.tensor_data(u)):
                diffs.append(("bytes", t.name))
    return diffs


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0", "f32"])
def test_llamacpp_profile_equals_llamacpp_converter(tmp_path, tiny_drafters, tiny_target, ref_drafter_gguf,
                                                     version, outtype):
    out = tmp_path / "d.gguf"
    convert_dflash(tiny_drafters[f"v{version}"], out, target=tiny_target.gguf["f16"], outtype=outtype,
                   name=NAMES[version])
    ref = ref_drafter_gguf(version, outtype)
    assert same_kvs_and_tensors(out, ref) == []
    assert out.read_bytes() == ref.read_bytes()


@pytest.mark.parametrize("variant", ["v1-sharded", "v2-sharded", "v1-prefixed", "v2-prefixed", "v2-hub-codebooks",
                                     "v1-toplevel-block-size", "v1-toplevel-mask"])
def test_layout_variants_equal_the_converter(tmp_path, tiny_drafters, tiny_target, ref_drafter_gguf, variant):
    out = tmp_path / "d.gguf"
    convert_dflash(tiny_drafters[variant], out, target=tiny_target.gguf["f16"], outtype="f16",
                   name=NAMES[int(variant[1])])
    diffs = same_kvs_and_tensors(out, ref_drafter_gguf(variant, "f16"))
    if variant == "v1-toplevel-mask":
        # llama.cpp's converter ignores a top-level mask id (the drafter then drafts nothing, LC#26761); ggtools
        # writes it. That key is the only difference.
        assert diffs == [("kv", [("tokenizer.ggml.mask_token_id", "UINT32", 1000)], [])]
    else:
        assert diffs == []


@pytest.mark.parametrize("version,outtype", [(1, "f16"), (1, "q8_0"), (2, "bf16"), (2, "q8_0")])
def test_outputs_load_in_libllama(tmp_path, tiny_drafters, tiny_target, version, outtype):
    out = tmp_path / "d.gguf"
    convert_dflash(tiny_drafters[f"v{version}"], out, target=tiny_target.gguf["f16"], outtype=outtype)
    info = llama_load_info(out)
    assert info["ok"], info
    assert info["desc"].startswith("dflash") and info["n_vocab"] == 1024


@pytest.mark.slow
def test_config_features_equal_the_converter(tmp_path, tiny_drafters, tiny_target, llama_cpp_src):
    """Features the tiny fixtures lack, each run through llama.cpp's converter: model card, non-causal flag,
    sliding window pattern, YaRN, value scale, logit scale / softcap / embedding scale, interleaved rope rows."""
    from scripts.fixtures.tiny_models import run_converter as run

    d = tmp_path / "dflash-features"
    shutil.copytree(tiny_drafters["v2"], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg |= {"is_causal": False, "use_sliding_window": True, "sliding_window": 2048, "rope_is_neox_style": False,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
                                "original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}}
    cfg["dflash_config"] |= {"attention_value_scale": 0.5, "output_multiplier": 0.196,
                             "final_logit_softcapping": 20.0, "input_embedding_scale": 16.0}
    (d / "config.json").write_text(json.dumps(cfg))
    (d / "README.md").write_text("---\nlicense: mit\nbase_model:\n- Qwen/Qwen3-8B\ntags:\n- dflash\nlanguage:\n"
                                 "- en\n---\n# Qwen3-8B-DFlash-b16\n")        # model-card keys
    ref = tmp_path / "ref.gguf"
    run(llama_cpp_src, [[d, "--target-model-dir", tiny_target.hf_dir, "--outtype", "f16", "--outfile", ref,
                         "--model-name", "features"]])
    out = tmp_path / "ours.gguf"
    convert_dflash(d, out, target=tiny_target.gguf["f16"], outtype="f16", name="features")
    assert same_kvs_and_tensors(out, ref) == []
    assert out.read_bytes() == ref.read_bytes()


def test_lucebox_profile_equals_lucebox_converter(tmp_path, tiny_drafters):
    """GGTOOLS_LUCEBOX_CONVERTER: path to Luce-Org/lucebox server/scripts/convert_dflash_to_gguf.py (62880e20).
    Its converter reads rope_theta and mask_token_id from the config's top level only (else 27B defaults), so
    the checkpoint states them there; then both files are identical."""
    script = os.environ.get("GGTOOLS_LUCEBOX_CONVERTER")
    if not script or not os.path.isfile(script):
        pytest.skip("oracle missing: set GGTOOLS_LUCEBOX_CONVERTER to lucebox's convert_dflash_to_gguf.py")
    d = tmp_path / "d"
    d.mkdir()
    shutil.copy(tiny_drafters["v1"] / "model.safetensors", d)
    cfg = json.loads((tiny_drafters["v1"] / "config.json").read_text())
    cfg |= {"rope_theta": cfg["rope_parameters"]["rope_theta"], "mask_token_id": cfg["dflash_config"]["mask_token_id"]}
    (d / "config.json").write_text(json.dumps(cfg))
    ref = tmp_path / "ref.gguf"
    subprocess.run([sys.executable, script, str(d / "model.safetensors"), str(ref), "--no-aux-heads"], check=True,
                   capture_output=True)
    out = tmp_path / "ours.gguf"
    convert_dflash(d, out, profile="lucebox")
    assert same_kvs_and_tensors(out, ref) == []
    assert out.read_bytes() == ref.read_bytes()
