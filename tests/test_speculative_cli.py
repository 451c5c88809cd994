"""`ggtools run --draft`: statistics with definitions, JSON, the target-only check, and --min-acceptance failing
a silently broken drafter (shuffled fc, wrong mask id) while the good one passes."""

import json

import numpy as np
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.gguf import GGUFFile
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.demo import demo_data

TARGET = str(demo_data() / "target.gguf")
GOLDEN = json.loads((demo_data() / "demo_pair.json").read_text())["golden_greedy"]   # torch's greedy tokens
PROMPT = ",".join(map(str, GOLDEN["prompt_ids"]))
FLOOR = "0.15"          # the good drafter accepts 0.21 of its drafts on this prompt


@pytest.fixture(scope="module")
def drafters(tmp_path_factory):
    d = tmp_path_factory.mktemp("drafters")
    paths = {name: str(d / f"{name}.gguf") for name in ("good", "lucebox", "shuffled-fc", "mask-0")}
    convert_dflash(demo_data() / "drafter", paths["good"], target=TARGET, outtype="f16")
    convert_dflash(demo_data() / "drafter", paths["lucebox"], profile="lucebox")
    convert_dflash(demo_data() / "drafter", paths["shuffled-fc"], target=TARGET, outtype="f16")
    convert_dflash(demo_data() / "drafter", paths["mask-0"], target=TARGET, outtype="f16", mask_token_id=0)
    _shuffle_fc_columns(paths["shuffled-fc"])
    return paths


def _shuffle_fc_columns(path):
    """Permute fc's input columns in place: the drafter reads the target features in the wrong order."""
    with GGUFFile(path) as f:
        t = f.tensor["fc.weight"]
        start, (n_in, n_out) = t.data_start, t.ne
    fc = np.fromfile(path, np.float16, count=n_in * n_out, offset=start).reshape(n_out, n_in)
    with open(path, "r+b") as fh:
        fh.seek(start)
        fh.write(fc[:, np.random.default_rng(0).permutation(n_in)].tobytes())


def _run(*args):
    return CliRunner().invoke(main, ["run", "--target", TARGET, "--threads", "1", *args])


@pytest.mark.parametrize("name", ["good", "lucebox"])
def test_good_drafter_passes_the_floor(drafters, name):
    r = _run("--draft", drafters[name], "--prompt-ids", PROMPT, "-n", "64", "--min-acceptance", FLOOR, "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["failures"] == [] and out["outputs_match_target"]
    assert out["outputs"][0] == GOLDEN["greedy_ids"]
    assert out["draft_kv"] == "ring:4096" and out["profile"] == ("lucebox" if name == "lucebox" else "llama.cpp")
    assert out["stats"]["acceptance_rate"] >= float(FLOOR) and out["speedup"] > 0


@pytest.mark.parametrize("name", ["shuffled-fc", "mask-0"])
def test_broken_drafter_fails_the_floor(drafters, name):
    r = _run("--draft", drafters[name], "--prompt-ids", PROMPT, "-n", "64", "--min-acceptance", FLOOR, "--full-kv")
    assert r.exit_code == 1
    assert "below --min-acceptance" in r.stderr
    assert "output equals target-only greedy decoding" in r.stderr      # wrong drafts never change the output


def test_text_report_prints_each_statistic_with_its_definition(drafters):
    r = _run("--draft", drafters["good"], "--prompt-ids", PROMPT, "-n", "24", "--ring-cap", "16", "--cut", "margin",
             "--p-min", "0.35", "--n-min", "1", "--n-max", "5")
    assert r.exit_code == 0, r.output
    for line in ("acceptance_rate = ", "(accepted_tokens / drafted_tokens", "tau_zlab = ", "per_position_accept_rate",
                 "lucebox_accept_rate", "verified_per_step", "speedup", "draft KV: ", "ring:16", "n_max 5, cut margin"):
        assert line in r.stderr


@pytest.mark.parametrize("args, said", [(["--ring-cap", "8", "--full-kv"], "at most one of --ring-cap and --full-kv"),
                                        (["--n-max", "9"], "drafts at most 7 tokens per step")])
def test_usage_errors(drafters, args, said):
    r = _run("--draft", drafters["good"], "--prompt-ids", PROMPT, "-n", "4", *args)
    assert r.exit_code == 2 and said in r.output


def test_draft_options_need_a_drafter():
    r = _run("--prompt-ids", PROMPT, "--cut", "prob")
    assert r.exit_code == 2 and "need --draft" in r.output
