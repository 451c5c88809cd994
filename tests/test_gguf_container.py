"""Parser and writer against real files and against gguf-py, an independent reader."""

import filecmp
import os

import gguf
import numpy as np
import pytest
from gguf import GGUFValueType as VT

from ggtools.gguf import GGUFError, GGUFFile, GGUFWriter, ShardSet
from ggtools.engine import rewrite_shard
from ggtools.plan import ShardPlan, copy_action


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_path):
    return gguf.GGUFReader(smollm2_path)


def test_real_files_round_trip_byte_for_byte(real_gguf_paths, tmp_path):
    for path in real_gguf_paths:
        out = tmp_path / os.path.basename(path)
        with GGUFFile(path) as f:
            plan = ShardPlan(path, str(out), [copy_action(t, "identity") for t in f.tensors])
        rewrite_shard(plan)
        assert filecmp.cmp(path, out, shallow=False), path


def test_parse_matches_gguf_py(smollm2_path, smollm2_reader):
    f = GGUFFile(smollm2_path)
    r = smollm2_reader
    keys = [k for k in r.fields if not k.startswith("GGUF.")]
    assert [kv.key for kv in f.kvs] == keys
    for kv in f.kvs:
        field = r.fields[kv.key]
        expected = field.contents()
        got = kv.value
        if isinstance(got, np.ndarray):
            assert np.array_equal(got, np.asarray(expected)), kv.key
        elif isinstance(got, float):
            assert np.float32(got) == np.float32(expected), kv.key
        else:
            assert got == expected, kv.key
        start, end = field.offset, field.offset + sum(p.nbytes for p in field.parts)
        assert (kv.start, kv.end) == (start, end), kv.key
    assert f.data_offset == r.data_offset
    for t, rt in zip(f.tensors, r.tensors):
        assert (t.name, list(t.ne), t.type_id, t.data_start, t.nbytes) == \
            (rt.name, [int(x) for x in rt.shape], int(rt.tensor_type), rt.data_offset, rt.n_bytes)
        assert np.array_equal(f.tensor_data(t), rt.data.reshape(-1).view(np.uint8))


def _written_sample(path, alignment=None):
    with GGUFWriter(path) as w:
        w.add_kv("general.architecture", VT.STRING, "container-test")    # no model: no hyperparameter rules
        if alignment:
            w.add_kv("general.alignment", VT.UINT32, alignment)
        w.add_kv("x.u8", VT.UINT8, 200)
        w.add_kv("x.i64", VT.INT64, -(2 ** 40))
        w.add_kv("x.f64", VT.FLOAT64, 0.1)
        w.add_kv("x.bool", VT.BOOL, True)
        w.add_kv("x.u32s", VT.ARRAY, [1, 2, 2 ** 32 - 1], VT.UINT32)
        w.add_kv("x.strs", VT.ARRAY, ["a", "ü", ""], VT.STRING)
        w.add_kv("x.empty", VT.ARRAY, [], VT.INT32)
        a = np.arange(48, dtype=np.float32).reshape(3, 16)
        b = np.arange(10, dtype=np.float16)
        w.add_tensor_info("a", (16, 3), 0, a.nbytes)
        w.add_tensor_info("b", (10,), 1, b.nbytes)
        w.write(a[:2].tobytes())         # streamed in two chunks
        w.write(a[2:].tobytes())
        w.write(b.tobytes())
    return a, b


@pytest.mark.parametrize("alignment", [None, 64, 8])
def test_writer_output_reads_identically_in_gguf_py(tmp_path, alignment):
    path = tmp_path / "w.gguf"
    a, b = _written_sample(path, alignment)
    r = gguf.GGUFReader(path)
    assert r.alignment == (alignment or 32)
    assert r.fields["x.u8"].contents() == 200
    assert r.fields["x.i64"].contents() == -(2 ** 40)
    assert r.fields["x.f64"].contents() == 0.1
    assert r.fields["x.bool"].contents() is True
    assert r.fields["x.u32s"].contents() == [1, 2, 2 ** 32 - 1]
    assert r.fields["x.u32s"].types == [VT.ARRAY, VT.UINT32]
    assert r.fields["x.strs"].contents() == ["a", "ü", ""]
    assert r.fields["x.empty"].contents() == []
    assert np.array_equal(r.tensors[0].data, a) and np.array_equal(r.tensors[1].data, b)
    for t in r.tensors:
        assert t.data_offset % (alignment or 32) == 0
    assert os.path.getsize(path) % (alignment or 32) == 0
    from ggtools.jobs.validate import validate
    assert validate([str(path)]).exit_code == 0


def test_writer_refuses_overwrite_and_leaves_nothing_on_error(tmp_path):
    path = tmp_path / "w.gguf"
    _written_sample(path)
    with pytest.raises(GGUFError, match="exists"):
        GGUFWriter(path)
    before = path.read_bytes()
    with pytest.raises(GGUFError, match="is 64 bytes; got 80"):
        with GGUFWriter(path, force=True) as w:
            w.add_kv("general.architecture", VT.STRING, "llama")
            w.add_tensor_info("a", (16,), 0, 64)
            w.write(bytes(80))
    assert path.read_bytes() == before
    assert os.listdir(tmp_path) == ["w.gguf"]


def test_writer_incomplete_tensor_is_an_error(tmp_path):
    with pytest.raises(GGUFError, match="closed with tensor 'a' at 4 of 64 bytes"):
        with GGUFWriter(tmp_path / "x.gguf") as w:
            w.add_tensor_info("a", (16,), 0, 64)
            w.write(bytes(4))
    assert not os.listdir(tmp_path)


@pytest.mark.oracle
def test_writer_output_loads_in_llama_cpp(tmp_path, smollm2_path):
    """Our identity rewrite of SmolLM2, with a non-default alignment, loads and generates in libllama."""
    llama_cpp = pytest.importorskip("llama_cpp")
    src = GGUFFile(smollm2_path)
    out = tmp_path / "smol-a64.gguf"
    with open(smollm2_path, "rb") as fh, GGUFWriter(out) as w:
        for kv in src.kvs:
            w.add_kv_record(kv)
        w.add_kv("general.alignment", VT.UINT32, 64)
        for t in src.tensors:
            w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
        for t in src.tensors:
            w.copy_from(fh.fileno(), t.data_start, t.nbytes)
    outs = []
    for p in (smollm2_path, out):
        llm = llama_cpp.Llama(str(p), n_ctx=64, n_threads=2, verbose=False)
        outs.append(llm("The capital of France is", max_tokens=8, temperature=0.0)["choices"][0]["text"])
        del llm
    assert outs[0] == outs[1]


def test_shard_set_discovery(tmp_path):
    for i in range(3):
        (tmp_path / f"m-{i + 1:05d}-of-00003.gguf").write_bytes(b"")
    s = ShardSet(tmp_path / "m-00002-of-00003.gguf")
    assert s.is_split and s.count == 3 and not s.missing
    assert [os.path.basename(p) for p in s.paths] == [f"m-{i:05d}-of-00003.gguf" for i in (1, 2, 3)]
    (tmp_path / "plain.gguf").write_bytes(b"")
    assert not ShardSet(tmp_path / "plain.gguf").is_split
    with pytest.raises(GGUFError, match="absent.gguf: not found"):
        ShardSet(tmp_path / "absent.gguf")
