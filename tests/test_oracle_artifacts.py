"""The oracle artifacts exist, load in libllama and have the properties the reference documents state
(test-artifacts.md §5-§7, dflash-formats.md §6). Inspected with gguf-py's GGUFReader (independent of ggtools)."""

from __future__ import annotations

import json

import pytest

from tests.oracle_artifacts import llama_greedy, llama_load_info, llama_loads

gguf = pytest.importorskip("gguf")

pytestmark = pytest.mark.oracle

PROMPT = [1, 50, 60, 70, 80]


def _reader(path):
    return gguf.GGUFReader(str(path))


def _kv(reader, key):
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def _tensors(path) -> dict[str, tuple[str, tuple, bytes]]:
    """{name: (type name, ne, data bytes)} in file order."""
    return {t.name: (t.tensor_type.name, tuple(int(x) for x in t.shape), t.data.tobytes())
            for t in _reader(path).tensors}


def _types(path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for t in _reader(path).tensors:
        counts[t.tensor_type.name] = counts.get(t.tensor_type.name, 0) + 1
    return counts


# ---------------------------------------------------------------------------------------------- sources


def test_llama_cpp_src_tree(llama_cpp_src):
    assert (llama_cpp_src / "convert_hf_to_gguf.py").is_file()
    assert "class DFlashModel" in (llama_cpp_src / "conversion" / "qwen.py").read_text()
    assert "DFLASH" in (llama_cpp_src / "gguf-py" / "gguf" / "constants.py").read_text()
    vocab = llama_cpp_src / "models" / "ggml-vocab-qwen35.gguf"
    assert vocab.is_file() and vocab.with_name(vocab.name + ".inp").is_file()
    assert (llama_cpp_src / "tools" / "quantize" / "quantize.cpp").is_file()


# ---------------------------------------------------------------------------------------------- target


def test_tiny_target(tiny_target):
    cfg = json.loads((tiny_target.hf_dir / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["num_hidden_layers"] == 8
    assert tiny_target.tokenizer_model.is_file()
    for outtype, path in tiny_target.gguf.items():
        r = _reader(path)
        assert _kv(r, "general.architecture") == "qwen3"
        assert _kv(r, "qwen3.block_count") == 8
        assert _kv(r, "tokenizer.ggml.model") == "llama"
        assert len(_kv(r, "tokenizer.ggml.tokens")) == 1024
    assert _types(tiny_target.gguf["f32"]) == {"F32": 91}
    assert _types(tiny_target.gguf["f16"]) == {"F16": 58, "F32": 33}


def test_tiny_target_generates(tiny_target):
    for path in tiny_target.gguf.values():
        out = llama_greedy(path, PROMPT, 4)
        assert len(out) == 4 and all(0 <= t < 1024 for t in out)
    assert llama_greedy(path, PROMPT, 4) == out              # deterministic


# ---------------------------------------------------------------------------------------------- drafters


def test_tiny_drafters_layouts(tiny_drafters):
    v1 = json.loads((tiny_drafters["v1"] / "config.json").read_text())
    v2 = json.loads((tiny_drafters["v2"] / "config.json").read_text())
    assert v1["architectures"] == ["DFlashDraftModel"] and v2["architectures"] == ["DFlash2DraftModel"]
    assert v1["dflash_config"] == {"block_size": 16, "mask_token_id": 1000, "target_layer_ids": [1, 5]}
    assert v2["dflash_config"]["selector_top_k"] == 4 and v2["dflash_config"]["conv_kernel_size"] == 4
    assert (tiny_drafters["v1-sharded"] / "model.safetensors.index.json").is_file()
    assert len(list(tiny_drafters["v2-sharded"].glob("model-*-of-00003.safetensors"))) == 3
    top = json.loads((tiny_drafters["v1-toplevel-mask"] / "config.json").read_text())
    assert top["mask_token_id"] == 1000 and "mask_token_id" not in top["dflash_config"]
    top = json.loads((tiny_drafters["v1-toplevel-block-size"] / "config.json").read_text())
    assert top["block_size"] == 16 and "block_size" not in top["dflash_config"]
    assert "candidate_selector.predecessor_codebook" in _safetensors_names(tiny_drafters["v2-hub-codebooks"])
    assert all(k.startswith("model.") for k in _safetensors_names(tiny_drafters["v1-prefixed"]))
    assert _safetensors_names(tiny_drafters["v2-sharded"]) == _safetensors_names(tiny_drafters["v2"])


def _safetensors_names(hf_dir) -> set[str]:
    names = set()
    for f in hf_dir.glob("*.safetensors"):
        with open(f, "rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            names |= set(json.loads(fh.read(n))) - {"__metadata__"}
    return names


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("outtype", ["f16", "bf16", "q8_0", "f32"])
def test_ref_drafter_metadata(ref_drafter_gguf, version, outtype):
    r = _reader(ref_drafter_gguf(version, outtype))
    assert _kv(r, "general.architecture") == "dflash"
    assert _kv(r, "dflash.target_layers") == [2, 6]            # HF ids [1, 5] + 1
    assert _kv(r, "dflash.block_size") == 16
    assert _kv(r, "tokenizer.ggml.mask_token_id") == 1000
    assert len(_kv(r, "tokenizer.ggml.tokens")) == 1024
    names = {t.name for t in r.tensors}
    assert {"fc.weight", "enc.output_norm.weight", "output_norm.weight"} <= names
    assert not names & {"token_embd.weight", "output.weight"}
    v2_keys = ("dflash.conv_kernel_size", "dflash.conv_group_size", "dflash.selector_rank", "dflash.selector_top_k")
    if version == 2:
        assert [_kv(r, k) for k in v2_keys] == [4, 64, 16, 4]
        base = next(t for t in r.tensors if t.name == "blk.0.attn_conv_base")
        assert base.tensor_type.name == "F32" and [int(x) for x in base.shape] == [256, 4, 2]
        assert {"selector_hidden.weight", "selector_predecessor.weight", "selector_successor.weight"} <= names
    else:
        assert all(_kv(r, k) is None for k in v2_keys)


def test_ref_drafter_variants_same_tensors(ref_drafter_gguf):
    """Every layout variant converts to the same tensors as its canonical drafter; llama.cpp ignores a
    top-level mask_token_id (dflash-formats.md §6), so that variant's reference has no mask id."""
    for version in (1, 2):
        base = _tensors(ref_drafter_gguf(version, "f16"))
        variants = [k.split("/")[0] for k in ref_drafter_gguf.paths if k.startswith(f"v{version}-")]
        assert variants
        for variant in variants:
            path = ref_drafter_gguf(variant, "f16")
            assert _tensors(path) == base, variant
            mask = _kv(_reader(path), "tokenizer.ggml.mask_token_id")
            assert mask == (None if variant == "v1-toplevel-mask" else 1000), variant


@pytest.mark.parametrize("version", [1, 2])
def test_converter_q8_0_equals_quantizer_q8_0(ref_drafter_gguf, ref_drafter_quant, version):
    """test-artifacts.md §5: --outtype q8_0 output equals llama_model_quantize Q8_0 on every tensor."""
    conv = _tensors(ref_drafter_gguf(version, "q8_0"))
    quant = _tensors(ref_drafter_quant(version, "Q8_0"))
    assert conv == quant


EXPECTED_DRAFTER_TYPES = {
    (1, "Q8_0"): {"Q8_0": 15, "F32": 10},
    (1, "Q4_K_M"): {"Q4_K": 13, "Q6_K": 2, "F32": 10},
    (1, "Q2_K"): {"Q2_K": 9, "Q3_K": 6, "F32": 10},
    (2, "Q8_0"): {"Q8_0": 20, "F16": 2, "F32": 14},
    (2, "Q4_K_M"): {"Q4_K": 18, "Q6_K": 2, "F16": 2, "F32": 14},
    (2, "Q2_K"): {"Q2_K": 14, "Q3_K": 6, "F16": 2, "F32": 14},
}


@pytest.mark.parametrize("version,ftype", sorted(EXPECTED_DRAFTER_TYPES))
def test_ref_drafter_quant_types(ref_drafter_quant, version, ftype):
    path = ref_drafter_quant(version, ftype)
    assert _types(path) == EXPECTED_DRAFTER_TYPES[version, ftype]
    if version == 2:   # selector codebooks (ne0 = 16) cannot be block-quantized: they stay F16
        t = {t.name: t.tensor_type.name for t in _reader(path).tensors}
        assert t["selector_predecessor.weight"] == t["selector_successor.weight"] == "F16"


def test_drafters_load_in_libllama(ref_drafter_quant):
    assert ref_drafter_quant.loads and all(r["ok"] for r in ref_drafter_quant.loads.values()), \
        {k: r for k, r in ref_drafter_quant.loads.items() if not r["ok"]}
    info = llama_load_info(ref_drafter_quant(2, "Q4_K_M"))
    assert info["ok"] and info["desc"].startswith("dflash")


# ---------------------------------------------------------------------------------------------- qwen35moe


def test_qwen35moe_types(qwen35moe_set):
    s = qwen35moe_set
    assert _kv(_reader(s.f16), "general.architecture") == "qwen35moe"
    assert _types(s.f16) == {"F16": 45, "F32": 31}
    assert _types(s.mxfp4_moe) == {"Q8_0": 33, "MXFP4": 12, "F32": 31}
    assert _types(s.surgical) == {"Q4_K": 33, "MXFP4": 12, "F32": 31}
    exps = {n: t for n, t in _tensors(s.mxfp4_moe).items() if "_exps" in n}
    assert len(exps) == 12 and all(t[0] == "MXFP4" and t[1] == (256, 256, 8) for t in exps.values())


def test_qwen35moe_surgical_copies_mxfp4_and_f32(qwen35moe_set):
    """The surgical reference keeps tensor order; every MXFP4 and F32 tensor is byte-identical to the input,
    every Q8_0 trunk tensor became Q4_K with the same shape."""
    src = _tensors(qwen35moe_set.mxfp4_moe)
    out = _tensors(qwen35moe_set.surgical)
    assert list(out) == list(src)
    for name, (typ, ne, data) in src.items():
        if typ in ("MXFP4", "F32"):
            assert out[name] == (typ, ne, data), name
        else:
            assert typ == "Q8_0" and out[name][0] == "Q4_K" and out[name][1] == ne, name


def test_qwen35moe_split(qwen35moe_set):
    s = qwen35moe_set
    assert [p.name for p in s.split] == [f"tiny-qwen35moe-MXFP4_MOE-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    single = _tensors(s.mxfp4_moe)
    merged: dict = {}
    for i, path in enumerate(s.split):
        r = _reader(path)
        assert _kv(r, "split.no") == i and _kv(r, "split.count") == 3
        assert _kv(r, "split.tensors.count") == len(single)
        merged.update(_tensors(path))
    assert list(merged) == list(single) and merged == single
    # keep_split: same shard boundaries, same bytes as the single-file surgical reference
    surgical = _tensors(s.surgical)
    merged = {}
    for a, b in zip(s.split, s.split_surgical):
        assert list(_tensors(a)) == list(_tensors(b))
        merged.update(_tensors(b))
    assert merged == surgical


def test_qwen35moe_loads_and_generates(qwen35moe_set):
    s = qwen35moe_set
    assert all(r["ok"] for r in s.loads.values()), s.loads
    single = llama_greedy(s.mxfp4_moe, PROMPT, 4)
    assert llama_greedy(s.split[0], PROMPT, 4) == single
    assert llama_greedy(s.split_surgical[0], PROMPT, 4) == llama_greedy(s.surgical, PROMPT, 4)


def test_llama_loads_missing_shard(qwen35moe_set, tmp_path):
    """A split set with a shard missing does not load (and does not take pytest down)."""
    import shutil
    for p in qwen35moe_set.split[:2]:
        shutil.copyfile(p, tmp_path / p.name)
    assert llama_loads(qwen35moe_set.split[0])
    assert not llama_loads(tmp_path / qwen35moe_set.split[0].name)



def test_moe_targets(qwen3moe_target, gpt_oss_target):
    """The routed-expert targets: the converter's keys and types, experts as 3-D stacks, all six GGUFs load."""
    q, g = qwen3moe_target, gpt_oss_target
    assert _kv(_reader(q.gguf["f16"]), "general.architecture") == "qwen3moe"
    assert _types(q.gguf["Q8_0"]) == {"Q8_0": 30, "F32": 21}
    r = _reader(g.gguf["f16"])
    assert _kv(r, "general.architecture") == "gpt-oss" and _kv(r, "gpt-oss.attention.sliding_window") == 16
    assert _kv(r, "gpt-oss.rope.scaling.type") == "yarn" and _kv(r, "gpt-oss.expert_used_count") == 4
    assert _types(g.gguf["MXFP4_MOE"]) == {"MXFP4": 12, "Q8_0": 18, "F32": 49}
    exps = {n: t for n, t in _tensors(g.gguf["MXFP4_MOE"]).items() if "_exps.weight" in n}
    assert len(exps) == 12 and all(t[0] == "MXFP4" and t[1][2] == 8 for t in exps.values())
    assert all(r["ok"] for m in (q.manifest, g.manifest) for r in m["loads"].values())
