"""Interrupts and parallel runs: requant-trunk -j 2 and several `--shard K` runs at once, stopped by SIGINT (^C
to the whole process group), SIGTERM, SIGHUP or SIGKILL, always finish with --resume: outputs byte-identical to
an uninterrupted run, a manifest listing every shard, no temporary file left. accept, demo, convert gguf-layout,
convert mtp and doctor --fix stopped by SIGTERM, SIGHUP or SIGINT exit 128 + n with one line and leave nothing behind.
"""

import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ggtools.jobs.requant import plan_requant_trunk
from ggtools.samples import write_moe_set
from ggtools.engine import run_plan
from tests.hostile_corpus import snapshot
from tests.mtp_files import write_qwen35_mtp
from tests.stalled_cli import stop_while_stalled

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


# ---- SIGTERM and SIGHUP end a command as ^C does ----------------------------------------------------------------

DEMO = Path(__file__).resolve().parents[1] / "ggtools" / "data" / "demo"
COMMIT = "ggtools.gguf.outputs:AtomicOutput.commit"
STOPPED = {  # command -> (args, the function it is stalled in when the signal comes: what exists then)
    "accept": (["accept", "--target", "{target}", "--draft", "{hf}", "-n", "4", "-q"],   # the converted HF drafter
               "ggtools.jobs.accept:measure"),
    "demo": (["demo", "--skip-requant", "--prompts", "1", "-n", "4", "--rounds", "1"],   # 5 drafter GGUFs
             "ggtools.jobs.demo:measure"),
    "gguf-layout": (["convert", "gguf-layout", "{drafter}", "--to", "lucebox", "-o", "{out}/l.gguf"], COMMIT),
    "doctor-fix": (["doctor", "{drafter}", "--fix", "-o", "{out}/f.gguf"], COMMIT),      # the .partial-PID file
    "convert-mtp": (["convert", "mtp", "{mtp}", "-o", "{out}/m.gguf"], COMMIT),           # issue 41: the sidecar
}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from ggtools.jobs.convert import convert_dflash
    d = tmp_path_factory.mktemp("pair")
    files = {"target": shutil.copy(DEMO / "target.gguf", d / "target.gguf"),
             "hf": shutil.copytree(DEMO / "drafter", d / "hf")}
    files["drafter"] = str(d / "drafter.gguf")
    convert_dflash(files["hf"], files["drafter"], profile="llama.cpp", target=files["target"])
    files["mtp"] = write_qwen35_mtp(d / "mtp.gguf")                 # a target with its MTP block (convert mtp)
    return d, {k: str(v) for k, v in files.items()}


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
@pytest.mark.parametrize("name", STOPPED)
def test_stop_signal_leaves_nothing_behind(pair, tmp_path, name, sig):
    """SIGTERM (kill, a CI timeout), SIGHUP (a closed terminal) and ^C: exit 128 + n, one line, no temporary
    directory, no partial or final output, inputs unchanged."""
    root, files = pair
    out = tmp_path / "out"
    out.mkdir()
    args, stalled = STOPPED[name]
    before = snapshot(root)
    p, stderr, tmp, seen = stop_while_stalled([a.format(out=out, **files) for a in args], stalled, sig, tmp_path,
                                              look=out)
    assert seen, "nothing temporary existed when the signal came: stall a later function"
    assert p.returncode == 128 + sig, stderr
    expected = "error: interrupted" + ("" if sig == signal.SIGINT else f" by {sig.name}")
    assert stderr.splitlines() == [expected], stderr
    assert os.listdir(tmp) == [] and os.listdir(out) == []
    assert snapshot(root) == before


def test_sigterm_during_an_output_write_removes_the_partial_file(pair, tmp_path):
    """The fast suite's case of the above: convert gguf-layout stopped with its .partial-PID file open."""
    _, files = pair
    out = tmp_path / "out"
    out.mkdir()
    p, stderr, _, seen = stop_while_stalled(["convert", "gguf-layout", files["drafter"], "--to", "lucebox", "-o",
                                             str(out / "l.gguf")], COMMIT, signal.SIGTERM, tmp_path, look=out)
    assert [f for f in seen if f.startswith(".l.gguf.partial-")] == seen != []
    assert (p.returncode, stderr.splitlines()) == (143, ["error: interrupted by SIGTERM"])
    assert os.listdir(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_during_parallel_run_then_resume(moe, tmp_path, sig):
    """As ^C: workers remove their temporary files, the finished shards are recorded, --resume finishes."""
    out = tmp_path / "out"
    [(p, _, stderr)] = stop_after_first_shard([start(["requant-trunk", moe[0][0], "-o", str(out), "-j", "2",
                                                      "-q"])], out, sig)
    assert p.returncode == 128 + sig, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted") and "--resume" in lines[0], stderr
    assert not [f for f in os.listdir(out) if "partial" in f]
    resume_and_compare(moe, out)


def test_an_interruption_swallowed_in_a_c_callback_comes_again(capfd):
    """Python drops an exception raised in a callback from C (llvmlite's, while numba compiles) and prints it as
    'Exception ignored': the signal is raised again once the main thread is back in Python code, silently."""
    from ggtools.cli.signals import Stopped, stop_signals_interrupt

    callback = ctypes.CFUNCTYPE(None)(lambda: (signal.raise_signal(signal.SIGTERM), time.sleep(0.01)))
    with stop_signals_interrupt() as state:
        with pytest.raises(Stopped):
            callback()
            assert state.swallowed
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                time.sleep(0.01)
    assert state.signum == signal.SIGTERM
    assert "Exception ignored" not in capfd.readouterr().err


def test_sigint_after_the_command_ends_the_process_without_a_traceback(pair, tmp_path):
    """A ^C that comes after the command finished, while the interpreter exits (here from an atexit hook, as it
    came in a CI run's shard process), ends the process by the signal: no KeyboardInterrupt traceback from the
    teardown, the finished output kept."""
    _, files = pair
    out = tmp_path / "l.gguf"
    code = ("import atexit, os, signal, sys, time\n"
            "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(5)))\n"
            "from ggtools.cli import entry\n"
            f"sys.argv = ['ggtools', 'convert', 'gguf-layout', {files['drafter']!r}, '--to', 'lucebox', '-o', "
            f"{str(out)!r}]\n"
            "entry()\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGINT, p.stderr
    assert "Traceback" not in p.stderr and "KeyboardInterrupt" not in p.stderr, p.stderr
    assert out.exists()
