"""The model-file rules (ggtools.hparam_rules): one place that the runtime's loaders, validate and doctor apply.

- the runtime reads no hyperparameter key the rules do not check (its reads are recorded, on every arch and
  drafter layout it runs);
- each broken rule is worded the same by the runtime (its ModelError), validate (a problem) and doctor (a finding,
  and the words it says ggtools' runtime prints);
- what the rules say llama.cpp prints refusing a file, libllama prints refusing that file (the oracle test, in a
  child process: its asserts abort), and the unbroken models run there.
"""

import numpy as np
import pytest
from gguf import GGUFValueType as VT

from ggtools.dflash.profiles import LUCEBOX
from ggtools.gguf import GGUFFile
from ggtools.gguf.check import check_file
from ggtools.hparam_rules import drafter_violations, dspark_violations, model_violations
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.doctor import doctor
from ggtools.jobs.validate import validate
from ggtools.runtime.drafter.hparams import read_draft_hparams
from ggtools.runtime.errors import ModelError
from ggtools.runtime.model.archs import arch_of
from ggtools.runtime.model.hparams import read_hparams
from tests.hostile_corpus import DEMO, HPARAM_VARIANTS, NAN, _kimi_k3, _swapped
from tests.test_convert_support import make_checkpoint, make_dspark_checkpoint, make_target_gguf, rewrite_gguf
from tests.tiny_targets import DEMO_TARGET, write_gpt_oss, write_qwen35

U32, I32, F32, STR, BOOL, ARR = VT.UINT32, VT.INT32, VT.FLOAT32, VT.STRING, VT.BOOL, VT.ARRAY


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("rules")
    m = {"target": DEMO_TARGET, "q35": write_qwen35(d / "q35.gguf"), "oss": write_gpt_oss(d / "oss.gguf"),
         "drafter": str(d / "drafter.gguf"), "lucebox": str(d / "lucebox.gguf"), "v2": str(d / "v2.gguf")}
    convert_dflash(f"{DEMO}/drafter", m["drafter"], profile="llama.cpp", target=DEMO_TARGET)
    convert_dflash(f"{DEMO}/drafter", m["lucebox"], profile="lucebox")
    convert_dflash(make_checkpoint(d / "c2", 2), m["v2"], profile="llama.cpp",
                   target=make_target_gguf(d / "t2.gguf"))
    m["k3"] = _kimi_k3(d / "k3.gguf", {})       # kimi-k3's keys as its converter writes them, no layer tensors
    m["k3_layers"] = _kimi_k3(d / "k3l.gguf", {}, layers=True)     # and every tensor of those keys
    m["swa"] = str(rewrite_gguf(m["drafter"], d / "swa.gguf", set_keys=[
        ("dflash.attention.sliding_window", U32, 4, None),
        ("dflash.attention.sliding_window_pattern", ARR, [True, False], BOOL)]))
    target = make_target_gguf(d / "t.gguf")
    for name, ckpt in (("dspark", make_dspark_checkpoint(d / "cds")),
                       ("dsred", make_dspark_checkpoint(d / "cdsred", arch="DSparkSpeculator", layout="speculators",
                                                        reduced=True))):
        m[name] = str(d / f"{name}.gguf")
        convert_dflash(ckpt, m[name], profile="llama.cpp", target=target)
    m["dir"] = d
    return m


class RecordedKeys(dict):
    """A GGUFFile's `kv` that records every key looked up (get, [], in)."""

    def __init__(self, kv):
        super().__init__(kv)
        self.read = set()

    def get(self, key, default=None):
        self.read.add(key)
        return super().get(key, default)

    def __getitem__(self, key):
        self.read.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.read.add(key)
        return super().__contains__(key)


def keys_read(f, read) -> set[str]:
    f.kv = RecordedKeys(f.kv)
    read(f)
    return f.kv.read - {"general.architecture"}


TARGETS = ("target", "q35", "oss", "k3_layers")       # whole models ("k3", its keys alone, serves the key rules)
MODELS = (*TARGETS, "drafter", "lucebox", "v2", "swa", "dspark", "dsred")


@pytest.mark.parametrize("name", MODELS)
def test_the_runtime_reads_no_key_the_rules_do_not_check(models, name):
    with GGUFFile(models[name]) as f:
        if name in TARGETS:
            runtime = keys_read(f, lambda g: read_hparams(g, 100, arch_of(g)))
            rules = keys_read(f, model_violations)
        else:
            names = {t.name for t in f.tensors}
            runtime = keys_read(f, lambda g: read_draft_hparams(g, names))
            rules = keys_read(f, lambda g: model_violations(g) + dspark_violations(g))
    assert runtime, name
    assert runtime <= rules, sorted(runtime - rules)


@pytest.mark.parametrize("name", MODELS)
def test_good_models_break_no_rule(models, name):
    with GGUFFile(models[name]) as f:
        assert model_violations(f) == [] and dspark_violations(f) == []
    assert validate([models[name]]).exit_code == 0


# (base, keys set, the key the first broken rule names, a fragment of its rule): beyond hostile_corpus'
# HPARAM_VARIANTS (which test_hostile runs through the CLI)
MORE = [
    ("target", [("qwen3.attention.layer_norm_rms_epsilon", F32, 0.0, None)], "layer_norm_rms_epsilon", "above 0"),
    ("target", [("qwen3.rope.freq_base", F32, float("inf"), None)], "rope.freq_base", "finite"),
    ("target", [("qwen3.rope.freq_base", F32, -10.0, None)], "rope.freq_base", "above 0"),
    ("target", [("qwen3.rope.freq_base_swa", F32, NAN, None)], "rope.freq_base_swa", "finite"),
    ("target", [("qwen3.rope.scaling.type", STR, "wobble", None)], "rope.scaling.type", "one of none, linear"),
    ("target", [("qwen3.rope.scaling.factor", F32, -2.0, None)], "rope.scaling.factor", "negative"),
    ("target", [("qwen3.block_count", U32, 513, None)], "block_count", "1..512"),
    ("target", [("qwen3.block_count", VT.UINT64, 4, None)], "block_count", "llama.cpp requires UINT32"),
    ("target", [("qwen3.context_length", U32, 0, None)], "context_length", "no context"),
    ("target", [("qwen3.attention.head_count_kv", U32, 3, None)], "head_count_kv", "do not divide"),
    ("target", [("qwen3.attention.head_count", ARR, [4, 4], I32)], "attention.head_count", "2 entries for 4"),
    ("target", [("qwen3.attention.head_count", ARR, [4, -4, 4, 4], I32)], "attention.head_count", "negative"),
    ("target", [("qwen3.attention.key_length", U32, 0, None)], "key_length", "is 0"),
    ("target", [("qwen3.expert_used_count", U32, 2, None)], "expert_used_count", "above expert_count 0"),
    ("target", [("qwen3.rope.dimension_sections", ARR, [1, 2], I32)], "dimension_sections", "4 sections"),
    ("target", [("qwen3.rope.dimension_sections", ARR, [0, 0, 0, 4], I32)], "dimension_sections", "first three"),
    ("q35", [("qwen35.ssm.time_step_rank", U32, 3, None)], "ssm.time_step_rank", "not a multiple"),
    ("q35", [("qwen35.attention.recurrent_layers", ARR, [True, False], BOOL)], "recurrent_layers", "2 entries"),
    ("q35", [("qwen35.rope.dimension_count", U32, 0, None)], "rope.dimension_count", "is 0"),
    ("oss", [("gpt-oss.expert_used_count", U32, 5, None)], "expert_used_count", "above expert_count 4"),
    ("oss", [("gpt-oss.attention.sliding_window", U32, 0, None)], "sliding_window", "need a window"),
    ("oss", [("gpt-oss.attention.sliding_window_pattern", ARR, ["a"], STR)], "sliding_window_pattern", "array[STRING]"),
    ("oss", [("gpt-oss.rope.scaling.original_context_length", U32, 0, None)], "original_context_length", "YaRN"),
    ("drafter", [("dflash.block_size", U32, 1, None)], "block_size", "2 or more"),
    ("drafter", [("dflash.target_layers", ARR, [], I32)], "target_layers", "is empty"),
    ("drafter", [("dflash.target_layers", ARR, [0, 3], I32)], "target_layers", "at least 1"),
    ("drafter", [("dflash.target_layers", U32, 2, None)], "target_layers", "array of integers"),
    ("drafter", [("tokenizer.ggml.mask_token_id", U32, 4096, None)], "mask_token_id", "2048-token vocabulary"),
    ("drafter", [("dflash.final_logit_softcapping", F32, -1.0, None)], "softcapping", "negative"),
    ("drafter", [("dflash.attention.head_count", U32, 0, None)], "attention.head_count", "is 0"),
    ("drafter", [("dflash.embedding_length", F32, 128.0, None)], "embedding_length", "llama.cpp requires UINT32"),
    ("swa", [("dflash.attention.sliding_window_pattern", ARR, [True], BOOL)], "sliding_window_pattern",
     "1 entries for 2"),
    ("lucebox", [(f"{LUCEBOX.arch}.dflash.block_size", I32, -3, None)], "block_size", "negative"),
    ("k3", [("kimi-k3.expert_weights_norm", U32, 1, None)], "expert_weights_norm", "llama.cpp requires BOOL"),
    ("k3", [("kimi-k3.activation.situ_linear_beta", U32, 0, None)], "situ_linear_beta", "requires FLOAT32"),
    ("k3", [("kimi-k3.kda.gate_lower_bound", F32, NAN, None)], "gate_lower_bound", "finite"),
    ("k3", [("kimi-k3.attention.kv_lora_rank", U32, 0, None)], "kv_lora_rank", "is 0"),
    ("k3", [("kimi-k3.ssm.conv_kernel", U32, 0, None)], "conv_kernel", "is 0"),
    ("k3", [("kimi-k3.attention.head_count_kv", ARR, [0.0, 1.0], F32)], "head_count_kv", "array of integers"),
    ("k3", [("kimi-k3.leading_dense_block_count", U32, 1, None)], "feed_forward_length", "leading dense layers"),
    ("k3", [("kimi-k3.attention.key_length", VT.UINT64, 48, None)], "key_length", "requires UINT32"),
    ("lucebox", [(f"{LUCEBOX.arch}.embedding_length", F32, 128.0, None)], "embedding_length", "an integer type"),
]
CASES = {f"{name}": (base, keys, keys[0][0].rpartition(".")[2], "") for name, (base, keys) in
         HPARAM_VARIANTS.items()} | {f"more{i}": case for i, case in enumerate(MORE)}


@pytest.mark.parametrize("case", list(CASES))
def test_each_rule_is_worded_the_same_by_the_runtime_validate_and_doctor(models, case, tmp_path):
    base, keys, key, fragment = CASES[case]
    path = str(rewrite_gguf(models[base], tmp_path / "m.gguf", set_keys=keys))
    with GGUFFile(path) as f:
        violations = model_violations(f)
        assert violations and key in violations[0].key and fragment in violations[0].rule, violations
        drafter = f.architecture in ("dflash", LUCEBOX.arch)
        with pytest.raises(ModelError) as refused:
            read_draft_hparams(f, {t.name for t in f.tensors}) if drafter else read_hparams(f, 100, arch_of(f))
    more = f" ({len(violations) - 1} more: see ggtools validate)" if len(violations) > 1 else ""
    assert str(refused.value) == f"{path}: {violations[0]}{more}"
    problems = validate([path]).problems
    with GGUFFile(path) as f:
        container = {p.where for p in check_file(f)}
    for v in violations:
        said = f' (llama.cpp: "{v.says}")' if v.says else ""
        assert v.where in container or any((p.where, p.rule) == (v.where, v.rule + said) for p in problems), v
    assert validate([path]).exit_code == 1
    if drafter:
        report = doctor(path, runtimes=["ggtools"])
        assert report.exit_code == 1
        said = [f.says("ggtools") for f in report.findings if f.severity == "error"]
        assert str(refused.value).removesuffix(more) in said


def _d2t_ids(path) -> np.ndarray:
    with GGUFFile(path) as f:
        return f.tensor_data(f.tensor["d2t"]).view("<i8").copy()


def _with_d2t(ids):
    return lambda m: {"retype": {"d2t": (27, np.asarray(ids(m), "<i8").tobytes())}}


# (base, edits, the place the first broken rule names, its finding class, a fragment of its rule): DSpark's rules
DSPARK = {
    "no-block-size": ("dspark", lambda m: {"drop_keys": ["dflash.block_size"]}, "key 'dflash.block_size'",
                      "block_size", "Markov head asserts it"),
    "anchor-u8": ("dspark", lambda m: {"set_keys": [("dflash.sample_from_anchor", VT.UINT8, 1, None)]},
                  "key 'dflash.sample_from_anchor'", "sample_from_anchor", "is 1, expected a boolean"),
    "confidence-str": ("dspark", lambda m: {"set_keys": [("dflash.has_confidence_head", STR, "true", None)]},
                       "key 'dflash.has_confidence_head'", "confidence_head", "is 'true', expected a boolean"),
    "d2t-i32": ("dsred", lambda m: {"retype": {"d2t": (26, _d2t_ids(m["dsred"]).astype("<i4").tobytes())}},
                "tensor 'd2t'", "d2t", "is I32, expected I64"),
    "d2t-outside": ("dsred", _with_d2t(lambda m: np.r_[_d2t_ids(m["dsred"])[:-1], 128]), "tensor 'd2t'", "d2t",
                    "row 63 maps to 128, outside the target ids 0..127"),
    "d2t-repeated": ("dsred", _with_d2t(lambda m: np.r_[_d2t_ids(m["dsred"])[:-1], _d2t_ids(m["dsred"])[5]]),
                     "tensor 'd2t'", "d2t", "maps two draft rows to one target id (rows 5 and 63"),
    "d2t-no-head": ("dsred", lambda m: {"drop_tensors": ["output.weight"]}, "tensor 'd2t'", "d2t",
                    "needs its own output.weight with 64 rows: the target's output head gives 128 logits"),
}


@pytest.mark.parametrize("case", list(DSPARK))
def test_each_dspark_rule_is_worded_the_same_by_the_runtime_validate_and_doctor(models, case, tmp_path):
    """DSpark's rules (hparam_rules/dspark.py): the drafter loader refuses the file in their words, validate
    reports them as DSpark problems and doctor as llama.cpp findings of the class the rule names, quoting what
    llama.cpp says."""
    base, edits, where, check, fragment = DSPARK[case]
    path = str(rewrite_gguf(models[base], tmp_path / "m.gguf", **edits(models)))
    with GGUFFile(path) as f:
        assert drafter_violations(f) == []
        (v, *more) = dspark_violations(f)
        assert (v.where, v.check) == (where, check) and fragment in v.rule, v
        with pytest.raises(ModelError) as refused:
            read_draft_hparams(f, {t.name for t in f.tensors})
    assert str(refused.value).startswith(f"{path}: {v}")
    report = validate([path])
    assert report.exit_code == 1
    assert any(p.where == f"DSpark {check}" and p.rule.startswith(str(v)) for p in report.problems), report.problems
    found = [x for x in doctor(path).findings if x.check == check and x.message == str(v)]
    assert found and found[0].severity == "error" and found[0].says("llama.cpp") == v.says
    said = [x.says("ggtools") for x in doctor(path, runtimes=["ggtools"]).findings if x.severity == "error"]
    assert str(refused.value) in said


def test_a_mask_id_given_replaces_the_stored_one(models, tmp_path):
    """--mask-id is the repair for a broken stored mask id: the stored one is then not held against the file."""
    path = str(rewrite_gguf(models["drafter"], tmp_path / "m.gguf",
                            set_keys=[("tokenizer.ggml.mask_token_id", U32, 99999, None)]))
    with GGUFFile(path) as f:
        assert drafter_violations(f) and drafter_violations(f, mask_id=5) == []


def test_lucebox_mask_is_the_targets(models, tmp_path):
    """lucebox takes the mask id from the target: a stored one beyond the drafter's vocab_size breaks no rule."""
    path = str(rewrite_gguf(models["lucebox"], tmp_path / "m.gguf",
                            set_keys=[(f"{LUCEBOX.arch}.dflash.mask_token_id", U32, 248070, None)]))
    with GGUFFile(path) as f:
        assert drafter_violations(f) == []


# ---- tensor shapes (hparam_rules/tensor_shapes.py) ---------------------------------------------------------------

def llama_format_tensor_shape(ne) -> str:
    """llama.cpp's src/llama-impl.cpp: each dimension "%6" PRId64, joined by ", "."""
    return ", ".join(f"{n:6d}" for n in ne)


def swappable(path) -> str:
    """The last 2-D (or 3-D) tensor whose first two dimensions differ and stay whole blocks when swapped."""
    with GGUFFile(path) as f:
        return next(t.name for t in reversed(f.tensors) if len(t.ne) >= 2 and t.ne[0] != t.ne[1]
                    and t.ne[1] % t.block[0] == 0)


SHAPE_MODELS = ("target", "q35", "oss", "k3_layers", "drafter", "lucebox", "v2", "dspark", "dsred")


@pytest.mark.parametrize("name", SHAPE_MODELS)
def test_a_tensor_shape_the_keys_do_not_give_is_refused_in_llama_cpp_words(models, name, tmp_path):
    """One tensor stored with its first two dimensions swapped: the rules name it with the shape of the good file (the
    one llama.cpp's loader takes: the oracle test below) and llama.cpp's words; the runtime refuses it in the rule's
    words, validate reports it (quoting llama.cpp), doctor fails it."""
    tensor = swappable(models[name])
    bad = str(_swapped(models[name], tmp_path / "bad.gguf", tensor))
    with GGUFFile(models[name]) as f:
        want = list(f.tensor[tensor].ne)
    got = [want[1], want[0], *want[2:]]
    with GGUFFile(bad) as f:
        (v, *_) = model_violations(f)
        drafter = f.architecture in ("dflash", LUCEBOX.arch)
        with pytest.raises(ModelError) as refused:
            read_draft_hparams(f, {t.name for t in f.tensors}) if drafter else read_hparams(f, 100, arch_of(f))
    assert v.where == f"tensor '{tensor}'" and v.rule.startswith(f"has wrong shape; expected {want}, got {got}"), v
    padded = got + [1] * (4 - len(got))
    llama = f"check_tensor_dims: tensor '{tensor}' has wrong shape; expected {llama_format_tensor_shape(want)}, " \
            f"got {llama_format_tensor_shape(padded)}"
    assert v.says == (None if name == "lucebox" else llama)
    assert str(refused.value).startswith(f"{bad}: {v}")
    report = validate([bad])
    assert report.exit_code == 1 and any(p.where == v.where and p.rule.startswith(v.rule) for p in report.problems)
    report = doctor(bad, runtimes=["ggtools"]) if drafter else doctor(models["drafter"], target=bad)
    assert report.exit_code == 1 and any(f.message == str(v) for f in report.errors), report.findings


def test_a_split_models_tensors_are_checked_against_its_first_shards_keys(models, tmp_path):
    """validate, doctor --target and the rules see every shard's tensors (here the wrong one lies in shard 2)."""
    from ggtools.gguf import GGUFWriter, shard_path
    bad = str(_swapped(models["target"], tmp_path / "bad.gguf", "blk.1.attn_q.weight"))
    with GGUFFile(bad) as f:
        (v, *_) = model_violations(f)
        halves = (f.tensors[:len(f.tensors) // 2], f.tensors[len(f.tensors) // 2:])
        assert v.tensor in {t.name for t in halves[1]}
        for i, tensors in enumerate(halves):
            with GGUFWriter(shard_path(tmp_path / "s", i, 2)) as w:
                for kv in f.kvs if i == 0 else ():
                    w.add_kv_record(kv)
                for key, vtype, value in (("split.no", VT.UINT16, i), ("split.count", VT.UINT16, 2),
                                          ("split.tensors.count", VT.INT32, len(f.tensors))):
                    w.add_kv(key, vtype, value)
                for t in tensors:
                    w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
                for t in tensors:
                    w.write(f.tensor_data(t))
    first = shard_path(tmp_path / "s", 0, 2)
    report = validate([first])
    assert report.exit_code == 1 and [p.where for p in report.errors] == [v.where], report.problems
    assert any(f.message == str(v) for f in doctor(models["drafter"], target=first).errors)


# ---- the oracle: libllama refuses what the rules say it refuses, in those words --------------------------------

LOGGED = ("load: bad special token",)      # llama.cpp logs these and loads on (test_doctor finds them in its source)


@pytest.mark.oracle
def test_libllama_refuses_in_the_words_the_rules_quote(models, tmp_path):
    """Every case whose rule quotes llama.cpp: libllama (loading it, and for a target decoding 2 tokens) fails with
    those words. A graph's assert comes only after the tensors load: where the edited key also sizes tensors,
    llama.cpp's loader refuses their shapes first, and a model built consistent with the key proves the assert."""
    pytest.importorskip("llama_cpp")
    from scripts.fixtures.llama_oracle import run_ops_subprocess
    paths = {name: str(rewrite_gguf(models[base], tmp_path / f"{name}.gguf", set_keys=keys))
             for name, (base, keys, _, _) in CASES.items() if base in ("target", "q35", "oss", "drafter")}
    paths["q35-rank3"] = write_qwen35(tmp_path / "q35-rank3.gguf", rank=3)      # 3 value heads, 2 key heads
    cases, ops = [], []
    for name, path in paths.items():
        with GGUFFile(path) as f:
            says = model_violations(f)[0].says
        loads_only = f.architecture == "dflash"    # a drafter alone: its loader's words (its graph runs by a target)
        if says is None or (loads_only and says.startswith("GGML_ASSERT")) or says.startswith(LOGGED):
            continue
        cases.append((name, says))
        ops.append({"op": "load", "path": path} if loads_only else
                   {"op": "greedy", "path": path, "prompt_ids": [1, 2, 3], "n": 2})
    good = [{"op": "greedy", "path": models[m], "prompt_ids": [1, 2, 3], "n": 2} for m in ("target", "q35", "oss")]
    results = run_ops_subprocess(good + ops)
    assert all(r["ok"] for r in results[:len(good)]), results[:len(good)]
    assert len(cases) >= 12
    shapes_first = []
    for (name, says), r in zip(cases, results[len(good):]):
        assert not r["ok"], (name, says)
        if "check_tensor_dims" in r["error"] and says.startswith("GGML_ASSERT"):
            shapes_first.append(name)
            continue
        assert says in r["error"], (name, says, r)
    assert "q35-rank3" not in shapes_first and len(shapes_first) <= 2, shapes_first


# kimi-k3 keys that also size tensors (issue 39): key -> another value, which llama.cpp's loader holds against them
K3_SIZE_KEYS = {"kimi-k3.expert_latent_length": 64, "kimi-k3.kda.head_dim": 32, "kimi-k3.expert_shared_count": 2,
                "kimi-k3.attention.q_lora_rank": 64}


@pytest.mark.oracle
def test_llama_cpp_converter_models_pass_and_libllama_refuses_their_broken_shapes_in_the_rules_words(
        tmp_path, tiny_target, qwen35_target, qwen35moe_target, qwen3moe_target, gpt_oss_target, kimi_k3_target,
        ref_drafter_gguf, dspark_drafters):
    """Every tiny model llama.cpp's own converter built (each arch, the DFlash v1 / DFlash2 / DSpark drafters, a split
    set) breaks no rule and has no tensor the shape tables do not name; the same model with one tensor's dimensions
    swapped, or a kimi-k3 key that sizes tensors changed, libllama refuses in the words of one of the rules."""
    pytest.importorskip("llama_cpp")
    from ggtools.gguf import ShardSet
    from ggtools.hparam_rules.tensor_shapes import expected_shapes, locator
    from scripts.fixtures.llama_oracle import run_ops_subprocess
    good = [tiny_target.gguf["f16"], qwen35_target.gguf["f16"], qwen35moe_target.gguf["f16"], qwen35moe_target.split[0],
            qwen3moe_target.gguf["f16"], gpt_oss_target.gguf["f16"], gpt_oss_target.gguf["MXFP4_MOE"],
            kimi_k3_target.gguf["f16"], kimi_k3_target.gguf["plain-f32"], kimi_k3_target.gguf["q8_0"],
            ref_drafter_gguf("v1"), ref_drafter_gguf("v2"), ref_drafter_gguf("v2", "q8_0"),
            dspark_drafters("anchor-conf", "f16"), dspark_drafters("bonus-reduced", "f16")]
    for path in good:
        with ShardSet(path) as s:
            locate = locator(s.files)
            assert model_violations(s.first, locate) == [], path
            table = expected_shapes(s.first, locate)
            assert [t.name for f in s.files for t in f.tensors if t.name not in table] == [], path
    broken = [str(_swapped(p, tmp_path / f"{i}.gguf", swappable(p))) for i, p in enumerate(good) if "-of-" not in
              str(p)]
    broken += [str(rewrite_gguf(kimi_k3_target.gguf["f16"], tmp_path / f"k3-{i}.gguf", set_keys=[(key, U32, v, None)]))
               for i, (key, v) in enumerate(K3_SIZE_KEYS.items())]
    says = []
    for path in broken:
        with GGUFFile(path) as f:
            violations = model_violations(f)
        assert violations and all(v.tensor for v in violations), path
        says.append({v.says for v in violations})
    for path, words, r in zip(broken, says, run_ops_subprocess([{"op": "load", "path": p} for p in broken])):
        assert not r["ok"] and any(w in r["error"] for w in words), (path, r)


def _one_block_of_each_kind(names) -> list[str]:
    """The tensor names outside the blocks, and those of the first block of each distinct set of tensors (a
    recurrent layer, an attention layer, a dense or an MoE FFN, an MTP block)."""
    blocks, kinds, out = {}, set(), []
    for name in names:
        if name.startswith("blk."):
            blocks.setdefault(name.split(".")[1], []).append(name.split(".", 2)[2])
        else:
            out.append(name)
    for layer, own in blocks.items():
        if frozenset(own) not in kinds:
            kinds.add(frozenset(own))
            out += [f"blk.{layer}.{n}" for n in own]
    return out


@pytest.mark.oracle
@pytest.mark.slow
def test_a_missing_tensor_fails_validate_where_libllama_cannot_decode(
        tmp_path, tiny_target, qwen35_target, qwen35moe_target, qwen3moe_target, gpt_oss_target, kimi_k3_target,
        mtp_targets):
    """Each tiny target llama.cpp's converter built, with one tensor removed (every tensor outside the blocks and
    every tensor of one block of each kind): the rules report it missing, in check_tensor_dims' words, exactly when
    libllama cannot load the model and decode 2 tokens with it (a tied output head, a rope factor or a bias it does
    without; a tensor it requires, or one its graph reads)."""
    pytest.importorskip("llama_cpp")
    from scripts.fixtures.llama_oracle import run_ops_subprocess
    models = [tiny_target.gguf["f16"], qwen35_target.gguf["f16"], qwen35moe_target.gguf["f16"],
              qwen3moe_target.gguf["f16"], gpt_oss_target.gguf["f16"], kimi_k3_target.gguf["f16"],
              mtp_targets["qwen35"]("default", "f16")]
    disagree, checked, optional = [], 0, 0
    for k, path in enumerate(models):
        with GGUFFile(path) as f:
            names = _one_block_of_each_kind([t.name for t in f.tensors])
        cases = [(name, rewrite_gguf(path, tmp_path / f"{k}-{i}.gguf", drop_tensors=[name]))
                 for i, name in enumerate(names)]
        ops = [{"op": "greedy", "path": str(p), "prompt_ids": [1, 2, 3], "n": 2} for _, p in cases]
        # in chunks: a graph that crashes on a missing tensor kills its child, and its chunk reruns one op a child
        results = [r for i in range(0, len(ops), 8) for r in run_ops_subprocess(ops[i:i + 8])]
        for (name, p), r in zip(cases, results):
            with GGUFFile(p) as f:
                says = [v.says for v in model_violations(f) if v.says and v.says.endswith("' not found")]
            refused = bool(says)      # the tensor removed, or the other form it stood for (attn_q for attn_q_a_norm)
            if refused == r["ok"] or refused and "not found" in r["error"] and not any(w in r["error"] for w in says):
                disagree.append((path.name, name, says, r.get("error")))
            checked += 1
            optional += r["ok"]
            p.unlink()
    assert disagree == [], "\n".join(map(str, disagree))
    assert checked > 200 and optional >= 12, (checked, optional)     # both verdicts are exercised (238, 18)
