"""Byte-level BPE for the demo pair: GPT-2 byte alphabet, Qwen2 pre-tokenizer regex, 2048 tokens
(2046 learned + <|endoftext|> + <|mask|> at the end), trained on the training files only."""

import json

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

from scripts.demo_pair.common import QWEN2_PRE_REGEX, SPECIAL_TOKENS, VOCAB_SIZE, read_text


def train_tokenizer(train_files) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE - len(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    texts = [read_text(p) for p in train_files]
    tok.train_from_iterator(texts, trainer=trainer)
    tok.add_special_tokens(SPECIAL_TOKENS)
    assert tok.get_vocab_size() == VOCAB_SIZE, tok.get_vocab_size()
    return tok


def vocab_and_merges(tok: Tokenizer):
    """(tokens by id, merges as 'a b' strings in rank order) for the GGUF tokenizer KVs."""
    data = json.loads(tok.to_str())
    vocab = dict(data["model"]["vocab"])
    for added in data["added_tokens"]:
        vocab[added["content"]] = added["id"]
    tokens = [None] * len(vocab)
    for s, i in vocab.items():
        tokens[i] = s
    assert all(t is not None for t in tokens)
    merges = [m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]]
    return tokens, merges
