"""DSpark's model-file rules (reference §13): what a DFlash drafter with DSpark heads, or with a reduced draft
vocabulary, must hold beyond a DFlash drafter's keys, as llama.cpp's graph asserts them or misreads them.

llama.cpp (src/models/dflash.cpp, common/speculative.cpp): the Markov head asserts `dflash.block_size` (a plain
DFlash drafter would be drafted with block size 16); `dflash.sample_from_anchor` and `dflash.has_confidence_head` are
read as text and compared with "true"; `d2t` (the target id of each row of the drafter's own output head) is asserted
I64 and as long as the head it scatters, and its ids index the vocabulary (set_rows: out of range aborts, a repeated
id loses a row). Only a profile that has these keys and tensors (llama.cpp's) is checked here; lucebox's DSpark
loader rules are its loader's (dflash/dspark_rules.py), and its block size is a drafter key (drafter.py).

Applied by doctor and validate (dflash/dspark_rules.py: findings quoting llama.cpp) and by ggtools' drafter loader
(runtime/drafter/hparams.py: a ModelError), in these words.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from ggtools.dflash.profiles import D2T, MARKOV_W1, profile_of
from ggtools.hparam_rules.violation import MISSING, TYPE, Violation

BLOCK_SIZE_ASSERT = ('GGML_ASSERT(it != model.gguf_kv.end() && "DSpark draft requires \'dflash.block_size\' in GGUF '
                     'metadata") failed')
BLOCK_SIZE_POSITIVE = "GGML_ASSERT(block_size > 0) failed"
D2T_TYPE_ASSERT = "GGML_ASSERT(model.d2t->type == GGML_TYPE_I64) failed"
D2T_HEAD_ASSERT = "GGML_ASSERT(model.d2t->ne[0] == n_draft_vocab) failed"
FIRST_DRAFT_ABORTS = "the first draft aborts"
FLAG_SYMPTOMS = {"sample_from_anchor": ("bonus-anchor blocks", "an anchor-first drafter drafts one position late: "
                                        "acceptance near 0"),
                 "has_confidence_head": ("no confidence head", "--spec-draft-p-min > 0 is refused")}
FLAG_CHECKS = {"sample_from_anchor": "sample_from_anchor", "has_confidence_head": "confidence_head"}


def dspark_violations(f, n_vocab: int | None = None, locate=None) -> list[Violation]:
    """Every DSpark rule the drafter breaks (empty for a drafter without DSpark heads or d2t, or an arch no DFlash
    loader takes). f: the drafter's GGUFFile (shard 1 of a set: its keys); n_vocab: the vocabulary d2t's ids index
    (ggtools' runtime: the target's; None: the drafter's own tokenizer, as llama.cpp reads it); locate(name) ->
    (GGUFFile, TensorInfo) or None: where a tensor lies in the drafter's files (default: in f)."""
    p = profile_of(f.architecture)
    if p is None:
        return []
    locate = locate or (lambda name: (f, f.tensor[name]) if name in f.tensor else None)
    if n_vocab is None:
        tokens = f.kv.get("tokenizer.ggml.tokens")
        n_vocab = tokens.count if tokens is not None and tokens.is_array else None
    out = _d2t(p, locate, n_vocab)
    if locate(p.gguf_name(MARKOV_W1)) is None:
        return out
    return out + _block_size(f, p) + _flags(f, p)


def _d2t(p, locate, n_vocab) -> list[Violation]:
    """d2t: I64, one row per row of the head that gives the draft logits, each a distinct id of the vocabulary."""
    name = p.gguf_name(D2T)
    found = locate(name) if name else None
    if found is None:
        return []
    f, t = found

    def broken(rule, says=None, symptom="every draft aborts", kind=TYPE):
        return [Violation(None, rule, says, kind, "d2t", symptom, tensor=name)]

    if t.type_id != T.I64:
        return broken(f"is {t.type_name}, expected I64 (one target id per draft row)", D2T_TYPE_ASSERT)
    rows = int(t.ne[0])
    own_head = locate(p.gguf_name("lm_head.weight"))
    embd = locate(p.gguf_name("embed_tokens.weight"))
    if own_head is None and (embd is not None or n_vocab is not None):
        head_rows, head = (int(embd[1].ne[1]), "token_embd.weight") if embd else (n_vocab, "target's output head")
        if head_rows != rows:
            return broken(f"holds {rows} ids, so the drafter needs its own output.weight with {rows} rows: the "
                          f"{head} gives {head_rows} logits", None if embd else D2T_HEAD_ASSERT,
                          "the loader refuses token_embd.weight's shape" if embd else "every draft aborts")
    if n_vocab is None:
        return []
    fault = d2t_id_fault(f.tensor_data(t).view("<i8").reshape(-1), n_vocab)
    return broken(fault[0], None, fault[1]) if fault else []


def d2t_id_fault(ids, n_vocab: int) -> tuple[str, str] | None:
    """(rule, symptom) of a d2t table whose ids leave the vocabulary or repeat (each draft row scatters its logit
    into the vocabulary's row of its id: ggml_set_rows), else None. DSpark's and EAGLE3's d2t alike."""
    outside = np.flatnonzero((ids < 0) | (ids >= n_vocab))
    if outside.size:
        row = int(outside[0])
        return (f"row {row} maps to {int(ids[row])}, outside the target ids 0..{n_vocab - 1}",
                "the scatter of the draft logits indexes outside the vocabulary: the backend aborts (CPU: set_rows' "
                "bounds assert) or writes out of bounds")
    order = np.argsort(ids, kind="stable")
    repeated = np.flatnonzero(ids[order][1:] == ids[order][:-1])
    if repeated.size:
        a, b = sorted(int(r) for r in order[repeated[0]:repeated[0] + 2])
        return (f"maps two draft rows to one target id (rows {a} and {b} to {int(ids[a])})",
                "one of the two rows' logits is lost: drafts silently worse")
    return None


def _block_size(f, p) -> list[Violation]:
    """The Markov head asserts the block size: the default a DFlash drafter is drafted with (llama.cpp's 16) is no
    default for it (a profile without a default requires the key of every drafter: drafter.py)."""
    if p.default_block_size is None:
        return []
    key = p.key("block_size", f.architecture)
    block = f.get(key)
    if block is None:
        return [Violation(key, "missing: llama.cpp's DSpark Markov head asserts it", BLOCK_SIZE_ASSERT, MISSING,
                          "block_size", FIRST_DRAFT_ABORTS)]
    if isinstance(block, int) and not isinstance(block, bool) and block == 0:
        return [Violation(key, "is 0: llama.cpp's DSpark Markov head asserts a block above 0", BLOCK_SIZE_POSITIVE,
                          check="block_size", symptom=FIRST_DRAFT_ABORTS)]
    return []


def _flags(f, p) -> list[Violation]:
    """The block layout and confidence flags: BOOLs (llama.cpp compares their text with "true"; absent: true)."""
    out = []
    for role, (as_false, symptom) in FLAG_SYMPTOMS.items():
        if not p.has_key(role):
            continue
        key = p.key(role, f.architecture)
        value = f.get(key)
        if value is not None and not isinstance(value, bool):
            out.append(Violation(key, f"is {value!r}, expected a boolean: llama.cpp compares it with \"true\", so "
                                 f"false ({as_false})", None, TYPE, FLAG_CHECKS[role], symptom))
    return out
