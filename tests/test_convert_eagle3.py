"""convert drafter on EAGLE3 checkpoints: byte-identical to llama.cpp's converter (every HF layout it takes x f32 /
f16 / bf16 / q8_0, scripts/fixtures/eagle3_drafters.py), the family named in one line, and every refusal: the
converter's own (in its words) and what it misses (num_hidden_layers, 3 target layers, target_hidden_size against
the target, d2t against the target's vocabulary, ids within the target, tensors llama.cpp's loader would refuse)."""

import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.dflash import eagle3 as E
from ggtools.errors import GGToolsError
from ggtools.gguf import GGUFFile
from ggtools.jobs.convert_drafter import convert_drafter, drafter_family
from scripts.fixtures import dspark_checkpoints as DS
from scripts.fixtures import eagle3_drafters as E3
from tests.hostile_corpus import DEMO

DEMO_TARGET = f"{DEMO}/target.gguf"
LAYOUTS = tuple(E3.LAYOUTS)
OUTTYPES = ("f32", "f16", "bf16", "q8_0")


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def demo_drafter(tmp_path, edit=None, name="e3") -> str:
    """The demo target's EAGLE3 checkpoint (eagle3_drafters.demo_checkpoint), edit(config, tensors) applied."""
    cfg, tensors = E3.demo_checkpoint()
    if edit:
        edit(cfg, tensors)
    return str(DS.write_dspark(tmp_path / name, cfg, tensors))


def convert(hf_dir, out, target=DEMO_TARGET, **kw):
    return convert_drafter(hf_dir, str(out), target=target, **kw)


# ---- llama.cpp's converter, byte for byte ----------------------------------------------------------------------

@pytest.mark.oracle
@pytest.mark.parametrize("outtype", OUTTYPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_byte_identical_to_llama_cpp(eagle3_drafters, tiny_target, tmp_path, layout, outtype):
    """Every key, its order and type, every tensor's name, type, shape, order and bytes: the file llama.cpp's
    converter writes with --target-model-dir, from --target-gguf alone (the target's GGUF of the same model)."""
    out = tmp_path / "ours.gguf"
    r = cli("convert", "drafter", eagle3_drafters.dirs[layout], "-o", out, "--target-gguf", tiny_target.gguf["f16"],
            "--outtype", outtype, "--name", f"tiny-eagle3-{layout}", "-q")
    assert r.exit_code == 0, r.output
    assert out.read_bytes() == eagle3_drafters(layout, outtype).read_bytes()


@pytest.mark.oracle
@pytest.mark.parametrize("layout", ["speculators", "eagle3.1"])
def test_target_model_dir_gives_the_same_file(eagle3_drafters, tiny_target, tmp_path, layout):
    """--target-model-dir (llama.cpp's option: the target's layer count, hidden size and vocab_size from its
    config.json) with --target-gguf for the tokenizer; auto keeps the checkpoint's BF16."""
    out = tmp_path / "ours.gguf"
    convert(eagle3_drafters.dirs[layout], out, target=tiny_target.gguf["f32"], target_model_dir=tiny_target.hf_dir,
            name=f"tiny-eagle3-{layout}")
    assert out.read_bytes() == eagle3_drafters(layout, "bf16").read_bytes()


@pytest.mark.oracle
def test_target_layers_as_llama_cpp_derives_them(eagle3_drafters):
    """[2, L // 2, L - 3] of the 8-layer target, or the config's eagle_aux_hidden_state_layer_ids (specforge)."""
    for layout, ids in eagle3_drafters.target_layers.items():
        with GGUFFile(eagle3_drafters(layout)) as f:
            assert list(f.get("eagle3.target_layers")) == ids
    assert eagle3_drafters.target_layers["specforge"] == [1, 3, 6]
    assert eagle3_drafters.target_layers["llama-eagle3"] == E.default_target_layers(8)


@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(E3.REFUSED))
def test_converter_refusals_in_its_words(eagle3_drafters, tiny_target, tmp_path, name):
    """The d2t checks llama.cpp's converter makes, refused in its words (its last line, recorded by the fixture)."""
    said = eagle3_drafters.refusals[name].removeprefix("ValueError: ")
    with pytest.raises(GGToolsError) as e:
        convert(eagle3_drafters.refused_dirs[name], tmp_path / "o.gguf", target=tiny_target.gguf["f16"])
    assert said in str(e.value) and e.value.exit_code == 2
    assert not (tmp_path / "o.gguf").exists()


@pytest.mark.oracle
def test_demo_drafter_is_llama_cpps(eagle3_demo, tmp_path):
    """The demo target's EAGLE3 drafter (a byte-level BPE tokenizer, taken from the demo target's GGUF)."""
    out = tmp_path / "demo.gguf"
    convert(eagle3_demo["hf_dir"], out, outtype="f16", name="demo-eagle3")
    assert out.read_bytes() == eagle3_demo["ref"].read_bytes()
    assert eagle3_demo["load"]["ok"]


# ---- family detection ------------------------------------------------------------------------------------------

def test_family_detected_and_named(tmp_path):
    d = demo_drafter(tmp_path)
    assert drafter_family(d) == "EAGLE3"
    r = cli("convert", "drafter", d, "-o", tmp_path / "o.gguf", "--target-gguf", DEMO_TARGET, "-q")
    assert r.exit_code == 0, r.output
    line = r.stdout.splitlines()[0]
    assert line.startswith(f"wrote {tmp_path / 'o.gguf'}: EAGLE3 (LlamaForCausalLMEagle3, EAGLE layout: midlayer.*)")
    assert "draft vocabulary 512 of 2048 (d2t)" in line and "target layers [0, 1, 3]" in line
    assert "--spec-type draft-eagle3" in r.stderr


def test_plain_llama_arch_with_a_draft_vocabulary_is_eagle3(tmp_path):
    """llama.cpp's converter takes any llama architecture with draft_vocab_size and one layer for EAGLE3."""
    d = demo_drafter(tmp_path, lambda c, t: c.update(architectures=["LlamaForCausalLM"]))
    assert drafter_family(d) == "EAGLE3"
    assert convert(d, tmp_path / "o.gguf").found.startswith("EAGLE3 (LlamaForCausalLM")


def test_dflash_checkpoints_take_the_dflash_path(tmp_path):
    """convert drafter on a DFlash checkpoint writes what convert dflash writes, and says it found DFlash v1."""
    from tests.test_convert_support import make_checkpoint, make_target_gguf
    d, target = make_checkpoint(tmp_path / "d", 1), make_target_gguf(tmp_path / "t.gguf")
    assert drafter_family(d) == "DFlash"
    r = cli("convert", "drafter", d, "-o", tmp_path / "a.gguf", "--target-gguf", target, "-q")
    assert r.exit_code == 0 and r.stdout.startswith(f"wrote {tmp_path / 'a.gguf'}: DFlash v1;"), r.output
    assert cli("convert", "dflash", d, "-o", tmp_path / "b.gguf", "--target-gguf", target, "-q").exit_code == 0
    assert (tmp_path / "a.gguf").read_bytes() == (tmp_path / "b.gguf").read_bytes()
    r = cli("convert", "drafter", d, "-o", tmp_path / "c.gguf", "--target-gguf", target, "--target-model-dir", d)
    assert r.exit_code == 2 and "--target-model-dir" in r.stderr


def test_dry_run_json_is_the_plan(tmp_path):
    d = demo_drafter(tmp_path)
    r = cli("convert", "drafter", d, "-o", tmp_path / "o.gguf", "--target-gguf", DEMO_TARGET, "--dry-run", "--json")
    plan = json.loads(r.stdout)
    assert plan["family"] == "EAGLE3" and plan["target_layers"] == [0, 1, 3] and plan["spec_type"] == "draft-eagle3"
    assert plan["metadata"]["eagle3.target_hidden_size"] == 128
    assert [t["name"] for t in plan["tensors"]][-1] == "d2t" and plan["tensors"][-1]["to"] == "I64"
    assert not (tmp_path / "o.gguf").exists()


def test_q_and_k_rows_are_permuted_per_head(tmp_path):
    """LlamaModel.permute: each head's two halves interleaved (checked against the HF rows, independently)."""
    d = demo_drafter(tmp_path)
    convert(d, tmp_path / "o.gguf", outtype="f32")
    cfg, tensors = E3.demo_checkpoint()
    with GGUFFile(tmp_path / "o.gguf") as f:
        for hf, heads in (("midlayer.self_attn.q_proj.weight", 4), ("midlayer.self_attn.k_proj.weight", 2)):
            w = tensors[hf][1]
            hf_rows = np.frombuffer(DS.bf16_bits(w).tobytes(), np.uint16).astype(np.uint32) << 16
            hf_rows = hf_rows.view(np.float32).reshape(w.shape)
            want = hf_rows.reshape(heads, 2, -1, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
            got = f.tensor_data(f.tensor["blk.0." + ("attn_q" if "q_proj" in hf else "attn_k") + ".weight"])
            assert np.array_equal(np.frombuffer(bytes(got), "<f4").reshape(w.shape), want)


# ---- refusals --------------------------------------------------------------------------------------------------

def _set(**kw):
    return lambda c, t: c.update(kw)


def _drop(*keys):
    return lambda c, t: [c.pop(k) for k in keys]


def _tensor(name, value=None):
    return lambda c, t: t.pop(name) if value is None else t.__setitem__(name, value)


def _d2t(row, target_id):
    def edit(c, t):
        d2t = t["d2t"][1].copy()
        d2t[row] = target_id - row
        t["d2t"] = ("I64", d2t)
    return edit


REFUSALS = {
    "two layers": (_set(num_hidden_layers=2), "exactly one decoder layer"),
    "no draft vocabulary": (_drop("draft_vocab_size"), "Can not map tensor 'fc.weight'"),
    "two target layers": (_set(eagle_aux_hidden_state_layer_ids=[0, 1]), E.SAYS_THREE),
    "id beyond the target": (_set(eagle_aux_hidden_state_layer_ids=[0, 1, 5]),
                             E.SAYS_BEYOND.format(5, 4)),
    "target hidden size": (_set(target_hidden_size=256), E.SAYS_FEATURES.format(384, 128, 768)),
    "d2t beyond the vocabulary": (_d2t(511, 2048), E.SAYS_D2T_RANGE.format(2048)),
    "d2t negative": (_d2t(3, -1), E.SAYS_D2T_RANGE.format(2048)),
    "d2t twice": (_d2t(20, 21 + int(E3.demo_checkpoint()[1]["d2t"][1][21])), E.SAYS_D2T_DUPLICATE),
    "d2t length": (lambda c, t: t.__setitem__("d2t", ("I64", t["d2t"][1][:500])), "shape [500]"),
    "no d2t": (_tensor("d2t"), "without d2t llama.cpp's loader refuses output.weight"),
    "no own head": (_tensor("lm_head.weight"), E.SAYS_D2T_HEAD),
    "unknown tensor": (_tensor("midlayer.extra.weight", ("BF16", np.ones(4, np.float32))),
                       "Can not map tensor 'midlayer.extra.weight'"),
    "input_norm without the flag": (_tensor("input_norm.weight", ("BF16", np.ones(384, np.float32))),
                                    "does not set norm_before_fc"),
    "the flag without input_norm": (_set(norm_before_fc=True), "requires enc.output_norm.weight"),
    "a flag not a bool": (_set(norm_before_residual="yes"), "is not true or false"),
    "fc width": (_tensor("fc.weight", ("BF16", np.zeros((128, 256), np.float32))), "3 target layers"),
    "other model_type": (_set(model_type="qwen3"), "LlamaConfig's only"),
    "kv heads": (_set(num_key_value_heads=3), "not a positive multiple"),
    "draft vocabulary above the vocabulary": (_set(draft_vocab_size=4096), "is not in 1..vocab_size"),
    "narrow draft without its embedding": (_set(hidden_size=64, num_attention_heads=1, num_key_value_heads=1),
                                           "shape"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_refusals(tmp_path, case):
    edit, words = REFUSALS[case]
    d = demo_drafter(tmp_path, edit)
    r = cli("convert", "drafter", d, "-o", tmp_path / "o.gguf", "--target-gguf", DEMO_TARGET)
    assert r.exit_code == 2, r.output
    assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and words in r.stderr, r.stderr
    assert not (tmp_path / "o.gguf").exists()


def test_needs_the_target_gguf(tmp_path):
    r = cli("convert", "drafter", demo_drafter(tmp_path), "-o", tmp_path / "o.gguf")
    assert r.exit_code == 2 and E.SAYS_NEEDS_TARGET in r.stderr and "--target-gguf" in r.stderr


def test_target_model_dir_must_be_the_same_model(tmp_path):
    d = demo_drafter(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"num_hidden_layers": 6, "hidden_size": 128, "vocab_size": 2048}))
    r = cli("convert", "drafter", d, "-o", tmp_path / "o.gguf", "--target-gguf", DEMO_TARGET,
            "--target-model-dir", other)
    assert r.exit_code == 2 and "describe different models" in r.stderr


@pytest.mark.parametrize("option", [["--profile", "lucebox"], ["--mask-token-id", "5"], ["--guess-target-layers"]])
def test_dflash_options_refused_for_eagle3(tmp_path, option):
    r = cli("convert", "drafter", demo_drafter(tmp_path), "-o", tmp_path / "o.gguf", "--target-gguf", DEMO_TARGET,
            *option)
    assert r.exit_code == 2 and option[0] in r.stderr and "EAGLE3" in r.stderr


def test_pickled_checkpoint_refused(tmp_path):
    d = tmp_path / "bin"
    shutil.copytree(demo_drafter(tmp_path), d)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    r = cli("convert", "drafter", d, "-o", tmp_path / "o.gguf", "--target-gguf", DEMO_TARGET)
    assert r.exit_code == 2 and "pytorch_model.bin" in r.stderr and "safetensors" in r.stderr


def test_llama_config_defaults_as_transformers_fills_them(tmp_path):
    """model_type llama: head_dim (key_length) and the RoPE base come from LlamaConfig's defaults when config.json
    leaves them out (what AutoConfig.from_pretrained(...).to_dict() gives llama.cpp's converter); without model_type
    the file is read as it is."""
    d = demo_drafter(tmp_path, _drop("rope_theta", "max_position_embeddings"))
    kvs = convert(d, tmp_path / "o.gguf", dry_run=True).kvs
    assert kvs.value("eagle3.rope.freq_base") == 10000.0 and kvs.value("eagle3.context_length") == 2048
    assert kvs.value("eagle3.attention.key_length") == 32
    d = demo_drafter(tmp_path, _drop("model_type", "rope_theta"), name="raw")
    kvs = convert(d, tmp_path / "o.gguf", dry_run=True).kvs
    assert "eagle3.rope.freq_base" not in kvs and "eagle3.attention.key_length" not in kvs


# ---- what converts but does not draft well ----------------------------------------------------------------------

def test_last_output_tap_on_a_target_without_it_warns(tmp_path):
    """Id 4 of a 4-layer qwen3 target: llama.cpp reads t_h_nextn, which qwen3's graph never writes."""
    d = demo_drafter(tmp_path, _set(eagle_aux_hidden_state_layer_ids=[0, 1, 4]))
    plan = convert(d, tmp_path / "o.gguf", dry_run=True)
    assert any("stale features" in w for w in plan.warnings)


@pytest.mark.oracle
@pytest.mark.parametrize("drop", [(), ("rope_theta",), ("max_position_embeddings", "rms_norm_eps"),
                                  ("num_key_value_heads", "intermediate_size"), ("vocab_size", "hidden_size")])
@pytest.mark.parametrize("rope", [None, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0},
                                  {"type": "linear", "factor": 2.0}])
def test_llama_hparams_are_what_transformers_gives_the_converter(tmp_path, drop, rope):
    """eagle3_checkpoint.llama_hparams against transformers' own AutoConfig.from_pretrained(...).to_dict() (what
    llama.cpp's converter reads), on every key the converter reads."""
    transformers = pytest.importorskip("transformers")
    from ggtools.dflash.eagle3_checkpoint import converter_hparams
    cfg = E3.demo_checkpoint()[0]
    for key in drop:
        cfg.pop(key)
    if rope:
        cfg["rope_scaling"] = rope
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    want = transformers.AutoConfig.from_pretrained(tmp_path).to_dict()
    got, _ = converter_hparams(cfg, tmp_path / "config.json")
    for key in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "max_position_embeddings", "rms_norm_eps", "head_dim", "rope_parameters",
                "rope_scaling", "rope_theta", "draft_vocab_size", "tie_word_embeddings"):
        assert got.get(key) == want.get(key), key
