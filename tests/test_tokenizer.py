"""GGUF tokenizer: exact ids on llama.cpp's vocabulary test vectors (models/ggml-vocab-*.gguf with
.inp/.out, tokenized with add_special=false, parse_special=false as test-tokenizer-0 does), plus
special tokens, BOS handling and decoding on real vocabularies."""

import pytest

from ggtools.gguf import GGUFFile
from ggtools.runtime.tokenizer import Tokenizer, TokenizerError

SEPARATOR = "\n__ggml_vocab_test__\n"
# byte-level BPE with the supported pre-tokenizers, and SentencePiece vocabularies
VOCABS = ["gpt-2", "llama-bpe", "qwen2", "qwen35", "starcoder", "refact", "command-r", "mpt", "falcon",
          "deepseek-coder", "deepseek-llm", "llama-spm", "phi-3"]


def vocab_cases(src, name):
    base = src / "models" / f"ggml-vocab-{name}.gguf"
    inputs = base.with_name(base.name + ".inp").read_text(encoding="utf-8").split(SEPARATOR)
    outputs = base.with_name(base.name + ".out").read_text(encoding="utf-8").split("\n")
    return base, [(text, [int(v) for v in ids.split()]) for text, ids in zip(inputs, outputs)]


@pytest.mark.parametrize("name", VOCABS)
def test_vocab_test_vectors(llama_cpp_src, name):
    path, cases = vocab_cases(llama_cpp_src, name)
    assert len(cases) >= 40
    tokenizer = Tokenizer.from_gguf(GGUFFile(path))
    wrong = [(text, ids, got) for text, ids in cases
             if (got := tokenizer.encode(text, add_special=False, parse_special=False)) != ids]
    assert not wrong, wrong[:3]


@pytest.mark.parametrize("name", ["qwen2", "llama-spm"])
def test_decode_inverts_encode(llama_cpp_src, name):
    path, cases = vocab_cases(llama_cpp_src, name)
    tokenizer = Tokenizer.from_gguf(GGUFFile(path))
    for text, ids in cases:
        decoded = tokenizer.decode(ids)
        if name == "llama-spm":     # SentencePiece adds a leading space
            decoded = decoded[1:] if decoded.startswith(" ") else decoded
        assert decoded == text


def test_special_tokens_and_bos(llama_cpp_src):
    tokenizer = Tokenizer.from_gguf(GGUFFile(llama_cpp_src / "models" / "ggml-vocab-llama-bpe.gguf"))
    text = "<|begin_of_text|>Hello"
    plain = tokenizer.encode(text, add_special=False, parse_special=False)
    parsed = tokenizer.encode(text, add_special=False, parse_special=True)
    assert parsed == [tokenizer.token_to_id["<|begin_of_text|>"]] + tokenizer.encode("Hello", add_special=False)
    assert plain != parsed
    assert tokenizer.encode("Hello")[0] == tokenizer.bos          # llama-bpe adds BOS by default
    assert tokenizer.decode(parsed) == "Hello" and tokenizer.decode(parsed, special=True) == text


def test_unsupported_tokenizer_model(llama_cpp_src):
    with pytest.raises(TokenizerError, match="bert"):
        Tokenizer.from_gguf(GGUFFile(llama_cpp_src / "models" / "ggml-vocab-bert-bge.gguf"))
