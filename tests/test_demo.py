"""`ggtools demo`: the embedded drafter converted, quantized, checked and decoded speculatively, one table; the
requant-trunk part; held-out prompts from standard-library modules the demo pair never trained on."""

import json
import os

import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.jobs.demo import demo_data, held_out_prompts
from ggtools.runtime import TargetModel, Tokenizer, greedy
from ggtools.runtime.sampling import Sampler, SamplingParams
from ggtools.gguf import GGUFFile


def test_held_out_prompts_come_from_held_out_modules():
    meta = json.loads((demo_data() / "demo_pair.json").read_text())
    with GGUFFile(demo_data() / "target.gguf") as f:
        prompts = held_out_prompts(Tokenizer.from_gguf(f), 6, 100)
    assert len(prompts) == 6 and all(len(ids) == 100 for _, ids in prompts)
    assert {name.split("@")[0] for name, _ in prompts} <= set(meta["corpus"]["held_out"])


def test_demo_json(tmp_path):
    r = CliRunner().invoke(main, ["demo", "--work-dir", str(tmp_path), "--prompts", "2", "-n", "24", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    names = [v["name"] for v in out["variants"]]
    assert names == ["f16, full KV", "f16", "q8_0", "q4-mix", "q2_k", "dspark f16", "eagle3 f16", "f16, T 0.8",
                     "mtp (qwen35-mtp.gguf)"]
    runs = {v["name"]: v["run"] for v in out["variants"]}
    for name, family, n_max, kv in (("dspark f16", "dspark", 8, "ring:64"), ("eagle3 f16", "eagle3", 3, "full"),
                                    ("mtp (qwen35-mtp.gguf)", "mtp", 3, "full")):
        assert (runs[name]["family"], runs[name]["settings"]["n_max"], runs[name]["draft_kv"]) == (family, n_max, kv)
    assert runs["mtp (qwen35-mtp.gguf)"]["target"].endswith("qwen35-mtp.gguf")
    for v in out["variants"]:
        assert v["checks"] == ("validate --deep ok (its MTP block)" if v["name"].startswith("mtp") else
                               "validate --deep ok, pair-check ok")
        assert v["run"]["outputs_match_target"] and v["run"]["prompts"] == 2
    for v in out["variants"]:
        assert (v["run"]["sampling"] is None) == (v["name"] != "f16, T 0.8")
    _check_sampled_row(out["variants"][-2], out["variants"][1])
    ring, full = out["variants"][1]["run"], out["variants"][0]["run"]
    assert ring["draft_kv"] == "ring:64" and full["draft_kv"] == "full"
    assert ring["draft_kv_bytes"] < full["draft_kv_bytes"]
    requant = out["requant"]                    # --json runs (and reports) the second part too
    assert requant["exit_code"] == 0 and requant["shards"] == 3
    assert requant["output"] == str(tmp_path / "moe-q4k" / "kimi-like-00001-of-00003.gguf")
    assert 0 < requant["bytes_out"] < requant["bytes_in"]
    shards = [sorted(f for f in os.listdir(tmp_path / d) if f.endswith(".gguf")) for d in ("moe", "moe-q4k")]
    assert shards[0] == shards[1] and len(shards[0]) == 3


def _check_sampled_row(sampled, f16):
    """The f16 drafter at T 0.8, seed 42: its outputs are target-only sampled decoding with that seed (not greedy)."""
    run = sampled["run"]
    assert (run["sampling"]["temp"], run["sampling"]["seed"]) == (0.8, 42) and run["draft"] == f16["run"]["draft"]
    assert run["draft_kv"] == "ring:64" and run["outputs_match_target"] and "expected_acceptance_rate" in run["stats"]
    model = TargetModel(str(demo_data() / "target.gguf"), threads=1)
    tokenizer = Tokenizer.from_gguf(model.weights.meta)
    want = []
    for _, ids in held_out_prompts(tokenizer, 2):
        model.kv.clear()
        want.append(greedy(model, ids, 24, tokenizer.eog, sampler=Sampler(SamplingParams(temp=0.8, seed=42),
                                                                         model.n_vocab))[0])
    model.close()
    assert run["outputs"] == want and want != f16["run"]["outputs"]


def test_demo_refuses_a_work_dir_of_an_earlier_demo_without_force(tmp_path):
    (tmp_path / "drafter").mkdir()
    (tmp_path / "drafter" / "drafter-f16.gguf").write_bytes(b"earlier")
    r = CliRunner().invoke(main, ["demo", "--work-dir", str(tmp_path), "--prompts", "1", "-n", "4", "--skip-requant"])
    assert r.exit_code == 2 and "holds drafter/" in r.stderr and "--force" in r.stderr
    assert (tmp_path / "drafter" / "drafter-f16.gguf").read_bytes() == b"earlier"
    r = CliRunner().invoke(main, ["demo", "--work-dir", str(tmp_path), "--prompts", "1", "-n", "4", "--rounds", "1",
                                  "--skip-requant", "--force"])
    assert r.exit_code == 0, r.output
    assert (tmp_path / "drafter" / "drafter-f16.gguf").read_bytes()[:4] == b"GGUF"


@pytest.mark.slow
def test_demo_default(tmp_path):
    r = CliRunner().invoke(main, ["demo", "--work-dir", str(tmp_path)])
    assert r.exit_code == 0, r.output
    for text in ("drafter", "acceptance", "tau", "speedup", "draft KV", "f16, full KV", "q4-mix", "q2_k",
                 "f16, T 0.8", "chain and seed 42", "2. requant-trunk", "all good"):
        assert text in r.output
