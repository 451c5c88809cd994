"""convert dflash on synthetic checkpoints: profiles, dtype rules, layout variants, mask / layer-id rules,
overflow, bad input (one clear error, nothing written). The llama.cpp-converter comparisons are in
test_convert_oracle.py."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T

from ggtools.cli import main
from ggtools.dflash.errors import CheckpointError
from ggtools.errors import GGToolsError
from ggtools.gguf import GGUFFile
from ggtools.jobs.convert import ConvertError, convert_dflash
from ggtools.quants import quantize
from tests.test_convert_support import (H, HD, NH, VOCAB, drafter_config, from_bf16_bits, kv_table, make_checkpoint,
                                  make_dspark_checkpoint, make_target_gguf, random_tensors, rewrite_gguf,
                                  to_bf16_bits, write_safetensors)

@pytest.fixture
def target(tmp_path):
    return make_target_gguf(tmp_path / "target.gguf")


def convert(ckpt, out, target=None, **kw):
    return convert_dflash(ckpt, out, target=target, **kw)


def tensors_of(path) -> dict:
    with GGUFFile(path) as f:
        return {t.name: (t.ne, t.type_name, bytes(f.tensor_data(t))) for t in f.tensors}


def bf16_values(x):
    return from_bf16_bits(to_bf16_bits(x))


# ---- llama.cpp profile ------------------------------------------------------------------------------------------

def test_v1_llamacpp_keys_names_and_types(tmp_path, target):
    ckpt = make_checkpoint(tmp_path / "d", 1)
    out = tmp_path / "d.gguf"
    convert(ckpt, out, target, name="tiny")
    kvs = {k: (t, v) for k, t, v in kv_table(out)}
    assert list(kvs)[:4] == ["general.architecture", "general.type", "general.name", "general.size_label"]
    assert kvs["general.architecture"][1] == "dflash"
    assert kvs["dflash.target_layers"] == ("array[INT32]", [2, 6])           # HF ids + 1
    assert kvs["dflash.block_size"] == ("UINT32", 8)
    assert kvs["tokenizer.ggml.mask_token_id"] == ("UINT32", 100)
    assert kvs["general.file_type"] == ("UINT32", 32)                        # auto keeps BF16
    assert list(kvs)[-1] == "tokenizer.ggml.mask_token_id"
    with GGUFFile(out) as f, GGUFFile(target) as t:                          # tokenizer copied byte for byte
        tok = [kv for kv in t.kvs if kv.key.startswith("tokenizer.")]
        assert [bytes(f.kv[kv.key].raw) for kv in tok] == [bytes(kv.raw) for kv in tok]
    got = tensors_of(out)
    assert got["fc.weight"][:2] == ((2 * H, H), "BF16")
    assert got["enc.output_norm.weight"][:2] == ((H,), "F32")
    assert got["blk.0.attn_q.weight"][:2] == ((H, NH * HD), "BF16")
    assert got["blk.1.attn_k_norm.weight"][:2] == ((HD,), "F32")
    assert "output_norm.weight" in got and len(got) == 3 + 2 * 11
    src = random_tensors(drafter_config(1))
    assert got["fc.weight"][2] == to_bf16_bits(src["fc.weight"]).tobytes()
    assert got["blk.0.ffn_norm.weight"][2] == bf16_values(src["layers.0.post_attention_layernorm.weight"]).tobytes()


def test_v2_llamacpp_keys_and_tensors(tmp_path, target):
    ckpt = make_checkpoint(tmp_path / "d", 2)
    out = tmp_path / "d.gguf"
    convert(ckpt, out, target)
    kvs = {k: (t, v) for k, t, v in kv_table(out)}
    for key, value in (("conv_kernel_size", 2), ("conv_group_size", 16), ("selector_rank", 8), ("selector_top_k", 2)):
        assert kvs[f"dflash.{key}"] == ("UINT32", value)
    got = tensors_of(out)
    assert got["blk.0.attn_conv_base"][:2] == ((H, 2, 2), "F32")             # no .weight, F32, HF bytes
    assert got["blk.1.ffn_conv_proj.weight"][:2] == ((H, 2 * 2 * 4), "BF16")
    assert got["selector_hidden.weight"][:2] == ((H, 8), "BF16")
    assert got["selector_predecessor.weight"][:2] == ((8, VOCAB), "BF16")
    assert got["selector_successor.weight"][:2] == ((8, VOCAB), "BF16")
    src = random_tensors(drafter_config(2))
    assert got["blk.0.attn_conv_base"][2] == bf16_values(src["layers.0.attention_conv.base_kernel"]).tobytes()


@pytest.mark.parametrize("outtype", ["f16", "f32", "q8_0", "bf16"])
def test_outtypes(tmp_path, target, outtype):
    ckpt = make_checkpoint(tmp_path / "d", 2)
    out = tmp_path / "d.gguf"
    convert(ckpt, out, target, outtype=outtype)
    src = {k: bf16_values(v) for k, v in random_tensors(drafter_config(2)).items()}
    got = tensors_of(out)
    fc = src["fc.weight"]
    want = {"f16": fc.astype("<f2").tobytes(), "f32": fc.astype("<f4").tobytes(),
            "q8_0": quantize(T.Q8_0, fc).tobytes(), "bf16": to_bf16_bits(fc).tobytes()}[outtype]
    assert got["fc.weight"][2] == want
    assert got["output_norm.weight"][1] == "F32"
    codebook = got["selector_successor.weight"][1]
    assert codebook == ("F16" if outtype == "q8_0" else outtype.upper())     # ne0 = 8: no Q8_0 blocks -> F16
    with GGUFFile(out) as f:
        assert f.get("general.file_type") == {"f32": 0, "f16": 1, "q8_0": 7, "bf16": 32}[outtype]


@pytest.mark.parametrize("dtype,guess", [("BF16", "BF16"), ("F16", "F16"), ("F32", "F16")])
def test_auto_outtype_is_the_converters_guess(tmp_path, target, dtype, guess):
    out = tmp_path / "d.gguf"
    convert(make_checkpoint(tmp_path / "d", 1, dtype=dtype), out, target)
    assert tensors_of(out)["blk.0.attn_q.weight"][1] == guess


def test_layout_variants_give_the_same_file(tmp_path, target):
    outs = []
    for i, kw in enumerate([{}, {"shards": 3}, {"prefix": "model."}, {"hub_codebooks": True},
                            {"shards": 2, "prefix": "model.", "hub_codebooks": True}]):
        out = tmp_path / f"{i}.gguf"
        convert(make_checkpoint(tmp_path / f"d{i}", 2, **kw), out, target, name="same")
        outs.append(out.read_bytes())
    assert all(o == outs[0] for o in outs)


def test_rope_interleaved_rows_are_deinterleaved(tmp_path, target):
    cfg = drafter_config(1, rope_is_neox_style=False)
    out = tmp_path / "d.gguf"
    convert(make_checkpoint(tmp_path / "d", 1, config=cfg, dtype="F32"), out, target, outtype="f32")
    src, got = random_tensors(cfg), tensors_of(out)
    q = src["layers.0.self_attn.q_proj.weight"].reshape(NH, HD // 2, 2, H).transpose(0, 2, 1, 3).reshape(NH * HD, H)
    assert got["blk.0.attn_q.weight"][2] == q.tobytes()
    kn = src["layers.1.self_attn.k_norm.weight"]
    assert got["blk.1.attn_k_norm.weight"][2] == np.concatenate([kn[0::2], kn[1::2]]).tobytes()
    assert got["blk.0.attn_v.weight"][2] == src["layers.0.self_attn.v_proj.weight"].tobytes()


def test_converter_hparams_from_config(tmp_path, target):
    cfg = drafter_config(1, is_causal=False, use_sliding_window=True, sliding_window=256,
                         layer_types=["sliding_attention", "full_attention"],
                         rope_parameters={"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
                                          "original_max_position_embeddings": 4096, "beta_fast": 32.0})
    cfg["dflash_config"] |= {"output_multiplier": 0.5, "final_logit_softcapping": 20.0}
    out = tmp_path / "d.gguf"
    convert(make_checkpoint(tmp_path / "d", 1, config=cfg), out, target)
    kvs = {k: (t, v) for k, t, v in kv_table(out)}
    keys = list(kvs)
    assert keys.index("dflash.attention.causal") == keys.index("dflash.attention.head_count_kv") + 1
    assert kvs["dflash.attention.causal"] == ("BOOL", False)
    assert kvs["dflash.rope.scaling.type"] == ("STRING", "yarn")
    assert kvs["dflash.rope.scaling.original_context_length"] == ("UINT32", 4096)
    assert kvs["dflash.rope.scaling.yarn_beta_fast"] == ("FLOAT32", 32.0)
    assert kvs["dflash.logit_scale"] == ("FLOAT32", 0.5)
    assert kvs["dflash.final_logit_softcapping"] == ("FLOAT32", 20.0)
    assert kvs["dflash.attention.sliding_window"] == ("UINT32", 256)
    assert kvs["dflash.attention.sliding_window_pattern"] == ("array[BOOL]", [True, False])


def test_mrope_target_gets_degenerate_sections(tmp_path):
    from gguf import GGUFValueType as VT
    tgt = make_target_gguf(tmp_path / "t.gguf", arch="qwen35",
                           extra=[("qwen35.rope.dimension_sections", VT.ARRAY, [11, 11, 10, 0], VT.INT32)])
    out = tmp_path / "d.gguf"
    convert(make_checkpoint(tmp_path / "d", 1), out, tgt)
    assert dict((k, v) for k, _, v in kv_table(out))["dflash.rope.dimension_sections"] == [HD // 2, 0, 0, 0]


# ---- mask id and target layer ids --------------------------------------------------------------------------------

def _mask_only_at_top(version=1, **top):
    cfg = drafter_config(version, **top)
    del cfg["dflash_config"]["mask_token_id"]
    return cfg


def test_mask_from_top_level_and_override(tmp_path, target):
    ckpt = make_checkpoint(tmp_path / "d", 1, config=_mask_only_at_top(mask_token_id=77))
    plan = convert(ckpt, tmp_path / "a.gguf", target, dry_run=True)
    assert (plan.cfg.mask_token_id, plan.cfg.mask_from) == (77, "mask_token_id")
    convert(ckpt, tmp_path / "b.gguf", target, mask_token_id=5)
    assert dict((k, v) for k, _, v in kv_table(tmp_path / "b.gguf"))["tokenizer.ggml.mask_token_id"] == 5
    nested = make_checkpoint(tmp_path / "n", 1, config=drafter_config(1, mask_token_id=77))
    assert convert(nested, tmp_path / "c.gguf", target, dry_run=True).cfg.mask_token_id == 100   # nested first


def test_missing_mask_is_refused(tmp_path, target):
    ckpt = make_checkpoint(tmp_path / "d", 1, config=_mask_only_at_top())
    with pytest.raises(ConvertError, match=r"no mask_token_id.*26761.*--mask-token-id"):
        convert(ckpt, tmp_path / "d.gguf", target)
    assert not (tmp_path / "d.gguf").exists()


def test_mask_outside_target_vocab(tmp_path, target):
    ckpt = make_checkpoint(tmp_path / "d", 1)
    with pytest.raises(ConvertError, match=r"mask token id 500 \(--mask-token-id\) is outside the target's "
                                           r"vocabulary \(128 tokens"):
        convert(ckpt, tmp_path / "d.gguf", target, mask_token_id=500)


def test_missing_target_layer_ids_refused_unless_guessing(tmp_path, target):
    cfg = drafter_config(1)
    del cfg["dflash_config"]["target_layer_ids"]
    ckpt = make_checkpoint(tmp_path / "d", 1, config=cfg, tensors=random_tensors(drafter_config(1)))
    with pytest.raises(CheckpointError, match=r"dflash_config.target_layer_ids: missing.*dflash#156.*"
                                              r"--guess-target-layers"):
        convert(ckpt, tmp_path / "d.gguf", target)
    plan = convert(ckpt, tmp_path / "d.gguf", target, guess_target_layers=True, dry_run=True)
    assert plan.cfg.target_layer_ids == [1, 5]          # build_target_layer_ids(8, 2): 1 .. 8-3
    assert any("guessed" in w for w in plan.warnings)


@pytest.mark.parametrize("ids,rule", [
    ([1, -2], r"\[1\]': -2 is outside 0..511"), ([1, 1], "appears twice"),
    ([1, 8], "not a layer of a 8-layer target"), ("5", "not a non-empty list"), ([], "not a non-empty list")])
def test_bad_target_layer_ids(tmp_path, target, ids, rule):
    cfg = drafter_config(1)
    cfg["dflash_config"]["target_layer_ids"] = ids
    ckpt = make_checkpoint(tmp_path / "d", 1, config=cfg, tensors=random_tensors(drafter_config(1)))
    with pytest.raises(CheckpointError, match=rule):
        convert(ckpt, tmp_path / "d.gguf", target)


def test_ids_beyond_the_target_and_fc_width(tmp_path):
    small = make_target_gguf(tmp_path / "t.gguf", n_layer=5)
    ckpt = make_checkpoint(tmp_path / "d", 1)
    with pytest.raises(ConvertError, match=r"ids \[5\].*not layers of the 5-layer target"):
        convert(ckpt, tmp_path / "d.gguf", small)
    cfg = drafter_config(1)
    cfg["dflash_config"]["target_layer_ids"] = [1, 3, 5]
    ckpt = make_checkpoint(tmp_path / "e", 1, config=cfg, tensors=random_tensors(drafter_config(1)))
    with pytest.raises(CheckpointError, match=r"tensor 'fc.weight': shape \[64, 128\], but config.json implies "
                                              r"\[64, 192\] \(fc input width = 3 target layer ids"):
        convert(ckpt, tmp_path / "e.gguf", make_target_gguf(tmp_path / "t8.gguf"))


def test_hidden_mismatch_with_target(tmp_path):
    with pytest.raises(ConvertError, match="hidden_size 64 differs from the target's embedding_length 128"):
        convert(make_checkpoint(tmp_path / "d", 1), tmp_path / "d.gguf", make_target_gguf(tmp_path / "t.gguf",
                                                                                          hidden=128))


def test_last_target_layer_warns_for_llamacpp(tmp_path, target):
    cfg = drafter_config(1)
    cfg["dflash_config"]["target_layer_ids"] = [1, 7]
    plan = convert(make_checkpoint(tmp_path / "d", 1, config=cfg), tmp_path / "d.gguf", target, dry_run=True)
    assert any("last layer" in w for w in plan.warnings)


# ---- overflow ----------------------------------------------------------------------------------------------------

def _overflowing(tmp_path):
    values = random_tensors(drafter_config(1))
    values["fc.weight"][3, 7] = 1e5
    values["layers.1.mlp.down_proj.weight"][0, :2] = [-2e5, 7e4]
    return make_checkpoint(tmp_path / "d", 1, tensors=values)


def test_bf16_to_f16_overflow_is_an_error_naming_each_tensor(tmp_path, target):
    ckpt, out = _overflowing(tmp_path), tmp_path / "d.gguf"
    with pytest.raises(ConvertError, match=r"fc.weight \(1 value\), layers.1.mlp.down_proj.weight \(2 values\).*"
                                           r"--allow-overflow.*--outtype bf16"):
        convert(ckpt, out, target, outtype="f16")
    assert sorted(os.listdir(tmp_path)) == ["d", "target.gguf"]    # no output, no temp file


def test_overflow_allowed_writes_inf_and_warns(tmp_path, target):
    ckpt, out = _overflowing(tmp_path), tmp_path / "d.gguf"
    result = convert(ckpt, out, target, outtype="f16", allow_overflow=True)
    assert result.overflow == {"fc.weight": 1, "layers.1.mlp.down_proj.weight": 2}
    assert any("F16 range" in w for w in result.warnings)
    fc = np.frombuffer(tensors_of(out)["fc.weight"][2], "<f2").reshape(H, 2 * H)
    assert np.isinf(fc[3, 7]) and np.isfinite(fc).sum() == fc.size - 1


def test_auto_keeps_bf16_so_no_overflow(tmp_path, target):
    out = tmp_path / "d.gguf"
    result = convert(_overflowing(tmp_path), out, target)
    assert result.overflow == {} and tensors_of(out)["fc.weight"][1] == "BF16"


def test_lucebox_overflow(tmp_path):
    with pytest.raises(ConvertError, match=r"fc.weight \(1 value\)"):
        convert(_overflowing(tmp_path), tmp_path / "d.gguf", profile="lucebox")


# ---- lucebox profile ---------------------------------------------------------------------------------------------

LUCEBOX_KEYS = [  # lucebox convert_dflash_to_gguf.py @62880e20: key order and types
    ("general.architecture", "STRING"), ("general.name", "STRING"),
    ("qwen35-dflash-draft.context_length", "UINT32"), ("qwen35-dflash-draft.embedding_length", "UINT32"),
    ("qwen35-dflash-draft.block_count", "UINT32"), ("qwen35-dflash-draft.feed_forward_length", "UINT32"),
    ("qwen35-dflash-draft.attention.head_count", "UINT32"), ("qwen35-dflash-draft.attention.head_count_kv", "UINT32"),
    ("qwen35-dflash-draft.attention.key_length", "UINT32"), ("qwen35-dflash-draft.attention.value_length", "UINT32"),
    ("qwen35-dflash-draft.vocab_size", "UINT32"), ("qwen35-dflash-draft.attention.layer_norm_rms_epsilon", "FLOAT32"),
    ("qwen35-dflash-draft.rope.freq_base", "FLOAT32"), ("qwen35-dflash-draft.dflash.n_target_layers", "UINT32"),
    ("qwen35-dflash-draft.dflash.block_size", "UINT32"), ("qwen35-dflash-draft.dflash.mask_token_id", "UINT32"),
    ("qwen35-dflash-draft.dflash.target_layer_ids", "array[INT32]")]


def test_lucebox_keys_names_order(tmp_path):
    out = tmp_path / "d.gguf"
    convert(make_checkpoint(tmp_path / "d", 1), out, profile="lucebox")
    table = kv_table(out)
    assert [(k, t) for k, t, _ in table] == LUCEBOX_KEYS                     # no tokenizer, no general.file_type
    v = {k.removeprefix("qwen35-dflash-draft."): val for k, _, val in table}
    assert v["general.architecture"] == "qwen35-dflash-draft" and v["general.name"] == "DFlash-Draft-64h-2L"
    assert (v["dflash.target_layer_ids"], v["dflash.n_target_layers"]) == ([1, 5], 2)          # raw HF ids
    assert (v["dflash.mask_token_id"], v["dflash.block_size"], v["rope.freq_base"]) == (100, 8, 10000.0)
    names = list(tensors_of(out))
    assert names[:3] == ["dflash.fc.weight", "dflash.hidden_norm.weight", "output_norm.weight"]
    assert names[3:14] == sorted(names[3:14]) and all(n.startswith("blk.0.") for n in names[3:14])
    assert all(n.startswith("blk.1.") for n in names[14:]) and len(names) == 25


def test_lucebox_dtype_rules(tmp_path):
    values = random_tensors(drafter_config(1))
    mixed = {k: ("F32" if "mlp.up_proj" in k or k == "norm.weight" else "F16" if "mlp.gate_proj" in k
                  else "BF16", v) for k, v in values.items()}
    values["hidden_norm.weight"][0] = 1e-7                     # a BF16 norm value F16 cannot hold exactly
    mixed["hidden_norm.weight"] = ("BF16", values["hidden_norm.weight"])
    out = tmp_path / "d.gguf"
    convert(make_checkpoint(tmp_path / "d", 1, tensors=mixed), out, profile="lucebox")
    got = tensors_of(out)
    fc = bf16_values(values["fc.weight"])
    assert got["dflash.fc.weight"][1:] == ("F16", fc.astype("<f2").tobytes())               # BF16 -> F32 -> F16
    assert got["blk.0.ffn_gate.weight"][1:] == ("F16", values["layers.0.mlp.gate_proj.weight"].astype("<f2").tobytes())
    assert got["blk.0.ffn_up.weight"][1:] == ("F32", values["layers.0.mlp.up_proj.weight"].tobytes())   # F32 kept
    hn = bf16_values(values["hidden_norm.weight"])
    assert got["dflash.hidden_norm.weight"][1:] == ("F32", hn.astype("<f2").astype("<f4").tobytes())   # via F16
    assert got["output_norm.weight"][1:] == ("F32", values["norm.weight"].tobytes())
    assert {t for n, (_, t, _) in got.items() if n.endswith("_norm.weight")} == {"F32"}


def test_lucebox_refuses_dflash2_and_outtype(tmp_path):
    with pytest.raises(CheckpointError, match="lucebox has no DFlash2 support"):
        convert(make_checkpoint(tmp_path / "d2", 2), tmp_path / "a.gguf", profile="lucebox")
    with pytest.raises(ConvertError, match="--outtype applies to the llama.cpp profile"):
        convert(make_checkpoint(tmp_path / "d1", 1), tmp_path / "b.gguf", profile="lucebox", outtype="q8_0")


def test_lucebox_drops_embeddings_and_writes_swa(tmp_path):
    cfg = drafter_config(1, sliding_window=2048, layer_types=["sliding_attention", "full_attention"])
    values = random_tensors(cfg) | {"embed_tokens.weight": np.zeros((VOCAB, H), np.float32)}
    out = tmp_path / "d.gguf"
    result = convert(make_checkpoint(tmp_path / "d", 1, config=cfg, tensors=values), out, profile="lucebox")
    assert any("dropped embed_tokens.weight" in w for w in result.warnings)
    kvs = dict((k, v) for k, _, v in kv_table(out))
    assert kvs["qwen35-dflash-draft.attention.sliding_window"] == 2048
    assert kvs["qwen35-dflash-draft.attention.sliding_window_pattern"] == [True, False]


# ---- bad input ---------------------------------------------------------------------------------------------------

def _bad(tmp_path, edit):
    d = make_checkpoint(tmp_path / "d", 1)
    edit(d)
    return d


@pytest.mark.parametrize("edit,pattern", [
    (lambda d: (d / "config.json").unlink(), r"d: no config.json"),
    (lambda d: (d / "config.json").write_text("{nope"), r"config.json: cannot read as JSON"),
    (lambda d: (d / "config.json").write_text(json.dumps(drafter_config(1) | {"architectures": ["LlamaForCausalLM"]})),
     r"config.json: architectures: \['LlamaForCausalLM'\]: not a DFlash drafter"),
    (lambda d: (d / "config.json").write_text(json.dumps({k: v for k, v in drafter_config(1).items()
                                                          if k != "hidden_size"})),
     r"config.json: key 'hidden_size': missing"),
    (lambda d: (d / "model.safetensors").unlink(), r"no model\*.safetensors"),
    (lambda d: (d / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}......"),
     r"model.safetensors: byte 8: header is not valid JSON"),
    (lambda d: write_safetensors(d / "model.safetensors", {k: ("BF16", v) for k, v in random_tensors(
        drafter_config(1)).items() if k != "layers.1.mlp.up_proj.weight"}),
     r"tensor 'layers.1.mlp.up_proj.weight': missing from the safetensors files \(config.json: num_hidden_layers = 2\)"),
    (lambda d: write_safetensors(d / "model.safetensors", {k: ("BF16", v if k != "layers.0.self_attn.k_proj.weight"
                                                                else np.zeros((2 * HD, H), np.float32))
                                                            for k, v in random_tensors(drafter_config(1)).items()}),
     r"tensor 'layers.0.self_attn.k_proj.weight': shape \[64, 64\], but config.json implies \[32, 64\]"),
    (lambda d: write_safetensors(d / "model.safetensors", {k: ("BF16", v) for k, v in random_tensors(
        drafter_config(1)).items()} | {"extra.weight": ("F32", np.zeros(3, np.float32))}),
     r"tensor 'extra.weight': not part of a DFlash v1 drafter with 2 layers"),
    (lambda d: (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"fc.weight": "gone.st"}})),
     r"index.json: weight_map: names 'gone.st'"),
])
def test_bad_input_one_clear_error(tmp_path, target, edit, pattern):
    d = _bad(tmp_path, edit)
    with pytest.raises(GGToolsError, match=pattern) as e:
        convert(d, tmp_path / "d.gguf", target)
    assert e.value.exit_code == 2
    assert not (tmp_path / "d.gguf").exists()


def test_cli_errors_are_one_line_exit_2(tmp_path, target):
    d = _bad(tmp_path, lambda d: (d / "config.json").unlink())
    r = CliRunner().invoke(main, ["convert", "dflash", str(d), "-o", str(tmp_path / "o.gguf"),
                                  "--target-gguf", str(target)])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("error: ") and "config.json" in r.output


def test_cli_llamacpp_needs_a_target(tmp_path):
    r = CliRunner().invoke(main, ["convert", "dflash", str(make_checkpoint(tmp_path / "d", 1)), "-o",
                                  str(tmp_path / "o.gguf")])
    assert r.exit_code == 2 and "--target-gguf" in r.output


def test_cli_convert_dry_run_json_and_refuses_overwrite(tmp_path, target):
    d = make_checkpoint(tmp_path / "d", 2)
    args = ["convert", "dflash", str(d), "-o", str(tmp_path / "o.gguf"), "--target-gguf", str(target)]
    r = CliRunner().invoke(main, args + ["--dry-run", "--json"])
    assert r.exit_code == 0, r.output
    plan = json.loads(r.output)
    assert plan["version"] == 2 and plan["metadata"]["dflash.target_layers"] == [2, 6]
    assert not (tmp_path / "o.gguf").exists()
    assert CliRunner().invoke(main, args).exit_code == 0
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2 and "--force" in r.output
    assert CliRunner().invoke(main, args + ["--force", "--quiet"]).exit_code == 0


def test_cli_help_has_examples():
    r = CliRunner().invoke(main, ["convert", "dflash", "--help"])
    assert r.exit_code == 0 and "Examples:" in r.output and "--profile lucebox" in r.output


def test_lucebox_without_mask_writes_its_default(tmp_path):
    out = tmp_path / "d.gguf"
    result = convert(make_checkpoint(tmp_path / "d", 1, config=_mask_only_at_top()), out, profile="lucebox")
    assert dict((k, v) for k, _, v in kv_table(out))["qwen35-dflash-draft.dflash.mask_token_id"] == 248070
    assert any("lucebox's default 248070" in w for w in result.warnings)


# ---- config.json numbers, and the model-file rules before writing (issue 39) -------------------------------------

def _checkpoint(tmp_path, layout, edits=()):
    """A checkpoint of each config layout (v1, v2: DFlash's flat dflash_config; flat / speculators: DSpark's),
    config.json edited: edits (key path, value), a path into nested objects."""
    d = tmp_path / layout
    if layout in ("flat", "speculators"):
        make_dspark_checkpoint(d, arch="DSparkSpeculator" if layout == "speculators" else "Qwen3DSparkModel",
                               layout=layout)
    else:
        make_checkpoint(d, 2 if layout == "v2" else 1)
    cfg = json.loads((d / "config.json").read_text())
    for path, value in edits:
        node = cfg
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _refused(tmp_path, d, target, profile="llama.cpp") -> str:
    """convert's refusal of d (exit 2, one line, no output file), the line without 'error: '."""
    out = tmp_path / "out.gguf"
    args = ["convert", "dflash", str(d), "-o", str(out), "--profile", profile]
    r = CliRunner().invoke(main, args + (["--target-gguf", str(target)] if profile == "llama.cpp" else []))
    assert r.exit_code == 2 and r.output.count("\n") == 1 and r.output.startswith("error: "), r.output
    assert "internal error" not in r.output and not out.exists()
    return r.output[len("error: "):].strip()


NAN = float("nan")
# (layout, edited key path, value, where config.json keeps it, the rule): every number goes through one checked
# reader: its type, finite, and the range of what it becomes (a GGUF u32 is 0..2^32-1: struct '<I'; llama.cpp's
# LLAMA_MAX_LAYERS is 512)
CONFIG_NUMBERS = [
    ("v1", ("dflash_config", "block_size"), 2 ** 32, "dflash_config.block_size", "4294967296 is outside 0..4294967295"),
    ("v1", ("num_hidden_layers",), 10 ** 9, "num_hidden_layers", "1000000000 is outside 1..512"),
    ("v1", ("rope_parameters", "rope_theta"), "abc", "rope_parameters.rope_theta", "'abc' is not a number"),
    ("v1", ("rms_norm_eps",), NAN, "rms_norm_eps", "nan is not a finite number"),
    ("v1", ("max_position_embeddings",), 1.5, "max_position_embeddings", "1.5 is not an integer"),
    ("v1", ("head_dim",), True, "head_dim", "True is not a number"),
    ("v1", ("dflash_config", "mask_token_id"), -1, "dflash_config.mask_token_id", "-1 is outside 0..4294967295"),
    ("v1", ("dflash_config", "target_layer_ids"), [1, 2 ** 40], "dflash_config.target_layer_ids[1]",
     "1099511627776 is outside 0..511"),
    ("v2", ("dflash_config", "selector_rank"), 2 ** 32, "dflash_config.selector_rank",
     "4294967296 is outside 0..4294967295"),
    ("v2", ("rope_parameters", "rope_theta"), 1e39, "rope_parameters.rope_theta", "1e+39 is outside"),
    ("flat", ("rope_theta",), "abc", "rope_theta", "'abc' is not a number"),
    ("flat", ("block_size",), 2 ** 32, "block_size", "4294967296 is outside 0..4294967295"),
    ("flat", ("draft_vocab_size",), "64", "draft_vocab_size", "'64' is not a number"),
    ("speculators", ("transformer_layer_config", "rope_theta"), "abc", "transformer_layer_config.rope_theta",
     "'abc' is not a number"),
    ("speculators", ("transformer_layer_config", "rope_theta"), NAN, "transformer_layer_config.rope_theta",
     "nan is not a finite number"),
    ("speculators", ("transformer_layer_config", "num_hidden_layers"), 10 ** 9,
     "transformer_layer_config.num_hidden_layers", "1000000000 is outside 1..512"),
    ("speculators", ("aux_hidden_state_layer_ids",), [2, 2 ** 33], "aux_hidden_state_layer_ids[1]",
     "8589934592 is outside 1..512"),
    ("speculators", ("transformer_layer_config", "rms_norm_eps"), "1e-6", "transformer_layer_config.rms_norm_eps",
     "'1e-6' is not a number"),
]


@pytest.mark.parametrize("layout,path,value,place,rule", CONFIG_NUMBERS,
                         ids=[f"{c[0]}-{c[3]}={c[2]!r:.12}" for c in CONFIG_NUMBERS])
def test_config_numbers_are_checked_as_they_are_read(tmp_path, target, layout, path, value, place, rule):
    """One line naming config.json, the key where config.json keeps it, and the rule; exit 2, nothing written (the
    1e9-layer drafter took 60 s and then died of MemoryError; 2^32 failed inside the writer as an internal error)."""
    d = _checkpoint(tmp_path, layout, [(path, value)])
    line = _refused(tmp_path, d, target)
    assert line.startswith(f"{d / 'config.json'}: key '{place}': {rule}"), line


def test_config_numbers_in_the_lucebox_profile(tmp_path):
    for i, (path, value, rule) in enumerate((
            (("rms_norm_eps",), NAN, "key 'rms_norm_eps': nan is not a finite number"),
            (("max_position_embeddings",), "x", "key 'max_position_embeddings': 'x' is not a number"),
            (("sliding_window",), 2 ** 32, "key 'sliding_window': 4294967296 is outside"),
            (("rope_parameters", "rope_theta"), "abc", "key 'rope_parameters.rope_theta': 'abc' is not a number"))):
        edits = [(path, value), (("layer_types",), ["sliding_attention", "full_attention"])]
        assert rule in _refused(tmp_path, _checkpoint(tmp_path / str(i), "v1", edits), None, profile="lucebox")


def _validate_says(tmp_path, good_gguf, key, vtype, value) -> tuple[str, str]:
    """What `ggtools validate` says of the good file with key set to value: its first error (place, rule)."""
    from ggtools.jobs.validate import validate
    bad = rewrite_gguf(good_gguf, tmp_path / f"patched-{key}.gguf", set_keys=[(key, vtype, value, None)])
    report = validate([bad])
    assert report.exit_code == 1
    return report.errors[0].where, report.errors[0].rule


# (layout, profile, config edits, the GGUF key and type the value is written as): values of the right type and range
# that break a model-file rule; convert refuses each in validate's words (before: exit 0 and a file validate fails)
MODEL_RULES = [
    ("v1", "llama.cpp", [(("dflash_config", "block_size"), 1)], "dflash.block_size", "u32", 1),
    ("v1", "llama.cpp", [(("dflash_config", "block_size"), 2 ** 31)], "dflash.block_size", "u32", 2 ** 31),
    ("v1", "llama.cpp", [(("rms_norm_eps",), -1e-6)], "dflash.attention.layer_norm_rms_epsilon", "f32", -1e-6),
    ("v1", "llama.cpp", [(("rope_parameters", "rope_theta"), 0.0)], "dflash.rope.freq_base", "f32", 0.0),
    ("v2", "llama.cpp", [(("dflash_config", "block_size"), 1)], "dflash.block_size", "u32", 1),
    ("flat", "llama.cpp", [(("block_size",), 1)], "dflash.block_size", "u32", 1),
    ("speculators", "llama.cpp", [(("block_size",), 2 ** 31)], "dflash.block_size", "u32", 2 ** 31),
    ("speculators", "llama.cpp", [(("transformer_layer_config", "rope_theta"), -5.0)], "dflash.rope.freq_base",
     "f32", -5.0),
    ("v1", "lucebox", [(("dflash_config", "block_size"), 1)], "qwen35-dflash-draft.dflash.block_size", "u32", 1),
]


@pytest.mark.parametrize("layout,profile,edits,key,vtype,value", MODEL_RULES,
                         ids=[f"{c[0]}-{c[1]}-{c[3]}={c[5]}" for c in MODEL_RULES])
def test_convert_never_writes_what_validate_rejects(tmp_path, target, layout, profile, edits, key, vtype, value):
    from gguf import GGUFValueType as VT
    good = tmp_path / "good.gguf"
    convert(_checkpoint(tmp_path / "good", layout), good, target if profile == "llama.cpp" else None, profile=profile)
    where, rule = _validate_says(tmp_path, good, key, {"u32": VT.UINT32, "f32": VT.FLOAT32}[vtype], value)
    line = _refused(tmp_path, _checkpoint(tmp_path / "bad", layout, edits), target, profile)
    assert line.startswith(f"{tmp_path / 'out.gguf'}: {where}: refusing to write an output that ggtools validate "
                           f"would fail: {rule}"), (line, where, rule)


def test_block_size_1_is_refused_for_the_rule_validate_applies(tmp_path, target):
    """validate refuses a block size of 1 because a block is the anchor plus at least one mask position
    (hparam_rules/drafter.py: 2 up to the context length): a drafter of block 1 drafts nothing."""
    line = _refused(tmp_path, _checkpoint(tmp_path, "v1", [(("dflash_config", "block_size"), 1)]), target)
    assert line == (f"{tmp_path / 'out.gguf'}: key 'dflash.block_size': refusing to write an output that ggtools "
                    "validate would fail: is 1: a drafter's block is the anchor and at least one mask (2 or more)")


def test_dry_run_refuses_the_plan_too(tmp_path, target):
    d = _checkpoint(tmp_path, "v1", [(("dflash_config", "block_size"), 1)])
    with pytest.raises(GGToolsError, match="ggtools validate would fail: is 1") as e:
        convert(d, tmp_path / "o.gguf", target, dry_run=True)
    assert e.value.exit_code == 2


def test_model_card_and_generation_config_values_are_checked(tmp_path, target):
    """The general.* keys come from README.md's front matter, generation_config.json and config.json's _name_or_path
    (gguf-py's heuristics, which check nothing): a value of the wrong type is refused naming its file and key."""
    for name, data, rule in (
            ("README.md", "---\nlicense: [a\n---\n", "README.md: the model card's front matter cannot be read"),
            ("README.md", "---\nlicense: 5\n---\n", "README.md: key 'general.license': 5 is not text"),
            ("generation_config.json", '{"top_k": 5000000000}', "generation_config.json: key 'top_k': 5000000000 "
                                                                 "is outside -2147483648..2147483647"),
            ("generation_config.json", '{"temperature": NaN}', "key 'temperature': nan is not a finite number"),
            ("generation_config.json", "[1]", "generation_config.json: is not a JSON object"),
            ("config.json", json.dumps(drafter_config(1) | {"_name_or_path": 5}), "key '_name_or_path': 5 is not "
                                                                                 "text")):
        d = make_checkpoint(tmp_path / name / str(len(data)), 1)
        (d / name).write_text(data)
        assert rule in _refused(tmp_path, d, target), (name, data)
    d = make_checkpoint(tmp_path / "fine", 1)
    (d / "generation_config.json").write_text('{"temperature": 0.6, "top_k": 20}')
    convert(d, tmp_path / "fine.gguf", target)
    assert dict((k, v) for k, _, v in kv_table(tmp_path / "fine.gguf"))["general.sampling.top_k"] == 20


# ---- safetensors: the tensors' byte ranges (issue 39) -------------------------------------------------------------

def _safetensors(path, entries: dict, body: bytes):
    raw = json.dumps(entries).encode()
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + body)
    return path


F32x4 = {"dtype": "F32", "shape": [4]}
# data_offsets of two 16-byte tensors a, b in a data section of `size` bytes
LAYOUTS = {"consecutive": ([0, 16], [16, 32], 32), "reversed": ([16, 32], [0, 16], 32),
           "same-range": ([0, 16], [0, 16], 32), "overlap": ([0, 16], [8, 24], 32), "gap": ([0, 16], [20, 36], 36),
           "trailing-bytes": ([0, 16], [16, 32], 40)}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_safetensors_byte_ranges_as_the_reference_reader_takes_them(tmp_path, layout):
    """The reference reader (safetensors' own, Metadata::validate) takes tensors whose ranges follow each other from
    byte 0 to the end of the file, in any header order, and refuses the rest; read_header refuses the same files,
    naming the file and the tensor."""
    from safetensors.numpy import load_file

    from ggtools.dflash.safetensors import read_header
    a, b, size = LAYOUTS[layout]
    path = _safetensors(tmp_path / "m.safetensors", {"a": F32x4 | {"data_offsets": a},
                                                     "b": F32x4 | {"data_offsets": b}}, bytes(size))
    try:
        load_file(path)
        reference_refuses = False
    except Exception:       # noqa: BLE001 (the reference's own error type)
        reference_refuses = True
    if not reference_refuses:
        assert sorted(t.name for t in read_header(path)) == ["a", "b"]
        return
    with pytest.raises(CheckpointError, match=r"m.safetensors: tensor '[ab]': .*the safetensors reader refuses"):
        read_header(path)


def test_overlapping_markov_heads_are_refused(tmp_path, target):
    """A DSpark checkpoint whose markov_w2 has markov_w1's data_offsets converted with exit 0 (both heads read from
    the same bytes)."""
    d = _checkpoint(tmp_path, "flat")
    st = d / "model.safetensors"
    data = st.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    w1, w2 = "markov_head.markov_w1.weight", "markov_head.markov_w2.weight"
    header[w2]["data_offsets"] = header[w1]["data_offsets"]
    raw = json.dumps(header).encode()
    st.write_bytes(len(raw).to_bytes(8, "little") + raw + data[8 + n:])
    line = _refused(tmp_path, d, target)
    assert f"model.safetensors: tensor '{w2}': data_offsets" in line and f"overlap tensor '{w1}'" in line, line
