"""DSpark drafters without the oracles: synthetic checkpoints (scripts/fixtures/dspark_checkpoints.py's writer, small
shapes) through convert (both layouts, both profiles, the summary line), inspect, validate, doctor (and --fix),
gguf-layout and quantize's plan. What llama.cpp's converter and llama-quantize write is compared byte for byte in
test_convert_dspark.py and test_quantize.py; every refusal has its row in test_hostile.py."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

from ggtools.cli import main
from ggtools.dflash.profiles import DSPARK_ARCHITECTURES
from ggtools.gguf import GGUFFile
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.doctor import doctor, doctor_fix, move_layout
from ggtools.jobs.inspect import inspect
from ggtools.jobs.quantize import plan_quantize
from ggtools.jobs.validate import validate
from scripts.fixtures import dspark_checkpoints as DS
from tests.test_convert_support import DSPARK_DRAFT_VOCAB as VD
from tests.test_convert_support import DSPARK_MASK as MASK
from tests.test_convert_support import DSPARK_RANK as R
from tests.test_convert_support import VOCAB, H, kv_table, make_target_gguf, rewrite_gguf
from tests.test_convert_support import make_dspark_checkpoint as checkpoint


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    d = tmp_path_factory.mktemp("dspark")
    w = {"dir": d, "target": make_target_gguf(d / "target.gguf"),
         "flat": checkpoint(d / "flat"), "spec": checkpoint(d / "spec", arch="DSparkSpeculator", layout="speculators",
                                                           reduced=True),
         "bonus": checkpoint(d / "bonus", extra={"sample_from_anchor": False})}
    for name, ckpt, profile in (("ds", "flat", "llama.cpp"), ("dsred", "spec", "llama.cpp"),
                                ("dsbonus", "bonus", "llama.cpp"), ("dslb", "bonus", "lucebox")):
        w[name] = d / f"{name}.gguf"
        convert_dflash(w[ckpt], w[name], profile=profile, target=w["target"] if profile == "llama.cpp" else None)
    return w


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def kvs(path) -> dict:
    return {k: v for k, _, v in kv_table(path)}


def tensors(path) -> dict:
    with GGUFFile(path) as f:
        return {t.name: (t.type_name, tuple(t.ne), bytes(f.tensor_data(t))) for t in f.tensors}


# ---- convert ------------------------------------------------------------------------------------------------------

def test_flat_layout_keys_and_heads(work):
    k, t = kvs(work["ds"]), tensors(work["ds"])
    assert (k["dflash.sample_from_anchor"], k["dflash.has_confidence_head"]) == (True, True)
    assert k["dflash.target_layers"] == [2, 6] and k["tokenizer.ggml.mask_token_id"] == MASK
    assert list(k).index("dflash.has_confidence_head") == list(k).index("dflash.sample_from_anchor") + 1
    assert t["markov_w1.weight"][:2] == ("BF16", (R, VOCAB)) and t["markov_w2.weight"][:2] == ("BF16", (R, VOCAB))
    assert t["conf_proj.weight"][:2] == ("BF16", (H + R, 1)) and t["conf_proj.bias"][:2] == ("F32", (1,))
    assert "output.weight" not in t and "d2t" not in t


def test_speculators_layout_reduced_vocabulary(work):
    """Backbone keys from transformer_layer_config, ids = aux_hidden_state_layer_ids - 1, bonus anchor by default,
    d2t as the absolute ids the offsets encode (written last, I64), the drafter's own head, no t2d."""
    k, t = kvs(work["dsred"]), tensors(work["dsred"])
    assert k["dflash.embedding_length"] == H and k["dflash.target_layers"] == [2, 6]
    assert k["dflash.sample_from_anchor"] is False and k["dflash.has_confidence_head"] is True
    with GGUFFile(work["dsred"]) as f:
        assert f.tensors[-1].name == "d2t"
    assert t["d2t"][:2] == ("I64", (VD,))
    assert np.frombuffer(t["d2t"][2], "<i8").tolist() == DS.draft_ids(VOCAB, VD, DS.SEED).tolist()
    assert t["output.weight"][:2] == ("BF16", (H, VD)) and t["markov_w2.weight"][:2] == ("BF16", (R, VD))
    assert "t2d" not in t


@pytest.mark.parametrize("arch", DSPARK_ARCHITECTURES)
def test_every_architecture_llamacpp_registers_converts(tmp_path, work, arch):
    out = tmp_path / "d.gguf"
    convert_dflash(checkpoint(tmp_path / "c", arch=arch), out, target=work["target"])
    assert "markov_w1.weight" in tensors(out)


def test_summary_line_says_what_it_found(tmp_path, work):
    r = cli("convert", "dflash", work["spec"], "-o", tmp_path / "d.gguf", "--target-gguf", work["target"], "-q")
    assert r.exit_code == 0, r.output
    assert ("DSpark (speculators layout): Markov + confidence head, rank 32, bonus anchor blocks (default for the "
            "speculators layout), draft vocabulary 64 of 128 (d2t)") in r.stdout
    r = cli("convert", "dflash", "--json", work["flat"], "-o", tmp_path / "e.gguf", "--target-gguf", work["target"],
            "--dry-run")
    data = json.loads(r.stdout)
    assert data["dspark"] == {"layout": "DeepSpec", "sample_from_anchor": True,
                              "anchor_from": "default for the DeepSpec layout", "markov_rank": R, "vocab": VOCAB,
                              "draft_vocab": VOCAB, "confidence_head": True, "markov_w2_scale": False}


def test_lucebox_profile(tmp_path, work):
    """lucebox's names and keys, heads F16 (bias F32) after every other tensor; a missing bias written as zero."""
    A = "qwen35-dflash-draft"
    k, t = kvs(work["dslb"]), tensors(work["dslb"])
    assert [k[f"{A}.dflash.dspark.{x}"] for x in ("enabled", "markov_rank", "vocab_size", "confidence_dim",
                                                    "confidence.enabled")] == [1, R, VOCAB, H + R, 1]
    assert list(t)[-4:] == ["dflash.dspark.markov.w1", "dflash.dspark.markov.w2", "dflash.dspark.confidence.weight",
                            "dflash.dspark.confidence.bias"]
    assert [t[n][0] for n in list(t)[-4:]] == ["F16", "F16", "F16", "F32"]
    out = tmp_path / "nobias.gguf"
    convert_dflash(checkpoint(tmp_path / "nb", extra={"sample_from_anchor": False},
                              drop=["confidence_head.proj.bias"]), out, profile="lucebox")
    assert tensors(out)["dflash.dspark.confidence.bias"] == ("F32", (1,), bytes(4))


def test_lucebox_warns_when_its_backend_does_not_run_the_heads(tmp_path, work):
    plan = convert_dflash(work["bonus"], tmp_path / "d.gguf", profile="lucebox",
                          target=make_target_gguf(tmp_path / "q35.gguf", arch="qwen35"), dry_run=True)
    assert any("only for laguna targets" in w for w in plan.warnings)


# ---- inspect, validate --------------------------------------------------------------------------------------------

def test_inspect_describes_the_drafter(work):
    assert inspect(str(work["dsred"]))["drafter"] == {
        "layout": "llama.cpp", "family": "DSpark",
        "summary": "DSpark: Markov + confidence head, rank 32, bonus anchor blocks, draft vocabulary 64 of 128 (d2t)",
        "dspark": {"markov_rank": R, "sample_from_anchor": False, "confidence_head": True, "draft_vocab": VD,
                   "d2t": True}}
    assert inspect(str(work["target"]))["drafter"] is None


BROKEN = {   # name: (source, edits, the problem's place, a fragment of its rule)
    "no-block-size": ("ds", dict(drop_keys=["dflash.block_size"]), "DSpark block_size", "DSpark draft requires"),
    "conf-flag-false": ("ds", dict(set_keys=[("dflash.has_confidence_head", VT.BOOL, False, None)]),
                        "DSpark confidence_head", "please set --spec-draft-p-min 0"),
    "conf-flag-true": ("ds", dict(drop_tensors=["conf_proj.weight", "conf_proj.bias"]), "DSpark confidence_head",
                       "no conf_proj tensors"),
    "no-markov-w1": ("ds", dict(drop_tensors=["markov_w1.weight"]), "DSpark dspark", "wrong number of tensors"),
    "no-markov-w2": ("ds", dict(drop_tensors=["markov_w2.weight"]), "DSpark dspark", "check_tensor_dims: tensor 'markov_w2"),
    "d2t-no-head": ("dsred", dict(drop_tensors=["output.weight"]), "DSpark d2t", "model.d2t->ne[0] == n_draft_vocab"),
    "no-mask": ("ds", dict(drop_keys=["tokenizer.ggml.mask_token_id"]), "DSpark mask_token_id", "invalid token[1]"),
    "lb-no-w2": ("dslb", dict(drop_tensors=["dflash.dspark.markov.w2"]), "DSpark dspark",
                 "incomplete DSpark Markov tensors"),
    "lb-no-bias": ("dslb", dict(drop_tensors=["dflash.dspark.confidence.bias"]), "DSpark dspark",
                   "incomplete DSpark confidence tensors"),
}


@pytest.mark.parametrize("name", list(BROKEN))
def test_validate_reports_dspark_faults(work, name):
    src, edits, where, fragment = BROKEN[name]
    bad = rewrite_gguf(work[src], work["dir"] / f"v-{name}.gguf", **edits)
    report = validate([str(bad)])
    assert report.exit_code == 1
    (p,) = [p for p in report.problems if p.severity == "error"]
    assert p.where == where and fragment in p.rule, p


def test_validate_passes_good_dspark_files(work):
    assert validate([str(work[n]) for n in ("ds", "dsred", "dsbonus", "dslb")]).exit_code == 0


def test_validate_checks_markov_shapes_against_the_vocabulary(work):
    """markov_w1 must have one row per token of the drafter's vocabulary: a file whose tokenizer is smaller."""
    with GGUFFile(work["ds"]) as f:
        tokens = list(f.get("tokenizer.ggml.tokens"))[:100]
    bad = rewrite_gguf(work["ds"], work["dir"] / "v-vocab.gguf", set_keys=[
        ("tokenizer.ggml.tokens", VT.ARRAY, tokens, VT.STRING),
        ("tokenizer.ggml.mask_token_id", VT.UINT32, 50, None)], drop_keys=["tokenizer.ggml.scores",
                                                                           "tokenizer.ggml.token_type"])
    report = validate([str(bad)])
    rules = [p.rule for p in report.problems]
    assert report.exit_code == 1 and any("markov_w1.weight' has wrong shape; expected     32,    100" in r
                                         for r in rules), rules


# ---- doctor -------------------------------------------------------------------------------------------------------

def test_field_report_mask_is_found_and_fixed(work):
    """The K3 report: a DSpark drafter whose mask id is only in dflash.mask_token_id drafts nothing in llama.cpp
    ("invalid token[1] = -1" on every step); doctor names it, --fix writes tokenizer.ggml.mask_token_id."""
    bad = rewrite_gguf(work["ds"], work["dir"] / "k3mask.gguf", drop_keys=["tokenizer.ggml.mask_token_id"],
                       set_keys=[("dflash.mask_token_id", VT.UINT32, MASK, None)])
    report = doctor(str(bad))
    f = next(f for f in report.findings if f.check == "mask_token_id")
    assert f.severity == "error" and f.says("llama.cpp") == "init: invalid token[1] = -1"
    fixed = work["dir"] / "k3mask-fixed.gguf"
    result = doctor_fix(str(bad), str(fixed))
    assert result.exit_code == 0 and result.fixed == {"mask": MASK}
    assert kvs(fixed)["tokenizer.ggml.mask_token_id"] == MASK
    assert tensors(fixed) == tensors(bad)


@pytest.mark.parametrize("flag,tensors_dropped,want", [(False, (), True), (True, ("conf_proj.weight",
                                                                                   "conf_proj.bias"), False)])
def test_confidence_flag_fixed_from_the_tensors(work, flag, tensors_dropped, want):
    bad = rewrite_gguf(work["ds"], work["dir"] / f"conf-{flag}.gguf", drop_tensors=tensors_dropped,
                       set_keys=[("dflash.has_confidence_head", VT.BOOL, flag, None)])
    fixed = work["dir"] / f"conf-{flag}-fixed.gguf"
    result = doctor_fix(str(bad), str(fixed))
    assert result.fixed == {"has_confidence_head": want} and result.exit_code == 0
    assert kvs(fixed)["dflash.has_confidence_head"] is want


def test_hf_fixes_the_block_layout_and_block_size(work):
    bad = rewrite_gguf(work["ds"], work["dir"] / "anchor.gguf", drop_keys=["dflash.block_size"],
                       set_keys=[("dflash.sample_from_anchor", VT.BOOL, False, None)])
    report = doctor(str(bad), hf=work["flat"])
    assert {f.check for f in report.errors} >= {"block_size", "dspark"}
    fixed = work["dir"] / "anchor-fixed.gguf"
    result = doctor_fix(str(bad), str(fixed), hf=work["flat"])
    assert result.exit_code == 0
    assert result.fixed["sample_from_anchor"] is True and result.fixed["block_size"] == DS.BLOCK_SIZE
    assert kvs(fixed)["dflash.sample_from_anchor"] is True


def test_target_llamacpp_cannot_tap_is_named(work):
    """kimi-k3 in this llama.cpp: its graph sets no layer inputs; the draft asserts (the K3 report's crash)."""
    k3 = make_target_gguf(work["dir"] / "k3.gguf", arch="kimi-k3")
    report = doctor(str(work["ds"]), target=str(k3))
    f = next(f for f in report.findings if f.check == "target_arch[llama.cpp]")
    assert f.severity == "error"
    assert f.says("llama.cpp") == 'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed'


def test_anchor_first_drafts_a_whole_block(work):
    """llama.cpp clamps an anchor-first DSpark draft to block_size (not block_size - 1)."""
    B = DS.BLOCK_SIZE
    assert not [f for f in doctor(str(work["ds"]), n_max=B).findings if f.check == "n_max"]
    f = next(f for f in doctor(str(work["ds"]), n_max=B + 1).findings if f.check == "n_max")
    assert f"clamping to {B}" in f.says("llama.cpp")
    f = next(f for f in doctor(str(work["dsbonus"]), n_max=B).findings if f.check == "n_max")
    assert f"clamping to {B - 1}" in f.says("llama.cpp")


def test_lucebox_target_vocabulary(work):
    report = doctor(str(work["dslb"]), target=str(make_target_gguf(work["dir"] / "q35v.gguf", arch="qwen35",
                                                                    vocab=2 * VOCAB)))
    f = next(f for f in report.findings if f.check == "dspark_vocab")
    assert f.severity == "error" and f.says("lucebox") == (
        f"dspark_markov_correct_greedy_chain: vocab mismatch target={2 * VOCAB} dspark={VOCAB}")


# ---- layouts --------------------------------------------------------------------------------------------------------

def test_layout_round_trip(work):
    """lucebox -> llama.cpp -> lucebox gives the file back byte for byte; the move writes the bonus-anchor layout
    lucebox drafts with, and the llama.cpp file passes doctor against the checkpoint."""
    to_llama, back = work["dir"] / "lb2llama.gguf", work["dir"] / "lb2llama2lb.gguf"
    move_layout(str(work["dslb"]), str(to_llama), "llama.cpp", target=str(work["target"]))
    k = kvs(to_llama)
    assert (k["dflash.sample_from_anchor"], k["dflash.has_confidence_head"]) == (False, True)
    assert doctor(str(to_llama), hf=work["bonus"]).exit_code == 0
    move_layout(str(to_llama), str(back), "lucebox")
    assert back.read_bytes() == work["dslb"].read_bytes()


@pytest.mark.parametrize("src,edits,fragment", [
    ("ds", {}, "bonus-anchor blocks only"),
    ("dsred", {}, "draft vocabulary is smaller"),
    ("dsbonus", dict(drop_tensors=["conf_proj.bias"]), "confidence head has no bias"),
])
def test_moves_lucebox_cannot_draft_are_refused(tmp_path, work, src, edits, fragment):
    draft = rewrite_gguf(work[src], tmp_path / "d.gguf", **edits) if edits else work[src]
    r = cli("convert", "gguf-layout", draft, "--to", "lucebox", "-o", tmp_path / "o.gguf")
    assert r.exit_code == 2 and fragment in r.stderr and len(r.stderr.splitlines()) == 1, r.output
    r = cli("doctor", draft, "--fix", "--to", "lucebox", "-o", tmp_path / "o.gguf")
    assert r.exit_code == 2 and fragment in r.stderr, r.output
    assert not (tmp_path / "o.gguf").exists()


# ---- quantize ---------------------------------------------------------------------------------------------------

def test_quantize_keeps_the_tables_and_quantizes_the_markov_heads(tmp_path, work):
    """d2t stays I64, the 1-D-like confidence weight {H + R, 1} and bias stay as they are (llama-quantize never
    quantizes them); markov_w1 / markov_w2 are heads (Q8_0 in q4-mix / q2_k). Bytes: test_quantize.py."""
    f16 = tmp_path / "f16.gguf"
    convert_dflash(work["spec"], f16, target=work["target"], outtype="f16")
    for scheme, block in (("q4-mix", T.Q4_0), ("q2_k", T.Q4_0)):       # Q2_K falls back to Q4_0 on ne0 = 64
        acts = {a.name: a for a in plan_quantize(str(f16), str(tmp_path / "q.gguf"), scheme).shards[0].tensors}
        assert acts["d2t"].action == "copy" and acts["d2t"].dst_type == T.I64
        assert acts["conf_proj.weight"].action == "copy" and acts["conf_proj.bias"].action == "copy"
        assert acts["markov_w1.weight"].dst_type == T.Q8_0 and acts["markov_w2.weight"].dst_type == T.Q8_0
        assert acts["blk.0.ffn_up.weight"].dst_type == block
