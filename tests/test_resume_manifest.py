"""The resume manifest and the shard runner: entries added by many processes at once are all kept, an interrupt
leaves finished shards recorded and nothing half-written, --resume redoes what is not recorded, -j never
starts more workers than shards, temporary files of killed runs are removed by the next run."""

import json
import multiprocessing
import os
import shutil
import subprocess
import time

import pytest
from click.testing import CliRunner

from ggtools.engine import manifest as resume_manifest
from ggtools.engine import runner as shard_runner
from ggtools.cli import main
from ggtools.jobs.requant import plan_requant_trunk
from ggtools.samples import write_moe_set
from ggtools.engine import Interrupted, run_plan
from ggtools.gguf import outputs
from tests.hostile_corpus import DEMO


@pytest.fixture(scope="module")
def moe_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("moe")
    return write_moe_set(str(d / "k"), layers=2, hidden=256, ffn=256, experts=2, vocab=256, shards=3)


def _record(path, name):
    resume_manifest.record(path, name, {"fingerprint": name, "source": {}, "output": {"size": 1, "digest": name}})


def test_concurrent_records_are_all_kept(tmp_path):
    """Twelve processes add an entry each at the same moment: the lock and the re-read keep every one."""
    path = str(tmp_path / "m.ggtools.json")
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_record, args=(path, f"s{i}")) for i in range(12)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert sorted(resume_manifest.read_entries(path)) == sorted(f"s{i}" for i in range(12))
    assert os.listdir(tmp_path) == ["m.ggtools.json"]


def test_interrupt_keeps_finished_shards_and_resume_finishes(moe_set, tmp_path, monkeypatch):
    real = shard_runner.rewrite_shard
    plan = plan_requant_trunk(moe_set[0], str(tmp_path))

    def interrupt_second(shard, **kw):
        if shard.dst == plan.shards[1].dst:
            raise KeyboardInterrupt
        return real(shard, **kw)

    monkeypatch.setattr(shard_runner, "rewrite_shard", interrupt_second)
    with pytest.raises(Interrupted, match="1 of 3 shard.* recorded .*rerun with --resume") as e:
        run_plan(plan, jobs=1, progress=False)
    assert e.value.exit_code == 130
    assert sorted(os.listdir(tmp_path)) == ["k-00001-of-00003.gguf", "k.ggtools.json"]
    monkeypatch.setattr(shard_runner, "rewrite_shard", real)
    report = run_plan(plan_requant_trunk(moe_set[0], str(tmp_path)), jobs=1, resume=True, progress=False)
    assert [os.path.basename(p) for p in report.skipped] == ["k-00001-of-00003.gguf"]
    assert sorted(resume_manifest.read_entries(report.manifest)) == [os.path.basename(p) for p in moe_set]


def test_resume_redoes_an_output_that_was_never_recorded(moe_set, tmp_path):
    """What a run killed between the rename and the record leaves: --resume replaces it, no --force needed."""
    fresh = tmp_path / "fresh"
    run_plan(plan_requant_trunk(moe_set[0], str(fresh)), jobs=1, progress=False, make_dirs=True)
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(fresh / "k-00002-of-00003.gguf", out)
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(out), "-q"])
    assert result.exit_code == 2 and "pass --force to overwrite it, or --resume" in result.stderr
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(out), "-q", "--resume"])
    assert result.exit_code == 0, result.stderr
    for p in moe_set:
        name = os.path.basename(p)
        assert open(out / name, "rb").read() == open(fresh / name, "rb").read()


def test_jobs_are_capped_at_the_number_of_shards(moe_set, tmp_path, monkeypatch):
    started = []
    real = multiprocessing.get_context

    class Counting:
        def __init__(self, method=None):
            self._ctx = real(method)

        def Process(self, *args, **kw):  # noqa: N802  (the context's name)
            started.append(self._ctx.Process(*args, **kw))
            return started[-1]

        def __getattr__(self, name):
            return getattr(self._ctx, name)

    monkeypatch.setattr(shard_runner.multiprocessing, "get_context", Counting)
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(tmp_path), "-q", "-j", "1000"])
    assert result.exit_code == 0, result.stderr
    assert len(started) == len(moe_set)


def test_temporary_files_of_killed_runs_are_removed(tmp_path):
    """`patch` killed with SIGKILL leaves `.NAME.partial-PID`; the next run over that output removes it."""
    dead = multiprocessing.get_context("fork").Process(target=os.getpid)
    dead.start()
    dead.join()
    stale = tmp_path / f".p.gguf.partial-{dead.pid}"
    stale.write_bytes(b"half a file")
    target = os.path.join(DEMO, "target.gguf")
    result = CliRunner().invoke(main, ["patch", "set", target, "x.y=u8:1", "-o", str(tmp_path / "p.gguf")])
    assert result.exit_code == 0, result.stderr
    assert os.listdir(tmp_path) == ["p.gguf"]


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="process states are read from /proc")
def test_temporary_files_of_unreaped_killed_processes_are_removed(tmp_path):
    """A worker killed with its run stays a zombie until reaped, and kill(pid, 0) still finds it: its temporary
    file is stale all the same (`requant-trunk -j 2` killed with SIGKILL, then --resume)."""
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while open(f"/proc/{zombie.pid}/stat", "rb").read().rpartition(b")")[2][1:2] != b"Z":
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:
        stale = tmp_path / f".p.gguf.partial-{zombie.pid}"
        stale.write_bytes(b"half a file")
        outputs.remove_stale_temps(tmp_path / "p.gguf")
        assert not stale.exists()
    finally:
        zombie.wait()


def test_disk_check_speaks_human_units(moe_set, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "disk_usage", lambda d: shutil._ntuple_diskusage(10 ** 12, 10 ** 12 - 5000, 5000))
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(tmp_path / "o"), "-q"])
    assert result.exit_code == 2
    assert "not enough disk space: the output needs" in result.stderr and "MiB, 4.88 KiB are free" in result.stderr
    assert "GB" not in result.stderr and not os.path.exists(tmp_path / "o")


def test_manifest_of_a_resumed_run_is_not_a_json_list(moe_set, tmp_path):
    (tmp_path / "k.ggtools.json").write_text(json.dumps([1, 2]))
    result = CliRunner().invoke(main, ["requant-trunk", moe_set[0], "-o", str(tmp_path), "-q", "--resume"])
    assert result.exit_code == 2 and "not a ggtools rewrite manifest" in result.stderr
    assert os.listdir(tmp_path) == ["k.ggtools.json"]
