"""EAGLE3 files in validate, doctor / pair-check and inspect: each model-file and pair rule of hparam_rules/eagle3.py
provoked on a broken copy of a good drafter, refused in llama.cpp's words (found in its vendored source; the load-time
ones proven against libllama itself), the family's facts (which target archs write the tapped features) derived from
that source, and what never fails (a good file, the spec type llama.cpp must be told)."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

from ggtools.cli import main
from ggtools.dflash import eagle3 as E
from ggtools.gguf import GGUFFile, GGUFWriter
from ggtools.hparam_rules import model_violations
from ggtools.jobs.convert_drafter import convert_drafter
from ggtools.jobs.doctor import doctor
from scripts.fixtures import dspark_checkpoints as DS
from scripts.fixtures import eagle3_drafters as E3
from scripts.fixtures import runtime_sources
from tests.hostile_corpus import DEMO
from tests.test_convert_support import make_target_gguf, rewrite_gguf

DEMO_TARGET = f"{DEMO}/target.gguf"
K = "eagle3."


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> str:
    """The demo target's EAGLE3 drafter as convert drafter writes it (f32): taps [0, 1, 3], d2t of 512 rows."""
    d = tmp_path_factory.mktemp("e3")
    hf = DS.write_dspark(d / "hf", *E3.demo_checkpoint())
    out = d / "good.gguf"
    convert_drafter(hf, str(out), target=DEMO_TARGET, outtype="f32")
    return str(out)


def replaced(src, dst, name, ne=None, type_id=None, data=None, drop=()) -> str:
    """A copy of src with tensor `name` replaced (ne, type, data) or added, and tensors `drop` left out."""
    with GGUFFile(src) as f, GGUFWriter(dst, force=True) as w:
        for kv in f.kvs:
            w.add_kv_record(kv)
        keep = [(t.name, tuple(t.ne), t.type_id, None) for t in f.tensors if t.name not in drop]
        if data is not None:
            keep = [k for k in keep if k[0] != name] + [(name, tuple(ne), type_id, data)]
        for n, shape, tid, d in keep:
            w.add_tensor_info(n, shape, tid, len(d) if d is not None else f.tensor[n].nbytes)
        for n, shape, tid, d in keep:
            w.write(d if d is not None else f.tensor_data(f.tensor[n]))
    return str(dst)


def d2t_with(good, tmp_path, edit) -> str:
    with GGUFFile(good) as f:
        ids = np.frombuffer(bytes(f.tensor_data(f.tensor["d2t"])), "<i8").copy()
    edit(ids)
    return replaced(good, tmp_path / "bad.gguf", "d2t", (len(ids),), T.I64, ids.astype("<i8").tobytes())


def keys(*set_keys, drop=()):
    return lambda good, tmp: str(rewrite_gguf(good, tmp / "bad.gguf", set_keys=set_keys, drop_keys=drop))


# case -> (make the broken file, the place validate names, the rule's words, llama.cpp's words or None)
CASES = {
    "no target layers": (keys(drop=(K + "target_layers",)), "key 'eagle3.target_layers'", "missing",
                         E.SAYS_NO_LAYERS),
    "target layers not an array": (keys((K + "target_layers", VT.UINT32, 3, None), drop=()),
                                   "key 'eagle3.target_layers'", "an array of 3 layer ids", E.SAYS_NO_LAYERS),
    "two target layers": (keys((K + "target_layers", VT.ARRAY, [0, 1], VT.INT32)), "key 'eagle3.target_layers'",
                          "exactly 3", E.SAYS_THREE),
    "float target layers": (keys((K + "target_layers", VT.ARRAY, [0.0, 1.0, 3.0], VT.FLOAT32)),
                            "key 'eagle3.target_layers'", "an array of integers",
                            "eagle3.target_layers has wrong array element type f32"),
    "negative target layer": (keys((K + "target_layers", VT.ARRAY, [0, -1, 3], VT.INT32)),
                              "key 'eagle3.target_layers'", "at least 0", None),
    "no target hidden size": (keys(drop=(K + "target_hidden_size",)), "key 'eagle3.target_hidden_size'", "missing",
                              "key not found in model: eagle3.target_hidden_size"),
    "target hidden size 0": (keys((K + "target_hidden_size", VT.UINT32, 0, None)), "key 'eagle3.target_hidden_size'",
                             "is 0", None),
    "target hidden size i32": (keys((K + "target_hidden_size", VT.INT32, 128, None)),
                               "key 'eagle3.target_hidden_size'", "llama.cpp requires UINT32",
                               "key eagle3.target_hidden_size has wrong type i32 but expected type u32"),
    "two layers": (keys((K + "block_count", VT.UINT32, 2, None)), "key 'eagle3.block_count'", "one decoder layer",
                   E.SAYS_ONE_LAYER),
    "head sizes": (keys((K + "attention.value_length", VT.UINT32, 64, None)), "key 'eagle3.attention.value_length'",
                   "one head size", E.SAYS_HEAD_SIZES),
    "no eps": (keys(drop=(K + "attention.layer_norm_rms_epsilon",)), "key 'eagle3.attention.layer_norm_rms_epsilon'",
               "missing", "key not found in model: eagle3.attention.layer_norm_rms_epsilon"),
    "flag not a bool": (keys((K + "norm_before_fc", VT.UINT32, 1, None)), "key 'eagle3.norm_before_fc'",
                        "llama.cpp requires BOOL",
                        "key eagle3.norm_before_fc has wrong type u32 but expected type bool"),
    "no fc": (lambda good, tmp: replaced(good, tmp / "bad.gguf", None, drop=("fc.weight",)), "tensor 'fc.weight'",
              "missing", "check_tensor_dims: tensor 'fc.weight' not found"),
    "norm_before_fc without its norm": (keys((K + "norm_before_fc", VT.BOOL, True, None)),
                                        "tensor 'enc.output_norm.weight'", "missing",
                                        "check_tensor_dims: tensor 'enc.output_norm.weight' not found"),
    "t2d kept": (lambda good, tmp: replaced(good, tmp / "bad.gguf", "t2d", (2048,), T.I8, bytes(2048)),
                 "tensor 't2d'", "not an EAGLE3 tensor",
                 "done_getting_tensors: wrong number of tensors; expected 15, got 14"),
    "attn_q shape": (lambda good, tmp: replaced(good, tmp / "bad.gguf", "blk.0.attn_q.weight", (128, 128), T.F32,
                                                bytes(128 * 128 * 4)), "tensor 'blk.0.attn_q.weight'",
                     "has wrong shape",
                     "check_tensor_dims: tensor 'blk.0.attn_q.weight' has wrong shape; expected    256,    128, got    "
                     "128,    128,      1,      1"),
    "d2t not I64": (lambda good, tmp: replaced(good, tmp / "bad.gguf", "d2t", (512,), T.I32, bytes(2048)),
                    "tensor 'd2t'", "expected I64", E.SAYS_D2T_TYPE),
    "d2t beyond the vocabulary": (lambda good, tmp: d2t_with(good, tmp, lambda ids: ids.__setitem__(7, 2048)),
                                  "tensor 'd2t'", "outside the target ids", None),
    "d2t twice": (lambda good, tmp: d2t_with(good, tmp, lambda ids: ids.__setitem__(7, ids[8])), "tensor 'd2t'",
                  "maps two draft rows to one target id", None),
    "d2t without own head": (lambda good, tmp: replaced(good, tmp / "bad.gguf", None, drop=("output.weight",)),
                             "tensor 'd2t'", "its own output.weight", E.SAYS_D2T_HEAD),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_validate_refuses_in_llama_cpps_words(good, tmp_path, case):
    make, where, rule, says = CASES[case]
    bad = make(good, tmp_path)
    r = cli("validate", bad, "--json")
    assert r.exit_code == 1, r.output
    problems = json.loads(r.stdout)["files"][0]["problems"]
    hit = [p for p in problems if p["where"] == where and rule in p["rule"]]
    assert hit, problems
    if says:
        assert f'llama.cpp: "{says}"' in hit[0]["rule"]


def test_good_file_passes_every_check(good):
    with GGUFFile(good) as f:
        assert model_violations(f) == []
    assert cli("validate", good).exit_code == 0
    report = doctor(good)
    assert report.exit_code == 0 and [f.check for f in report.findings] == ["eagle3", "spec_type"]


@pytest.mark.parametrize("case", sorted(c for c, v in CASES.items() if v[3]))
def test_quotes_are_llama_cpps(case):
    """Every word quoted as llama.cpp's is printed (or asserted) by its vendored source."""
    try:
        texts = runtime_sources.llama_cpp_texts()
    except runtime_sources.SourcesMissing as e:
        pytest.skip(str(e))
    assert runtime_sources.quoted_in(CASES[case][3], texts), CASES[case][3]


LOAD_TIME = ("no target layers", "target layers not an array", "two target layers", "float target layers",
             "no target hidden size", "target hidden size i32", "no eps", "flag not a bool", "no fc",
             "norm_before_fc without its norm", "t2d kept", "attn_q shape")


@pytest.mark.oracle
@pytest.mark.parametrize("case", LOAD_TIME)
def test_libllama_refuses_with_the_quoted_words(good, tmp_path, case):
    """What libllama's loader says refusing each broken file is what the rule quotes."""
    from tests.oracle_artifacts import llama_load_info
    make, _, _, says = CASES[case]
    assert llama_load_info(good)["ok"]
    info = llama_load_info(make(good, tmp_path))
    assert not info["ok"] and says in info["error"], info


def test_tap_facts_are_llama_cpps_source():
    """The archs whose graph writes t_layer_inp and t_h_nextn, as the vendored source says (drafter archs aside)."""
    try:
        texts = runtime_sources.llama_cpp_texts()
    except runtime_sources.SourcesMissing as e:
        pytest.skip(str(e))
    assert E.TAP_ARCHS == runtime_sources.llama_cpp_tap_archs(texts)
    drafters = {"dflash", "eagle3", "gemma4-assistant"}
    assert E.NEXTN_ARCHS == runtime_sources.llama_cpp_tap_archs(texts, member="t_h_nextn") - drafters


# ---- doctor: the pair, the checkpoint ----------------------------------------------------------------------------

def finding(report, check):
    return next(f for f in report.findings if f.check == check)


@pytest.mark.parametrize("case,check,severity,says", [
    (dict(arch="kimi-k3", n_layer=6, hidden=128, vocab=2048), "target_arch", "error", E.SAYS_NO_TAP),
    (dict(n_layer=3, hidden=128, vocab=2048), "target_layers", "warning", None),
    (dict(n_layer=2, hidden=128, vocab=2048), "target_layers", "error", E.SAYS_BEYOND.format(3, 2)),
    (dict(n_layer=8, hidden=64, vocab=2048), "target_hidden_size", "error", E.SAYS_FEATURES.format(192, 128, 384)),
    (dict(n_layer=8, hidden=128, vocab=1000), "vocab", "error", None),
])
def test_pair_check(good, tmp_path, case, check, severity, says):
    target = make_target_gguf(tmp_path / "t.gguf", **case)
    report = doctor(good, target=str(target))
    f = next(f for f in report.findings if f.check == check and f.severity == severity)
    assert f.says("llama.cpp") == says
    assert report.exit_code == 1           # the metadata-only target lends no embedding: never a passing pair


def test_stale_tap_is_a_warning_with_no_words(good, tmp_path):
    """Id 3 of a 3-layer qwen3 target: llama.cpp reads t_h_nextn, which qwen3 never writes, and says nothing."""
    target = make_target_gguf(tmp_path / "t.gguf", n_layer=3, hidden=128, vocab=2048)
    f = finding(doctor(good, target=str(target)), "target_layers")
    assert f.severity == "warning" and "stale" in f.message and f.says("llama.cpp") is None


def test_the_demo_pair_passes(good):
    report = doctor(good, target=DEMO_TARGET)
    assert report.exit_code == 0, [f.as_dict() for f in report.errors]
    assert finding(report, "pair").severity == "ok"


def test_spec_type_is_told(good):
    f = finding(doctor(good), "spec_type")
    assert f.severity == "warning" and "--spec-type draft-eagle3" in f.message
    assert "common_speculative_types_from_gguf" in f.message


def test_hf_compares_every_value_and_tensor(good, tmp_path):
    hf = DS.write_dspark(tmp_path / "hf", *E3.demo_checkpoint())
    report = doctor(good, hf=str(hf))
    assert finding(report, "hf_values").severity == "ok" and finding(report, "tensor_data").severity == "ok"
    cfg, tensors = E3.demo_checkpoint()
    cfg["rms_norm_eps"] = 1e-6
    tensors["norm.weight"] = ("BF16", tensors["norm.weight"][1] * 2)
    other = DS.write_dspark(tmp_path / "other", cfg, tensors)
    report = doctor(good, hf=str(other))
    assert "layer_norm_rms_epsilon" in finding(report, "hf_values").message
    assert "output_norm.weight" in finding(report, "tensor_data").message and report.exit_code == 1


def test_fix_refused(good, tmp_path):
    r = cli("doctor", good, "--fix", "-o", tmp_path / "o.gguf")
    assert r.exit_code == 2 and "EAGLE3" in r.stderr and not (tmp_path / "o.gguf").exists()


def test_lucebox_runtime_refused(good):
    r = cli("doctor", good, "--runtime", "lucebox")
    assert r.exit_code == 2 and "no EAGLE3" in r.stderr


def test_inspect_names_the_family(good):
    r = cli("inspect", good, "--json")
    d = json.loads(r.stdout)["drafter"]
    assert d["family"] == "EAGLE3" and d["eagle3"]["target_layers"] == [0, 1, 3]
    assert d["eagle3"]["draft_vocab"] == 512 and d["eagle3"]["spec_type"] == "draft-eagle3"


@pytest.mark.oracle
def test_the_tiny_drafters_pass_and_pair(eagle3_drafters, tiny_target):
    """llama.cpp's own conversions (every layout, every quantization) pass validate and pair with their target;
    against the checkpoint they came from, every key and tensor agrees."""
    for key, path in {**eagle3_drafters.paths, **eagle3_drafters.quants}.items():
        layout = key.split("/")[0]
        report = doctor(str(path), target=str(tiny_target.gguf["f16"]), hf=str(eagle3_drafters.dirs[layout]))
        assert report.exit_code == 0, (key, [f.as_dict() for f in report.errors])


def test_pair_and_converter_quotes_are_llama_cpps(llama_cpp_src):
    """The pair rules' words are in llama.cpp's runtime source; the converter's in its conversion/llama.py."""
    try:
        texts = runtime_sources.llama_cpp_texts()
    except runtime_sources.SourcesMissing as e:
        pytest.skip(str(e))
    for said in (E.SAYS_FEATURES.format(768, 256, 384), E.SAYS_BEYOND.format(9, 8), E.SAYS_NO_TAP, E.SAYS_NO_EMBD,
                 E.SAYS_NO_OUTPUT, E.SAYS_NOT_EAGLE3.format(2)):
        assert runtime_sources.quoted_in(said, texts), said
    converter = {"conversion/llama.py": (llama_cpp_src / "conversion" / "llama.py").read_text()}
    for said in (E.SAYS_NEEDS_TARGET, E.SAYS_D2T_RANGE.format(1024), E.SAYS_D2T_DUPLICATE):
        assert runtime_sources.quoted_in(said, converter), said
