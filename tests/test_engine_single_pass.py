"""The engine's single pass (engine/rewrite.py, engine/output.py, gguf/readahead.py): every input byte read once and
every output byte written once, the manifest's digests those of the bytes written (and, for copies, of the source's
bytes), the same output whatever the threads and workers; read-ahead in order, bounded, failing in one line."""

import hashlib
import json
import os
import threading

import gguf
import pytest

from ggtools.engine import run_plan
from ggtools.gguf import GGUFError
from ggtools.gguf.readahead import Piece, read_ahead, split
from ggtools.jobs.requant import plan_requant_trunk
from ggtools.samples import write_moe_set


@pytest.fixture(scope="module")
def moe_set(tmp_path_factory):
    d = tmp_path_factory.mktemp("single-pass")
    return write_moe_set(str(d / "kimi"), layers=2, hidden=1024, ffn=512, experts=16, vocab=1024, shards=2)


def io_counters() -> dict[str, int]:
    with open("/proc/self/io") as f:
        return {k: int(v) for k, v in (line.split(": ") for line in f)}


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's per-process I/O counters")
def test_every_byte_read_once_and_written_once(moe_set, tmp_path):
    plan = plan_requant_trunk(moe_set[0], str(tmp_path / "warm-up"))
    run_plan(plan, jobs=1, progress=False, make_dirs=True)       # kernels loaded, imports done
    plan = plan_requant_trunk(moe_set[0], str(tmp_path / "out"))
    before = io_counters()
    run_plan(plan, jobs=1, progress=False, make_dirs=True)
    after = io_counters()
    read, written = after["rchar"] - before["rchar"], after["wchar"] - before["wchar"]
    size_in = sum(os.path.getsize(p) for p in moe_set)
    size_out = sum(os.path.getsize(s.dst) for s in plan.shards)
    slack = 256 << 10                 # manifests, headers parsed again, /proc reads
    assert plan.bytes_in <= read <= size_in + slack, (read, size_in)
    assert size_out <= written <= size_out + slack, (written, size_out)


def tensor_digests(path) -> dict[str, str]:
    return {t.name: hashlib.sha256(t.data.tobytes()).hexdigest() for t in gguf.GGUFReader(path).tensors}


def test_manifest_digests_are_the_bytes_written_and_the_copies_the_sources(moe_set, tmp_path):
    plan = plan_requant_trunk(moe_set[0], str(tmp_path))
    report = run_plan(plan, jobs=1, progress=False)
    with open(report.manifest) as f:
        recorded = json.load(f)["shards"]
    for shard in plan.shards:
        written = recorded[os.path.basename(shard.dst)]["output"]["tensors"]
        assert written == tensor_digests(shard.dst)                     # read back by gguf-py
        source = tensor_digests(shard.src)
        copies = [a.name for a in shard.tensors if a.action == "copy"]
        assert copies and all(written[n] == source[n] for n in copies)


def test_same_output_whatever_the_threads_and_workers(moe_set, tmp_path):
    outputs = []
    for jobs, threads in ((1, 1), (2, 2), (1, 4)):
        plan = plan_requant_trunk(moe_set[0], str(tmp_path / f"j{jobs}t{threads}"))
        run_plan(plan, jobs=jobs, threads=threads, progress=False, make_dirs=True)
        outputs.append([open(s.dst, "rb").read() for s in plan.shards])
    assert outputs[0] == outputs[1] == outputs[2]


def test_read_ahead_gives_every_piece_in_order(tmp_path):
    data = os.urandom(1 << 20)
    path = tmp_path / "f"
    path.write_bytes(data)
    pieces = split(100, 700_000, 65_536, "a", align=7) + [Piece(5, 0, "empty")] + split(0, 50, 16, "b")
    fd = os.open(path, os.O_RDONLY)
    try:
        got = [(p.tag, bytes(view)) for p, view in read_ahead(fd, pieces, str(path), depth=2)]
    finally:
        os.close(fd)
    assert [tag for tag, _ in got] == [p.tag for p in pieces]
    assert all(len(b) % 7 == 0 for tag, b in got[:-5] if tag == "a")      # whole blocks but the last
    assert b"".join(b for tag, b in got if tag == "a") == data[100:700_100]
    assert b"".join(b for tag, b in got if tag == "b") == data[:50]


def test_read_ahead_past_the_end_fails_naming_the_file_and_stops_its_thread(tmp_path):
    path = tmp_path / "short"
    path.write_bytes(bytes(1000))
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(GGUFError, match="short: the file ends at byte 1000"):
            for _ in read_ahead(fd, split(0, 5000, 512), str(path)):
                pass
        reader = read_ahead(fd, split(0, 1000, 100), str(path), depth=2)
        next(reader)
        reader.close()                   # a consumer that stops early
    finally:
        os.close(fd)
    assert not [t for t in threading.enumerate() if t.name == "ggtools-read-ahead"]
