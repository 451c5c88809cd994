"""An OS error on output is an input error: one line naming the path and the OS reason, exit 2, no partial file,
inputs unchanged; for every command that writes.

EFBIG comes from the kernel: each command runs in a child process under RLIMIT_FSIZE (Python ignores
SIGXFSZ, so the write fails with EFBIG). ENOSPC and EROFS are raised by the output file in-process. EACCES
comes from a directory the process cannot write: a chmod-ed one, or /sys when running as root (root ignores
file modes).
"""

import errno
import os
import resource
import shutil
import subprocess
import sys

import pytest

from ggtools.gguf import outputs
from tests.hostile_corpus import build_corpus, check_run, snapshot


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("os-errors"))


WRITERS = {   # command -> (args, the output path); the output of each is larger than 64 KiB
    "convert": (["convert", "dflash", "{hf}", "--target-gguf", "{target}", "-o", "{out}/d.gguf"], "{out}/d.gguf"),
    "quantize": (["quantize", "{target}", "-o", "{out}/q.gguf", "--scheme", "q8_0", "-q"], "{out}/q.gguf"),
    "requant-trunk": (["requant-trunk", "{set}", "-o", "{out}/rq", "-q"], "{out}/rq"),
    "patch": (["patch", "set", "{target}", "x.y=u8:1", "-o", "{out}/p.gguf"], "{out}/p.gguf"),
    "validate --write-manifest": (["validate", "--write-manifest", "{out}/m.json", "{target}"], "{out}/m.json"),
    "demo --work-dir": (["demo", "--work-dir", "{out}/demo", "--skip-requant", "--prompts", "1", "-n", "4"],
                        "{out}/demo"),
    "convert mtp": (["convert", "mtp", "{q35_mtp}", "-o", "{out}/m.gguf", "-q"], "{out}/m.gguf"),
    "convert mtp --strip": (["convert", "mtp", "--strip", "{q35_mtp_set}", "-o", "{out}/s.gguf", "-q"],
                            "{out}/s-00001-of-00002.gguf"),
}


def fill(items, corpus, out):
    return [x.format(out=out, **corpus) for x in items]


def limit_file_size(n):
    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (n, n))


@pytest.mark.parametrize("name", WRITERS)
def test_file_size_limit(corpus, tmp_path, name):
    """The kernel refuses to grow a file past RLIMIT_FSIZE (EFBIG): one line, exit 2, nothing left behind."""
    args, _ = WRITERS[name]
    limit = 512 if name.startswith("validate") else 64 << 10
    before = snapshot(corpus["root"])
    run = subprocess.run([sys.executable, "-m", "ggtools", *fill(args, corpus, tmp_path)], capture_output=True,
                         text=True, timeout=600, preexec_fn=limit_file_size(limit))
    assert run.returncode == 2, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and "cannot write: File too large" in lines[0], run.stderr
    assert snapshot(corpus["root"]) == before
    left = [os.path.join(d, f) for d, _, files in os.walk(tmp_path) for f in files]
    if name.startswith("demo"):         # the work directory keeps the files finished before the error
        left = [p for p in left if ".partial-" in p]
    assert left == [], left


class FullDisk:
    """An output file whose writes fail with ENOSPC once `room` bytes are written."""

    def __init__(self, fh, room):
        self._fh, self._room = fh, room

    def write(self, data):
        n = memoryview(data).nbytes
        if n > self._room:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room -= n
        return self._fh.write(data)

    def __getattr__(self, name):
        return getattr(self._fh, name)


def full_disk_open(path, mode):
    return FullDisk(open(path, mode), 1000) if "w" in mode else open(path, mode)


def read_only_open(path, mode):
    if "w" in mode:
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
    return open(path, mode)


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS])
@pytest.mark.parametrize("name", ["convert", "validate --write-manifest", "patch", "quantize", "convert mtp",
                                  "convert mtp --strip"])
def test_full_or_read_only_disk(corpus, tmp_path, monkeypatch, name, code):
    monkeypatch.setattr(outputs, "open", full_disk_open if code == errno.ENOSPC else read_only_open, raising=False)
    args, _ = WRITERS[name]
    check_run(str(tmp_path), fill(args, corpus, tmp_path), 2, fragment=f"cannot write: {os.strerror(code)}")
    assert os.listdir(tmp_path) == []


def unwritable_dir(tmp_path) -> str:
    """A directory this process cannot create files in."""
    if os.geteuid() != 0:
        d = tmp_path / "locked"
        d.mkdir(mode=0o555)
        return str(d)
    try:                        # root ignores modes; sysfs refuses new files even to root
        os.close(os.open("/sys/.ggtools-probe", os.O_CREAT | os.O_WRONLY, 0o600))
    except OSError as e:
        if e.errno in (errno.EACCES, errno.EPERM):
            return "/sys"
        raise
    os.unlink("/sys/.ggtools-probe")
    pytest.skip("running as root with a writable /sys: no directory refuses writes here")


@pytest.mark.parametrize("name", [n for n in WRITERS if n != "demo --work-dir"])
def test_permission_denied(corpus, tmp_path, monkeypatch, name):
    locked = unwritable_dir(tmp_path)
    plenty = shutil._ntuple_diskusage(1 << 50, 0, 1 << 50)       # /sys reports no free space: not this test
    monkeypatch.setattr(shutil, "disk_usage", lambda path: plenty)
    args, _ = WRITERS[name]
    result = check_run(str(tmp_path), fill(args, corpus, locked), 2)
    assert locked in result.stderr and ("Permission denied" in result.stderr or "not permitted" in result.stderr)
