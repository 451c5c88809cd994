"""`ggtools run`: output, --json fields, usage errors."""

import json

import pytest
from click.testing import CliRunner

from ggtools.cli.run import command
from ggtools.runtime import ModelError
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


def test_text_prompt_with_a_real_vocabulary(smollm2_path):
    result = invoke("--target", smollm2_path, "--prompt", "The capital of France is", "-n", "4")
    assert result.exit_code == 0, result.output
    assert "Paris" in result.stdout
