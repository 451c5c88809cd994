"""Outputs written without --force never replace a file: an output that appears while a command writes it (another
run of the same command, another tool) is kept, and the command fails saying so; of several concurrent writers of
one output exactly one wins. With --force the last one wins, as asked. Temporary files and directories are
registered before they exist, so an interruption at any moment leaves none."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.gguf import GGUFFile, outputs
from ggtools.gguf.errors import GGUFError
from ggtools.jobs.convert import convert_dflash

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "ggtools" / "data" / "demo"
OTHER = b"written by another process meanwhile"


@pytest.fixture(scope="module")
def drafter(tmp_path_factory):
    d = tmp_path_factory.mktemp("drafter")
    target = shutil.copy(DEMO / "target.gguf", d / "target.gguf")
    convert_dflash(DEMO / "drafter", d / "drafter.gguf", profile="llama.cpp", target=target)
    return str(d / "drafter.gguf")


def test_commit_keeps_a_file_that_appeared(tmp_path):
    dst = tmp_path / "out.bin"
    out = outputs.AtomicOutput(dst)
    out.open().write(b"mine")
    dst.write_bytes(OTHER)
    with pytest.raises(GGUFError, match="output appeared while this command was writing it"):
        out.commit()
    assert dst.read_bytes() == OTHER and os.listdir(tmp_path) == ["out.bin"]


def test_commit_with_force_replaces_a_file_that_appeared(tmp_path):
    dst = tmp_path / "out.bin"
    out = outputs.AtomicOutput(dst, force=True)
    out.open().write(b"mine")
    dst.write_bytes(OTHER)
    out.commit()
    assert dst.read_bytes() == b"mine" and os.listdir(tmp_path) == ["out.bin"]


def test_a_stop_signal_between_placing_and_unlinking_leaves_only_the_output(tmp_path, monkeypatch):
    """A signal after link(2) gave the output its name but before the temporary name is removed (a worker's
    manifest write, stopped by the parent's SIGTERM): the output stays, complete, and the temporary file goes."""
    def link_then_interrupt(tmp, path):
        os.link(tmp, path)
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs, "_place_new", link_then_interrupt)
    dst = tmp_path / "out.bin"
    out = outputs.AtomicOutput(dst)
    out.open().write(b"mine")
    with pytest.raises(KeyboardInterrupt):
        out.commit()
    assert os.listdir(tmp_path) == ["out.bin"] and dst.read_bytes() == b"mine"
    assert out.tmp not in outputs._pending


def _another_writer_finishes_first(monkeypatch, out):
    """The commit of `out` finds it already written by someone else (a command's own temporary files, such as
    doctor --fix's trial before its re-check, are nobody else's to write)."""
    commit = outputs.AtomicOutput.commit

    def late_commit(self):
        if os.fspath(self.path) == os.fspath(out):
            Path(self.path).write_bytes(OTHER)
        commit(self)

    monkeypatch.setattr(outputs.AtomicOutput, "commit", late_commit)


@pytest.mark.parametrize("args", [
    ["convert", "gguf-layout", "{drafter}", "--to", "lucebox", "-o", "{out}"],
    ["doctor", "{drafter}", "--fix", "-o", "{out}"],
    ["quantize", "{drafter}", "-o", "{out}", "--scheme", "q8_0", "-q"],
    ["patch", "set", "{drafter}", "x.y=u8:1", "-o", "{out}"],
], ids=lambda a: " ".join(a[:2]))
def test_an_output_that_appeared_meanwhile_is_kept(drafter, tmp_path, monkeypatch, args):
    out = tmp_path / "out.gguf"
    _another_writer_finishes_first(monkeypatch, out)
    r = CliRunner().invoke(main, [a.format(drafter=drafter, out=out) for a in args])
    assert r.exit_code == 2, r.output
    assert r.stderr.splitlines() == [f"error: {out}: output appeared while this command was writing it (another "
                                     "process wrote it); it was left as it is: pass --force to overwrite it"]
    assert out.read_bytes() == OTHER and not [f for f in os.listdir(tmp_path) if ".partial-" in f]


@pytest.mark.slow
@pytest.mark.parametrize("args", [["convert", "gguf-layout", "{drafter}", "--to", "lucebox", "-o", "{out}"],
                                  ["doctor", "{drafter}", "--fix", "-o", "{out}"]], ids=lambda a: a[0])
def test_one_of_three_concurrent_writers_wins(drafter, tmp_path, args):
    """Three processes started together: one exits 0, the others 2 ("appeared", or "exists" when one finished
    before another began); the output is the winner's, complete."""
    out = tmp_path / "out.gguf"
    args = [sys.executable, "-m", "ggtools", *(a.format(drafter=drafter, out=out) for a in args)]
    procs = [subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(3)]
    results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
    codes = sorted(code for code, _ in results)
    assert codes == [0, 2, 2], results
    for code, stderr in results:
        if code:
            assert ("output appeared while" in stderr or "output exists" in stderr), stderr
    with GGUFFile(out) as f:
        assert f.tensors
    assert os.listdir(tmp_path) == ["out.gguf"]


def test_temporary_directory_is_registered_before_it_exists(tmp_path, monkeypatch):
    """An interruption between making the directory and entering its `with` leaves nothing: remove_pending
    (what the CLI runs on the way out) removes it."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(outputs.tempfile, "tempdir", None)
    made = outputs.temporary_directory("ggtools-test-")
    path = made.__enter__()
    (Path(path) / "f").write_bytes(b"x")
    outputs.remove_pending()
    assert os.listdir(tmp_path) == []
    made.__exit__(None, None, None)
