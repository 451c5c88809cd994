"""`ggtools run`: output, --json fields, usage errors."""

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.cli.run import command
from ggtools.jobs.errors import UsageError
from ggtools.runtime import ModelError
from ggtools.runtime.errors import SettingsError
from tests.test_runtime_model import write_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return write_model(tmp_path_factory.mktemp("cli") / "tiny.gguf")


def invoke(*args):
    return CliRunner().invoke(command, [str(a) for a in args])


def test_prompt_ids_json(tiny_model):
    result = invoke("--target", tiny_model, "--prompt-ids", "5, 17 42", "-n", "6", "--threads", "1", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["prompt_ids"] == [5, 17, 42] and len(data["generated_ids"]) == 6
    assert data["text"] is None and data["stop"] == "length" and data["threads"] == 1
    assert data["peak_rss_bytes"] > 0 and data["generate_tokens_per_second"] > 0


def test_peak_rss_is_never_below_rss(tiny_model):
    """A fresh process (in pytest's the peak is pytest's): both values come from one reading, so the peak, a
    maximum over the run, is at least the current value (statm and getrusage disagreed by ~300 KB)."""
    run = subprocess.run([sys.executable, "-m", "ggtools", "run", "--target", str(tiny_model), "--prompt-ids", "5",
                          "-n", "2", "--threads", "1", "--json"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    data = json.loads(run.stdout)
    assert data["peak_rss_bytes"] >= data["rss_bytes"] > 0


def test_plain_output_lists_ids_without_a_vocabulary(tiny_model):
    result = invoke("--target", tiny_model, "--prompt-ids", "5", "-n", "3")
    assert result.exit_code == 0
    assert len(result.stdout.split()) == 3 and "tok/s" in result.stderr


@pytest.mark.parametrize("args", [[], ["--prompt", "hi", "--prompt-ids", "1"]])
def test_exactly_one_prompt(tiny_model, args):
    result = invoke("--target", tiny_model, *args)
    assert result.exit_code == 2 and "exactly one" in result.output


def test_bad_ids_and_text_without_vocabulary(tiny_model):
    assert invoke("--target", tiny_model, "--prompt-ids", "1,x").exit_code == 2
    result = invoke("--target", tiny_model, "--prompt", "hello")
    assert isinstance(result.exception, ModelError)


@pytest.mark.parametrize("args, kind, said", [
    (["-n", "100000"], UsageError, "tiny.gguf: the prompt (1 tokens) plus -n 100000 is 100001 tokens, beyond the "
                                   "context length"),
    (["--device", "cuda"], SettingsError, "--device and --dtype other than cpu / f32 need --backend torch"),
])
def test_usage_refusals_are_not_model_faults(tiny_model, args, kind, said):
    """A setting that cannot work is the jobs' UsageError or the runtime's SettingsError, both exit 2, one line."""
    result = invoke("--target", tiny_model, "--prompt-ids", "1", *args)
    assert isinstance(result.exception, kind), result.exception
    cli = CliRunner().invoke(main, ["run", "--target", str(tiny_model), "--prompt-ids", "1", *args])
    assert cli.exit_code == 2 and cli.stderr == f"error: {result.exception}\n" and said in cli.stderr, cli.output


def test_threads_beyond_the_runtimes_most_are_refused(tiny_model, monkeypatch):
    """On a machine with more CPUs than the workers take (1024), --threads past that is refused, not cut."""
    monkeypatch.setattr("os.cpu_count", lambda: 2048)
    cli = CliRunner().invoke(main, ["run", "--target", str(tiny_model), "--prompt-ids", "1", "--threads", "1025"])
    assert cli.exit_code == 2 and cli.stderr == "error: --threads: 1025 is more than 1024 (the runtime's most)\n", \
        cli.output


def test_text_prompt_with_a_real_vocabulary(smollm2_path):
    result = invoke("--target", smollm2_path, "--prompt", "The capital of France is", "-n", "4")
    assert result.exit_code == 0, result.output
    assert "Paris" in result.stdout
