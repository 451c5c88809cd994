"""Text <-> token ids with a GGUF's own vocabulary, as llama.cpp's llama-vocab.cpp does it.

- `gpt2` (byte-level BPE): special tokens are cut out first; each remaining piece is split by the
  pre-tokenizer's regexes (chosen by `tokenizer.ggml.pre`, applied one after another, each within the
  pieces of the previous one, unmatched text kept as pieces), mapped to GPT-2's byte alphabet and
  merged by rank (lowest rank first, leftmost on ties).
- `llama` (SentencePiece): spaces become U+2581, a space is prefixed at the start and after special
  tokens (`tokenizer.ggml.add_space_prefix`), characters are merged by token score (highest first),
  and pieces that are not tokens fall back to <0xXX> byte tokens.

Pre-tokenizer regexes use Unicode property classes, expanded for Python's `re` (unicode_classes.py).
"""

import heapq

from ggtools.runtime.errors import ModelError
from ggtools.runtime.unicode_classes import compile_pattern

NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_CONTRACTIONS = "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+"
           r"|\s+(?!\S)|\s+")
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"

# tokenizer.ggml.pre -> regexes, from llama-vocab.cpp (llm_tokenizer_bpe)
PRE_TOKENIZERS = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", "[0-9][0-9][0-9]"],
    "llama3": [_LLAMA3], "llama-v3": [_LLAMA3], "llama-bpe": [_LLAMA3], "falcon3": [_LLAMA3],
    "qwen2": [_QWEN2], "deepseek-r1-qwen": [_QWEN2], "stablelm2": [_QWEN2], "megrez": [_QWEN2],
    "qwen35": [_QWEN35],
    "gpt-2": [_GPT2], "phi-2": [_GPT2], "mpt": [_GPT2], "olmo": [_GPT2], "jais": [_GPT2],
    "smollm": [r"\p{N}", _GPT2], "starcoder": [r"\p{N}", _GPT2], "refact": [r"\p{N}", _GPT2],
    "command-r": [r"\p{N}", _GPT2], "codeshell": [r"\p{N}", _GPT2], "exaone": [r"\p{N}", _GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", "[一-龥ࠀ-一가-퟿]+", r"\p{N}"],
    "deepseek-llm": [r"[\r\n]", r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+", r"\s?[!-/:-~！-／：-～‘-‟　-。]+", r"\s+$",
                     "[一-龥ࠀ-一가-퟿]+", r"\p{N}+"],
}
# pre-tokenizers whose BOS llama.cpp adds by default (tokenizer.ggml.add_bos_token overrides), and
# those whose whole pre-token is taken as one token when the vocabulary has it ("ignore_merges")
ADD_BOS_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3"}
IGNORE_MERGES_PRE = {"llama3", "llama-v3", "llama-bpe", "falcon3"}


def merge_pairs(symbols: list[str], priority) -> list[str]:
    """Repeatedly join the adjacent pair with the lowest priority(left, right) (None: never joined),
    leftmost on ties, as llama.cpp's BPE and SPM tokenizers do; returns the joined symbols."""
    prev = list(range(-1, len(symbols) - 1))
    nxt = list(range(1, len(symbols) + 1))
    if nxt:
        nxt[-1] = -1
    heap = []

    def push(left, right):
        if left >= 0 and right >= 0:
            rank = priority(symbols[left], symbols[right])
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, symbols[left] + symbols[right]))

    for i in range(len(symbols) - 1):
        push(i, i + 1)
    while heap:
        _, left, right, joined = heapq.heappop(heap)
        if not symbols[left] or not symbols[right] or symbols[left] + symbols[right] != joined:
            continue
        symbols[left], symbols[right] = joined, ""
        nxt[left] = nxt[right]
        if nxt[right] >= 0:
            prev[nxt[right]] = left
        push(prev[left], left)
        push(left, nxt[left])
    return [s for s in symbols if s]


class TokenizerError(ModelError):
    """A vocabulary the runtime cannot encode with; pass token ids instead."""


def _bytes_to_unicode() -> dict:
    """GPT-2's reversible byte -> printable character map."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_TO_CHAR = _bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


class Tokenizer:
    """Shared parts: the vocabulary, special-token cutting, decoding. Build with `from_gguf`."""

    def __init__(self, gguf):
        self.tokens: list[str] = gguf.get("tokenizer.ggml.tokens")
        if not self.tokens:
            raise TokenizerError(f"{gguf.path}: no tokenizer.ggml.tokens")
        n = len(self.tokens)
        types = gguf.get("tokenizer.ggml.token_type")
        self.types = [int(t) for t in types] if types is not None else [NORMAL] * n
        self.token_to_id = {}
        for i, text in enumerate(self.tokens):
            self.token_to_id.setdefault(text, i)
        self.bos = gguf.get("tokenizer.ggml.bos_token_id")
        self.eos = gguf.get("tokenizer.ggml.eos_token_id")
        eot = gguf.get("tokenizer.ggml.eot_token_id")
        self.eog = {i for i in (self.eos, eot) if i is not None}
        self.add_bos = bool(gguf.get("tokenizer.ggml.add_bos_token", self.default_add_bos(gguf)))
        self.add_eos = bool(gguf.get("tokenizer.ggml.add_eos_token", False))
        # llama.cpp cuts special tokens longest first
        self.special_ids = sorted((i for i, t in enumerate(self.types) if t in (CONTROL, USER_DEFINED, UNKNOWN)),
                                  key=lambda i: (-len(self.tokens[i]), i))

    @staticmethod
    def from_gguf(gguf) -> "Tokenizer":
        model = gguf.get("tokenizer.ggml.model")
        if model == "gpt2":
            return BPETokenizer(gguf)
        if model == "llama":
            return SPMTokenizer(gguf)
        raise TokenizerError(f"{gguf.path}: tokenizer model {model!r} is not supported; pass token ids")

    def default_add_bos(self, gguf) -> bool:
        return False

    def n_vocab(self) -> int:
        return len(self.tokens)

    def encode(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Token ids of text. add_special: BOS/EOS as the vocabulary asks; parse_special: control
        tokens written in the text (e.g. '<|im_start|>') become those tokens."""
        out = [self.bos] if add_special and self.add_bos and self.bos is not None else []
        self._encode_fragments(self._cut_special(text, parse_special), out)
        if add_special and self.add_eos and self.eos is not None:
            out.append(self.eos)
        return out

    def _cut_special(self, text: str, parse_special: bool) -> list:
        """The text as a list of str fragments and int special-token ids (tokenizer_st_partition)."""
        fragments = [text] if text else []
        for tid in self.special_ids:
            if not parse_special and self.types[tid] in (CONTROL, UNKNOWN):
                continue
            piece = self.tokens[tid]
            if not piece:
                continue
            cut = []
            for frag in fragments:
                if not isinstance(frag, str) or piece not in frag:
                    cut.append(frag)
                    continue
                parts = frag.split(piece)
                for k, part in enumerate(parts):
                    if k:
                        cut.append(tid)
                    if part:
                        cut.append(part)
            fragments = cut
        return fragments

    def _encode_fragments(self, fragments: list, out: list) -> None:
        raise NotImplementedError

    def piece(self, token_id: int, special: bool = False) -> bytes:
        """The bytes one token stands for (control tokens only when special)."""
        kind = self.types[token_id]
        text = self.tokens[token_id]
        if kind in (CONTROL, UNKNOWN):
            return text.encode() if special else b""
        if kind == USER_DEFINED:
            return text.encode()
        return self._normal_piece(token_id, text)

    def _normal_piece(self, token_id: int, text: str) -> bytes:
        raise NotImplementedError

    def decode(self, ids, special: bool = False) -> str:
        return b"".join(self.piece(int(i), special) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer(Tokenizer):
    def __init__(self, gguf):
        super().__init__(gguf)
        self.pre = gguf.get("tokenizer.ggml.pre") or "default"
        self.regexes = PRE_TOKENIZERS.get(self.pre)
        self.ranks = {}
        for rank, merge in enumerate(gguf.get("tokenizer.ggml.merges") or []):
            cut = merge.find(" ", 1)
            if cut > 0:
                self.ranks.setdefault((merge[:cut], merge[cut + 1:]), rank)
        self._compiled = None

    def default_add_bos(self, gguf) -> bool:
        return (gguf.get("tokenizer.ggml.pre") or "default") in ADD_BOS_PRE

    def _patterns(self):
        if self._compiled is None:
            if self.regexes is None:
                raise TokenizerError(f"pre-tokenizer {self.pre!r} is not supported; pass token ids")
            self._compiled = [compile_pattern(r) for r in self.regexes]
        return self._compiled

    def split(self, text: str) -> list[str]:
        """Pre-tokenize: each regex splits every piece left by the previous ones."""
        pieces = [text]
        for pattern in self._patterns():
            split = []
            for piece in pieces:
                end = 0
                for m in pattern.finditer(piece):
                    if m.start() > end:
                        split.append(piece[end:m.start()])
                    if m.end() > m.start():
                        split.append(m.group())
                    end = m.end()
                if end < len(piece):
                    split.append(piece[end:])
            pieces = split
        return pieces

    def _encode_fragments(self, fragments, out):
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                continue
            for word in self.split(frag):
                self._encode_word("".join(BYTE_TO_CHAR[b] for b in word.encode("utf-8")), out)

    def _encode_word(self, word: str, out: list) -> None:
        if self.pre in IGNORE_MERGES_PRE and word in self.token_to_id:
            out.append(self.token_to_id[word])
            return
        symbols = self._merge(word)
        for sym in symbols:
            tid = self.token_to_id.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for ch in sym:  # unknown merge result: one token per byte, as llama.cpp
                tid = self.token_to_id.get(ch)
                if tid is not None:
                    out.append(tid)

    def _merge(self, word: str) -> list[str]:
        """Merge adjacent symbols by rank (lowest first, leftmost on ties)."""
        return merge_pairs(list(word), lambda a, b: self.ranks.get((a, b)))

    def _normal_piece(self, token_id, text):
        return bytes(CHAR_TO_BYTE.get(c, ord("?")) for c in text)


class SPMTokenizer(Tokenizer):
    def __init__(self, gguf):
        super().__init__(gguf)
        scores = gguf.get("tokenizer.ggml.scores")
        self.scores = [float(s) for s in scores] if scores is not None else [0.0] * len(self.tokens)
        self.add_space_prefix = bool(gguf.get("tokenizer.ggml.add_space_prefix", True))
        self.byte_ids = {}
        for i, text in enumerate(self.tokens):
            if self.types[i] == BYTE and len(text) == 6 and text.startswith("<0x"):
                self.byte_ids[int(text[3:5], 16)] = i
        self.unk = gguf.get("tokenizer.ggml.unknown_token_id")

    def default_add_bos(self, gguf) -> bool:
        return True

    def _encode_fragments(self, fragments, out):
        prev_special = True
        for frag in fragments:
            if isinstance(frag, int):
                out.append(frag)
                prev_special = True
                continue
            text = (" " if self.add_space_prefix and prev_special else "") + frag
            self._encode_text(text.replace(" ", "\u2581"), out)
            prev_special = False

    def _encode_text(self, text: str, out: list) -> None:
        """Merge characters by token score (highest first, leftmost on ties); every merge result is
        a token, so what is left over are single characters, which fall back to byte tokens."""
        def priority(a, b):
            tid = self.token_to_id.get(a + b)
            return None if tid is None else -self.scores[tid]

        for sym in merge_pairs(list(text), priority):
            tid = self.token_to_id.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for b in sym.encode("utf-8"):
                out.append(self.byte_ids.get(b, self.unk if self.unk is not None else 0))

    def _normal_piece(self, token_id, text):
        if self.types[token_id] == BYTE and token_id in self.byte_ids.values():
            return bytes([int(text[3:5], 16)])
        return text.replace("\u2581", " ").encode()
