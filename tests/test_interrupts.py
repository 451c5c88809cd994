"""Interrupts and parallel runs: requant-trunk -j 2 and several `--shard K` runs at once, stopped by SIGINT (^C
to the whole process group) or SIGKILL, always finish with --resume: outputs byte-identical to an
uninterrupted run, a manifest listing every shard, no temporary file left.
"""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from ggtools.jobs.requant import plan_requant_trunk
from ggtools.samples import write_moe_set
from ggtools.engine import run_plan

SHARDS = 6
GGTOOLS = [sys.executable, "-m", "ggtools"]


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    """A 6-shard set (about 8 MB a shard) and the outputs of one uninterrupted run."""
    d = tmp_path_factory.mktemp("interrupts")
    paths = write_moe_set(str(d / "src" / "k"), layers=6, hidden=1024, ffn=512, experts=4, vocab=2048,
                          shards=SHARDS) if os.makedirs(d / "src") is None else None
    reference = d / "reference"
    run_plan(plan_requant_trunk(paths[0], str(reference)), jobs=1, progress=False, make_dirs=True)
    return paths, reference


def start(args):
    return subprocess.Popen(GGTOOLS + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def recorded(out) -> dict:
    try:
        return json.load(open(os.path.join(out, "k.ggtools.json")))["shards"]
    except (OSError, ValueError):
        return {}


def stop_after_first_shard(procs, out, sig):
    """Wait until one shard is recorded, then send sig to every process group (as ^C or kill -9 would)."""
    deadline = time.monotonic() + 300
    while not recorded(out):
        assert time.monotonic() < deadline and any(p.poll() is None for p in procs), \
            [p.communicate() for p in procs]
        time.sleep(0.02)
    running = [p for p in procs if p.poll() is None]
    assert running, "every run finished before the signal: make the sample set larger"
    for p in running:
        os.killpg(p.pid, sig)
    results = [(p, *p.communicate(timeout=120)) for p in procs]
    for p in running:
        wait_for_group_to_end(p.pid)
    return results


def wait_for_group_to_end(group):
    """Until no process of the group runs: a killed worker may still be finishing a write when its parent has
    gone (a rerun then rightly keeps its temporary file). Unreaped zombies do not count."""
    deadline = time.monotonic() + 60
    while any(stat[4] == str(group) and stat[2] not in "ZX" for stat in process_stats()):
        assert time.monotonic() < deadline, f"process group {group} still runs"
        time.sleep(0.02)


def process_stats():
    """Each process's /proc stat fields after the command name: [pid, name, state, ppid, pgrp, ...]."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            raw = open(f"/proc/{pid}/stat").read()
        except OSError:
            continue
        yield [pid, ""] + raw[raw.rindex(")") + 2:].split()


def resume_and_compare(moe, out, args=()):
    paths, reference = moe
    run = subprocess.run(GGTOOLS + ["requant-trunk", paths[0], "-o", str(out), "--resume", "-q", *args],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr
    names = sorted(os.path.basename(p) for p in paths)
    assert sorted(recorded(out)) == names                               # the manifest lists every shard
    assert sorted(p for p in os.listdir(out) if p.endswith(".gguf")) == names
    assert not [p for p in os.listdir(out) if "partial" in p]           # no temporary file left
    for name in names:
        assert open(os.path.join(out, name), "rb").read() == open(os.path.join(reference, name), "rb").read(), name
    ref = recorded(reference)
    assert {k: v["output"]["digest"] for k, v in recorded(out).items()} == \
           {k: v["output"]["digest"] for k, v in ref.items()}
    return run


@pytest.mark.slow
def test_sigint_during_parallel_run_then_resume(moe, tmp_path):
    out = tmp_path / "out"
    [(p, stdout, stderr)] = stop_after_first_shard([start(["requant-trunk", moe[0][0], "-o", str(out), "-j", "2",
                                                           "-q"])], out, signal.SIGINT)
    assert p.returncode == 130, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted") and "--resume" in lines[0], stderr
    assert "Traceback" not in stderr
    assert not [f for f in os.listdir(out) if "partial" in f]          # workers removed their temporary files
    for name in recorded(out):                                           # what is recorded is finished
        assert open(out / name, "rb").read() == open(moe[1] / name, "rb").read()
    resume_and_compare(moe, out)


@pytest.mark.slow
def test_sigkill_during_parallel_run_then_resume(moe, tmp_path):
    out = tmp_path / "out"
    [(p, _, _)] = stop_after_first_shard([start(["requant-trunk", moe[0][0], "-o", str(out), "-j", "2", "-q"])],
                                         out, signal.SIGKILL)
    assert p.returncode == -signal.SIGKILL
    resume_and_compare(moe, out)


@pytest.mark.slow
def test_parallel_shard_runs_fill_one_manifest(moe, tmp_path):
    """The documented cluster fan-out: one `--shard K` run per shard, all at once, into one directory."""
    out = tmp_path / "out"
    out.mkdir()
    procs = [start(["requant-trunk", moe[0][0], "-o", str(out), "--shard", str(k), "-q"]) for k in range(1, SHARDS + 1)]
    for p in procs:
        _, stderr = p.communicate(timeout=600)
        assert p.returncode == 0, stderr
    assert sorted(recorded(out)) == sorted(os.path.basename(p) for p in moe[0])
    run = resume_and_compare(moe, out)
    assert run.stdout.count("skipped (finished and intact)") == SHARDS


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGKILL])
def test_interrupted_shard_runs_then_resume(moe, tmp_path, sig):
    out = tmp_path / "out"
    out.mkdir()
    procs = [start(["requant-trunk", moe[0][0], "-o", str(out), "--shard", str(k), "-q"]) for k in range(1, SHARDS + 1)]
    for p, _, stderr in stop_after_first_shard(procs, out, sig):
        # -SIGINT: the signal came while the interpreter had no handler (starting up, or shutting down after
        # its shard was recorded); what matters is below: nothing half-written, and --resume finishes the set
        assert p.returncode in (0, 130, -signal.SIGINT, -signal.SIGKILL), stderr
        assert "Traceback" not in stderr
    resume_and_compare(moe, out)
