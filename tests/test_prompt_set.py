"""Prompt sets of `ggtools accept`: JSONL and plain-text files, the default set, and one-line refusals of bad files
(through the command: exit 2, no traceback, nothing decoded)."""

import json

import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.gguf import GGUFFile
from ggtools.jobs.demo import demo_data
from ggtools.jobs.prompt_set import PromptSetError, default_prompts_path, load_prompts
from ggtools.runtime import Tokenizer

TARGET = str(demo_data() / "target.gguf")
N_VOCAB = 2048


@pytest.fixture(scope="module")
def tokenizer():
    with GGUFFile(TARGET) as f:
        return Tokenizer.from_gguf(f)


@pytest.fixture(scope="module")
def hf_tokenizer():
    """The same BPE for Hugging Face `tokenizers` (shipped beside the demo pair): an independent encoder."""
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(demo_data() / "tokenizer.json"))


def _write(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_jsonl_texts_and_ids(tmp_path, tokenizer, hf_tokenizer):
    text = "def main():\n    return 0\n"
    path = _write(tmp_path / "p.jsonl", [json.dumps({"id": "a", "prompt": text}), "",
                                         json.dumps({"prompt_ids": [1, 2, 3], "note": "ignored"})])
    prompts = load_prompts(path, tokenizer, N_VOCAB)
    assert [p.id for p in prompts] == ["a", "2"]
    assert prompts[0].ids == hf_tokenizer.encode(text).ids and prompts[0].text == text
    assert prompts[1].ids == [1, 2, 3] and prompts[1].text is None


def test_plain_text_paragraphs(tmp_path, tokenizer, hf_tokenizer):
    path = tmp_path / "p.txt"
    path.write_text("\n\nimport os\nimport sys\n\n   \nclass A:\n    pass\n")
    prompts = load_prompts(path, tokenizer, N_VOCAB)
    assert [p.text for p in prompts] == ["import os\nimport sys", "class A:\n    pass"]
    assert [p.id for p in prompts] == ["1", "2"]
    assert [p.ids for p in prompts] == [hf_tokenizer.encode(p.text).ids for p in prompts]


def test_default_set(tokenizer, hf_tokenizer):
    prompts = load_prompts(None, tokenizer, N_VOCAB)
    kinds = [p.id.split("-")[0] for p in prompts]
    assert len(prompts) == 12 and {k: kinds.count(k) for k in kinds} == {"code": 3, "math": 3, "chat": 3, "prose": 3}
    raw = [json.loads(line)["prompt"] for line in default_prompts_path().read_text().splitlines()]
    assert [p.ids for p in prompts] == [hf_tokenizer.encode(t).ids for t in raw]


def test_text_prompt_without_a_vocabulary(tmp_path):
    path = _write(tmp_path / "p.jsonl", [json.dumps({"prompt": "x"})])
    with pytest.raises(PromptSetError, match=r"p.jsonl:1: a text prompt needs the target's vocabulary"):
        load_prompts(path, None, N_VOCAB)
    assert load_prompts(_write(tmp_path / "ids.jsonl", ['{"prompt_ids": [5]}']), None, N_VOCAB)[0].ids == [5]


BAD_FILES = [
    ("bad.jsonl", ['{"prompt": "ok"}', '{"prompt": "no end"'], "bad.jsonl:2: not valid JSON"),
    ("empty.jsonl", [], "empty.jsonl: no prompts (the file is empty)"),
    ("blank.txt", ["", "   "], "blank.txt: no prompts"),
    ("vocab.jsonl", ['{"prompt_ids": [1, 2048]}'], "vocab.jsonl:1: token id 2048 is outside the target's vocabulary "
                                                   "(0..2047)"),
    ("neg.jsonl", ['{"prompt_ids": [-1]}'], "neg.jsonl:1: token id -1 is outside"),
    ("both.jsonl", ['{"prompt": "a", "prompt_ids": [1]}'], "both.jsonl:1: give exactly one of"),
    ("neither.jsonl", ['{"id": "x"}'], "neither.jsonl:1: give exactly one of"),
    ("list.jsonl", ['[1, 2]'], "list.jsonl:1: expected a JSON object, got list"),
    ("floats.jsonl", ['{"prompt_ids": [1.0]}'], "floats.jsonl:1: \"prompt_ids\" must be a non-empty list of integers"),
    ("bools.jsonl", ['{"prompt_ids": [true]}'], "\"prompt_ids\" must be a non-empty list of integers"),
    ("noids.jsonl", ['{"prompt_ids": []}'], "\"prompt_ids\" must be a non-empty list of integers"),
    ("emptytext.jsonl", ['{"prompt": ""}'], "emptytext.jsonl:1: \"prompt\" must be a non-empty string"),
    ("badid.jsonl", ['{"id": [1], "prompt": "a"}'], "\"id\" must be a string or an integer"),
    ("dup.jsonl", ['{"id": "a", "prompt": "x"}', '{"id": "a", "prompt": "y"}'],
     "dup.jsonl:2: id 'a' repeats the prompt at"),
]


@pytest.mark.parametrize("name, lines, said", BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_prompt_files_are_refused_in_one_line(tmp_path, name, lines, said):
    path = _write(tmp_path / name, lines)
    report = tmp_path / "report.md"
    r = CliRunner().invoke(main, ["accept", "--target", TARGET, "--draft", TARGET, "--prompts", str(path),
                                  "--report", str(report)])
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith("error: ") and said in r.stderr and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.output and not report.exists()


@pytest.mark.parametrize("content, said", [(b"\xff\xfe bad", "byte 0: not UTF-8 text"), (None, "no such file")])
def test_unreadable_prompt_files(tmp_path, content, said):
    path = tmp_path / "p.txt"
    if content is not None:
        path.write_bytes(content)
    r = CliRunner().invoke(main, ["accept", "--target", TARGET, "--draft", TARGET, "--prompts", str(path)])
    assert r.exit_code == 2 and said in r.stderr and r.stderr.count("\n") == 1, r.output
