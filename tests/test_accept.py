"""`ggtools accept` on the embedded demo pair: per-prompt τ equal to `ggtools run --draft` on that prompt, outputs
equal to target-only greedy decoding, broken drafters (mask id patched wrong, features from the wrong layers) fail
and are named, a byte-identical copy of the baseline gives delta 0, the target-only pass runs once per prompt
whatever the number of drafters, HF directories converted on the fly, the report and the plot, hostile input."""

import json
import os
import shutil
import tempfile
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.jobs import accept as accept_job
from ggtools.jobs.accept_report import sparkline
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.jobs.run import TargetOnly
from ggtools.runtime import TargetModel, Tokenizer, greedy

TARGET = str(demo_data() / "target.gguf")
EOS = 2046
N = 32


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """The four demo variants, a copy of f16, and two broken drafters made with `ggtools patch`; a prompts file of
    held-out windows as token ids."""
    d = tmp_path_factory.mktemp("accept")
    paths = {v.name: v.path for v in build_drafters(d, TARGET)}
    paths["copy"] = str(d / "copy" / "drafter-f16.gguf")
    os.makedirs(os.path.dirname(paths["copy"]))
    shutil.copyfile(paths["f16"], paths["copy"])
    paths["mask-0"], paths["layers"] = str(d / "mask-0.gguf"), str(d / "layers-4-4.gguf")
    for args in (["mask-token", paths["f16"], "--id", "0", "-o", paths["mask-0"]],
                 ["set", paths["f16"], "dflash.target_layers=i32[]:4,4", "-o", paths["layers"]]):
        r = CliRunner().invoke(main, ["patch", *args])
        assert r.exit_code == 0, r.output
    prompts = d / "held-out.jsonl"
    model = TargetModel(TARGET, threads=1)
    chosen = held_out_prompts(Tokenizer.from_gguf(model.weights.meta), 3, 64)
    model.close()
    prompts.write_text("".join(json.dumps({"id": name, "prompt_ids": ids}) + "\n" for name, ids in chosen))
    return d, paths, str(prompts), chosen


def _accept(*args):
    return CliRunner().invoke(main, ["accept", "--target", TARGET, "--threads", "1", "-q", *args])


def _drafts(paths, *names):
    return [a for name in names for a in ("--draft", paths[name])]


@pytest.fixture(scope="module")
def variants(work):
    d, paths, prompts, _ = work
    r = _accept(*_drafts(paths, "f16", "q8_0", "q4-mix", "q2_k"), "--prompts", prompts, "-n", str(N), "--json")
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_outputs_equal_greedy(work, variants):
    chosen = work[3]
    model = TargetModel(TARGET, threads=1)
    expected = []
    for _, ids in chosen:
        model.kv.clear()
        expected.append(greedy(model, ids, N, {EOS})[0])
    model.close()
    assert variants["reference_outputs"] == expected
    for d in variants["drafters"]:
        assert d["run"]["outputs"] == expected and d["run"]["outputs_match_target"], d["name"]
    assert variants["verdict"] == "pass" and variants["failed"] == []


@pytest.mark.parametrize("name", ["f16", "q8_0", "q4-mix", "q2_k"])
def test_tau_per_prompt_equals_run_draft(work, variants, name):
    _, paths, _, chosen = work
    mine = next(d for d in variants["drafters"] if d["given"] == paths[name])
    for i, (_, ids) in enumerate(chosen):
        r = CliRunner().invoke(main, ["run", "--target", TARGET, "--threads", "1", "--draft", paths[name],
                                      "--prompt-ids", ",".join(map(str, ids)), "-n", str(N), "--json"])
        assert r.exit_code == 0, r.output
        single = json.loads(r.stdout)
        assert mine["run"]["tau_per_prompt"][i] == single["stats"]["tau_zlab"]
        assert mine["run"]["outputs"][i] == single["outputs"][0]
    taus = mine["run"]["tau_per_prompt"]
    assert mine["run"]["stats"]["tau_zlab"] == sum(taus) / len(taus)     # the same floats in the same order


def test_report_fields(variants):
    assert [d["baseline"] for d in variants["drafters"]] == [True, False, False, False]
    assert variants["baseline"] == "drafter-f16.gguf" and variants["draft_kv"] == "ring:4096"
    for d in variants["drafters"]:
        base = variants["drafters"][0]["run"]["stats"]
        assert d["delta_tau"] == d["run"]["stats"]["tau_zlab"] - base["tau_zlab"]
        assert d["bytes"] == os.path.getsize(d["given"]) and d["source"] == "gguf"
        assert d["run"]["draft_kv_bytes"] > 0 and d["run"]["speculative_tokens_per_second"] > 0
        assert len(d["run"]["stats"]["per_position_accept_rate"]) == 7
    assert set(variants["definitions"]) >= {"tau_zlab", "mean_accepted_length_incl_bonus", "acceptance_rate"}


def test_broken_drafters_fail_and_are_named(work, tmp_path):
    _, paths, prompts, _ = work
    report = tmp_path / "summary.md"
    r = _accept(*_drafts(paths, "f16", "mask-0", "layers", "copy"), "--prompts", prompts, "-n", str(N),
                "--report", str(report))
    assert r.exit_code == 1, r.output
    fails = [line for line in r.stderr.splitlines() if line.startswith("FAIL: ")]
    assert len(fails) == 3, r.stderr
    assert fails[0].startswith("FAIL: mask-0.gguf: tau ") and "below the baseline's" in fails[0]
    assert fails[1].startswith("FAIL: layers-4-4.gguf: tau ") and "below the baseline's" in fails[1]
    assert "2 of 4 drafter(s) failed: mask-0.gguf, layers-4-4.gguf" in fails[2]
    md = report.read_text()
    assert "# ggtools accept: FAIL" in md and "| drafter | family | acceptance | tau | Δtau |" in md
    assert md.count("| FAIL |") == 2 and md.count("| pass |") == 2
    assert "- mask-0.gguf: tau" in md and "## τ per prompt" in md


def test_byte_identical_copy_has_delta_zero(work):
    _, paths, prompts, _ = work
    r = _accept(*_drafts(paths, "f16", "copy"), "--prompts", prompts, "-n", str(N), "--json")
    assert r.exit_code == 0, r.output
    copy = json.loads(r.stdout)["drafters"][1]
    assert copy["name"] == paths["copy"]          # two drafter-f16.gguf: the paths as given tell them apart
    assert copy["delta_tau"] == 0.0 and copy["delta_acceptance"] == 0.0 and copy["failures"] == []


def test_baseline_and_min_tau(work):
    _, paths, prompts, _ = work
    r = _accept(*_drafts(paths, "mask-0", "f16"), "--baseline", paths["mask-0"], "--min-tau", "2.0", "--prompts",
                prompts, "-n", str(N), "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["baseline"] == "mask-0.gguf" and out["failed"] == ["mask-0.gguf"]
    assert out["drafters"][0]["failures"][0].startswith("tau ") and "below --min-tau 2" in out["drafters"][0]["failures"][0]
    assert out["drafters"][1]["delta_tau"] > 0


def test_output_that_differs_from_greedy_fails(work, monkeypatch):
    """A reference that differs from what the drafters decode (one token changed) fails every drafter."""
    _, paths, prompts, _ = work
    real = TargetOnly.output

    def changed(self, i):
        tokens = real(self, i)
        return tokens[:-1] + [(tokens[-1] + 1) % 2046]

    monkeypatch.setattr(TargetOnly, "output", changed)
    r = _accept(*_drafts(paths, "f16"), "--prompts", prompts, "-n", str(N))
    assert r.exit_code == 1
    assert "FAIL: drafter-f16.gguf: output differs from target-only greedy decoding on 3 of 3 prompts" in r.stderr


def test_target_only_pass_runs_once_per_prompt(work, monkeypatch):
    """Count the target's forward calls without feature taps (target-only decoding; speculative decoding always
    taps): 2 warm-up calls plus one call per reference token (prefill, then one-token steps), for 1 or 3 drafters."""
    _, paths, prompts, chosen = work
    calls = []
    forward = TargetModel.forward

    def counting(self, tokens, positions=None, taps=(), logits="all", stepwise=False):
        if not taps:
            calls.append(list(tokens))
        return forward(self, tokens, positions, taps, logits, stepwise)

    monkeypatch.setattr(TargetModel, "forward", counting)
    counts = []
    for names in (["f16"], ["f16", "q8_0", "q2_k"]):
        calls.clear()
        report = accept_job.accept(TARGET, [paths[n] for n in names], prompts=prompts, n=N, threads=1)
        expected = 2 + sum(len(o) for o in report.reference_outputs)
        assert len(calls) == expected
        assert sum(c == ids for c in calls for _, ids in chosen) == len(chosen)      # one prefill per prompt
        counts.append(len(calls))
    assert counts[0] == counts[1]


def test_hf_directory_is_converted_and_cleaned_up(work, tmp_path, monkeypatch):
    d, paths, prompts, _ = work
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    r = _accept("--draft", str(d / "drafter-hf"), "--draft", paths["f16"], "--prompts", prompts, "-n", str(N),
                "--json")
    assert r.exit_code in (0, 1), r.output
    hf = json.loads(r.stdout)["drafters"][0]
    converted = tmp_path / "reference.gguf"
    convert_dflash(d / "drafter-hf", converted, profile="llama.cpp", target=TARGET)
    assert hf["source"] == "hf" and hf["name"] == "drafter-hf/" and hf["bytes"] == os.path.getsize(converted)
    assert hf["run"]["outputs_match_target"]
    assert sorted(os.listdir(tmp_path)) == ["reference.gguf"]


@pytest.mark.parametrize("case", ["bad-hf-dir", "not-a-drafter-after-conversion", "interrupted"])
def test_temporary_conversions_removed_on_failure(work, tmp_path, monkeypatch, case):
    d, paths, prompts, _ = work
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    hf = d / "drafter-hf"
    if case == "bad-hf-dir":
        hf = tmp_path / "broken-hf"
        shutil.copytree(d / "drafter-hf", hf)
        (hf / "config.json").write_text("{not json")
    if case == "interrupted":
        def interrupt(*a, **k):
            raise KeyboardInterrupt
        monkeypatch.setattr(accept_job, "measure_drafter", interrupt)
    other = TARGET if case == "not-a-drafter-after-conversion" else paths["f16"]
    r = _accept("--draft", str(hf), "--draft", other, "--prompts", prompts, "-n", str(N))
    if case == "interrupted":
        assert r.exit_code == 130 and r.stderr == "error: interrupted\n"     # docs/safety.md
    else:
        assert r.exit_code == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.output, r.output
        said = "broken-hf: an HF directory that does not convert" if case == "bad-hf-dir" else "target.gguf"
        assert r.stderr.startswith("error: ") and said in r.stderr, r.stderr
    assert os.listdir(tmp) == []


@pytest.mark.parametrize("args, said", [
    (["--draft", "missing.gguf"], "missing.gguf: no such file or directory (--draft)"),
    (["--draft", TARGET, "--draft", TARGET], "given twice as --draft"),
    (["--draft", TARGET, "--baseline", "other.gguf"], "--baseline other.gguf: not one of the --draft files"),
    (["--draft", TARGET, "--plot", "figure.pdf"], "--plot writes .png or .svg files"),
    (["--draft", TARGET, "--report", "no-such-dir/r.md"], "no such directory"),
])
def test_usage_errors_in_one_line(args, said):
    r = _accept(*args)
    assert r.exit_code == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.output


@pytest.mark.parametrize("case, said", [("target", "target.gguf: qwen3.nextn_predict_layers is absent or 0: context "
                                                  "type MTP requested but model doesn't contain MTP layers"),
                                        ("n-max", "drafter-f16.gguf: --n-max 8: the drafter's block of 8 drafts "
                                                  "at most 7 tokens per step")])
def test_drafters_that_cannot_draft_are_named(work, case, said):
    _, paths, prompts, _ = work
    args = ["--draft", TARGET] if case == "target" else [*_drafts(paths, "f16", "q8_0"), "--n-max", "8"]
    r = _accept(*args, "--prompts", prompts)
    assert r.exit_code == 2 and r.stderr.count("\n") == 1 and said in r.stderr, r.output


def test_plot_needs_matplotlib(monkeypatch, tmp_path):
    import importlib.util
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    r = _accept("--draft", TARGET, "--plot", str(tmp_path / "p.png"))
    assert r.exit_code == 2 and "pip install 'ggtools[plot]'" in r.stderr and r.stderr.count("\n") == 1


def test_plot_files_open(work, tmp_path):
    pytest.importorskip("matplotlib")
    from matplotlib.image import imread
    _, paths, prompts, _ = work
    png, svg = tmp_path / "a.png", tmp_path / "a.svg"
    for path in (png, svg):
        r = _accept(*_drafts(paths, "f16", "q2_k"), "--prompts", prompts, "-n", "8", "--plot", str(path))
        assert r.exit_code == 0, r.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    pixels = imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100 and pixels.std() > 0
    root = ET.parse(svg).getroot()
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert sorted(os.listdir(tmp_path)) == ["a.png", "a.svg"]


def test_sparkline():
    assert sparkline([0.0, 0.3, 0.5, 0.99, 1.0]) == "▁▃▅██"


def test_default_set_four_variants_equal_run_draft(work):
    """The proof on the default prompt set (texts, tokenized with the target's vocabulary), 64 tokens: every
    variant passes, and each prompt's τ and output equal `ggtools run --draft --prompt TEXT`'s."""
    _, paths, _, _ = work
    r = _accept(*_drafts(paths, "f16", "q8_0", "q4-mix", "q2_k"), "--json")
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert len(out["prompts"]) == 12 and out["n"] == 64
    for d in out["drafters"]:
        assert d["run"]["outputs"] == out["reference_outputs"]
        for i, p in enumerate(out["prompts"]):
            single = CliRunner().invoke(main, ["run", "--target", TARGET, "--threads", "1", "--draft", d["given"],
                                               "--prompt", p["text"], "--json"])
            assert single.exit_code == 0, single.output
            single = json.loads(single.stdout)
            assert d["run"]["tau_per_prompt"][i] == single["stats"]["tau_zlab"], (d["name"], p["id"])
            assert d["run"]["outputs"][i] == single["outputs"][0]
