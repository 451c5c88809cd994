"""`ggtools run` at temperature > 0: the seed is always reported and replays the run; the model's general.sampling.*
keys are the chain's defaults as llama.cpp takes them, the user's options win; a broken key is a model-file rule
(validate 1, run 2); options that cannot mean anything are refused."""

import json

import pytest
from click.testing import CliRunner
from gguf import GGUFValueType as VT

from ggtools.cli import main
from ggtools.jobs.demo import demo_data
from tests.test_convert_support import rewrite_gguf

TARGET = str(demo_data() / "target.gguf")
RUN = ["run", "--target", TARGET, "--prompt-ids", "1,450,996", "-n", "12"]


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def run_json(*args, target=TARGET):
    result = cli("run", "--target", target, "--prompt-ids", "1,450,996", "-n", "12", "--json", *args)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def with_keys(tmp_path, *keys, name="t.gguf"):
    return str(rewrite_gguf(TARGET, tmp_path / name, set_keys=[(k, vt, v, None) for k, vt, v in keys]))


def test_a_random_seed_is_reported_and_replays_the_run():
    first = run_json("--temp", "1.0")
    seed = first["sampling"]["seed"]
    again = run_json("--temp", "1.0", "--seed", seed)
    assert again["generated_ids"] == first["generated_ids"]
    other = run_json("--temp", "1.0", "--seed", (seed + 1) % 1000)
    assert other["sampling"]["seed"] != seed
    assert run_json()["sampling"] is None                       # --temp 0: greedy, as before


def test_the_models_sampling_keys_are_defaults_and_options_win(tmp_path):
    target = with_keys(tmp_path, ("general.sampling.top_k", VT.INT32, 7), ("general.sampling.top_p", VT.FLOAT32, 0.5),
                       ("general.sampling.sequence", VT.STRING, "temperature;top-k;nucleus"))
    s = run_json("--temp", "0.7", "--seed", "1", target=target)["sampling"]
    assert (s["top_k"], s["top_p"], s["samplers"]) == (7, 0.5, "temperature;top_k;top_p")
    s = run_json("--temp", "0.7", "--seed", "1", "--top-k", "3", "--samplers", "top_k;temp", target=target)["sampling"]
    assert (s["top_k"], s["top_p"], s["samplers"]) == (3, 0.5, "top_k;temperature")


def test_a_float_key_is_read_as_llama_cpp_prints_it(tmp_path):
    """llama.cpp prints a float key with six decimals and parses that back: 1e-7 is 0 (min_p off)."""
    target = with_keys(tmp_path, ("general.sampling.min_p", VT.FLOAT32, 1e-7), ("general.sampling.top_k", VT.FLOAT32,
                                                                                 12.75))
    s = run_json("--temp", "0.7", "--seed", "1", target=target)["sampling"]
    assert (s["min_p"], s["top_k"]) == (0.0, 12)


@pytest.mark.parametrize("key, vtype, value, said", [
    ("general.sampling.top_p", VT.STRING, "0.9", "has type str: a number is required"),
    ("general.sampling.temp", VT.FLOAT32, float("nan"), "it must be a finite number"),
    ("general.sampling.temp", VT.FLOAT32, -1.0, "a temperature cannot be negative"),
    ("general.sampling.top_k", VT.INT64, 2 ** 40, "it must fit a 32-bit integer"),
    ("general.sampling.sequence", VT.STRING, "top_k;bogus", "names 'bogus': not a llama.cpp sampler"),
])
def test_broken_sampling_keys_are_model_file_rules(tmp_path, key, vtype, value, said):
    target = with_keys(tmp_path, (key, vtype, value))
    validate = cli("validate", target)
    assert validate.exit_code == 1 and said in validate.output
    run = cli("run", "--target", target, "--prompt-ids", "1,2", "-n", "2")
    assert run.exit_code == 2 and f"key '{key}'" in run.stderr and said in run.stderr


def test_a_model_asking_for_mirostat_is_refused_until_switched_off(tmp_path):
    target = with_keys(tmp_path, ("general.sampling.mirostat", VT.INT32, 2))
    refused = cli("run", "--target", target, "--prompt-ids", "1,2", "-n", "2", "--temp", "0.8")
    assert refused.exit_code == 2 and "mirostat sampling is not supported" in refused.stderr
    assert run_json("--temp", "0.8", "--mirostat", "0", target=target)["sampling"] is not None
    assert cli("run", "--target", target, "--prompt-ids", "1,2", "-n", "2").exit_code == 0   # greedy needs no chain


@pytest.mark.parametrize("args, said", [
    (["--top-k", "5"], "--top-k: needs --temp above 0"),
    (["--seed", "5"], "--seed needs --temp above 0"),
    (["--temp", "nan"], "is not a finite number"),
    (["--temp", "-0.5"], "-0.5 is not in the range x>=0"),
    (["--temp", "1", "--samplers", "top_k;bogus"], "unknown sampler 'bogus'"),
    (["--temp", "1", "--samplers", "infill"], "not supported by ggtools' runtime"),
    (["--temp", "1", "--seed", "4294967295"], "4294967295 is not in the range"),
    (["--temp", "1", "--repeat-penalty", "0"], "is not in the range x>0"),
    (["--temp", "1", "--mirostat", "2"], "not in the range"),
    (["--temp", "1e308"], "--temp: 1e+308 is not a finite 32-bit float"),
])
def test_options_that_cannot_mean_anything_are_refused(args, said):
    result = cli(*RUN, *args)
    assert result.exit_code == 2 and said in result.output, result.output
