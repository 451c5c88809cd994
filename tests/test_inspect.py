"""inspect: complete, stable JSON for files and shard sets; filters; abbreviated arrays."""

import json

import gguf
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.samples import write_moe_set


def run(*args):
    r = CliRunner().invoke(main, ["inspect", *map(str, args)])
    assert r.exit_code == 0, r.output
    return r.output


def test_json_on_a_shard_set(tmp_path):
    paths = write_moe_set(str(tmp_path / "m"), layers=2, hidden=256, ffn=256, experts=2, vocab=512, shards=3)
    info = json.loads(run(paths[2], "--json"))
    assert [f["path"] for f in info["files"]] == paths
    readers = [gguf.GGUFReader(p) for p in paths]
    expected = [(t.name, t.tensor_type.name, [int(x) for x in t.shape], int(t.n_bytes), i)
                for i, r in enumerate(readers) for t in r.tensors]
    assert [(t["name"], t["type"], t["ne"], t["bytes"], t["shard"]) for t in info["tensors"]] == expected
    keys = [k for k in readers[0].fields if not k.startswith("GGUF.")]
    assert [k["key"] for k in info["kv"]] == keys
    assert info["totals"]["bytes"] == sum(e[3] for e in expected)
    assert info["totals"]["by_type"]["MXFP4"]["tensors"] == 6
    assert json.loads(run(paths[0], "--json")) == info            # stable


def test_filters_and_arrays(smollm2_path):
    info = json.loads(run(smollm2_path, "--json", "--tensors", r"^blk\.0\.", "--kv", "tokenizer.ggml.tokens"))
    assert all(t["name"].startswith("blk.0.") for t in info["tensors"]) and len(info["tensors"]) == 9
    (tokens,) = info["kv"]
    assert tokens["count"] == 49152 and len(tokens["value"]) == 8
    full = json.loads(run(smollm2_path, "--json", "--kv", "tokenizer.ggml.tokens$", "--full-arrays"))
    assert len(full["kv"][0]["value"]) == 49152
    text = run(smollm2_path, "--tensors", "token_embd")
    assert "token_embd.weight" in text and "Q8_0" in text and "[49152] " in text


def test_bad_regex(smollm2_path):
    r = CliRunner().invoke(main, ["inspect", smollm2_path, "--tensors", "("])
    assert r.exit_code == 2 and "bad regular expression" in r.output
