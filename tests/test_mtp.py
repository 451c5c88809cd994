"""MTP (NextN) blocks as a file operation: `convert mtp` (the sidecar, --strip), requant-trunk on MTP targets
(--keep-mtp), and the MTP rules of validate, doctor and pair-check.

Truth: llama.cpp's converter on tiny Qwen3.5 dense and MoE checkpoints with an MTP block (the qwen35-mtp fixture:
default, --mtp and --no-mtp conversions, --split-max-tensors sets), llama_model_quantize's surgical recipe on the
MoE, and libllama itself (loads, MTP contexts, its asserts' words) in a child process.
"""

import os
import shutil

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as VT

from ggtools.cli import main
from ggtools.gguf import GGUFFile, GGUFWriter
from ggtools.hparam_rules.mtp import NO_MTP_LAYERS
from ggtools.jobs.doctor import doctor, pair_check
from ggtools.jobs.inspect import inspect
from ggtools.jobs.validate import validate
from tests.mtp_files import TRUNK, sidecar_of, write_qwen35_mtp
from tests.test_convert_support import rewrite_gguf

KINDS = ("qwen35", "qwen35moe")
MTP_BLOCK = {"qwen35": 6, "qwen35moe": 4}


def cli(*args, code=0):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == code, result.output
    return result


def same_bytes(a, b) -> bool:
    with open(a, "rb") as fa, open(b, "rb") as fb:
        return fa.read() == fb.read()


def shards_of(first):
    from ggtools.gguf import ShardSet
    with ShardSet(first) as s:
        return list(s.paths)


# ---- what llama.cpp's converter writes (the fixture), as docs/mtp.md describes it ---------------------------------

@pytest.mark.oracle
@pytest.mark.parametrize("kind", KINDS)
def test_the_converters_three_files(mtp_targets, kind):
    """The default conversion holds the MTP block after the trunk; --mtp keeps its keys (all but size_label) and
    token_embd, output_norm, output and the block; --no-mtp drops the block and its keys. libllama loads all three
    (the sidecar also with load_mtp, and makes an MTP context on it: llama.cpp reads the MTP-only file)."""
    from scripts.fixtures.mtp_targets import run_mtp_ops
    t, block = mtp_targets[kind], MTP_BLOCK[kind]
    with GGUFFile(t("default")) as d, GGUFFile(t("mtp")) as m, GGUFFile(t("no-mtp")) as n:
        assert (d.get(f"{kind}.block_count"), d.get(f"{kind}.nextn_predict_layers")) == (block + 1, 1)
        assert [kv.key for kv in m.kvs] == [kv.key for kv in d.kvs]
        assert [kv.key for kv in m.kvs if bytes(kv.raw) != bytes(d.kv[kv.key].raw)] == ["general.size_label"]
        assert {t.name for t in m.tensors} == {"token_embd.weight", "output_norm.weight", "output.weight"} | \
            {x.name for x in d.tensors if x.name.startswith(f"blk.{block}.")}
        assert f"{kind}.nextn_predict_layers" not in n.kv and n.get(f"{kind}.block_count") == block
        assert [x.name for x in n.tensors] == [x.name for x in d.tensors if not x.name.startswith(f"blk.{block}.")]
    assert all(r["ok"] for r in t.loads.values()), t.loads
    assert t.loads["mtp/f16+load_mtp"]["n_layer_nextn"] == 1 and t.loads["no-mtp/f16"]["n_layer_nextn"] == 0
    [sidecar] = run_mtp_ops([{"op": "mtp_context", "path": str(t("mtp")), "load_mtp": True}])
    assert sidecar.get("mtp_context"), sidecar


# ---- convert mtp: byte identity with the converter ------------------------------------------------------------

@pytest.mark.oracle
@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
@pytest.mark.parametrize("kind", KINDS)
def test_sidecar_equals_the_converters_mtp(mtp_targets, tmp_path, kind, outtype):
    t = mtp_targets[kind]
    out = tmp_path / "mtp.gguf"
    cli("convert", "mtp", t("default", outtype), "-o", out, "-q")
    assert same_bytes(out, t("mtp", outtype))


@pytest.mark.oracle
@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
@pytest.mark.parametrize("kind", KINDS)
def test_strip_equals_the_converters_no_mtp(mtp_targets, tmp_path, kind, outtype):
    t = mtp_targets[kind]
    out = tmp_path / "stripped.gguf"
    cli("convert", "mtp", "--strip", t("default", outtype), "-o", out, "-q")
    assert same_bytes(out, t("no-mtp", outtype))


@pytest.mark.oracle
@pytest.mark.parametrize("kind", KINDS)
def test_shard_sets(mtp_targets, tmp_path, kind):
    """From the converter's split default conversion: the sidecar is --mtp's one file; --strip keeps the shard
    boundaries, which is the converter's --no-mtp with the same --split-max-tensors (a shard left empty dropped:
    qwen35moe's 3 shards become 2)."""
    t = mtp_targets[kind]
    first = t.split["default/f16"][1]                   # any shard names the set
    cli("convert", "mtp", first, "-o", tmp_path / "mtp.gguf", "-q")
    assert same_bytes(tmp_path / "mtp.gguf", t("mtp"))
    cli("convert", "mtp", "--strip", first, "-o", tmp_path / "stripped.gguf", "-q")
    ours = sorted(p for p in os.listdir(tmp_path) if p.startswith("stripped-"))
    refs = t.split["no-mtp/f16"]
    assert ours == [f"stripped-{i:05d}-of-{len(refs):05d}.gguf" for i in range(1, len(refs) + 1)]
    assert all(same_bytes(tmp_path / a, b) for a, b in zip(ours, refs))


@pytest.mark.oracle
def test_size_label_from_the_model_card_is_kept(mtp_targets, tmp_path):
    """A size label the converter did not count from the tensors (model card, directory name) it keeps in every file:
    so does convert mtp."""
    src = tmp_path / "labelled.gguf"
    cli("patch", "set", mtp_targets["qwen35"]("default"), "general.size_label=str:35B-A3B", "-o", src)
    cli("convert", "mtp", src, "-o", tmp_path / "mtp.gguf", "-q")
    with GGUFFile(tmp_path / "mtp.gguf") as f:
        assert f.get("general.size_label") == "35B-A3B"


# ---- requant-trunk on an MTP target ---------------------------------------------------------------------------

def _tensors(path):
    """name -> (the tensor info's bytes but the offset, the data)."""
    with GGUFFile(path) as f:
        return {t.name: (bytes(f.buf[t.info_start:t.info_end - 8]), bytes(f.tensor_data(t))) for t in f.tensors}


@pytest.mark.oracle
def test_requant_trunk_treats_the_mtp_block_as_llama_quantize_does(mtp_targets, tmp_path):
    """llama-quantize's surgical recipe on the MXFP4_MOE MTP target converts the MTP block's Q8_0 tensors
    (nextn.eh_proj, attention, shared expert) to Q4_K and keeps its MXFP4 experts and F32 norms and router:
    requant-trunk writes every tensor byte for byte as it does (and every key but general.file_type), and lists the
    block's tensors apart."""
    t = mtp_targets["qwen35moe"]
    src = tmp_path / "src" / "t.gguf"
    src.parent.mkdir()
    shutil.copyfile(t.gguf["mxfp4_moe"], src)
    dry = cli("requant-trunk", src, "-o", tmp_path / "out", "--dry-run")
    assert "  MTP block:\n" in dry.output and "MTP block: 20 tensors, 8 converted, 12 copied" in dry.output
    cli("requant-trunk", src, "-o", tmp_path / "out", "-q")
    out = tmp_path / "out" / "t.gguf"
    assert _tensors(out) == _tensors(t.gguf["surgical"])
    with GGUFFile(out) as a, GGUFFile(t.gguf["surgical"]) as b:
        assert [kv.key for kv in a.kvs if bytes(kv.raw) != bytes(b.kv[kv.key].raw)] == ["general.file_type"]
    with GGUFFile(t.gguf["surgical"]) as ref:
        block = {x.name: x.type_name for x in ref.tensors if x.name.startswith("blk.4.")}
    assert block["blk.4.nextn.eh_proj.weight"] == block["blk.4.attn_q.weight"] == "Q4_K"
    assert block["blk.4.ffn_gate_exps.weight"] == "MXFP4" and block["blk.4.nextn.enorm.weight"] == "F32"


@pytest.mark.oracle
def test_keep_mtp(mtp_targets, tmp_path):
    """--keep-mtp: every MTP block tensor is the input's byte for byte (its Q8_0 stays Q8_0); every other tensor is
    llama-quantize's surgical output's."""
    t = mtp_targets["qwen35moe"]
    src = tmp_path / "src" / "t.gguf"
    src.parent.mkdir()
    shutil.copyfile(t.gguf["mxfp4_moe"], src)
    cli("requant-trunk", src, "-o", tmp_path / "out", "-q", "--keep-mtp")
    ours, given, ref = _tensors(tmp_path / "out" / "t.gguf"), _tensors(src), _tensors(t.gguf["surgical"])
    block = [n for n in ours if n.startswith("blk.4.")]
    assert len(block) == 20 and all(ours[n][1] == given[n][1] for n in block)
    assert {n: v for n, v in ours.items() if n not in block} == {n: v for n, v in ref.items() if n not in block}
    with GGUFFile(tmp_path / "out" / "t.gguf") as f:
        assert f.tensor["blk.4.nextn.eh_proj.weight"].type_name == "Q8_0"


def test_keep_mtp_needs_an_mtp_block(tmp_path):
    plain = write_qwen35_mtp(tmp_path / "plain.gguf", n_nextn=0)
    result = cli("requant-trunk", plain, "-o", tmp_path / "out", "--keep-mtp", code=2)
    assert "--keep-mtp" in result.output and "has no MTP block" in result.output


# ---- convert mtp on the synthetic layout (no oracle): split sets, refusals ------------------------------------

def test_strip_gives_the_model_without_its_block(tmp_path):
    """--strip of a model with an MTP block is the model written without one; the sidecar is its keys, token_embd,
    output_norm and the block (both written here by hand, tests/mtp_files.py)."""
    src = write_qwen35_mtp(tmp_path / "m.gguf")
    cli("convert", "mtp", "--strip", src, "-o", tmp_path / "s.gguf", "-q")
    assert same_bytes(tmp_path / "s.gguf", write_qwen35_mtp(tmp_path / "plain.gguf", n_nextn=0))
    cli("convert", "mtp", src, "-o", tmp_path / "mtp.gguf", "-q")
    assert same_bytes(tmp_path / "mtp.gguf", sidecar_of(src, tmp_path / "by-hand.gguf"))


def test_shard_set_of_the_synthetic_model(tmp_path):
    """A set split by halves: the sidecar gathers its tensors from both shards (the engine reads each from its own
    file); --strip keeps two shards, the second without the block, split.tensors.count less the block's."""
    from tests.hostile_corpus import split_in_two
    src = write_qwen35_mtp(tmp_path / "m.gguf")
    (tmp_path / "set").mkdir()
    first = split_in_two(src, str(tmp_path / "set" / "m"))
    cli("convert", "mtp", first, "-o", tmp_path / "mtp.gguf", "-q")
    assert same_bytes(tmp_path / "mtp.gguf", sidecar_of(src, tmp_path / "by-hand.gguf"))
    cli("convert", "mtp", "--strip", first, "-o", tmp_path / "s.gguf", "-q")
    with GGUFFile(tmp_path / "s-00001-of-00002.gguf") as a, GGUFFile(tmp_path / "s-00002-of-00002.gguf") as b:
        assert a.get("split.tensors.count") == b.get("split.tensors.count") == len(a.tensors) + len(b.tensors) == 55
        assert not any(x.name.startswith(f"blk.{TRUNK}.") for x in b.tensors)
    assert validate([tmp_path / "s-00001-of-00002.gguf"]).exit_code == 0


@pytest.mark.parametrize("case, fragment", [
    ("plain", ": qwen35.nextn_predict_layers is absent (a --no-mtp conversion"),
    ("sidecar", "already an MTP sidecar (no trunk block"),
    ("two_blocks", "QWEN35 MTP currently only supports a single MTP block"),
    ("no_eh_proj", "check_tensor_dims: tensor 'blk.4.nextn.eh_proj.weight' not found"),
    ("qwen3", "arch 'qwen3': convert mtp writes what llama.cpp's Qwen MTP converter writes"),
])
def test_refusals(tmp_path, case, fragment):
    """One line naming the file and the rule, exit 2, nothing written."""
    from tests.tiny_targets import DEMO_TARGET
    src = {"plain": lambda: write_qwen35_mtp(tmp_path / "p.gguf", n_nextn=0),
           "sidecar": lambda: sidecar_of(write_qwen35_mtp(tmp_path / "m.gguf"), tmp_path / "s.gguf"),
           "two_blocks": lambda: write_qwen35_mtp(tmp_path / "m2.gguf", n_nextn=2),
           "no_eh_proj": lambda: write_qwen35_mtp(tmp_path / "m.gguf", drop=["blk.4.nextn.eh_proj.weight"]),
           "qwen3": lambda: shutil.copy(DEMO_TARGET, tmp_path / "t.gguf")}[case]()
    for strip in ([], ["--strip"]):
        result = cli("convert", "mtp", *strip, src, "-o", tmp_path / "out.gguf", code=2)
        assert fragment in result.output and str(src) in result.output, result.output
        assert not os.path.exists(tmp_path / "out.gguf")


def test_output_over_the_input_is_refused(tmp_path):
    src = write_qwen35_mtp(tmp_path / "m.gguf")
    before = open(src, "rb").read()
    result = cli("convert", "mtp", "--strip", src, "-o", src, "--force", code=2)
    assert open(src, "rb").read() == before and "input" in result.output


# ---- inspect, validate, doctor ---------------------------------------------------------------------------------

def test_inspect_shows_the_block(tmp_path):
    src = write_qwen35_mtp(tmp_path / "m.gguf")
    info = inspect(src)["mtp"]
    assert (info["nextn_predict_layers"], info["blocks"], info["sidecar"], len(info["tensors"])) == (1, [4], False, 15)
    assert inspect(sidecar_of(src, tmp_path / "s.gguf"))["mtp"]["sidecar"] is True
    assert inspect(write_qwen35_mtp(tmp_path / "p.gguf", n_nextn=0))["mtp"] is None
    assert "MTP block: nextn_predict_layers 1, block(s) 4 of block_count 5 (4 trunk); 15 tensors" in \
        cli("inspect", src).output


@pytest.mark.parametrize("piece", ["eh_proj", "enorm", "hnorm"])
def test_validate_names_a_missing_nextn_tensor(tmp_path, piece):
    name = f"blk.4.nextn.{piece}.weight"
    report = validate([write_qwen35_mtp(tmp_path / "m.gguf", drop=[name])])
    [p] = report.errors
    assert p.where == f"tensor '{name}'" and f'"MTP block missing nextn.{piece}"' in p.rule
    assert f"check_tensor_dims: tensor '{name}' not found" in p.rule


def test_doctor_on_an_mtp_draft(tmp_path):
    """doctor takes a Qwen3.5 file as an MTP draft: a target with its block or a sidecar passes; one without any fails
    in llama.cpp's words; a sidecar against a target whose keys differ fails naming the key."""
    src = write_qwen35_mtp(tmp_path / "m.gguf")
    side = sidecar_of(src, tmp_path / "s.gguf")
    assert doctor(src).exit_code == 0 and doctor(side).exit_code == 0
    plain = write_qwen35_mtp(tmp_path / "p.gguf", n_nextn=0)
    assert pair_check(plain, side).exit_code == 0                    # a --no-mtp target and its sidecar
    [f] = doctor(plain).errors
    assert f.check == "mtp" and f.says("llama.cpp") == NO_MTP_LAYERS
    other = write_qwen35_mtp(tmp_path / "o.gguf", n_nextn=0, keys=[("qwen35.rope.freq_base", VT.FLOAT32, 5e5)])
    [f] = pair_check(other, side).errors
    assert f.check == "mtp_pair" and "key 'qwen35.rope.freq_base'" in f.message and "belongs to another model" in \
        f.message
    result = cli("doctor", plain, code=1)
    assert "context type MTP requested but model doesn't contain MTP layers" in result.output


def test_doctor_names_the_row_width(tmp_path):
    """A sidecar of another width: llama.cpp's draft-mtp asserts the row width (speculative.cpp)."""
    side = sidecar_of(write_qwen35_mtp(tmp_path / "m.gguf"), tmp_path / "s.gguf")
    wide = write_qwen35_mtp(tmp_path / "w.gguf", n_nextn=0, keys=[("qwen35.embedding_length", VT.UINT32, 128)])
    report = doctor(side, target=wide)
    assert any("MTP input row width must match the target h_nextn width" in (f.says("llama.cpp") or "")
               for f in report.errors)


# ---- the rules against libllama -------------------------------------------------------------------------------

def _two_blocks(src, dst, block):
    """src with a second, complete MTP block (a copy of its first): block_count + 1, nextn_predict_layers 2."""
    with GGUFFile(src) as f, GGUFWriter(str(dst)) as w:
        arch = f.architecture
        for kv in f.kvs:
            if kv.key == f"{arch}.block_count":
                w.add_kv(kv.key, VT.UINT32, kv.value + 1)
            elif kv.key == f"{arch}.nextn_predict_layers":
                w.add_kv(kv.key, VT.UINT32, 2)
            elif kv.key == f"{arch}.attention.recurrent_layers":
                w.add_kv(kv.key, VT.ARRAY, [bool(v) for v in kv.value] + [False], VT.BOOL)
            else:
                w.add_kv_record(kv)
        extra = [(t, t.name.replace(f"blk.{block}.", f"blk.{block + 1}.")) for t in f.tensors
                 if t.name.startswith(f"blk.{block}.")]
        for t in f.tensors:
            w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
        for t, name in extra:
            w.add_tensor_info(name, t.ne, t.type_id, t.nbytes)
        for t in f.tensors + [t for t, _ in extra]:
            w.write(f.tensor_data(t))
    return str(dst)


@pytest.mark.oracle
def test_the_rules_say_what_libllama_does(mtp_targets, tmp_path):
    """Each MTP fault, reported by validate / doctor in the words libllama prints for it: two MTP blocks (it loads,
    its MTP graph aborts), a missing nextn.eh_proj (its loader refuses), a --no-mtp model asked for an MTP context."""
    from scripts.fixtures.mtp_targets import run_mtp_ops
    t = mtp_targets["qwen35"]
    two = _two_blocks(t("default"), tmp_path / "two.gguf", 6)
    cut = str(rewrite_gguf(t("default"), tmp_path / "cut.gguf", drop_tensors=["blk.6.nextn.eh_proj.weight"]))
    r_two, r_cut, r_none = run_mtp_ops([{"op": "mtp_context", "path": p, "load_mtp": True}
                                        for p in (two, cut, str(t("no-mtp")))])
    assert "QWEN35 MTP currently only supports a single MTP block" in r_two["error"], r_two
    [p] = validate([two]).errors
    assert p.where == "key 'qwen35.nextn_predict_layers'" and "QWEN35 MTP currently only supports a single MTP block" \
        in p.rule
    said = "check_tensor_dims: tensor 'blk.6.nextn.eh_proj.weight' not found"
    assert said in r_cut["error"], r_cut
    [p] = validate([cut]).errors
    assert said in p.rule
    assert r_none["error"] == NO_MTP_LAYERS and doctor(str(t("no-mtp"))).errors[0].says("llama.cpp") == NO_MTP_LAYERS
    assert pair_check(str(t("no-mtp")), str(t("mtp"))).exit_code == 0
    assert pair_check(str(mtp_targets["qwen35moe"]("no-mtp")), str(t("mtp"))).exit_code == 1
