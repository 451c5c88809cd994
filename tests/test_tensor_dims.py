"""How many dimensions an output's tensor infos have, by whose output it stands for.

llama-quantize writes every tensor info of its output through ggml, which stores ggml_n_dims dimensions: those after
the last one above 1 are dropped, so a tensor [256, 1] is written [256] and [4, 1, 64, 1] is written [4, 1, 64].
llama.cpp's converter (gguf-py) writes len(shape): [256, 1] stays. quantize and requant-trunk stand for
llama-quantize, for every tensor of the output, copied ones included; convert, patch, doctor --fix and gguf-layout
stand for the converter. The byte-for-byte proofs against llama_model_quantize: test_quantize.py (DSpark's confidence
weight [H + R, 1]) and test_requant_kimi_k3.py (K3's conv taps [4, 1, C, 1]); against the converter:
test_convert_dspark.py."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.gguf import GGUFFile
from tests import gguf_builder as B
from tests.hostile_corpus import F32, Q8_0, dense, q8_blocks
from tests.test_convert_support import make_dspark_checkpoint, make_target_gguf

# the probes' file: an arch the model-file rules have no tables for (its tensors are probes, not a model's)
PROBE_KVS = B.sample_kvs("gpt2")
# name -> (ne in the source, ne as ggml writes it)
DIMS = {"blk.0.probe_col.weight": ([256, 1], (256,)), "blk.0.probe_taps.weight": ([4, 1, 64, 1], (4, 1, 64)),
        "blk.0.probe_row.weight": ([1, 64], (1, 64)), "blk.0.probe_mat.weight": ([256, 4], (256, 4))}


def cli(*args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    return result


def dims(path) -> dict:
    with GGUFFile(path) as f:
        return {t.name: t.ne for t in f.tensors}


def specs(tensor_type, rng):
    """DIMS's tensors as (name, ne, type, data): of tensor_type where its rows fit its blocks, else F32."""
    out = []
    for name, (ne, _) in DIMS.items():
        n = int(np.prod(ne))
        if tensor_type == Q8_0 and ne[0] % 32 == 0:
            out.append((name, ne, Q8_0, q8_blocks(n // 32, rng)))
        else:
            out.append((name, ne, F32, rng.standard_normal(n).astype("<f4").tobytes()))
    return out


@pytest.fixture
def model(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(dense(specs(F32, np.random.default_rng(0)), PROBE_KVS))
    return path


@pytest.fixture
def q8_set(tmp_path):
    """A 2-shard set of Q8_0 (and F32) tensors, DIMS's shapes split over both shards."""
    rng = np.random.default_rng(1)
    tensors = specs(Q8_0, rng)
    (tmp_path / "set").mkdir()
    paths = []
    for i, part in enumerate((tensors[:2], tensors[2:])):
        kvs = (PROBE_KVS if i == 0 else []) + [B.kv_u16("split.no", i), B.kv_u16("split.count", 2),
                                                   B.kv_i32("split.tensors.count", len(tensors))]
        paths.append(tmp_path / "set" / f"s-0000{i + 1}-of-00002.gguf")
        paths[-1].write_bytes(dense(part, kvs))
    return paths


def test_quantize_writes_dims_as_ggml(model, tmp_path):
    out = tmp_path / "q.gguf"
    cli("quantize", model, "-o", out, "--scheme", "q8_0", "-q")
    assert dims(out) == {name: ggml for name, (_, ggml) in DIMS.items()}


def test_quantize_plan_shows_the_dims_it_writes(model, tmp_path):
    plan = json.loads(cli("quantize", "--json", model, "-o", tmp_path / "q.gguf", "--scheme", "q8_0",
                          "--dry-run").stdout)
    assert {t["name"]: tuple(t["ne"]) for s in plan["shards"] for t in s["tensors"]} == \
        {name: ggml for name, (_, ggml) in DIMS.items()}


def test_requant_trunk_writes_dims_as_ggml(q8_set, tmp_path):
    """Converted (probe_mat), kept because its rows do not fit Q4_K (probe_col: 1-D to ggml), and copied F32 alike."""
    cli("requant-trunk", q8_set[0], "-o", tmp_path / "out", "-q")
    got = {}
    for p in q8_set:
        got |= dims(tmp_path / "out" / p.name)
    assert got == {name: ggml for name, (_, ggml) in DIMS.items()}


def test_patch_keeps_the_source_dims(model, tmp_path):
    out = tmp_path / "p.gguf"
    cli("patch", "set", model, "x.y=u8:1", "-o", out)
    assert dims(out) == {name: tuple(ne) for name, (ne, _) in DIMS.items()}


def test_convert_and_its_repairs_keep_the_confidence_weight_2d(tmp_path):
    """The converter writes DSpark's confidence weight [H + R, 1] (gguf-py: len(shape)), and so do a layout move and
    doctor --fix; quantize writes it [H + R], as llama-quantize does."""
    target = make_target_gguf(tmp_path / "t.gguf")
    ckpt = make_dspark_checkpoint(tmp_path / "ckpt", extra={"sample_from_anchor": False})
    drafter = tmp_path / "d.gguf"
    cli("convert", "dflash", ckpt, "--target-gguf", target, "-o", drafter, "-q")
    width = dims(drafter)["conf_proj.weight"][0]
    assert dims(drafter)["conf_proj.weight"] == (width, 1)
    cli("convert", "gguf-layout", drafter, "--to", "lucebox", "-o", tmp_path / "lb.gguf")
    cli("convert", "gguf-layout", tmp_path / "lb.gguf", "--to", "llama.cpp", "--target", target, "-o",
        tmp_path / "back.gguf")
    assert dims(tmp_path / "back.gguf")["conf_proj.weight"] == (width, 1)
    cli("doctor", drafter, "--fix", "-o", tmp_path / "fixed.gguf")
    assert dims(tmp_path / "fixed.gguf")["conf_proj.weight"] == (width, 1)
    cli("quantize", drafter, "-o", tmp_path / "q.gguf", "--scheme", "q8_0", "-q")
    assert dims(tmp_path / "q.gguf")["conf_proj.weight"] == (width,)
