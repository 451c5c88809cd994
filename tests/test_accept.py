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
from ggtools.errors import GGToolsError
from ggtools.jobs import accept as accept_job
from ggtools.jobs.accept_temperatures import MAX_SEED, seed_list
from ggtools.jobs.accept_report import sparkline
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.jobs.run import TargetOnly
from ggtools.runtime import TargetModel, Tokenizer, greedy
from ggtools.runtime.sampling import Sampler, SamplingParams

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


# ----------------------------------------------------------------------------------------------------------
# drafter families side by side (issue 41 part 6): DFlash, DSpark and EAGLE3 on the demo target, MTP (the target's
# own block and its sidecar) on a tiny Qwen3.5 target


def _target_only(target, prompts, n, stop=(), params=None) -> list[list[int]]:
    """Target-only decoding of each prompt, greedy or with a fresh sampler of params (the runtime's, libllama's chain
    bit for bit: tests/test_sampled_decoding.py)."""
    model = TargetModel(str(target), threads=1)
    out = []
    for ids in prompts:
        model.kv.clear()
        out.append(greedy(model, ids, n, stop, sampler=params and Sampler(params, model.n_vocab))[0])
    model.close()
    return out


def test_families_side_by_side(work, eagle3_demo, tmp_path):
    """DFlash v1, DSpark, EAGLE3 (llama.cpp's conversion, and its HF directory converted on the fly by the
    family-detecting converter) in one table: each its family's own n_max, its output the target's greedy decoding,
    drafts and drafting milliseconds per step."""
    _, paths, prompts, chosen = work
    report = tmp_path / "families.md"
    r = _accept(*_drafts(paths, "f16", "dspark f16"), "--draft", str(eagle3_demo["ref"]), "--draft",
                str(eagle3_demo["hf_dir"]), "--prompts", prompts, "-n", str(N), "--json",
                "--report", str(report))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    drafters = out["drafters"]
    assert [d["family"] for d in drafters] == ["dflash", "dspark", "eagle3", "eagle3"]
    assert [d["source"] for d in drafters] == ["gguf", "gguf", "gguf", "hf"]
    assert [d["run"]["settings"]["n_max"] for d in drafters] == [7, 8, 3, 3]    # llama.cpp's EAGLE3 default: 3
    want = _target_only(TARGET, [ids for _, ids in chosen], N, {EOS})
    for d in drafters:
        assert d["run"]["outputs"] == want and d["run"]["outputs_match_target"], d["name"]
        first, stats = d["by_temperature"][0], d["run"]["stats"]
        assert first["drafts_per_step"] == stats["drafted_tokens"] / stats["steps"]
        assert first["draft_ms_per_step"] == pytest.approx(
            1000 * d["run"]["draft_seconds_share"] * d["run"]["decode_seconds"] / stats["steps"]) and \
            first["draft_ms_per_step"] > 0
    # EAGLE3 drafts 3 tokens a step to DFlash's 7: its tau is far below the baseline's, and --max-drop (a variant
    # of the baseline drafting worse) leaves another family alone
    assert all(d["delta_tau_relative"] < -0.05 and not d["failures"] for d in drafters[2:]), drafters
    gguf, hf = drafters[2], drafters[3]
    assert hf["bytes"] == os.path.getsize(eagle3_demo["ref"])      # the same file as llama.cpp's converter writes
    assert hf["run"]["stats"] == gguf["run"]["stats"]
    md = report.read_text()
    assert "| drafter | family | acceptance | tau | Δtau | mean len | drafts/step | draft ms/step |" in md
    for row in ("| drafter-f16.gguf (baseline) | DFlash v1 |", "| drafter-dspark-anchor-f16.gguf | DSpark |",
                "| demo-eagle3-f16.gguf | EAGLE3 |", "| demo-eagle3/ | EAGLE3 |"):
        assert row in md


MTP_PROMPTS = [[1, 415, 29, 88, 301, 7], [5, 9, 200, 17, 33, 44, 100, 12, 640]]


def _ids_file(path, prompts) -> str:
    path.write_text("".join(json.dumps({"prompt_ids": ids}) + "\n" for ids in prompts))
    return str(path)


def test_mtp_block_beside_its_sidecar(mtp_targets, tmp_path):
    """`--draft mtp` (the target's own block) and the converter's --mtp sidecar of the same model draft alike; the
    block's bytes are its tensors' in the target (gguf-py's reader)."""
    import gguf
    t = mtp_targets["qwen35"]
    target = t("default", "f16")
    r = _accept("--target", str(target), "--draft", "mtp", "--draft", str(t("mtp", "f16")), "--prompts",
                _ids_file(tmp_path / "ids.jsonl", MTP_PROMPTS), "-n", "16", "--json")
    assert r.exit_code == 0, r.output
    own, sidecar = json.loads(r.stdout)["drafters"]
    assert (own["name"], own["family"], own["source"]) == ("mtp", "mtp", "target")
    assert (sidecar["family"], sidecar["source"]) == ("mtp", "gguf")
    want = _target_only(target, MTP_PROMPTS, 16)
    for d in (own, sidecar):
        assert d["run"]["outputs"] == want and d["run"]["settings"]["n_max"] == 3
    assert own["run"]["stats"] == sidecar["run"]["stats"]
    reader = gguf.GGUFReader(target)
    trunk = reader.fields["qwen35.block_count"].contents() - reader.fields["qwen35.nextn_predict_layers"].contents()
    assert own["bytes"] == sum(int(x.n_bytes) for x in reader.tensors if x.name.startswith(f"blk.{trunk}."))


def test_mtp_on_a_target_without_one_is_refused(mtp_targets, tmp_path):
    r = _accept("--target", str(mtp_targets["qwen35"]("no-mtp", "f16")), "--draft", "mtp", "--prompts",
                _ids_file(tmp_path / "ids.jsonl", MTP_PROMPTS), "-n", "8")
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith("error: mtp: ") and \
        "context type MTP requested but model doesn't contain MTP layers" in r.stderr       # llama.cpp's words


# ----------------------------------------------------------------------------------------------------------
# temperatures (issue 42 part 4)

TEMPS = ["--temp", "0,0.8", "--seeds", "2", "--seed", "11"]


@pytest.fixture(scope="module")
def sampled(work, tmp_path_factory):
    _, paths, prompts, _ = work
    plot = tmp_path_factory.mktemp("plot") / "temps.png"
    r = _accept(*_drafts(paths, "f16", "q2_k"), "--prompts", prompts, "-n", str(N), *TEMPS, "--json", "--plot",
                str(plot))
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout), plot


def test_sampled_outputs_equal_target_only_sampled_decoding(work, sampled):
    chosen = [ids for _, ids in work[3]]
    out, _ = sampled
    greedy_outputs = _target_only(TARGET, chosen, N, {EOS})
    want = {seed: _target_only(TARGET, chosen, N, {EOS}, SamplingParams(temp=0.8, seed=seed)) for seed in (11, 12)}
    assert want[11] != greedy_outputs and want[11] != want[12]
    at0, at8 = out["by_temperature"]
    assert (at0["temp"], at0["seeds"], at0["reference_outputs"]) == (0, [], [greedy_outputs])
    assert (at8["temp"], at8["seeds"], at8["reference_outputs"]) == (0.8, [11, 12], [want[11], want[12]])
    for d in out["drafters"]:
        greedy_at, sampled_at = d["by_temperature"]
        assert greedy_at["runs"][0]["outputs"] == greedy_outputs and greedy_at["runs"][0]["sampling"] is None
        for seed, run in zip((11, 12), sampled_at["runs"]):
            assert run["outputs"] == want[seed] and run["outputs_match_target"], (d["name"], seed)
            assert (run["sampling"]["temp"], run["sampling"]["seed"]) == (0.8, seed)


def test_temperature_fields(sampled):
    out, plot = sampled
    assert out["temperatures"] == [0, 0.8] and out["seeds"] == [11, 12] and out["verdict"] == "pass"
    assert "temp 0.8" in out["sampling"]["chain"]
    base = out["drafters"][0]["by_temperature"]
    for d in out["drafters"]:
        assert d["run"] == d["by_temperature"][0]["runs"][0]        # the summary is the first temperature's
        for at, base_at in zip(d["by_temperature"], base):
            runs = at["runs"]
            taus = [r["stats"]["tau_zlab"] for r in runs]
            rates = [r["stats"]["acceptance_rate"] for r in runs]
            assert at["tau"] == {"mean": sum(taus) / len(taus), "min": min(taus), "max": max(taus)}
            assert at["acceptance"] == {"mean": sum(rates) / len(rates), "min": min(rates), "max": max(rates)}
            assert at["delta_tau"] == at["tau"]["mean"] - base_at["tau"]["mean"]     # the baseline at the same T
            if at["temp"] == 0:
                assert at["expected_acceptance"] is None and at["expected_acceptance_rejection"] is None
                continue
            for field, stat in (("expected_acceptance", "expected_acceptance_rate"),
                                ("expected_acceptance_rejection", "expected_acceptance_rate_rejection")):
                values = [r["stats"][stat] for r in runs]
                assert at[field] == pytest.approx(sum(values) / len(values)) and 0 < at[field] < 1
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    from matplotlib.image import imread
    assert imread(plot).shape[1] >= 1400            # a third panel: τ by temperature (two panels: 1100 pixels)


def test_one_prompt_at_a_temperature_equals_run(work, tmp_path):
    """accept at T 0.8 with seed 11 on one prompt: every statistic (the expected acceptance too) and the output equal
    `ggtools run --draft --temp 0.8 --seed 11` on that prompt."""
    _, paths, _, chosen = work
    ids = chosen[0][1]
    r = _accept(*_drafts(paths, "f16"), "--prompts", _ids_file(tmp_path / "one.jsonl", [ids]), "-n", str(N),
                "--temp", "0.8", "--seed", "11", "--json")
    assert r.exit_code == 0, r.output
    mine = json.loads(r.stdout)["drafters"][0]["run"]
    single = CliRunner().invoke(main, ["run", "--target", TARGET, "--threads", "1", "--draft", paths["f16"],
                                       "--prompt-ids", ",".join(map(str, ids)), "-n", str(N), "--temp", "0.8",
                                       "--seed", "11", "--json"])
    assert single.exit_code == 0, single.output
    single = json.loads(single.stdout)
    assert mine["stats"] == single["stats"] and mine["outputs"] == single["outputs"]
    assert "expected_acceptance_rate" in mine["stats"]


def test_gate_per_temperature(work):
    """--min-tau between the drafters' τ at T 0 and at T 0.8 fails every drafter at T 0.8 only, naming it; a drafter
    whose drafts are bad (mask id 0) fails --max-drop against the baseline at T 0."""
    _, paths, prompts, _ = work
    r = _accept(*_drafts(paths, "f16", "q2_k", "mask-0"), "--prompts", prompts, "-n", str(N), *TEMPS, "--json")
    out = json.loads(r.stdout)
    good = out["drafters"][:2]
    assert min(d["by_temperature"][0]["tau"]["mean"] for d in good) > \
        max(d["by_temperature"][1]["tau"]["mean"] for d in good) + 0.2
    assert r.exit_code == 1 and out["failed"] == ["mask-0.gguf"]
    mask = out["drafters"][2]
    assert mask["failures"][0].startswith("at T 0, tau ") and "below the baseline's" in mask["failures"][0]
    floor = (min(d["by_temperature"][0]["tau"]["mean"] for d in good)
             + max(d["by_temperature"][1]["tau"]["mean"] for d in good)) / 2
    r = _accept(*_drafts(paths, "f16", "q2_k"), "--prompts", prompts, "-n", str(N), *TEMPS, "--min-tau", f"{floor:.4f}")
    assert r.exit_code == 1
    fails = [line for line in r.stderr.splitlines() if line.startswith("FAIL: ")]
    assert len(fails) == 3, r.stderr
    for line, name in zip(fails, ("drafter-f16.gguf", "drafter-q2_k.gguf")):
        assert line.startswith(f"FAIL: {name}: at T 0.8, tau ") and f"is below --min-tau {floor:.4f}" in line
    assert "By temperature" in r.stdout and sum(line.startswith("drafter-") and "11..12" in line
                                                   for line in r.stdout.splitlines()) == 2
    # --min-acceptance likewise, between the good drafters' acceptance at T 0 and at T 0.8
    acc = [[d["by_temperature"][k]["acceptance"]["mean"] for d in good] for k in (0, 1)]
    assert min(acc[0]) > max(acc[1])
    floor = (min(acc[0]) + max(acc[1])) / 2
    r = _accept(*_drafts(paths, "f16", "q2_k"), "--prompts", prompts, "-n", str(N), *TEMPS, "--min-acceptance",
                f"{floor:.4f}", "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["min_acceptance"] == float(f"{floor:.4f}")
    for d in out["drafters"]:
        assert len(d["failures"]) == 1 and d["failures"][0].startswith("at T 0.8, acceptance ") and \
            d["failures"][0].endswith(f"is below --min-acceptance {floor:.4f}"), d["failures"]


def test_sampled_output_that_differs_fails_at_its_temperature(work, monkeypatch):
    """A sampled reference with one token changed fails every drafter at T 0.8, each seed named; greedy passes."""
    _, paths, prompts, _ = work
    real = TargetOnly.output

    def changed(self, i):
        tokens = real(self, i)
        return tokens if self.sampling is None else tokens[:-1] + [(tokens[-1] + 1) % 2046]

    monkeypatch.setattr(TargetOnly, "output", changed)
    r = _accept(*_drafts(paths, "f16"), "--prompts", prompts, "-n", str(N), *TEMPS, "--json")
    out = json.loads(r.stdout)
    assert r.exit_code == 1 and out["drafters"][0]["failures"] == [
        f"at T 0.8, output differs from target-only sampled decoding (seed {seed}) on 3 of 3 prompts"
        for seed in (11, 12)]
    assert out["drafters"][0]["by_temperature"][0]["failures"] == []


def test_random_seed_is_reported_and_replays(work, tmp_path):
    _, paths, _, chosen = work
    args = [*_drafts(paths, "f16"), "--prompts", _ids_file(tmp_path / "one.jsonl", [chosen[0][1]]), "-n", "12",
            "--temp", "0.9", "--seeds", "2", "--json"]
    drawn = _accept(*args)
    assert drawn.exit_code == 0, drawn.output
    drawn = json.loads(drawn.stdout)
    seeds = drawn["seeds"]
    assert len(seeds) == 2 and seeds[1] == seeds[0] + 1
    replay = json.loads(_accept(*args, "--seed", str(seeds[0])).stdout)
    assert replay["seeds"] == seeds
    assert replay["by_temperature"][0]["reference_outputs"] == drawn["by_temperature"][0]["reference_outputs"]


def test_seed_list():
    assert seed_list(5, 3) == [5, 6, 7]
    drawn = seed_list(None, 1000)
    assert drawn == list(range(drawn[0], drawn[0] + 1000)) and drawn[-1] <= MAX_SEED
    assert seed_list(MAX_SEED - 2, 3)[-1] == MAX_SEED
    with pytest.raises(GGToolsError, match=f"--seed: {MAX_SEED - 1} with --seeds 3: the seeds"):
        seed_list(MAX_SEED - 1, 3)


def test_trees_are_measured_greedily_beside_temperatures(work, tmp_path):
    _, paths, _, chosen = work
    one = _ids_file(tmp_path / "one.jsonl", [chosen[0][1]])
    r = _accept(*_drafts(paths, "f16"), "--prompts", one, "-n", "12", "--temp", "0.8,0", "--seed", "3",
                "--tree-budget", "4", "--json")
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)["drafters"][0]
    assert d["run"]["sampling"]["temp"] == 0.8                # the first temperature's
    tree = d["trees"][0]["run"]
    assert tree["sampling"] is None and tree["outputs"] == _target_only(TARGET, [chosen[0][1]], 12, {EOS})
    chain = d["by_temperature"][1]["runs"][0]
    assert d["trees"][0]["delta_tau"] == tree["stats"]["tau_zlab"] - chain["stats"]["tau_zlab"]
