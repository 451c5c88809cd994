"""The bad-input corpus: every corruption gets its specific message and exit code, never a traceback."""

import struct

import numpy as np
import pytest
from click.testing import CliRunner

from tests import gguf_builder as B
from ggtools.cli import main
from ggtools.jobs.validate import validate


def write(tmp_path, data, name="m.gguf"):
    p = tmp_path / name
    p.write_bytes(data)
    return str(p)


def run_cli(*args):
    result = CliRunner().invoke(main, list(args))
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result


def expect(tmp_path, data, code, fragment):
    path = write(tmp_path, data)
    result = run_cli("validate", path)
    assert result.exit_code == code, result.output
    assert fragment in result.output, result.output
    assert "Traceback" not in result.output


# A container sample: B.sample_file's keys and tensors under an arch the model-file rules have no tables for (gpt2),
# so that only the container rules apply (as llama, its three tensors are not a whole model: llama.cpp's loader would
# miss token_embd and the rest; test_tensor_shapes_are_checked_against_the_keys keeps llama's keys)
VALID_KVS = B.sample_kvs("gpt2")


def valid_sample(**kw) -> bytes:
    return B.build(VALID_KVS, B.sample_tensors(), **kw)


def test_sample_is_valid(tmp_path):
    path = write(tmp_path, valid_sample())
    assert validate([path]).exit_code == 0
    # gguf-py, an independent reader, reads it too
    import gguf
    r = gguf.GGUFReader(path)
    assert [t.name for t in r.tensors] == [t[0] for t in B.sample_tensors()]


@pytest.mark.parametrize("data,code,fragment", [
    (b"GGML" + B.sample_file()[4:], 2, "bad magic"),
    (B.sample_file(version=1), 2, "version 1 is no longer supported"),
    (B.sample_file(version=4), 2, "version 4"),
    (b"GGUF" + struct.pack(">I", 3) + B.sample_file()[8:], 2, "big-endian"),
    (b"GGU", 2, "file ends inside the magic"),
    (b"", 2, "file is empty"),
])
def test_unreadable_header(tmp_path, data, code, fragment):
    expect(tmp_path, data, code, fragment)


def test_duplicate_key(tmp_path):
    kvs = B.sample_kvs() + [B.kv_u32("llama.block_count", 2)]
    expect(tmp_path, B.build(kvs, B.sample_tensors()), 1, "duplicate key")


def test_duplicate_tensor(tmp_path):
    t = B.sample_tensors()
    t[1] = ("output_norm.weight",) + t[1][1:]
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "duplicate tensor name")


def test_bad_kv_type(tmp_path):
    kvs = B.sample_kvs() + [B.s("x.y") + struct.pack("<iI", 13, 0)]
    expect(tmp_path, B.build(kvs, B.sample_tensors()), 2, "invalid GGUF value type 13")


def test_array_of_arrays(tmp_path):
    kvs = B.sample_kvs() + [B.s("x.nested") + struct.pack("<iiQ", 9, 9, 1)]
    expect(tmp_path, B.build(kvs, B.sample_tensors()), 2, "array of arrays")


def test_long_name(tmp_path):
    t = B.sample_tensors()
    t[0] = ("n" * 64,) + t[0][1:]
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "at most 63")


def test_five_dims(tmp_path):
    t = B.sample_tensors()
    t[0] = (t[0][0], [64, 1, 1, 1, 1]) + t[0][2:]
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "5 dimensions")


def test_zero_dim(tmp_path):
    t = B.sample_tensors()
    t[1] = (t[1][0], [64, 0]) + t[1][2:]
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "zero dimension")


def test_unknown_type(tmp_path):
    t = B.sample_tensors()
    t[1] = t[1][:2] + (77,) + t[1][3:]
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "unknown or deprecated ggml type 77")


def test_row_not_divisible_by_block(tmp_path):
    t = B.sample_tensors()
    t[2] = (t[2][0], [48, 4]) + t[2][2:]
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "not a multiple of the Q8_0 block size 32")


def test_gap(tmp_path):
    t = B.sample_tensors()
    t[2] = t[2][:3] + (t[2][3] + 64, t[2][4])
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "gap: offset")


def test_overlap(tmp_path):
    t = B.sample_tensors()
    t[2] = t[2][:3] + (t[2][3] - 64, t[2][4])
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "overlap: offset")


def test_misaligned(tmp_path):
    t = B.sample_tensors()
    t[2] = t[2][:3] + (t[2][3] + 4, t[2][4])
    expect(tmp_path, B.build(B.sample_kvs(), t), 1, "not a multiple of the alignment")


def test_tensor_too_short_for_its_type(tmp_path):
    """The ik_llama.cpp#2437 case: the region reserved is smaller than the type needs, yet inside the file."""
    t = B.sample_tensors()
    name, ne, ty, off, nb = t[1]
    t[1] = (name, [64, 16], ty, off, nb)          # claims twice the rows it has room for
    data = B.build(B.sample_kvs(), t)
    expect(tmp_path, data, 1, "too short for its type")


def test_truncated_data(tmp_path):
    expect(tmp_path, B.sample_file()[:-100], 1, "tensor 'blk.0.ffn_up.weight': the file is truncated")


def test_truncation_names_the_first_tensor_cut(tmp_path):
    """Cut inside the second of three tensors: the message names that one, not the last."""
    data = B.sample_file()
    header = len(data) - sum(B.pad(nb, 32) for *_, nb in B.sample_tensors())
    cut = header + B.sample_tensors()[1][3] + 100
    expect(tmp_path, data[:cut], 1, "tensor 'blk.0.attn_q.weight': the file is truncated")


def test_missing_final_padding(tmp_path):
    expect(tmp_path, B.sample_file()[:-16], 1, "final padding is missing")


def test_trailing_bytes_are_a_warning(tmp_path):
    path = write(tmp_path, valid_sample() + b"junk")
    report = validate([path])
    assert report.exit_code == 0 and "trailing bytes" in str(report.problems[0])


@pytest.mark.parametrize("kv,fragment", [
    (B.kv_u32("general.alignment", 48), "not a power of 2"),
    (B.kv_i32("general.alignment", 32), "has type INT32, llama.cpp requires UINT32"),
])
def test_bad_alignment(tmp_path, kv, fragment):
    expect(tmp_path, B.build(B.sample_kvs() + [kv], B.sample_tensors()), 1, fragment)


def test_non_default_alignment_is_valid(tmp_path):
    t, off = [], 0
    for name, ne, ty, _, nb in B.sample_tensors():
        t.append((name, ne, ty, off, nb))
        off = B.pad(off + nb, 64)
    path = write(tmp_path, B.build(VALID_KVS + [B.kv_u32("general.alignment", 64)], t, alignment=64))
    assert validate([path]).exit_code == 0


def test_truncated_anywhere(tmp_path):
    """Every cut through the header, and many through the data, is a clean error: exit 1 or 2."""
    data = B.sample_file()
    header_end = data.index(b"\0" * 8, 200) if False else len(data) - 1600
    cuts = list(range(0, header_end + 40)) + list(range(header_end, len(data), 37))
    for cut in cuts:
        path = write(tmp_path, data[:cut])
        report = validate([path])
        assert report.exit_code in (1, 2), cut


# ---- shard sets ---------------------------------------------------------------------------------

def shard(index, count, tensors, total, arch=True, no=None):
    kvs = (VALID_KVS if arch else []) + [B.kv_u16("split.no", index if no is None else no),
                                              B.kv_u16("split.count", count), B.kv_i32("split.tensors.count", total)]
    return B.build(kvs, tensors)


def make_set(tmp_path, count=3, **kw):
    t = B.sample_tensors()
    paths = []
    for i in range(count):
        name, ne, ty, _, nb = t[i % len(t)]
        data = shard(i, count, [(f"{name}.{i}" if "dup" not in kw else name, ne, ty, 0, nb)], count,
                     arch=(i == 0))
        paths.append(write(tmp_path, data, f"model-{i + 1:05d}-of-{count:05d}.gguf"))
    return paths


def test_valid_set(tmp_path):
    paths = make_set(tmp_path)
    result = run_cli("validate", paths[1])
    assert result.exit_code == 0, result.output
    assert result.output.count("ok ") == 3


def test_missing_shard(tmp_path):
    paths = make_set(tmp_path)
    import os
    os.unlink(paths[2])
    result = run_cli("validate", paths[0])
    assert result.exit_code == 1 and "shard 3 of 3 is missing" in result.output


def test_wrong_split_count(tmp_path):
    paths = make_set(tmp_path)
    t = B.sample_tensors()[1]
    with open(paths[1], "wb") as fh:
        fh.write(shard(1, 4, [(t[0] + ".1",) + t[1:3] + (0, t[4])], 3, arch=False))
    result = run_cli("validate", paths[0])
    assert result.exit_code == 1 and "split.count is 4 but the set has 3" in result.output


def test_wrong_tensor_total(tmp_path):
    paths = make_set(tmp_path)
    t = B.sample_tensors()[0]
    with open(paths[0], "wb") as fh:
        fh.write(shard(0, 3, [(t[0] + ".0",) + t[1:3] + (0, t[4])], 5))
    result = run_cli("validate", paths[2])
    assert result.exit_code == 1 and "split.tensors.count is 5 but the shards hold 3" in result.output


def test_duplicate_tensor_across_shards(tmp_path):
    t = B.sample_tensors()[0]
    for i in range(2):
        write(tmp_path, shard(i, 2, [(t[0],) + t[1:3] + (0, t[4])], 2, arch=(i == 0)), f"m-{i + 1:05d}-of-00002.gguf")
    result = run_cli("validate", str(tmp_path / "m-00001-of-00002.gguf"))
    assert result.exit_code == 1 and "duplicated across shards" in result.output


def test_split_no_mismatch(tmp_path):
    paths = make_set(tmp_path)
    t = B.sample_tensors()[1]
    with open(paths[1], "wb") as fh:
        fh.write(shard(1, 3, [(t[0] + ".1",) + t[1:3] + (0, t[4])], 3, arch=False, no=2))
    result = run_cli("validate", paths[0])
    assert result.exit_code == 1 and "split.no is 2" in result.output


def test_metadata_on_first_shard(tmp_path):
    t = B.sample_tensors()
    for i in range(2):
        write(tmp_path, shard(i, 2, [(t[i][0],) + t[i][1:3] + (0, t[i][4])], 2, arch=(i == 1)),
              f"m-{i + 1:05d}-of-00002.gguf")
    result = run_cli("validate", str(tmp_path / "m-00002-of-00002.gguf"))
    assert result.exit_code == 1 and "general.architecture" in result.output


# ---- random mutation ----------------------------------------------------------------------------

def test_random_mutations_never_crash(tmp_path):
    """Thousands of mutated files: every one is a clean verdict (exit 0/1/2), never another exception."""
    rng = np.random.default_rng(1234)
    base = bytearray(B.sample_file())
    header_len = len(base) - 1600
    path = tmp_path / "mut.gguf"
    codes = set()
    for i in range(3000):
        data = bytearray(base)
        for _ in range(rng.integers(1, 4)):
            pos = int(rng.integers(0, header_len if rng.random() < 0.9 else len(data)))
            kind = rng.integers(0, 3)
            if kind == 0:
                data[pos] = int(rng.integers(0, 256))
            elif kind == 1:
                data[pos:pos + 8] = struct.pack("<q", int(rng.choice([-1, 0, 1, 2**31, 2**62, 5, 64])))
            else:
                del data[pos:pos + int(rng.integers(1, 16))]
        path.write_bytes(bytes(data[:len(base) + 8]))
        codes.add(validate([str(path)]).exit_code)
    assert codes <= {0, 1, 2} and {1, 2} <= codes


@pytest.mark.parametrize("cores", [1, 2, 3])
def test_deep_scan_finds_bad_values(tmp_path, monkeypatch, cores):
    """NaN in F32 data, an inf fp16 scale in a Q8_0 block, an MXFP4 exponent of 0xFF: each found and placed, the
    file read as one stream per core."""
    monkeypatch.setattr("ggtools.jobs.validate.os.cpu_count", lambda: cores)
    t = B.sample_tensors() + [("blk.0.ffn_exps.weight", [64, 2], 39, 0, 2 * 2 * 17)]
    name, ne, ty, _, nb = t[-1]
    t[-1] = (name, ne, ty, B.pad(t[-2][3] + t[-2][4], 32), nb)
    data = bytearray(B.build(VALID_KVS, t))
    data_offset = len(data) - B.pad(t[-1][3] + nb, 32)
    assert validate([write(tmp_path, bytes(data))], deep=True).exit_code == 0
    data[data_offset + 4 * 5:data_offset + 4 * 6] = struct.pack("<f", float("nan"))          # F32 value 5
    q8 = data_offset + t[2][3]
    data[q8 + 3 * 34:q8 + 3 * 34 + 2] = struct.pack("<H", 0x7C00)                              # Q8_0 block 3
    mx = data_offset + t[3][3]
    data[mx + 2 * 17] = 0xFF                                                                     # MXFP4 block 2
    report = validate([write(tmp_path, bytes(data))], deep=True)
    messages = {p.where: p.rule for p in report.problems}
    assert report.exit_code == 1
    assert "first at value 5" in messages["tensor 'output_norm.weight'"]
    assert "first at block 3" in messages["tensor 'blk.0.ffn_up.weight'"]
    assert "first at block 2" in messages["tensor 'blk.0.ffn_exps.weight'"]
    assert len(report.problems) == 3


def test_tensor_shapes_are_checked_against_the_keys(tmp_path):
    """The sample's llama keys (n_embd 64, 8 heads, no key_length: heads of 64 / 8, no feed_forward_length: 0) give
    attn_q {64, 8 x 8} and ffn_up {64, 0} (llama.cpp's llama loader); its tensors are [64, 8] and [64, 4]: validate
    names both, quoting check_tensor_dims (src/llama-model-loader.cpp, shapes as llama_format_tensor_shape prints)."""
    report = validate([write(tmp_path, B.sample_file())])
    rules = {p.where: p.rule for p in report.errors if "wrong shape" in p.rule}
    assert report.exit_code == 1 and set(rules) == {"tensor 'blk.0.attn_q.weight'", "tensor 'blk.0.ffn_up.weight'"}
    # and the llama loader's other tensors are missing (src/models/llama.cpp asks for token_embd, attn_k, ...)
    missing = {p.where for p in report.errors if "is missing" in p.rule}
    assert {"tensor 'token_embd.weight'", "tensor 'blk.0.attn_k.weight'", "tensor 'blk.0.ffn_down.weight'"} <= missing
    assert "tensor 'output.weight'" not in missing          # TENSOR_NOT_REQUIRED: token_embd stands in
    assert rules["tensor 'blk.0.attn_q.weight'"].startswith("has wrong shape; expected [64, 64], got [64, 8]")
    assert rules["tensor 'blk.0.attn_q.weight'"].endswith(
        "(llama.cpp: \"check_tensor_dims: tensor 'blk.0.attn_q.weight' has wrong shape; expected     64,     64, "
        "got     64,      8,      1,      1\")")
    assert rules["tensor 'blk.0.ffn_up.weight'"].startswith("has wrong shape; expected [64, 0], got [64, 4]")
