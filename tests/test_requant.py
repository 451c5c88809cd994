"""requant-trunk on a synthetic Kimi-like shard set: copies identical, conversions exact, resume, preflight."""

import collections
import json
import os
import shutil
import subprocess
import sys

import gguf
import numpy as np
import pytest
from click.testing import CliRunner

from ggtools.engine import runner as shard_runner
from ggtools.cli import main
from ggtools.engine import RewriteError
from ggtools.gguf import GGUFFile
from ggtools.jobs.requant import plan_requant_trunk
from ggtools.quants import quantize
from ggtools.samples import write_moe_set
from ggtools.engine import run_plan

T = gguf.GGMLQuantizationType


@pytest.fixture(scope="module")
def moe_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    return write_moe_set(str(d / "kimi"), layers=3, hidden=512, ffn=256, experts=4, vocab=1024,
                                     shards=3)


def requant(paths, out, *args):
    result = CliRunner().invoke(main, ["requant-trunk", paths[0], "-o", str(out), "-q", *args])
    assert result.exit_code == 0, result.output
    return [os.path.join(out, os.path.basename(p)) for p in paths]


def test_plan_decisions(moe_set, tmp_path):
    plan = plan_requant_trunk(moe_set[1], str(tmp_path))
    actions = {a.name: a for s in plan.shards for a in s.tensors}
    assert len(plan.shards) == 3
    for name, a in actions.items():
        if "_exps" in name or name.endswith("norm.weight") or "gate_inp" in name or "attn_k_b" in name:
            assert a.action == "copy", name
        else:
            assert (a.action, a.src_type, a.dst_type) == ("convert", T.Q8_0, T.Q4_K), name
    assert "not divisible by 256" in actions["blk.0.attn_k_b.weight"].reason


def test_requant_output(moe_set, tmp_path):
    outs = requant(moe_set, tmp_path)
    for src_path, out_path in zip(moe_set, outs):
        src, out = gguf.GGUFReader(src_path), gguf.GGUFReader(out_path)      # independent reader
        assert [f for f in src.fields] == [f for f in out.fields]
        for key in src.fields:
            if not key.startswith("GGUF."):
                assert src.fields[key].contents() == out.fields[key].contents()
        assert [t.name for t in src.tensors] == [t.name for t in out.tensors]
        for s, o in zip(src.tensors, out.tensors):
            if s.tensor_type == T.Q8_0 and s.shape[0] % 256 == 0:
                assert o.tensor_type == T.Q4_K
                expected = quantize(T.Q4_K, gguf.quants.dequantize(s.data, T.Q8_0))
                assert np.array_equal(o.data.reshape(-1), expected.reshape(-1)), s.name
            else:
                assert o.tensor_type == s.tensor_type
                assert bytes(o.data.reshape(-1).view(np.uint8)) == bytes(s.data.reshape(-1).view(np.uint8)), s.name
    result = CliRunner().invoke(main, ["validate", "--deep", outs[0]])
    assert result.exit_code == 0, result.output


@pytest.mark.oracle
def test_conversion_equals_ggml(moe_set, tmp_path):
    from tests.ggml_oracle import load_ggml
    ggml = load_ggml()
    outs = requant(moe_set, tmp_path)
    src, out = gguf.GGUFReader(moe_set[0]), gguf.GGUFReader(outs[0])
    for s, o in zip(src.tensors, out.tensors):
        if o.tensor_type == T.Q4_K:
            ref = ggml.quantize(T.Q4_K, gguf.quants.dequantize(s.data, T.Q8_0))
            assert np.array_equal(o.data.reshape(-1), ref.reshape(-1)), s.name


def test_parallel_equals_serial(moe_set, tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = requant(moe_set, tmp_path / "a", "-j", "1")
    b = requant(moe_set, tmp_path / "b", "-j", "2")
    for x, y in zip(a, b):
        assert open(x, "rb").read() == open(y, "rb").read()


WORKER_START = """
import sys, multiprocessing
import numpy as np
from gguf import GGMLQuantizationType as T
from ggtools import quants
from ggtools.engine import runner as shard_runner
from ggtools.jobs.requant import plan_requant_trunk
methods, get_context = [], multiprocessing.get_context


def recording_get_context(method=None):
    if method:
        methods.append(method)
    return get_context(method)


shard_runner.multiprocessing.get_context = recording_get_context
if sys.argv[3] == "after-kernels":
    quants.quantize(T.Q8_0, np.zeros((64, 32), np.float32))   # starts the thread pool
shard_runner.run_plan(plan_requant_trunk(sys.argv[1], sys.argv[2]), jobs=2, progress=False, make_dirs=True)
print(methods[0])
"""


@pytest.mark.parametrize("when, method", [("fresh", "fork"), ("after-kernels", "spawn")])
def test_parallel_workers_fork_only_before_numba_threads(moe_set, tmp_path, when, method):
    """Workers are forked (no re-import) unless numba's OpenMP pool already runs in this process."""
    serial = requant(moe_set, tmp_path / "serial", "-j", "1")
    run = subprocess.run([sys.executable, "-c", WORKER_START, moe_set[0], str(tmp_path / "par"), when],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split()[-1] == method
    for x in serial:
        assert open(x, "rb").read() == open(tmp_path / "par" / os.path.basename(x), "rb").read()


WORKER_PIDS = """
import os, signal, sys
from ggtools.engine import EngineError, runner as shard_runner
from ggtools.jobs.requant import plan_requant_trunk
real, kill = shard_runner.rewrite_shard, sys.argv[3]


def recording(shard, **kw):      # the workers are forked: they run this too
    with open(sys.argv[2] + ".pids", "a") as fh:
        fh.write(f"{os.getpid()}\\n")
    if kill != "none" and shard.dst.endswith(kill):
        os.kill(os.getpid(), signal.SIGKILL)
    return real(shard, **kw)


shard_runner.rewrite_shard = recording
try:
    shard_runner.run_plan(plan_requant_trunk(sys.argv[1], sys.argv[2]), jobs=2, progress=False, make_dirs=True)
except EngineError as e:
    print(e)
"""


def run_workers(moe_set, out, kill="none") -> tuple[str, set[str]]:
    run = subprocess.run([sys.executable, "-c", WORKER_PIDS, moe_set[0], str(out), kill], capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    with open(f"{out}.pids") as fh:
        return run.stdout, set(fh.read().split())


def test_a_worker_writes_shard_after_shard(moe_set, tmp_path):
    """-j 2 on 3 shards: two worker processes, one of them writing two shards (its kernels loaded once)."""
    serial = requant(moe_set, tmp_path / "serial", "-j", "1")
    said, pids = run_workers(moe_set, tmp_path / "par")
    assert said == "" and len(pids) == 2
    for x in serial:
        assert open(x, "rb").read() == open(tmp_path / "par" / os.path.basename(x), "rb").read()


def test_a_killed_worker_fails_its_shard_only(moe_set, tmp_path):
    """A worker killed while writing shard 2: that shard fails, naming the signal; the others are written and
    recorded, and --resume writes shard 2."""
    serial = requant(moe_set, tmp_path / "serial", "-j", "1")
    out = tmp_path / "par"
    said, _ = run_workers(moe_set, out, kill="00002-of-00003.gguf")
    assert "the worker process died (signal 9) before finishing this shard" in said
    with open(out / "kimi.ggtools.json") as fh:
        assert sorted(json.load(fh)["shards"]) == ["kimi-00001-of-00003.gguf", "kimi-00003-of-00003.gguf"]
    requant(moe_set, out, "--resume")
    for x in serial:
        assert open(x, "rb").read() == open(out / os.path.basename(x), "rb").read()


def test_resume_after_a_crash(moe_set, tmp_path, monkeypatch):
    plan = plan_requant_trunk(moe_set[0], str(tmp_path))
    real = shard_runner.rewrite_shard
    calls = collections.Counter()
    killed = subprocess.Popen(["true"])      # the pid of a process that no longer runs
    killed.wait()
    stale = f".kimi-00002-of-00003.gguf.partial-{killed.pid}"

    def crash_on_second(shard, **kw):
        calls[os.path.basename(shard.dst)] += 1
        if shard is plan.shards[1]:
            with open(os.path.join(tmp_path, stale), "wb") as fh:
                fh.write(b"half a shard")     # what a killed process leaves behind
            raise RewriteError("simulated crash")
        return real(shard, **kw)

    monkeypatch.setattr(shard_runner, "rewrite_shard", crash_on_second)
    with pytest.raises(RewriteError, match="simulated crash"):
        run_plan(plan, jobs=1, progress=False)
    assert sorted(os.listdir(tmp_path)) == sorted([stale, "kimi-00001-of-00003.gguf",
                                                   "kimi-00003-of-00003.gguf", "kimi.ggtools.json"])
    monkeypatch.setattr(shard_runner, "rewrite_shard", real)
    report = run_plan(plan_requant_trunk(moe_set[0], str(tmp_path)), jobs=1, resume=True, progress=False)
    assert [os.path.basename(p) for p in report.skipped] == ["kimi-00001-of-00003.gguf", "kimi-00003-of-00003.gguf"]
    assert [os.path.basename(p) for p in report.done] == ["kimi-00002-of-00003.gguf"]
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]
    (tmp_path / "fresh").mkdir()
    fresh = requant(moe_set, tmp_path / "fresh")
    for p in fresh:
        assert open(p, "rb").read() == open(tmp_path / os.path.basename(p), "rb").read()


def test_resume_redoes_a_damaged_output(moe_set, tmp_path):
    outs = requant(moe_set, tmp_path)
    with open(outs[2], "r+b") as fh:
        fh.seek(-40, os.SEEK_END)
        fh.write(b"\xff")
    report = run_plan(plan_requant_trunk(moe_set[0], str(tmp_path)), jobs=1, resume=True, progress=False)
    assert [os.path.basename(p) for p in report.done] == ["kimi-00003-of-00003.gguf"]


def test_single_shard_job(moe_set, tmp_path):
    requant(moe_set, tmp_path, "--shard", "2")
    assert sorted(os.listdir(tmp_path)) == ["kimi-00002-of-00003.gguf", "kimi.ggtools.json"]


def test_without_write_behind(moe_set, tmp_path, monkeypatch):
    """Where the system has no sync_file_range the outputs are the same and still verify."""
    from ggtools.gguf import writer
    with_it = requant(moe_set, tmp_path / "with")
    monkeypatch.setattr(writer, "SYNC_FILE_RANGE", None)
    without = requant(moe_set, tmp_path / "without", "-j", "1")
    for a, b in zip(with_it, without):
        assert open(a, "rb").read() == open(b, "rb").read()


def test_refuses_when_disk_too_small(moe_set, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda d: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(tmp_path), "-q"])
    assert result.exit_code == 2 and "not enough disk space" in result.output
    assert os.listdir(tmp_path) == []


def test_output_directory_is_made_by_the_run_not_by_a_dry_run_or_a_refusal(moe_set, tmp_path, monkeypatch):
    out = tmp_path / "new" / "dir"
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(out), "--dry-run", "-q"])
    assert result.exit_code == 0 and "the output fits" in result.output, result.output
    assert not (tmp_path / "new").exists()
    with monkeypatch.context() as m:
        m.setattr(shutil, "disk_usage", lambda d: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
        result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(out), "-q"])
        assert result.exit_code == 2 and "not enough disk space" in result.output
    assert not (tmp_path / "new").exists()
    outs = requant(moe_set, out)
    assert all(os.path.exists(p) for p in outs)
    (tmp_path / "a-file").write_text("x")
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(tmp_path / "a-file")])
    assert result.exit_code == 2, result.output


def test_refuses_to_overwrite_and_to_write_over_the_input(moe_set, tmp_path):
    requant(moe_set, tmp_path)
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(tmp_path), "-q"])
    assert result.exit_code == 2 and "output exists" in result.output
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", os.path.dirname(moe_set[0])])
    assert result.exit_code == 2 and "input's directory" in result.output


def test_copied_tensor_written_out_of_place_fails_verification(moe_set, tmp_path, monkeypatch):
    """If a copy's bytes do not land where the output's header places the tensor, the shard fails loudly (the single
    pass hashes what it writes; verification proves it wrote it where a reader looks)."""
    from ggtools.engine import output
    real = output.ShardOutput.tensor_sink

    def misplaced(self, name):
        sink = real(self, name)
        if "_exps" in name:
            sink.offset += self.layout.alignment
        return sink

    monkeypatch.setattr(output.ShardOutput, "tensor_sink", misplaced)
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(tmp_path), "-q", "-j", "1"])
    assert result.exit_code == 1 and "was not written where the output's header places it" in result.output
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".gguf")]    # verified before the rename


# ---- against llama-quantize's surgical recipe on a real qwen35moe (tests/oracle_artifacts.py) ----------

def _tensor_bytes(path):
    """(name, the tensor info's bytes as written but the offset, the data) per tensor."""
    with GGUFFile(path) as f:
        return [(t.name, bytes(f.buf[t.info_start:t.info_end - 8]), bytes(f.tensor_data(t))) for t in f.tensors]


@pytest.mark.oracle
def test_matches_llama_quantize_surgical_reference(qwen35moe_set, tmp_path):
    """llama-quantize --allow-requantize --pure --tensor-type _exps=mxfp4 Q4_K_M on the MXFP4_MOE model:
    our requant-trunk output has byte-identical tensor infos (but the offsets) and data for every tensor, and loads in
    llama.cpp."""
    from tests.oracle_artifacts import llama_greedy, llama_loads
    import shutil as sh
    src_dir = tmp_path / "src"
    src_dir.mkdir()
    src = src_dir / "tiny-qwen35moe.gguf"
    sh.copyfile(qwen35moe_set.mxfp4_moe, src)
    out = requant([str(src)], tmp_path)[0]
    assert _tensor_bytes(out) == _tensor_bytes(qwen35moe_set.surgical)
    assert llama_loads(out)
    assert llama_greedy(out, [1, 5, 9, 200], 8) == llama_greedy(qwen35moe_set.surgical, [1, 5, 9, 200], 8)


@pytest.mark.oracle
def test_matches_reference_on_a_split_set(qwen35moe_set, tmp_path):
    outs = requant([str(p) for p in qwen35moe_set.split], tmp_path)
    assert [os.path.basename(p) for p in outs] == [os.path.basename(p) for p in qwen35moe_set.split]
    ours = [x for p in outs for x in _tensor_bytes(p)]
    ref = [x for p in qwen35moe_set.split_surgical for x in _tensor_bytes(p)]
    assert sorted(ours) == sorted(ref)
    for src, out in zip(qwen35moe_set.split, outs):            # split-in = split-out: same tensors per shard
        assert [t[0] for t in _tensor_bytes(src)] == [t[0] for t in _tensor_bytes(out)]
    from tests.oracle_artifacts import llama_loads
    assert llama_loads(outs[0])
