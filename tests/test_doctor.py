"""doctor: every finding class quotes what its runtime prints (checked against the runtime's own source), the
repairs write what the evidence supports and nothing else, layout moves, and hostile input.

Synthetic drafters and targets (tests/test_convert_support.py); the runtime sources come from the llama-cpp-python
sdist (llama.cpp), $GGTOOLS_LUCEBOX_SRC (lucebox) and this repository's runtime/ (ggtools). The oracle-backed
proofs are in tests/test_doctor_oracle.py.
"""

import hashlib
import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as VT

from ggtools.cli import main
from ggtools.dflash.findings import failed
from ggtools.dflash.profiles import PROFILES
from ggtools.gguf import GGUFFile
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.doctor import FixRefused, doctor, doctor_fix, move_layout, pair_check
from ggtools.jobs.validate import validate
from scripts.fixtures import runtime_sources
from tests.test_convert_support import H, VOCAB, make_checkpoint, make_dspark_checkpoint, make_target_gguf, rewrite_gguf

LB = "qwen35-dflash-draft"
RUNTIME_DIR = Path(__file__).resolve().parents[1] / "runtime"


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """Drafters converted by ggtools from synthetic checkpoints, and targets."""
    d = tmp_path_factory.mktemp("doctor")
    w = {"dir": d, "target": make_target_gguf(d / "target.gguf"),
         "qwen35": make_target_gguf(d / "qwen35.gguf", arch="qwen35"),
         "c1": make_checkpoint(d / "c1", 1), "c2": make_checkpoint(d / "c2", 2)}
    w |= {"cds": make_dspark_checkpoint(d / "cds"), "cdsred": make_dspark_checkpoint(
        d / "cdsred", arch="DSparkSpeculator", layout="speculators", reduced=True),
        "cdsbonus": make_dspark_checkpoint(d / "cdsbonus", extra={"sample_from_anchor": False})}
    for name, ckpt, profile in (("v1", "c1", "llama.cpp"), ("v2", "c2", "llama.cpp"), ("lb", "c1", "lucebox"),
                                ("ds", "cds", "llama.cpp"), ("dsred", "cdsred", "llama.cpp"),
                                ("dslb", "cdsbonus", "lucebox")):
        w[name] = d / f"{name}.gguf"
        convert_dflash(w[ckpt], w[name], profile=profile, target=w["target"] if profile == "llama.cpp" else None)
    return w


@pytest.fixture(scope="session")
def sources():
    """runtime -> {file: text} of its source, for the runtimes whose sources are here (others skip)."""
    out = {"ggtools": {str(p.relative_to(RUNTIME_DIR)): p.read_text() for p in RUNTIME_DIR.rglob("*.py")}}
    for runtime, read in (("llama.cpp", runtime_sources.llama_cpp_texts), ("lucebox", runtime_sources.lucebox_texts)):
        try:
            out[runtime] = read()
        except runtime_sources.SourcesMissing as e:
            out[runtime] = e
    return out


def broken(w, src, name, **edits) -> Path:
    return rewrite_gguf(w[src], w["dir"] / f"{name}.gguf", **edits)


def finding(report, check, runtime):
    found = [f for f in report.findings if f.check == check and runtime in f.runtimes]
    assert found, [(f.check, f.severity, f.runtimes) for f in report.findings]
    return found[0]


def assert_quoted(f, runtime, sources):
    texts = sources[runtime]
    if isinstance(texts, Exception):
        pytest.skip(f"oracle missing: {runtime} sources: {texts}")
    said = f.says(runtime)
    assert said, f"{f.check}: no words quoted for {runtime}"
    assert runtime_sources.quoted_in(said, texts), f"{said!r} is not in {runtime}'s source"


# Each finding class: how to provoke it, the finding's check, the runtime whose words it quotes, and those words.
def _cases():
    A = "dflash"
    return {
        "arch/llama.cpp": (lambda w: doctor(w["lb"], runtimes=["llama.cpp"]), "arch", "llama.cpp",
                           f"unknown model architecture: '{LB}'"),
        "arch/lucebox": (lambda w: doctor(w["v1"], runtimes=["lucebox"]), "arch", "lucebox",
                         "unexpected draft arch: dflash (expected qwen35-dflash-draft, dflash-draft, or "
                         "gemma4-dflash-draft)"),
        "keys": (lambda w: doctor(broken(w, "v1", "nokey", drop_keys=[f"{A}.context_length"])), "keys",
                 "llama.cpp", f"key not found in model: {A}.context_length"),
        "target_layers/missing": (lambda w: doctor(broken(w, "v1", "noids", drop_keys=[f"{A}.target_layers"])),
                                  "target_layers", "llama.cpp", "DFlash model requires 'target_layers' in GGUF "
                                                                "metadata"),
        "target_layers/range": (lambda w: pair_check(w["target"], broken(w, "v1", "range", set_keys=[
            (f"{A}.target_layers", VT.ARRAY, [2, 8], VT.INT32)])), "target_layers", "llama.cpp",
            'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed'),
        "activation": (lambda w: doctor(broken(w, "v1", "act", set_keys=[
            (f"{A}.hidden_activation", VT.STRING, "relu", None)])), "activation", "llama.cpp",
            "unsupported DFlash hidden activation: relu"),
        "sliding_window": (lambda w: doctor(broken(w, "v1", "swa", set_keys=[
            (f"{A}.attention.sliding_window", VT.UINT32, 16, None)])), "sliding_window", "llama.cpp",
            f"array key not found in model: {A}.attention.sliding_window_pattern"),
        "tensors/missing": (lambda w: doctor(broken(w, "v1", "notensor", drop_tensors=["blk.1.ffn_up.weight"])),
                            "tensors", "llama.cpp", "check_tensor_dims: tensor 'blk.1.ffn_up.weight' not found"),
        "tensors/extra": (lambda w: doctor(broken(w, "v2", "extra", drop_tensors=["selector_hidden.weight"])),
                          "tensors", "llama.cpp", None),
        "tokenizer": (lambda w: doctor(broken(w, "v1", "notok", drop_keys=[
            k for k in _keys(w["v1"]) if k.startswith("tokenizer.")])), "tokenizer", "llama.cpp",
            "key not found in model: tokenizer.ggml.model"),
        "mask_token_id/missing": (lambda w: doctor(broken(w, "v1", "nomask", drop_keys=[
            "tokenizer.ggml.mask_token_id"])), "mask_token_id", "llama.cpp", "init: invalid token[1] = -1"),
        "mask_token_id/vocab": (lambda w: doctor(broken(w, "v1", "maskvocab", set_keys=[
            ("tokenizer.ggml.mask_token_id", VT.UINT32, 500, None)])), "mask_token_id", "llama.cpp",
            "load: bad special token: 'tokenizer.ggml.mask_token_id' = 500, using default id -1"),
        "block_size/missing": (lambda w: doctor(broken(w, "v1", "nobs", drop_keys=[f"{A}.block_size"])),
                               "block_size", "llama.cpp", "common_speculative_impl_draft_dflash: - block_size=16, "
                               "mask_token_id=100, n_extract=2, sample_from_anchor=true"),
        "dflash2/keys": (lambda w: doctor(broken(w, "v2", "v2keys", drop_keys=[f"{A}.conv_kernel_size"])),
                         "dflash2", "llama.cpp", "DFlash2 model is missing conv/selector metadata"),
        "dflash2/group": (lambda w: doctor(broken(w, "v2", "v2group", set_keys=[
            (f"{A}.conv_group_size", VT.UINT32, 24, None)])), "dflash2", "llama.cpp",
            "DFlash2 hidden size must be divisible by conv_group_size"),
        "dflash2/lattice": (lambda w: doctor(broken(w, "v2", "v2lattice", set_keys=[
            (f"{A}.selector_top_k", VT.UINT32, 8, None)])), "dflash2", "llama.cpp",
            "DFlash2 hidden size is too small for the selector lattice"),
        "n_max/llama.cpp": (lambda w: doctor(w["v1"], n_max=12), "n_max", "llama.cpp",
                            "common_speculative_impl_draft_dflash: requested draft size (n_max=12, n_min=0) exceeds the trained block size 8 -- "
                            "clamping to 7"),
        "n_max/ggtools": (lambda w: doctor(w["v1"], n_max=12, runtimes=["ggtools"]), "n_max", "ggtools",
                          "--n-max 12: the drafter's block of 8 drafts at most 7 tokens per step"),
        # a valid file ggtools' runtime does not run (a value_length that differs from key_length is no longer one:
        # attn_v's shape says the heads' size, and the model-file rules refuse it)
        "loader/ggtools": (lambda w: doctor(broken(w, "v1", "yarn-gg", set_keys=[
            (f"{A}.rope.scaling.type", VT.STRING, "yarn", None), (f"{A}.rope.scaling.factor", VT.FLOAT32, 2.0, None)]),
            runtimes=["ggtools"]), "loader", "ggtools", None),
        # the model-file rules (ggtools.hparam_rules), quoting llama.cpp's loader where it refuses the file
        "hparams/type": (lambda w: doctor(broken(w, "v1", "bs-f32", set_keys=[
            (f"{A}.block_size", VT.FLOAT32, 8.0, None)])), "block_size", "llama.cpp",
            f"key {A}.block_size has wrong type f32 but expected type u32"),
        "hparams/block_count": (lambda w: doctor(broken(w, "v1", "nl0", set_keys=[
            (f"{A}.block_count", VT.UINT32, 0, None)])), "hparams", "llama.cpp",
            "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS) failed"),
        "hparams/n_rot": (lambda w: doctor(broken(w, "v1", "nrot", set_keys=[
            (f"{A}.rope.dimension_count", VT.UINT32, 999, None)])), "hparams", "llama.cpp",
            "GGML_ASSERT(n_dims <= ne0) failed"),
        "mask_token_id/type": (lambda w: doctor(broken(w, "v1", "mask-i32", set_keys=[
            ("tokenizer.ggml.mask_token_id", VT.INT32, -1, None)])), "mask_token_id", "llama.cpp",
            "key tokenizer.ggml.mask_token_id has wrong type i32 but expected type u32"),
        "target_layers/strings": (lambda w: doctor(broken(w, "v1", "ids-str", set_keys=[
            (f"{A}.target_layers", VT.ARRAY, ["2", "6"], VT.STRING)])), "target_layers", "llama.cpp",
            f"{A}.target_layers has wrong array element type str"),

        "hidden": (lambda w: pair_check(make_target_gguf(w["dir"] / "wide.gguf", hidden=2 * H), w["v1"]), "hidden",
                   "llama.cpp", "encode: embd row width 256 does not match the encoder input 128"),
        "fc/llama.cpp": (lambda w: pair_check(w["target"], broken(w, "v1", "fc3", set_keys=[
            (f"{A}.target_layers", VT.ARRAY, [2, 4, 6], VT.INT32)])), "fc", "llama.cpp",
            "encode: embd row width 192 does not match the encoder input 128"),
        "target_arch/llama.cpp": (lambda w: pair_check(make_target_gguf(w["dir"] / "g3.gguf", arch="gemma3"),
                                                       w["v1"]), "target_arch[llama.cpp]", "llama.cpp",
                                  'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed'),
        "target_arch/ggtools": (lambda w: doctor(w["v1"], target=make_target_gguf(w["dir"] / "g3b.gguf", arch="gemma3"),
                                                 runtimes=["ggtools"]), "target_arch[ggtools]", "ggtools", None),
        "target_arch/lucebox": (lambda w: pair_check(make_target_gguf(w["dir"] / "g3c.gguf", arch="gemma3"),
                                                     w["lb"]), "target_arch[lucebox]", "lucebox",
                                "[backend_factory] unsupported architecture: gemma3"),
        "hparams/lucebox": (lambda w: doctor(broken(w, "lb", "lb-hd", drop_keys=[f"{LB}.attention.key_length"])),
                            "hparams", "lucebox", "draft GGUF: missing hparams: n_embd=64 n_layer=2 n_ff=128 "
                                                  "n_head=2 n_head_kv=1 head_dim=0"),
        "tensors/lucebox": (lambda w: doctor(broken(w, "lb", "lb-fc", drop_tensors=["dflash.fc.weight"])),
                            "tensors", "lucebox", "draft GGUF: missing top-level tensors (dflash.fc|dflash_fc / "
                                                  "dflash.hidden_norm|dflash_hidden_norm / output_norm)"),
        "tensors/lucebox-layer": (lambda w: doctor(broken(w, "lb", "lb-l1", drop_tensors=["blk.1.attn_v.weight"])),
                                  "tensors", "lucebox", "draft GGUF: layer 1 missing tensors"),
        "fc/lucebox": (lambda w: pair_check(w["qwen35"], broken(w, "lb", "lb-fc3", set_keys=[
            (f"{LB}.dflash.n_target_layers", VT.UINT32, 3, None)])), "fc", "lucebox",
            "[draft] dflash.n_target_layers metadata (3) != fc-derived capture count (2); using the weights"),
        "rope_theta/lucebox": (lambda w: doctor(broken(w, "lb", "lb-rope", drop_keys=[f"{LB}.rope.freq_base"])),
                               "rope_theta", "lucebox",
                               "[draft-gguf] WARNING: rope.freq_base not found in GGUF, draft RoPE will be wrong"),
        "rope_theta/hf": (lambda w: doctor(broken(w, "v1", "rope6", set_keys=[
            (f"{A}.rope.freq_base", VT.FLOAT32, 1e6, None)]), hf=w["c1"]), "rope_theta", "llama.cpp",
            "print_info: freq_base_train       = 1000000.0"),
        "hparams/hf": (lambda w: doctor(broken(w, "v1", "eps", set_keys=[
            (f"{A}.attention.layer_norm_rms_epsilon", VT.FLOAT32, 1e-5, None)]), hf=w["c1"]), "hparams",
            "llama.cpp", "print_info: f_norm_rms_eps        = 1.0e-05"),
        "block_size/hf": (lambda w: doctor(broken(w, "v1", "bs16", set_keys=[
            (f"{A}.block_size", VT.UINT32, 16, None)]), hf=w["c1"]), "block_size", "llama.cpp",
            "common_speculative_impl_draft_dflash: - block_size=16, mask_token_id=100, n_extract=2, "
            "sample_from_anchor=true"),
        "mask_token_id/hf": (lambda w: doctor(broken(w, "v1", "mask7", set_keys=[
            ("tokenizer.ggml.mask_token_id", VT.UINT32, 7, None)]), hf=w["c1"]), "mask_token_id", "llama.cpp",
            "common_speculative_impl_draft_dflash: - block_size=8, mask_token_id=7, n_extract=2, "
            "sample_from_anchor=true"),
        # DSpark (docs/dspark.md)
        "dspark/block_size": (lambda w: doctor(broken(w, "ds", "ds-nobs", drop_keys=[f"{A}.block_size"])),
                              "block_size", "llama.cpp", 'GGML_ASSERT(it != model.gguf_kv.end() && "DSpark draft '
                              'requires \'dflash.block_size\' in GGUF metadata") failed'),
        "dspark/confidence_head": (lambda w: doctor(broken(w, "ds", "ds-conf", set_keys=[
            (f"{A}.has_confidence_head", VT.BOOL, False, None)])), "confidence_head", "llama.cpp",
            "DSpark draft has no confidence head: please set --spec-draft-p-min 0"),
        "dspark/markov_w2": (lambda w: doctor(broken(w, "ds", "ds-now2", drop_tensors=["markov_w2.weight"])),
                             "dspark", "llama.cpp", "check_tensor_dims: tensor 'markov_w2.weight' not found"),
        "dspark/heads-without-w1": (lambda w: doctor(broken(w, "ds", "ds-now1", drop_tensors=["markov_w1.weight"])),
                                    "dspark", "llama.cpp", "done_getting_tensors: wrong number of tensors; expected "
                                                           "28, got 25"),
        "dspark/d2t-type": (lambda w: doctor(broken(w, "dsred", "ds-d2t32", retype={"d2t": (26, bytes(4 * 64))})),
                            "d2t", "llama.cpp", "GGML_ASSERT(model.d2t->type == GGML_TYPE_I64) failed"),
        "dspark/d2t-head": (lambda w: doctor(broken(w, "dsred", "ds-nohead", drop_tensors=["output.weight"])), "d2t",
                            "llama.cpp", "GGML_ASSERT(model.d2t->ne[0] == n_draft_vocab) failed"),
        "dspark/n_max": (lambda w: doctor(w["ds"], n_max=9), "n_max", "llama.cpp",
                         "common_speculative_impl_draft_dflash: requested draft size (n_max=9, n_min=0) exceeds the "
                         "trained block size 7 -- clamping to 7"),
        "dspark/target-kimi-k3": (lambda w: pair_check(make_target_gguf(w["dir"] / "k3.gguf", arch="kimi-k3"), w["ds"]),
                                  "target_arch[llama.cpp]", "llama.cpp",
                                  'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed'),
        "dspark/lucebox-markov": (lambda w: doctor(broken(w, "dslb", "dslb-now2", drop_tensors=[
            "dflash.dspark.markov.w2"])), "dspark", "lucebox", "draft GGUF: incomplete DSpark Markov tensors"),
        "dspark/lucebox-confidence": (lambda w: doctor(broken(w, "dslb", "dslb-nob", drop_tensors=[
            "dflash.dspark.confidence.bias"])), "dspark", "lucebox",
            "draft GGUF: incomplete DSpark confidence tensors"),
        "dspark/lucebox-shape": (lambda w: doctor(broken(w, "dslb", "dslb-rank", set_keys=[
            (f"{LB}.dflash.dspark.markov_rank", VT.UINT32, 16, None)])), "dspark", "lucebox",
            "draft GGUF: Domino tensor dspark.markov.w1 shape mismatch: got [32,128], expected [16,128]"),
        "dspark/lucebox-vocab": (lambda w: pair_check(make_target_gguf(w["dir"] / "q35v.gguf", arch="qwen35",
                                                                       vocab=2 * VOCAB), w["dslb"]),
                                 "dspark_vocab", "lucebox",
                                 "dspark_markov_correct_greedy_chain: vocab mismatch "
                                 f"target={2 * VOCAB} dspark={VOCAB}"),
    }


def _keys(path):
    with GGUFFile(path) as f:
        return [kv.key for kv in f.kvs]


@pytest.mark.parametrize("case", list(_cases()))
def test_finding_quotes_the_runtime(work, sources, case):
    """The finding fails (or warns) for that runtime, and what it quotes is in that runtime's source."""
    make, check, runtime, words = _cases()[case]
    report = make(work)
    f = finding(report, check, runtime)
    assert f.severity in ("error", "warning")
    if words is not None:
        assert f.says(runtime) == words
    assert f.fix
    assert_quoted(f, runtime, sources)


def test_llama_cpp_tap_archs_are_those_its_source_builds_with_layer_inputs(sources):
    """The profile's list of target archs llama.cpp's DFlash can tap equals what its vendored source says: the
    arch names whose model class builds a graph that sets t_layer_inp."""
    if isinstance(sources["llama.cpp"], Exception):
        pytest.skip(f"oracle missing: {sources['llama.cpp']}")
    assert PROFILES["llama.cpp"].tap_archs == runtime_sources.llama_cpp_tap_archs(sources["llama.cpp"])


def test_silent_findings_say_what_the_user_sees(work):
    """Faults no runtime reports: the finding names the symptom (there are no words to quote)."""
    off = broken(work, "v1", "offbyone", set_keys=[("dflash.target_layers", VT.ARRAY, [1, 5], VT.INT32)])
    f = finding(doctor(off, hf=work["c1"]), "target_layers", "llama.cpp")
    assert "off by one" in f.message and "acceptance silently low" in f.effects[0].symptom
    other = make_checkpoint(work["dir"] / "c1-other", 1, seed=1)
    f = finding(doctor(work["v1"], hf=other), "tensor_data", "llama.cpp")
    assert f.severity == "error" and "differ" in f.message


def test_good_files_pass(work):
    for name, extra in (("v1", {}), ("v2", {}), ("lb", {"runtimes": ["lucebox", "ggtools"]})):
        hf = work["c2" if name == "v2" else "c1"]
        report = doctor(work[name], hf=hf, **extra)
        assert report.exit_code == 0, [(f.check, f.message) for f in failed(report.findings)]
        assert {"loader", "rope_theta", "mask_token_id", "target_layers", "block_size", "hparams",
                "tensor_data"} <= {f.check for f in report.findings if f.severity == "ok"}


# ---- not checkable -------------------------------------------------------------------------------------------

def test_a_rule_without_its_inputs_fails_as_not_checkable(work):
    """pair-check with a target lacking the keys a rule needs fails instead of printing 'pair OK'."""
    bare = work["dir"] / "bare-target.gguf"
    rewrite_gguf(work["target"], bare, drop_keys=["qwen3.block_count", "qwen3.embedding_length",
                                                  "tokenizer.ggml.tokens"])
    report = pair_check(bare, work["v1"])
    assert report.exit_code == 1
    unchecked = {f.check for f in report.findings if f.severity == "unchecked"}
    assert {"target_layers", "hidden", "fc", "mask_token_id", "vocab"} <= unchecked
    r = CliRunner().invoke(main, ["pair-check", str(bare), str(work["v1"])])
    assert r.exit_code == 1 and "pair OK" not in r.output and "not checkable" in r.output


def test_a_checkpoint_without_a_value_leaves_that_rule_unchecked(work):
    cfg = json.loads((work["c1"] / "config.json").read_text())
    del cfg["rope_parameters"]
    ckpt = make_checkpoint(work["dir"] / "c1-norope", 1, config=cfg)
    report = doctor(work["v1"], hf=ckpt)
    assert [f.severity for f in report.findings if f.check == "rope_theta"] == ["unchecked"]
    assert report.exit_code == 1


# ---- repairs -------------------------------------------------------------------------------------------------

def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def tensor_bytes(path) -> dict:
    with GGUFFile(path) as f:
        return {t.name: (t.type_id, tuple(t.ne), bytes(f.tensor_data(t))) for t in f.tensors}


def test_fix_with_hf_writes_the_checkpoint_values_and_copies_tensors(work):
    bad = broken(work, "v1", "many", set_keys=[("dflash.target_layers", VT.ARRAY, [1, 5], VT.INT32),
                                               ("dflash.rope.freq_base", VT.FLOAT32, 1e6, None),
                                               ("dflash.block_size", VT.UINT32, 16, None)])
    before = sha(bad)
    out = work["dir"] / "many-fixed.gguf"
    result = doctor_fix(bad, out, hf=work["c1"], force=True)
    assert sha(bad) == before                                       # the input is never modified
    assert result.fixed == {"target_ids": [1, 5], "rope.freq_base": 10000.0, "block_size": 8}
    assert result.exit_code == 0 and doctor(out, hf=work["c1"]).exit_code == 0 and validate([out]).exit_code == 0
    with GGUFFile(out) as f:
        assert list(f.get("dflash.target_layers")) == [2, 6] and f.get("dflash.rope.freq_base") == 10000.0
    assert tensor_bytes(out) == tensor_bytes(bad)


def test_fix_refuses_to_guess_without_the_checkpoint(work):
    """Without --hf a wrong RoPE base and off-by-one ids are reported, not rewritten."""
    bad = broken(work, "lb", "lb-guess", set_keys=[(f"{LB}.rope.freq_base", VT.FLOAT32, 1e6, None)])
    report = doctor(bad)
    assert [f.severity for f in report.findings if f.check == "rope_theta"] == ["warning"]
    result = doctor_fix(bad, work["dir"] / "lb-guess-out.gguf", force=True)
    assert result.fixed == {}
    with GGUFFile(work["dir"] / "lb-guess-out.gguf") as f:
        assert f.get(f"{LB}.rope.freq_base") == 1e6
    theta = [("qwen35.rope.freq_base", VT.FLOAT32, 1e7, None)]
    report = doctor(bad, target=make_target_gguf(work["dir"] / "q35-1e7.gguf", arch="qwen35", extra=theta))
    rope = [f for f in report.findings if f.check == "rope_theta"]
    assert [f.severity for f in rope] == ["warning"] and "differs from the target's rope.freq_base 1e+07" in \
        rope[0].message
    theta = [("qwen35.rope.freq_base", VT.FLOAT32, 1e6, None)]      # the target vouches for 1e6
    report = doctor(bad, target=make_target_gguf(work["dir"] / "q35-1e6.gguf", arch="qwen35", extra=theta))
    assert not [f for f in report.findings if f.check == "rope_theta"]
    off = broken(work, "v1", "off-nohf", set_keys=[("dflash.target_layers", VT.ARRAY, [1, 5], VT.INT32)])
    assert doctor_fix(off, work["dir"] / "off-nohf-out.gguf", force=True).fixed == {}


def _d2t_repeated(work, name, **edits) -> Path:
    """The reduced-vocabulary DSpark drafter with its last d2t id repeating its first (llama.cpp loses a row)."""
    with GGUFFile(work["dsred"]) as f:
        ids = f.tensor_data(f.tensor["d2t"]).view("<i8").copy()
    ids[-1] = ids[0]
    return broken(work, "dsred", name, retype={"d2t": (27, ids.astype("<i8").tobytes())}, **edits)


@pytest.mark.parametrize("case", ["dspark-block-size-0", "no-mask", "d2t-repeated", "anchor-u32"])
def test_fix_writes_nothing_the_evidence_does_not_fix(work, tmp_path, monkeypatch, case):
    """A fault no evidence given fixes (a DSpark block size of 0 or a missing mask id without --hf, d2t ids repeated
    with --hf, a u32 block layout flag without --hf): --fix refuses (exit 1) naming it, and writes nothing."""
    hf = {"d2t-repeated": work["cdsred"]}.get(case)
    bad = {"dspark-block-size-0": lambda: broken(work, "ds", "fix-bs0", set_keys=[("dflash.block_size", VT.UINT32, 0,
                                                                                  None)]),
           "no-mask": lambda: broken(work, "v1", "fix-nomask", drop_keys=["tokenizer.ggml.mask_token_id"]),
           "d2t-repeated": lambda: _d2t_repeated(work, "fix-d2t"),
           "anchor-u32": lambda: broken(work, "ds", "fix-u32", set_keys=[("dflash.sample_from_anchor", VT.UINT32, 1,
                                                                          None)])}[case]()
    before = doctor(bad, hf=hf)
    assert before.exit_code == 1
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    out = tmp_path / "fixed.gguf"
    with pytest.raises(FixRefused) as refused:
        doctor_fix(bad, out, hf=hf)
    assert refused.value.exit_code == 1 and "nothing written" in str(refused.value)
    assert all(f"{f.check}: {f.message}" in str(refused.value) for f in before.errors)
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)
    r = CliRunner().invoke(main, ["doctor", str(bad), "--fix", "-o", str(out)] + (["--hf", str(hf)] if hf else []))
    assert r.exit_code == 1 and r.output.startswith("error: ") and len(r.output.splitlines()) == 1 and not out.exists()


def test_fix_that_leaves_a_fault_writes_nothing(work, tmp_path, monkeypatch):
    """The mask id kept under the older key is fixed, the repeated d2t id is not: the fixed file would still fail, so
    nothing is written (no output, no temporary file) and the refusal names what is left."""
    with GGUFFile(work["dsred"]) as f:
        mask = f.get("tokenizer.ggml.mask_token_id")
    bad = _d2t_repeated(work, "fix-left", drop_keys=["tokenizer.ggml.mask_token_id"],
                        set_keys=[("dflash.mask_token_id", VT.UINT32, mask, None)])
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)
    out = tmp_path / "fixed.gguf"
    with pytest.raises(FixRefused) as refused:
        doctor_fix(bad, out, hf=work["cdsred"])
    assert "nothing written: fixed mask, but" in str(refused.value) and "maps two draft rows" in str(refused.value)
    assert os.listdir(tmp_path) == []


def test_fix_writes_the_dspark_flags_the_evidence_gives_as_booleans(work):
    """dflash.sample_from_anchor stored as u32 (llama.cpp compares its text with "true": "1" is false) is rewritten as
    the checkpoint's BOOL with --hf; a missing has_confidence_head (read as true) without conf_proj, as false from
    the tensors. Each fixed file passes doctor and validate."""
    for value in (0, 1):
        bad = broken(work, "ds", f"anchor-u32-{value}", set_keys=[("dflash.sample_from_anchor", VT.UINT32, value,
                                                                   None)])
        out = work["dir"] / f"anchor-u32-{value}-fixed.gguf"
        result = doctor_fix(bad, out, hf=work["cds"], force=True)
        assert result.fixed == {"sample_from_anchor": True} and result.exit_code == 0
        with GGUFFile(out) as f:
            assert f.kv["dflash.sample_from_anchor"].vtype == VT.BOOL and f.get("dflash.sample_from_anchor") is True
        assert validate([out]).exit_code == 0
    bad = broken(work, "ds", "no-conf-flag", drop_keys=["dflash.has_confidence_head"],
                 drop_tensors=["conf_proj.weight", "conf_proj.bias"])
    conf = [f for f in doctor(bad).errors if f.check == "confidence_head"]
    assert conf and "which llama.cpp reads as true" in conf[0].message
    assert validate([bad]).exit_code == 1
    out = work["dir"] / "no-conf-flag-fixed.gguf"
    assert doctor_fix(bad, out, force=True).fixed == {"has_confidence_head": False}
    with GGUFFile(out) as f:
        assert f.get("dflash.has_confidence_head") is False
    assert validate([out]).exit_code == 0


def test_fix_takes_the_tokenizer_from_the_target(work):
    bad = broken(work, "v1", "notok-fix", drop_keys=[k for k in _keys(work["v1"]) if k.startswith("tokenizer.")
                                                     and k != "tokenizer.ggml.mask_token_id"])
    assert doctor(bad).exit_code == 1
    out = work["dir"] / "notok-fixed.gguf"
    result = doctor_fix(bad, out, target=work["target"], force=True)
    assert "tokenizer" in result.fixed and result.exit_code == 0
    assert pair_check(work["target"], out).exit_code == 0


def test_fix_dry_run_writes_nothing(work):
    out = work["dir"] / "dry.gguf"
    result = doctor_fix(work["lb"], out, to="llama.cpp", target=work["target"], dry_run=True)
    assert not out.exists() and result.after is None
    assert {a.name for a in result.plan.shards[0].tensors} >= {"fc.weight", "enc.output_norm.weight"}


# ---- layout moves --------------------------------------------------------------------------------------------

def test_move_round_trip_keeps_every_tensor(work):
    """lucebox -> llama.cpp -> lucebox gives back the lucebox file's tensors and values."""
    there, back = work["dir"] / "rt-llama.gguf", work["dir"] / "rt-lb.gguf"
    move_layout(work["lb"], there, "llama.cpp", target=work["target"], force=True)
    move_layout(there, back, "lucebox", force=True)
    assert tensor_bytes(back) == tensor_bytes(work["lb"])
    with GGUFFile(back) as a, GGUFFile(work["lb"]) as b:
        assert {kv.key: _plain(kv.value) for kv in a.kvs} == {kv.key: _plain(kv.value) for kv in b.kvs}
    assert pair_check(work["target"], there).exit_code == 0


def _plain(v):
    return v.tolist() if hasattr(v, "tolist") else v


def test_move_to_lucebox_converts_what_lucebox_does_not_take(work):
    """BF16 weights become F16 (lucebox's runtime takes F16, not BF16); F32 norms are byte-copied."""
    plan, _ = move_layout(work["v1"], work["dir"] / "v1-lb.gguf", "lucebox", force=True)
    actions = {a.name: a for a in plan.shards[0].tensors}
    assert actions["dflash.fc.weight"].action == "convert" and "does not take BF16" in actions["dflash.fc.weight"].reason
    assert actions["dflash.hidden_norm.weight"].action == "copy"
    assert actions["dflash.fc.weight"].src_name == "fc.weight"


def test_move_refuses_what_the_destination_cannot_hold(work):
    out = work["dir"] / "v2-lb.gguf"
    r = CliRunner().invoke(main, ["convert", "gguf-layout", str(work["v2"]), "--to", "lucebox", "-o", str(out)])
    assert r.exit_code == 2 and r.output.startswith("error: ") and len(r.output.strip().splitlines()) == 1
    assert "lucebox layout has no place for" in r.output and not out.exists()
    r = CliRunner().invoke(main, ["convert", "gguf-layout", str(work["lb"]), "--to", "llama.cpp", "-o", str(out)])
    assert r.exit_code == 2 and "pass --target" in r.output and not out.exists()


def test_profiles_name_every_tensor_both_ways():
    for p in PROFILES.values():
        for hf in ("fc.weight", "hidden_norm.weight", "norm.weight", "layers.3.self_attn.q_proj.weight",
                   "layers.0.mlp.down_proj.weight", "layers.1.post_attention_layernorm.weight"):
            assert p.hf_name(p.gguf_name(hf)) == hf
    assert PROFILES["lucebox"].hf_name("dflash_fc.weight") == "fc.weight"
    assert PROFILES["lucebox"].hf_name("blk.2.post_attention_norm.weight") == "layers.2.post_attention_layernorm.weight"


# ---- CLI -----------------------------------------------------------------------------------------------------

def test_cli_report_json_and_exit_codes(work):
    r = CliRunner().invoke(main, ["doctor", str(work["v1"]), "--target", str(work["target"]), "--hf", str(work["c1"])])
    assert r.exit_code == 0 and r.output.rstrip().endswith("OK"), r.output
    bad = broken(work, "v1", "cli-nomask", drop_keys=["tokenizer.ggml.mask_token_id"])
    r = CliRunner().invoke(main, ["doctor", str(bad)])
    assert r.exit_code == 1 and 'breaks llama.cpp: "init: invalid token[1] = -1"' in r.output
    r = CliRunner().invoke(main, ["doctor", str(bad), "--json"])
    data = json.loads(r.stdout)
    assert r.exit_code == 1 and data["ok"] is False
    mask = [f for f in data["findings"] if f["check"] == "mask_token_id"][0]
    assert mask["breaks"][0] == {"runtime": "llama.cpp", "says": "init: invalid token[1] = -1",
                                 "symptom": mask["breaks"][0]["symptom"]} and mask["fix"]


@pytest.mark.parametrize("args,code", [
    (["--fix"], 2), (["--to", "lucebox"], 2), (["--fix", "-o", "{out}", "--runtime", "tensorrt"], 2)])
def test_cli_usage_errors(work, args, code):
    out = work["dir"] / "usage-out.gguf"
    r = CliRunner().invoke(main, ["doctor", str(work["v1"])] + [a.format(out=out) for a in args])
    assert r.exit_code == code and not out.exists()


def test_cli_hostile_input(work):
    junk = work["dir"] / "junk.gguf"
    junk.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 40)
    r = CliRunner().invoke(main, ["doctor", str(junk)])
    assert r.exit_code == 2 and r.output.startswith("error: ") and "Traceback" not in r.output
    r = CliRunner().invoke(main, ["doctor", str(work["v1"]), "--hf", str(work["dir"])])
    assert r.exit_code == 2 and r.output.startswith("error: ") and "config.json" in r.output
    out = work["dir"] / "exists.gguf"
    out.write_bytes(b"keep")
    r = CliRunner().invoke(main, ["doctor", str(work["v1"]), "--fix", "-o", str(out)])
    assert r.exit_code == 2 and out.read_bytes() == b"keep"


def test_cli_fix_and_gguf_layout(work):
    bad = broken(work, "v1", "cli-legacy", drop_keys=["tokenizer.ggml.mask_token_id"],
                 set_keys=[("dflash.mask_token_id", VT.UINT32, 100, None)])
    out = work["dir"] / "cli-legacy-fixed.gguf"
    r = CliRunner().invoke(main, ["doctor", str(bad), "--fix", "-o", str(out), "--force"])
    assert r.exit_code == 0 and "fixed: mask = 100" in r.output, r.output
    out2 = work["dir"] / "cli-moved.gguf"
    r = CliRunner().invoke(main, ["convert", "gguf-layout", str(work["v1"]), "--to", "lucebox", "-o", str(out2),
                                  "--force"])
    assert r.exit_code == 0 and "byte-copied" in r.output and "converted" in r.output
