"""patch: metadata edits keep every tensor byte and touch only shard 1; inputs untouched unless in-place."""

import hashlib
import os

import gguf
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.gguf import GGUFFile
from ggtools.samples import write_moe_set


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def sha(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def data_section(path):
    with GGUFFile(path) as f:
        return bytes(f.buf[f.data_offset:])


@pytest.fixture
def moe_set(tmp_path):
    return write_moe_set(str(tmp_path / "in" / "m"), layers=2, hidden=256, ffn=256, experts=2, vocab=512, shards=3) \
        if os.makedirs(tmp_path / "in") is None else None


def test_set_and_remove_on_a_shard_set(moe_set, tmp_path):
    before = [sha(p) for p in moe_set]
    out = tmp_path / "out"
    out.mkdir()
    r = cli("patch", "set", moe_set[1], "general.name=str:patched", "x.layers=i32[]:2,6", "x.flag=bool:true",
            "-o", out)
    assert r.exit_code == 0, r.output
    assert [sha(p) for p in moe_set] == before                      # inputs untouched
    outs = [out / os.path.basename(p) for p in moe_set]
    assert [sha(p) for p in outs[1:]] == before[1:]                  # only shard 1 rewritten
    assert data_section(outs[0]) == data_section(moe_set[0])          # tensor data byte-identical
    r0 = gguf.GGUFReader(outs[0])
    assert r0.fields["general.name"].contents() == "patched"
    assert r0.fields["x.layers"].contents() == [2, 6] and r0.fields["x.layers"].types[1] == gguf.GGUFValueType.INT32
    assert r0.fields["x.flag"].contents() is True
    keys = list(gguf.GGUFReader(moe_set[0]).fields)
    assert list(r0.fields)[:len(keys)] == keys                       # existing keys keep their order
    r = cli("patch", "rm", outs[0], "x.flag", "general.name", "--in-place")
    assert r.exit_code == 0, r.output
    fields = gguf.GGUFReader(outs[0]).fields
    assert "x.flag" not in fields and "general.name" not in fields and "x.layers" in fields
    assert cli("validate", outs[2]).exit_code == 0


def test_mask_token_from_dflash_key(tmp_path):
    from ggtools.gguf import GGUFWriter
    src = tmp_path / "d.gguf"
    with GGUFWriter(src) as w:
        w.add_kv("general.architecture", gguf.GGUFValueType.STRING, "qwen35-dflash-draft")
        w.add_kv("qwen35-dflash-draft.dflash.mask_token_id", gguf.GGUFValueType.UINT32, 248070)
        w.add_tensor_info("t.weight", (32, 2), 0, 256)
        w.write(bytes(range(256)))
    r = cli("patch", "mask-token", src, "--in-place")
    assert r.exit_code == 0, r.output
    f = gguf.GGUFReader(src)
    assert f.fields["tokenizer.ggml.mask_token_id"].contents() == 248070
    assert f.fields["tokenizer.ggml.mask_token_id"].types == [gguf.GGUFValueType.UINT32]
    assert bytes(f.tensors[0].data.view("u1").reshape(-1)) == bytes(range(256))
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_mask_token_refusals(moe_set, tmp_path):
    r = cli("patch", "mask-token", moe_set[0], "-o", tmp_path)
    assert r.exit_code == 2 and "no --id given" in r.output
    r = cli("patch", "mask-token", moe_set[0], "--id", "600", "--target", moe_set[0], "-o", tmp_path)
    assert r.exit_code == 0 or "outside the target vocabulary" in r.output


@pytest.mark.parametrize("args,fragment", [
    (["general.name"], "expected KEY=TYPE:VALUE"),
    (["x=q17:3"], "unknown GGUF value type"),
    (["x=u8:300"], "does not fit UINT8"),
    (["x=bool:maybe"], "bool must be"),
])
def test_bad_assignments(moe_set, tmp_path, args, fragment):
    r = cli("patch", "set", moe_set[0], *args, "-o", tmp_path)
    assert r.exit_code == 2 and fragment in r.output, r.output
    assert os.listdir(tmp_path) == ["in"]


def test_output_rules(moe_set, tmp_path):
    r = cli("patch", "set", moe_set[0], "a=u8:1")
    assert r.exit_code == 2 and "exactly one of -o OUT and --in-place" in r.output
    r = cli("patch", "rm", moe_set[0], "no.such.key", "--in-place")
    assert r.exit_code == 2 and "not in the file" in r.output


@pytest.mark.oracle
def test_mask_patch_makes_a_real_drafter_usable(ref_drafter_gguf, tiny_target, tmp_path):
    """A llama.cpp-profile drafter whose converter wrote only `dflash.mask_token_id` fails pair-check (llama.cpp
    would decode -1 mask tokens: LC#26761); `patch mask-token` fixes it, the data section is byte-identical,
    and libllama loads the result."""
    from tests.oracle_artifacts import llama_loads
    src = ref_drafter_gguf(1, "f16")
    broken, fixed = tmp_path / "broken.gguf", tmp_path / "fixed.gguf"
    r = cli("patch", "rm", src, "tokenizer.ggml.mask_token_id", "-o", tmp_path / "tmp.gguf")
    assert r.exit_code == 0, r.output
    r = cli("patch", "set", tmp_path / "tmp.gguf", "dflash.mask_token_id=u32:1000", "-o", broken)
    assert r.exit_code == 0, r.output
    target = tiny_target.gguf["f16"]
    assert cli("pair-check", target, broken).exit_code == 1
    r = cli("patch", "mask-token", broken, "--target", target, "-o", fixed)
    assert r.exit_code == 0 and "1000" in r.output, r.output
    assert cli("pair-check", target, fixed).exit_code == 0
    assert gguf.GGUFReader(fixed).fields["tokenizer.ggml.mask_token_id"].contents() == 1000
    assert data_section(fixed) == data_section(src)
    assert llama_loads(fixed)
