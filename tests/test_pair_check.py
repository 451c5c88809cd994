"""pair-check (doctor with a target): a good drafter/target pair passes; each broken variant fails with the
runtime's own message."""

import json

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as VT

from ggtools.cli import main
from ggtools.jobs.convert import convert_dflash
from ggtools.dflash.findings import failed
from ggtools.jobs.doctor import doctor, pair_check
from ggtools.runtime.model.archs import ARCHS
from tests.oracle_artifacts import ref_drafter_gguf, tiny_target  # noqa: F401  (fixtures)
from tests.test_convert_support import H, make_checkpoint, make_target_gguf, rewrite_gguf

LB = "qwen35-dflash-draft"


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(target, llama.cpp v1 drafter, llama.cpp v2 drafter, lucebox drafter, working dir, qwen35 target)."""
    d = tmp_path_factory.mktemp("pair")
    target = make_target_gguf(d / "target.gguf")
    v1, v2, lb = d / "v1.gguf", d / "v2.gguf", d / "lb.gguf"
    convert_dflash(make_checkpoint(d / "c1", 1), v1, target=target)
    convert_dflash(make_checkpoint(d / "c2", 2), v2, target=target)
    convert_dflash(make_checkpoint(d / "c1", 1), lb, profile="lucebox")
    return target, v1, v2, lb, d, make_target_gguf(d / "qwen35.gguf", arch="qwen35")


def failures(report):
    """(check, what the runtime says) per failing finding and runtime it breaks."""
    return [(f.check, e.says) for f in failed(report.findings) for e in f.effects or [None] if e] + \
        [(f.check, None) for f in failed(report.findings) if not f.effects]


@pytest.mark.parametrize("which", [1, 2, 3])
def test_good_pairs_pass(pair, which):
    # lucebox drafts only for its DFlash targets (qwen35, qwen35moe, laguna, gemma4)
    report = pair_check(pair[5] if which == 3 else pair[0], pair[which])
    assert report.exit_code == 0, failures(report)
    assert report.profile == ("lucebox" if which == 3 else "llama.cpp")
    assert {f.check for f in report.findings} >= {"loader", "hidden", "fc", "mask_token_id"}


def broken(pair, src_index, name, **edits):
    target = pair[5] if src_index == 3 else pair[0]
    return pair_check(target, rewrite_gguf(pair[src_index], pair[4] / f"{name}.gguf", **edits))


def one_failure(report, check, loader_error):
    errs = failures(report)
    assert (check, loader_error) in errs, errs
    assert report.exit_code == 1


def test_mask_id_beyond_the_vocabulary(pair):
    r = broken(pair, 1, "mask", set_keys=[("tokenizer.ggml.mask_token_id", VT.UINT32, 500, None)])
    one_failure(r, "mask_token_id", "load: bad special token: 'tokenizer.ggml.mask_token_id' = 500, using default id -1")
    assert any(f.fix and "--hf HF_DIR --fix" in f.fix for f in r.findings if f.check == "mask_token_id")


def test_mask_id_missing(pair):
    one_failure(broken(pair, 1, "nomask", drop_keys=["tokenizer.ggml.mask_token_id"]),
                "mask_token_id", "init: invalid token[1] = -1")


def test_target_layers_missing(pair):
    one_failure(broken(pair, 1, "noids", drop_keys=["dflash.target_layers"]),
                "target_layers", "DFlash model requires 'target_layers' in GGUF metadata")


def test_target_layer_out_of_range(pair):
    r = broken(pair, 1, "range", set_keys=[("dflash.target_layers", VT.ARRAY, [2, 8], VT.INT32)])
    one_failure(r, "target_layers", 'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed')
    assert [f.runtimes for f in failed(r.findings)] == [["llama.cpp"]]     # ggtools taps the last layer's output


def test_fc_width_mismatch(pair):
    r = broken(pair, 1, "fc", set_keys=[("dflash.target_layers", VT.ARRAY, [2, 4, 6], VT.INT32)])
    one_failure(r, "tensors", "check_tensor_dims: tensor 'fc.weight' has wrong shape; expected    192,     64, "
                              "got    128,     64,      1,      1")
    one_failure(r, "fc", "encode: embd row width 192 does not match the encoder input 128")


def test_hidden_mismatch(pair):
    other = make_target_gguf(pair[4] / "wide-target.gguf", hidden=2 * H)
    r = pair_check(other, pair[1])
    one_failure(r, "hidden", "encode: embd row width 256 does not match the encoder input 128")
    r = pair_check(make_target_gguf(pair[4] / "wide-qwen35.gguf", arch="qwen35", hidden=2 * H), pair[3])
    assert "hidden" in {c for c, _ in failures(r)}


def test_missing_tensor(pair):
    one_failure(broken(pair, 1, "tensor", drop_tensors=["blk.1.ffn_up.weight"]),
                "tensors", "check_tensor_dims: tensor 'blk.1.ffn_up.weight' not found")


def test_extra_tensor_from_another_profile(pair):
    r = broken(pair, 2, "v2-extra", drop_tensors=["selector_hidden.weight"])     # conv tensors now unclaimed
    assert any(e and e.startswith("done_getting_tensors: wrong number of tensors") for _, e in failures(r))


@pytest.mark.parametrize("key,value,said", [
    ("dflash.conv_group_size", 24, "DFlash2 hidden size must be divisible by conv_group_size"),
    ("dflash.selector_top_k", 8, "DFlash2 hidden size is too small for the selector lattice"),
    ("dflash.selector_rank", 0, "DFlash2 model is missing conv/selector metadata")])
def test_dflash2_lattice(pair, key, value, said):
    one_failure(broken(pair, 2, key, set_keys=[(key, VT.UINT32, value, None)]), "dflash2", said)


def test_dflash2_key_missing(pair):
    one_failure(broken(pair, 2, "nokernel", drop_keys=["dflash.conv_kernel_size"]),
                "dflash2", "DFlash2 model is missing conv/selector metadata")


def test_required_key_missing_and_block_size(pair):
    r = broken(pair, 1, "nokeys", drop_keys=["dflash.context_length", "dflash.block_size"])
    one_failure(r, "keys", "key not found in model: dflash.context_length")
    assert [f.severity for f in r.findings if f.check == "block_size"] == ["warning"]    # llama.cpp assumes 16


def test_target_arch_without_layer_inputs(pair):
    r = doctor(pair[1], target=make_target_gguf(pair[4] / "gemma3.gguf", arch="gemma3"),
               runtimes=["llama.cpp", "ggtools"])
    one_failure(r, "target_arch[llama.cpp]", 'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is '
                                             'null") failed')
    one_failure(r, "target_arch[ggtools]", f"{pair[4] / 'gemma3.gguf'}: architecture 'gemma3' is not supported by "
                                           f"the runtime (supported: {', '.join(ARCHS)})")


def test_not_a_drafter(pair):
    r = pair_check(pair[0], pair[0])
    assert r.exit_code == 1 and "unknown model architecture: 'qwen3'" in failures(r)[0][1]


# ---- lucebox loader rules ------------------------------------------------------------------------------------

def test_lucebox_target_ids_missing_or_wrong_type(pair):
    r = broken(pair, 3, "lb-noids", drop_keys=[f"{LB}.dflash.target_layer_ids"])
    one_failure(r, "target_layers", None)
    assert "lucebox derives ids" in failed(r.findings)[0].effects[0].symptom
    r = broken(pair, 3, "lb-u32ids", set_keys=[(f"{LB}.dflash.target_layer_ids", VT.ARRAY, [1, 5], VT.UINT32)])
    assert any("not an INT32 array" in f.message for f in r.findings if f.severity == "error")


def test_lucebox_ids_out_of_range(pair):
    r = broken(pair, 3, "lb-range", set_keys=[(f"{LB}.dflash.target_layer_ids", VT.ARRAY, [1, 8], VT.INT32)])
    one_failure(r, "target_layers", None)
    assert failed(r.findings)[0].runtimes == ["lucebox"]


def test_lucebox_missing_layer_tensor(pair):
    one_failure(broken(pair, 3, "lb-tensor", drop_tensors=["blk.1.attn_v.weight"]),
                "tensors", "draft GGUF: layer 1 missing tensors")
    one_failure(broken(pair, 3, "lb-fc", drop_tensors=["dflash.fc.weight"]), "tensors",
                "draft GGUF: missing top-level tensors (dflash.fc|dflash_fc / dflash.hidden_norm|dflash_hidden_norm"
                " / output_norm)")


def test_lucebox_hparams(pair):
    one_failure(broken(pair, 3, "lb-hd", drop_keys=[f"{LB}.attention.key_length"]), "hparams",
                "draft GGUF: missing hparams: n_embd=64 n_layer=2 n_ff=128 n_head=2 n_head_kv=1 head_dim=0")
    one_failure(broken(pair, 3, "lb-heads", set_keys=[(f"{LB}.attention.head_count_kv", VT.UINT32, 4, None)]),
                "hparams", "draft GGUF: hparams out of range: n_embd=64 n_layer=2 n_ff=128 n_head=2 n_head_kv=4 "
                           "head_dim=32")


def test_lucebox_shapes_block_size_rope(pair):
    one_failure(broken(pair, 3, "lb-q", set_keys=[(f"{LB}.attention.head_count", VT.UINT32, 1, None)]),
                "tensors", "GGUF shape mismatch: blk.0 attn_q.weight->ne[1]=64 != expected_q_dim=32")
    r = broken(pair, 3, "lb-fcw", set_keys=[(f"{LB}.dflash.n_target_layers", VT.UINT32, 3, None)])
    assert ("fc", "warning") in {(f.check, f.severity) for f in r.findings}
    one_failure(broken(pair, 3, "lb-bs", drop_keys=[f"{LB}.dflash.block_size"]), "block_size", None)
    one_failure(broken(pair, 3, "lb-rope", drop_keys=[f"{LB}.rope.freq_base"]), "rope_theta",
                "[draft-gguf] WARNING: rope.freq_base not found in GGUF, draft RoPE will be wrong")


def test_lucebox_wrong_arch(pair):
    r = broken(pair, 3, "lb-arch", set_keys=[("general.architecture", VT.STRING, "qwen9-draft", None)])
    assert r.exit_code == 1
    assert ("arch", "unexpected draft arch: qwen9-draft (expected qwen35-dflash-draft, dflash-draft, or "
                    "gemma4-dflash-draft)") in failures(r)


# ---- CLI -----------------------------------------------------------------------------------------------------

def test_cli_ok_fail_json(pair):
    r = CliRunner().invoke(main, ["pair-check", str(pair[0]), str(pair[2])])
    assert r.exit_code == 0 and r.output.rstrip().endswith("pair OK")
    bad = rewrite_gguf(pair[1], pair[4] / "cli-bad.gguf", drop_keys=["dflash.target_layers"])
    r = CliRunner().invoke(main, ["pair-check", str(pair[0]), str(bad)])
    assert r.exit_code == 1
    assert "breaks llama.cpp: \"DFlash model requires 'target_layers' in GGUF metadata\"" in r.output
    assert "fix: ggtools doctor" in r.output
    r = CliRunner().invoke(main, ["pair-check", str(pair[0]), str(bad), "--json"])
    data = json.loads(r.stdout)
    assert r.exit_code == 1 and data["ok"] is False and data["profile"] == "llama.cpp"
    r = CliRunner().invoke(main, ["pair-check", str(pair[0]), str(pair[4] / "c1" / "config.json")])
    assert r.exit_code == 2 and r.output.startswith("error: ")


# ---- llama.cpp's own converter outputs -----------------------------------------------------------------------

@pytest.mark.oracle
@pytest.mark.parametrize("ref", ["v1/f16", "v2/q8_0", "v2-hub-codebooks/f16"])
def test_llamacpp_converter_outputs_pass(tiny_target, ref_drafter_gguf, ref):
    version, outtype = ref.split("/")
    report = pair_check(tiny_target.gguf["f16"], ref_drafter_gguf(version, outtype))
    assert report.exit_code == 0, failures(report)


@pytest.mark.oracle
def test_llamacpp_converter_drops_a_top_level_mask(tiny_target, ref_drafter_gguf):
    """llama.cpp's converter ignores a top-level mask_token_id: its output loads but drafts nothing (LC#26761)."""
    report = pair_check(tiny_target.gguf["f16"], ref_drafter_gguf("v1-toplevel-mask", "f16"))
    one_failure(report, "mask_token_id", "init: invalid token[1] = -1")


def test_lucebox_stored_mask_beyond_vocab(pair):
    """lucebox takes the mask id from the target (a warning for it); ggtools' runtime reads the stored one."""
    path = rewrite_gguf(pair[3], pair[4] / "lb-mask.gguf",
                        set_keys=[(f"{LB}.dflash.mask_token_id", VT.UINT32, 248070, None)])
    r = pair_check(pair[5], path)
    assert r.exit_code == 0
    assert [f.severity for f in r.findings if f.check == "mask_token_id"] == ["warning"]
    r = doctor(path, target=pair[5], runtimes=["lucebox", "ggtools"])
    assert [(f.severity, f.runtimes) for f in r.findings if f.check == "mask_token_id"] == [("error", ["ggtools"])]


def test_validate_pair_option(pair):
    """`ggtools validate --pair TARGET DRAFT` is the same check as `pair-check`."""
    good = CliRunner().invoke(main, ["validate", "--pair", str(pair[0]), str(pair[1])])
    assert good.exit_code == 0 and "pair OK" in good.output, good.output
    bad = CliRunner().invoke(main, ["validate", "--pair", str(pair[1]), str(pair[0])])
    assert bad.exit_code == 1 and "check(s) failed" in bad.output
