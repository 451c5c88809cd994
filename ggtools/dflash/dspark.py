"""DSpark checkpoints: a DFlash v1 backbone plus a low-rank Markov head, an optional confidence head and an
optional reduced draft vocabulary, read as llama.cpp's converter reads them (conversion/qwen.py, DSparkModel).

- Config layouts. DeepSpec: flat `target_layer_ids`, `mask_token_id`, `block_size` beside the Qwen3 keys.
  speculators / SpecForge: the Qwen3 keys in `transformer_layer_config` (merged into the root) and
  `aux_hidden_state_layer_ids` (= target layer ids + 1). Either becomes a `dflash_config` unless the config
  has one. `sample_from_anchor`: stated at the root, else true only for the flat layout.
- The heads: `markov_w1` [V, R] (one rank-R vector per target token), `markov_w2` [Vd, R] (+ a scalar scale),
  `confidence_head.proj` [1, H + R] (+ bias [1]). R comes from markov_w1; V is vocab_size, Vd
  draft_vocab_size (else V).
- Vd < V: `d2t` [Vd] holds offsets (target id = d2t[i] + i), written as absolute I64 ids, each inside the
  target vocabulary and none twice; the drafter's own `lm_head` [Vd, H]. `t2d` is not used.

Rules llama.cpp's converter applies are refused with its words; beyond them: a Markov head whose shapes disagree
with the vocabulary or with each other's rank, a missing Markov head, a confidence bias without its weight, and
a reduced vocabulary without the drafter's own head (llama.cpp would take the target's, V wide, and abort).
"""

from dataclasses import dataclass

import numpy as np

from ggtools.dflash.config_reader import LAYER_ID, U32, ConfigReader, Range, merge_nested
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.profiles import (CONF_B, CONF_W, D2T, DSPARK_ARCHITECTURES, MARKOV_HEAD_TYPES, MARKOV_W1,
                                     MARKOV_W2, MARKOV_W2_SCALE, T2D)
from ggtools.dflash.safetensors import FLOAT_DTYPES

FLAT, SPECULATORS = "DeepSpec", "speculators"
AUX_LAYER_ID = Range(True, LAYER_ID.low + 1, LAYER_ID.high + 1, "the layer ids + 1 of a model llama.cpp loads "
                                                                 f"(LLAMA_MAX_LAYERS {int(LAYER_ID.high) + 1})")


@dataclass(frozen=True)
class DSparkSource:
    """What config.json says about the DSpark layout, before it is normalized."""
    layout: str                 # FLAT | SPECULATORS
    sample_from_anchor: bool
    anchor_from: str
    ids_from: str | None        # where the target layer ids come from, when the layout put them in dflash_config
    mask_from: str | None


@dataclass
class DSparkConfig:
    layout: str
    sample_from_anchor: bool
    anchor_from: str
    rank: int                   # R, markov_w1's second dimension
    vocab: int                  # V: the target's vocabulary
    draft_vocab: int            # Vd: rows of markov_w2 (and of the drafter's head when Vd < V)
    confidence: bool            # confidence_head.proj.weight present
    conf_bias: bool
    w2_scale: bool

    @property
    def reduced(self) -> bool:
        return self.draft_vocab < self.vocab

    @property
    def anchor_mode(self) -> str:
        return "anchor-first" if self.sample_from_anchor else "bonus anchor"

    def summary(self) -> str:
        heads = "Markov + confidence" if self.confidence else "Markov"
        vocab = (f"draft vocabulary {self.draft_vocab} of {self.vocab} (d2t)" if self.reduced else
                 f"full vocabulary {self.vocab}")
        return (f"DSpark ({self.layout} layout): {heads} head, rank {self.rank}, {self.anchor_mode} blocks "
                f"({self.anchor_from}), {vocab}")

    def as_dict(self) -> dict:
        return {"layout": self.layout, "sample_from_anchor": self.sample_from_anchor, "anchor_from": self.anchor_from,
                "markov_rank": self.rank, "vocab": self.vocab, "draft_vocab": self.draft_vocab,
                "confidence_head": self.confidence, "markov_w2_scale": self.w2_scale}


def is_dspark(architecture) -> bool:
    return architecture in DSPARK_ARCHITECTURES


def normalize_config(config: dict, where) -> tuple[dict, DSparkSource, dict[str, str]]:
    """(the config as llama.cpp's DSparkModel sees it, what the original layout said, where config.json keeps each
    key the layout moved: the backbone's keys, and the dflash_config built from the layout's own keys)."""
    tlc = config.get("transformer_layer_config")
    speculators = "transformer_layer_config" in config or "aux_hidden_state_layer_ids" in config
    anchor = config.get("sample_from_anchor")
    if anchor is None:
        anchor, anchor_from = not speculators, f"default for the {SPECULATORS if speculators else FLAT} layout"
    elif isinstance(anchor, bool):
        anchor_from = "sample_from_anchor"
    else:
        raise CheckpointError(where, f"{anchor!r} is not true or false", "sample_from_anchor")
    if tlc is not None and not isinstance(tlc, dict):
        raise CheckpointError(where, "is not a JSON object of the backbone's hyperparameters",
                              "transformer_layer_config")
    config, places = merge_nested(config, "transformer_layer_config")
    ids_from = mask_from = None
    if "dflash_config" not in config:
        if "aux_hidden_state_layer_ids" in config:
            config = {**config, "dflash_config": {"mask_token_id": config.get("mask_token_id"),
                                                  "target_layer_ids": _aux_ids(config, where, places)}}
            ids_key, mask_from = "aux_hidden_state_layer_ids", "mask_token_id"
            ids_from = f"{ids_key} - 1"
        else:
            config = {**config, "dflash_config": {k: config[k] for k in ("target_layer_ids", "mask_token_id")
                                                  if k in config}}
            ids_key = ids_from = "target_layer_ids"
            mask_from = "mask_token_id"
        places |= {"dflash_config.target_layer_ids": places.get(ids_key, ids_key),
                   "dflash_config.mask_token_id": places.get("mask_token_id", "mask_token_id")}
    return config, DSparkSource(SPECULATORS if speculators else FLAT, anchor, anchor_from, ids_from, mask_from), places


def _aux_ids(config, where, places) -> list[int]:
    """The target layer ids: aux_hidden_state_layer_ids - 1 (each aux id names a layer's output, 1..LLAMA_MAX_LAYERS)."""
    aux = config["aux_hidden_state_layer_ids"]
    if not isinstance(aux, list) or not aux:
        raise CheckpointError(where, f"{aux!r} is not a non-empty list of layer ids", "aux_hidden_state_layer_ids")
    if any(isinstance(i, int) and not isinstance(i, bool) and i < 1 for i in aux):
        raise CheckpointError(where, f"{aux}: these are target layer ids + 1, so each is at least 1",
                              "aux_hidden_state_layer_ids")
    aux = ConfigReader(where, places).numbers(aux, "aux_hidden_state_layer_ids", AUX_LAYER_ID)
    return [i - 1 for i in aux]


def dspark_config(ckpt, source: DSparkSource, hidden: int, vocab: int | None) -> DSparkConfig:
    """The DSpark facts of a checkpoint, every head checked against the config and against each other."""
    c, where = ckpt.config, ckpt.config_path
    markov_type = c.get("markov_head_type", "vanilla")
    if markov_type not in MARKOV_HEAD_TYPES:
        raise CheckpointError(where, f"unsupported markov_head_type {markov_type!r} (only 'vanilla' is supported)",
                              "markov_head_type")
    if vocab is None:
        raise CheckpointError(where, "missing (a DSpark drafter's Markov head has one row per target token)",
                              "vocab_size")
    numbers = ckpt.numbers
    draft_vocab = numbers.get(c, "draft_vocab_size", U32) or vocab
    if draft_vocab > vocab:
        raise CheckpointError(where, f"draft_vocab_size {draft_vocab} exceeds vocab_size {vocab}", "draft_vocab_size")
    t = ckpt.tensors
    missing = [n for n in (MARKOV_W1, MARKOV_W2) if n not in t]
    if missing:
        raise CheckpointError(ckpt.path, f"a {c['architectures'][0]} drafter without its Markov head: no "
                                         f"{' or '.join(missing)} in the safetensors files", f"tensor '{missing[0]}'")
    w1 = t[MARKOV_W1]
    if len(w1.shape) != 2:
        raise CheckpointError(w1.path, f"shape {list(w1.shape)}: the Markov embedding is [vocab_size, rank]",
                              f"tensor '{w1.name}'")
    cfg_rank = numbers.get(c, "markov_rank", U32)
    rank = int(w1.shape[1])
    if cfg_rank is not None and cfg_rank != rank:
        raise CheckpointError(w1.path, f"shape {list(w1.shape)}: rank {rank}, but config.json says markov_rank "
                                       f"{cfg_rank}", f"tensor '{w1.name}'")
    return DSparkConfig(source.layout, source.sample_from_anchor, source.anchor_from, rank, vocab, draft_vocab,
                        CONF_W in t, CONF_B in t, MARKOV_W2_SCALE in t)


def head_shapes(ds: DSparkConfig, hidden: int) -> tuple[dict, dict]:
    """(required, optional) HF tensor shapes of the heads and vocabulary tables."""
    V, Vd, R = ds.vocab, ds.draft_vocab, ds.rank
    required = {MARKOV_W1: (V, R), MARKOV_W2: (Vd, R)}
    optional = {MARKOV_W2_SCALE: None, CONF_W: (1, hidden + R), CONF_B: (1,), D2T: None, T2D: None,
                "lm_head.weight": (Vd, hidden)}       # None: any shape (d2t and the scale: their size is checked)
    if ds.reduced:
        required["lm_head.weight"] = (Vd, hidden)
    return required, optional


def check_heads(ckpt, ds: DSparkConfig, hidden: int):
    """The heads against the config: shapes, what needs what, dtypes."""
    t = ckpt.tensors
    if ds.reduced and D2T not in t:
        raise CheckpointError(ckpt.path, f"draft_vocab_size {ds.draft_vocab} < vocab_size {ds.vocab} but no d2t "
                                         "table found", "tensor 'd2t'")
    if ds.reduced and "lm_head.weight" not in t:
        raise CheckpointError(ckpt.path, f"draft_vocab_size {ds.draft_vocab} < vocab_size {ds.vocab} but no "
                                         f"lm_head.weight [{ds.draft_vocab}, {hidden}]: llama.cpp would take the "
                                         f"target's head ({ds.vocab} rows) and abort at the first draft "
                                         "(GGML_ASSERT(model.d2t->ne[0] == n_draft_vocab))", "tensor 'lm_head.weight'")
    if CONF_B in t and CONF_W not in t:
        raise CheckpointError(ckpt.path, f"{CONF_B} without {CONF_W}: a confidence head needs its weight",
                              f"tensor '{t[CONF_B].name}'")
    if D2T in t and t[D2T].dtype == "BOOL":
        raise CheckpointError(t[D2T].path, "dtype BOOL: d2t holds target-id offsets", f"tensor '{t[D2T].name}'")
    for name in (MARKOV_W1, MARKOV_W2, MARKOV_W2_SCALE, CONF_W, CONF_B):
        if name in t and t[name].dtype not in FLOAT_DTYPES:
            raise CheckpointError(t[name].path, f"dtype {t[name].dtype}: a weight must be one of "
                                                f"{', '.join(FLOAT_DTYPES)}", f"tensor '{t[name].name}'")
    if D2T in t and t[D2T].n_elements != ds.draft_vocab:
        raise CheckpointError(t[D2T].path, f"d2t size {t[D2T].n_elements} does not match draft_vocab_size "
                                           f"{ds.draft_vocab}", f"tensor '{t[D2T].name}'")
    if MARKOV_W2_SCALE in t and t[MARKOV_W2_SCALE].n_elements != 1:
        raise CheckpointError(t[MARKOV_W2_SCALE].path, f"shape {list(t[MARKOV_W2_SCALE].shape)}: the scale of "
                                                       "markov_w2 is one value", f"tensor '{t[MARKOV_W2_SCALE].name}'")


def shape_rule(name: str, ds: DSparkConfig, hidden: int) -> str:
    """Why a head must have its shape (appended to a shape error)."""
    if name == MARKOV_W1:
        return f" (vocab_size {ds.vocab} x markov rank)"
    if name == MARKOV_W2:
        return (f" (draft_vocab_size {ds.draft_vocab} x markov rank {ds.rank}, the rank of "
                f"{MARKOV_W1})")
    if name == CONF_W:
        return f" (1 x hidden_size {hidden} + markov rank {ds.rank})"
    return ""


def absolute_ids(ckpt) -> np.ndarray:
    """d2t as llama.cpp's converter writes it: offset + row index, as int64, each a target token, none twice."""
    src = ckpt.tensors[D2T]
    where = f"tensor '{src.name}'"
    values = src.read_exact()
    if values.dtype != np.int64:
        if not np.all(np.isfinite(values)) or np.any(values != np.trunc(values)):
            raise CheckpointError(src.path, "d2t holds values that are not whole numbers", where)
        values = values.astype(np.int64)
    ids = values + np.arange(values.size, dtype=np.int64)
    vocab = ckpt.config["vocab_size"]
    if np.any((ids < 0) | (ids >= vocab)):
        bad = int(np.flatnonzero((ids < 0) | (ids >= vocab))[0])
        raise CheckpointError(src.path, f"d2t target ids out of range for target vocab size {vocab} (row {bad}: "
                                        f"{int(values[bad])} + {bad} = {int(ids[bad])})", where)
    if np.unique(ids).size != ids.size:
        order = np.argsort(ids, kind="stable")
        dup = int(ids[order][np.flatnonzero(np.diff(ids[order]) == 0)[0]])
        rows = np.flatnonzero(ids == dup)[:2].tolist()
        raise CheckpointError(src.path, f"d2t contains duplicate target ids (rows {rows[0]} and {rows[1]} both map "
                                        f"to {dup})", where)
    return ids
