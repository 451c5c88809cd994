"""The hostile corpus: bad and edge-case inputs made by code (never committed binaries), and the four
properties every run over them must keep (tests/test_hostile.py, tests/test_fuzz.py).

Properties of a run: the expected exit code; on failure exactly one line on stderr, starting "error: ", with
no traceback and no "internal error"; every file that existed before is byte-identical after; no new file
except the outputs the run is meant to write.
"""

import hashlib
import os
import shutil
import struct

import numpy as np
from click.testing import CliRunner

from tests import gguf_builder as B
from ggtools.cli import main
from ggtools.samples import write_moe_set

F32, F16, Q8_0 = 0, 1, 8
DEMO = os.path.join(os.path.dirname(__file__), "..", "ggtools", "data", "demo")


# ---- running a command and checking the properties ---------------------------------------------------------

def snapshot(root) -> dict[str, str]:
    """Every entry under root: sha256 of regular files, the target of links, the kind of anything else (a FIFO
    is never opened)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.path.islink(p):
                out[p] = "link:" + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    out[p] = hashlib.sha256(fh.read()).hexdigest()
            elif not os.path.isdir(p):
                out[p] = "special"
    return out


def run_cli(args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    unexpected = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not unexpected, f"{args}: uncaught {type(result.exception).__name__}: {result.exception}"
    return result


def check_run(root, args, code, outputs=(), fragment=None) -> object:
    """Run `ggtools args` and assert the four properties; code: the exit code, or a tuple of allowed ones;
    outputs: paths (files or directories) the run may create, removed after."""
    before = snapshot(root)
    result = run_cli(args)
    after = snapshot(root)
    try:
        what = f"ggtools {' '.join(map(str, args))}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        assert result.exit_code in (code if isinstance(code, tuple) else (code,)), what
        assert "Traceback" not in result.stdout + result.stderr, what
        assert "internal error" not in result.stderr, what
        if result.exit_code:
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), what
            if fragment:
                assert fragment in lines[0], what
        changed = [p for p, h in before.items() if after.get(p) != h]
        assert not changed, f"{what}\ninputs changed: {changed}"
        allowed = [os.path.abspath(p) for p in outputs]          # a file, or a directory and what it holds
        new = [p for p in after if p not in before
               and not any(os.path.abspath(p) == a or os.path.abspath(p).startswith(a + os.sep) for a in allowed)]
        assert not new, f"{what}\nnew files: {new}"
    finally:
        for p in outputs:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            elif os.path.lexists(p):
                os.unlink(p)
    return result


# ---- the corpus -------------------------------------------------------------------------------------------

def write(path, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
    return str(path)


def q8_blocks(n_blocks, rng, bad_block=None) -> bytes:
    """Q8_0 blocks with a 0.01 fp16 scale; bad_block gets a NaN scale."""
    blocks = np.zeros((n_blocks, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[:, 2:] = rng.integers(0, 256, (n_blocks, 32), dtype=np.uint8)
    if bad_block is not None:
        blocks[bad_block, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    return blocks.tobytes()


def dense(specs, kvs=None, alignment=32) -> bytes:
    """A valid file from (name, ne, type, data bytes) specs, offsets packed at the alignment."""
    tensors, data, off = [], bytearray(), 0
    for name, ne, t, payload in specs:
        tensors.append((name, ne, t, off, len(payload)))
        data += payload + bytes(B.pad(len(payload), alignment) - len(payload))
        off = B.pad(off + len(payload), alignment)
    return B.build(kvs if kvs is not None else B.sample_kvs(), tensors, data=bytes(data))


def with_tensor(index, **change) -> bytes:
    """The sample file with one tensor info changed (ne, type_id)."""
    t = [list(x) for x in B.sample_tensors()]
    if "ne" in change:
        t[index][1] = change["ne"]
    if "type_id" in change:
        t[index][2] = change["type_id"]
    return B.build(B.sample_kvs(), [tuple(x) for x in t])


def split_set(prefix, count_on_first):
    """A 3-shard set whose first shard claims split.count = count_on_first."""
    rng = np.random.default_rng(1)
    paths = []
    for i in range(3):
        kvs = ([B.kv_str("general.architecture", "llama")] if i == 0 else []) + [
            B.kv_u16("split.no", i), B.kv_u16("split.count", count_on_first if i == 0 else 3),
            B.kv_i32("split.tensors.count", 3)]
        payload = rng.standard_normal(64).astype("<f4").tobytes()
        paths.append(write(f"{prefix}-{i + 1:05d}-of-00003.gguf", dense([(f"t{i}.weight", [64], F32, payload)], kvs)))
    return paths


def build_corpus(root) -> dict[str, str]:
    """Write every input into root; returns name -> path."""
    root = str(root)
    rng = np.random.default_rng(0)
    c = {"root": root}
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    c["good"] = write(j("good.gguf"), B.sample_file())
    c["target"] = shutil.copy(os.path.join(DEMO, "target.gguf"), j("target.gguf"))
    c["hf"] = shutil.copytree(os.path.join(DEMO, "drafter"), j("hf"))
    os.makedirs(j("set"))
    c["set"] = write_moe_set(j("set", "k"), layers=1, hidden=256, ffn=256, experts=2, vocab=256, shards=3)[0]
    c["set2"] = c["set"].replace("00001-of", "00002-of")
    os.makedirs(j("badsplit"))
    c["badsplit"] = split_set(j("badsplit", "b"), 4)[0]
    c["zero_dim"] = write(j("zero_dim.gguf"), with_tensor(1, ne=[64, 0]))
    c["unknown_type"] = write(j("unknown_type.gguf"), with_tensor(1, type_id=77))
    c["bad_block"] = write(j("bad_block.gguf"), with_tensor(2, ne=[48, 4]))
    c["empty24"] = write(j("empty24.gguf"), b"GGUF" + struct.pack("<Iqq", 3, 0, 0))
    c["empty"] = write(j("empty.gguf"), b"")
    c["truncated"] = write(j("truncated.gguf"), B.sample_file()[:-100])
    c["huge_count"] = write(j("huge_count.gguf"), b"GGUF" + struct.pack("<IQQ", 3, 2 ** 64 - 1, 0) + bytes(64))
    c["fifo"] = j("fifo.gguf")
    os.mkfifo(c["fifo"])
    c["dangling"] = j("dangling.gguf")
    os.symlink(j("nowhere.gguf"), c["dangling"])
    c["missing"] = j("missing.gguf")
    os.makedirs(j("big"))
    c["big"] = shutil.copy(c["good"], j("big", "x-00001-of-99999.gguf"))
    nan_rows = rng.standard_normal((4, 64)).astype("<f4")
    nan_rows[2, 5] = np.nan
    c["nan_f32"] = write(j("nan_f32.gguf"), dense([("blk.0.ffn_up.weight", [64, 4], F32, nan_rows.tobytes())]))
    c["nan_q8"] = write(j("nan_q8.gguf"), dense([                 # converted by requant-trunk: scale NaN in row 1
        ("blk.0.ffn_up.weight", [256, 4], Q8_0, q8_blocks(32, rng, bad_block=9))]))
    c["nan_q8_copy"] = write(j("nan_q8_copy.gguf"), dense([       # 128-wide: copied by requant-trunk
        ("blk.0.attn_k_b.weight", [128, 4], Q8_0, q8_blocks(16, rng, bad_block=5))]))
    c["notok"] = write(j("notok.gguf"), _without_tokenizer(c["target"]))
    for case, edits in KIMI_K3_CASES.items():
        c[f"k3_{case}"] = _kimi_k3(j(f"k3_{case}.gguf"), edits)
    c["drafter"] = _drafter(c, j("drafter.gguf"))
    _hf_variants(c, j)
    _manifests(c, j)
    os.makedirs(j("outdir"))
    c["outdir"] = j("outdir")
    c["afile"] = write(j("afile"), b"not a directory")
    _aliases(c, j)
    return c


def _aliases(c, j):
    """Other names for inputs: a symbolic link, a hard link, an output directory holding a link to shard 2."""
    c["link_to_good"] = j("link_to_good.gguf")
    os.symlink(c["good"], c["link_to_good"])
    c["hard_to_good"] = j("hard_to_good.gguf")
    os.link(c["good"], c["hard_to_good"])
    c["link_to_target"] = j("link_to_target.gguf")
    os.symlink(c["target"], c["link_to_target"])
    c["link_to_drafter"] = j("link_to_drafter.gguf")
    os.symlink(c["drafter"], c["link_to_drafter"])
    c["outdir_link"] = j("outdir_link")
    os.makedirs(c["outdir_link"])
    os.symlink(c["set2"], os.path.join(c["outdir_link"], os.path.basename(c["set2"])))


# kimi-k3 files whose keys contradict each other (kimi_k3_hparams refuses them): case -> key edits (None: removed)
KIMI_K3_CASES = {
    "kv_heads": {"attention.head_count_kv": [0, 2]}, "kv_heads_count": {"attention.head_count_kv": [0, 1, 1]},
    "gating": {"expert_gating_func": 1}, "key_length": {"attention.key_length": 40},
    "rope": {"rope.dimension_count": 40, "attention.key_length": 72}, "situ": {"activation.situ_beta": 0.0},
    "used": {"expert_used_count": 5}, "no_kda_head_dim": {"kda.head_dim": None},
}


def _kimi_k3(path, edits) -> str:
    """A 2-layer kimi-k3 file (KDA, MLA) with the keys its loader reads, the token embedding and output norm only
    (keys are checked before any layer tensor is looked up), with `edits` applied to the keys."""
    import gguf

    keys = {"block_count": 2, "context_length": 64, "embedding_length": 32, "attention.head_count": 2,
            "attention.head_count_kv": [0, 1], "attention.layer_norm_rms_epsilon": 1e-6, "kda.head_dim": 16,
            "ssm.conv_kernel": 4, "attention.kv_lora_rank": 32, "attention.key_length": 48,
            "rope.dimension_count": 16, "attention.key_length_mla": 32, "attention.value_length_mla": 16,
            "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 16, "expert_shared_count": 1,
            "expert_gating_func": 2, "activation.situ_beta": 1.0, "activation.situ_linear_beta": 0.0,
            "attn_res.block_size": 0}
    keys.update(edits)
    w = gguf.GGUFWriter(path, "kimi-k3")
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, list):
            w.add_array(f"kimi-k3.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"kimi-k3.{key}", value)
        else:
            w.add_uint32(f"kimi-k3.{key}", value)
    rng = np.random.default_rng(3)
    w.add_tensor("token_embd.weight", rng.standard_normal((64, 32)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _without_tokenizer(path) -> bytes:
    from ggtools.gguf import GGUFFile, GGUFWriter
    out = path + ".tmp"
    with GGUFFile(path) as f, GGUFWriter(out) as w:
        for kv in f.kvs:
            if not kv.key.startswith("tokenizer."):
                w.add_kv_record(kv)
        for t in f.tensors:
            w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
        for t in f.tensors:
            w.write(f.tensor_data(t))
    data = open(out, "rb").read()
    os.unlink(out)
    return data


def _drafter(c, path) -> str:
    """The demo drafter as a llama.cpp-profile GGUF (an input of doctor, gguf-layout, accept)."""
    from ggtools.jobs.convert import convert_dflash
    convert_dflash(c["hf"], path, profile="llama.cpp", target=c["target"])
    return path


def _hf_variants(c, j):
    c["hf_fifo"] = j("hf_fifo")
    os.makedirs(c["hf_fifo"])
    shutil.copy(os.path.join(DEMO, "drafter", "config.json"), c["hf_fifo"])
    os.mkfifo(os.path.join(c["hf_fifo"], "model.safetensors"))
    c["hf_badjson"] = shutil.copytree(os.path.join(DEMO, "drafter"), j("hf_badjson"))
    write(os.path.join(c["hf_badjson"], "config.json"), b"[" * 100000)


HOSTILE_MANIFESTS = {"binary": bytes(range(256)) * 4, "list": b"[]", "files_number": b'{"files": 5}',
                     "shards_null": b'{"shards": null}', "deep": b"[" * 100000,
                     "no_source": b'{"shards": {"k-00001-of-00003.gguf": {"fingerprint": "x", "output": {}}}}'}


def _manifests(c, j):
    os.makedirs(j("manifests"))
    for name, data in HOSTILE_MANIFESTS.items():
        c[f"manifest_{name}"] = write(j("manifests", f"{name}.json"), data)
        resume_dir = j("resume", name)
        os.makedirs(resume_dir)
        c[f"resume_{name}"] = resume_dir
        write(os.path.join(resume_dir, "k.ggtools.json"), data)
    c["manifest_empty"] = write(j("manifests", "empty.sha256"), b"")
    c["manifest_other"] = write(j("manifests", "other.sha256"), b"0" * 64 + b"  other.gguf\n")
