"""DrafterRewrite: the metadata edits and tensor actions that repair a drafter GGUF in its own layout, or move it
to another profile's layout.

A repair sets only the keys whose values are fixed and byte-copies every tensor. A move writes every value in
the destination's keys, order and id convention (general.architecture, key names, where the mask id lives,
HF id vs id + 1), renames the tensors, and keeps each tensor's bytes where the destination's runtime takes its
encoding (converted otherwise, each with its reason). What the destination has no place for is refused by name,
except what it loses nothing by dropping (said in the notes).
"""

from dataclasses import dataclass, field

from gguf import GGUFValueType as VT

from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.errors import RewriteRefused
from ggtools.dflash.profiles import (CONF_B, CONF_W, D2T, HPARAM_KEYS, MARKOV_W1, MARKOV_W2_SCALE, ROLE_TYPES,
                                     V2_KEYS, Profile)
from ggtools.plan import KVEdits, TensorAction, convert_action, copy_action

# Keys of a llama.cpp-layout file that another layout may drop without changing what the drafter computes.
DROPPABLE = ("general.", "tokenizer.", "dflash.rope.dimension_sections")   # M-RoPE sections: text rows are equal
KEPT_GENERAL = ("general.alignment",)
HEADS_AND_EMBEDDINGS = ("embed_tokens.weight", "lm_head.weight")   # the target's own serve when absent


@dataclass
class DrafterRewrite:
    dest: Profile
    edits: KVEdits
    tensors: list[TensorAction]
    notes: list[str] = field(default_factory=list)


def repair(d: DraftFile, fixes: dict, tokenizer=()) -> DrafterRewrite:
    """Set the fixed values (role -> value, ids in the HF convention) in the file's own keys; copy every tensor.
    tokenizer: KVs (another file's tokenizer.*) to copy in."""
    edits = KVEdits()
    for kv in tokenizer:
        edits.copy(kv)
    for role, value in fixes.items():
        edits.put(d.key(role), *_typed(d.profile, role, value))
    tensors = [copy_action(t, "repair: tensors byte-copied") for t in d.file.tensors]
    return DrafterRewrite(d.profile, edits, tensors)


def move(d: DraftFile, dest: Profile, fixes: dict | None = None, tokenizer=()) -> DrafterRewrite:
    """Every value of d (with the fixes) in dest's layout; tokenizer: the KVs that give a dest that carries a
    tokenizer its vocabulary (default: the file's own)."""
    if d.profile is None:
        raise RewriteRefused(f"{d.path}: arch '{d.arch}' is not a DFlash drafter layout: nothing to move")
    if d.is_dspark:
        _check_dspark(d, dest)
    notes = []
    values = _values(d) | (fixes or {})
    edits = KVEdits()
    for kv in d.file.kvs:
        if kv.key not in KEPT_GENERAL:
            edits.drop(kv.key)
    _check_keys(d, dest, notes)
    edits.put("general.architecture", VT.STRING, dest.arch)
    edits.put("general.name", VT.STRING, _name(d, dest, values))
    for role in dest.role_order:
        if role == "mask" and dest.tokenizer:
            edits.put("general.quantization_version", VT.UINT32, 2)
            _tokenizer(d, dest, tokenizer, edits, values.get("mask"), notes)
        if values.get(role) is not None and dest.has_key(role):
            edits.put(dest.key(role), *_typed(dest, role, values[role]))
    if values.get("mask") is None:
        notes.append("no mask token id to move: set one with `ggtools doctor --hf HF_DIR --fix`")
    return DrafterRewrite(dest, edits, _tensors(d, dest, notes), notes)


def _check_dspark(d: DraftFile, dest: Profile):
    has_conf = d.tensor(CONF_W) is not None
    why = dest.dspark_refusal(d.sample_from_anchor, d.tensor(D2T) is not None, d.tensor(MARKOV_W2_SCALE) is not None,
                              has_conf and d.tensor(CONF_B) is None)
    if why:
        raise RewriteRefused(f"{d.path}: the {dest.name} layout cannot hold this DSpark drafter: {why}: not moved")
    if d.tensor(MARKOV_W1) is None or d.markov_rank is None:
        raise RewriteRefused(f"{d.path}: DSpark head tensors without markov_w1: nothing says the Markov rank; "
                             "reconvert the checkpoint")


def _dspark_values(d: DraftFile) -> dict:
    """The DSpark roles, from the tensors (what every layout's keys describe) and the block layout."""
    w1, conf = d.tensor(MARKOV_W1), d.tensor(CONF_W)
    return {"sample_from_anchor": d.sample_from_anchor, "has_confidence_head": conf is not None,
            "dspark_enabled": 1, "markov_rank": int(w1.ne[0]), "dspark_vocab_size": int(w1.ne[1]),
            "confidence_dim": int(conf.ne[0]) if conf is not None else None,
            "confidence_enabled": 1 if conf is not None else None}


def _values(d: DraftFile) -> dict:
    """Every role's value, profile-neutral: ids in the HF convention, defaults the loaders assume filled in."""
    values = {role: d.value(role) for role in (*HPARAM_KEYS, *V2_KEYS, "block_size", "vocab_size")}
    values["target_ids"] = d.hf_ids
    values["n_target_ids"] = len(d.hf_ids) if d.hf_ids is not None else None
    values["mask"] = d.mask[0]
    if values["vocab_size"] is None:
        values["vocab_size"] = d.n_vocab
    H, n_head = values["embedding_length"], values["attention.head_count"]
    if values["attention.head_count_kv"] is None:
        values["attention.head_count_kv"] = n_head
    if values["attention.key_length"] is None and H and n_head:
        values["attention.key_length"] = H // n_head
    if values["attention.value_length"] is None:
        values["attention.value_length"] = values["attention.key_length"]
    if values["block_size"] is None:
        values["block_size"] = d.profile.default_block_size
    if d.is_dspark:
        values |= _dspark_values(d)
    return values


def _typed(p: Profile, role: str, value) -> tuple:
    vtype, elem = ROLE_TYPES[role]
    if role == "target_ids":
        value = p.stored_ids(value)
    elif vtype == VT.ARRAY:
        value = [bool(v) for v in value]
    elif vtype == VT.FLOAT32:
        value = float(value)
    elif vtype == VT.BOOL:
        value = bool(value)
    else:
        value = int(value)
    return vtype, value, elem


def _name(d: DraftFile, dest: Profile, values) -> str:
    if not dest.tokenizer:      # lucebox's converter names every drafter by its size
        return f"DFlash-Draft-{values['embedding_length']}h-{values['block_count']}L"
    return d.file.get("general.name") or d.arch


def _check_keys(d: DraftFile, dest: Profile, notes):
    known = {d.key(role) for role in (*ROLE_TYPES, "mask") if d.profile.has_key(role)}
    known |= set(d.profile.legacy_mask_keys) | {"general.architecture", "general.name"}
    if not dest.dflash2:
        known -= {d.key(k) for k in V2_KEYS}
    causal = f"{d.arch}.attention.causal"
    if d.file.get(causal) is False:
        known.add(causal)         # the default every layout assumes
    dropped = [kv.key for kv in d.file.kvs if kv.key not in known and kv.key.startswith(DROPPABLE)]
    refused = [kv.key for kv in d.file.kvs if kv.key not in known and not kv.key.startswith(DROPPABLE)]
    if refused:
        raise RewriteRefused(f"{d.path}: the {dest.name} layout has no place for {', '.join(refused[:6])}"
                             f"{' ...' if len(refused) > 6 else ''} ({dest.runtime}'s loader would not read "
                             "them): not moved")
    tokenizer = [k for k in dropped if k.startswith("tokenizer.")]
    if tokenizer and not dest.tokenizer:
        notes.append(f"dropped the {len(tokenizer)} tokenizer keys: {dest.runtime} takes the target's tokenizer")


def _tokenizer(d: DraftFile, dest: Profile, tokenizer, edits: KVEdits, mask, notes):
    own = [kv for kv in d.file.kvs if kv.key.startswith("tokenizer.")]
    source = list(tokenizer) or own
    if not source:
        raise RewriteRefused(f"{d.path}: the {dest.name} layout carries the target's tokenizer ({dest.runtime} "
                             "reads the mask token from the drafter's own vocabulary): pass --target TARGET.gguf")
    for kv in source:
        edits.copy(kv)
    tokens = next((kv.count for kv in source if kv.key == "tokenizer.ggml.tokens"), None)
    if mask is not None and tokens is not None and mask >= tokens:
        notes.append(f"the mask token id {mask} is outside the {tokens}-token vocabulary: moved as it is; find the "
                     "right one with `ggtools doctor --hf HF_DIR --fix`")


def _tensors(d: DraftFile, dest: Profile, notes) -> list[TensorAction]:
    actions = []
    for t in d.file.tensors:
        hf = d.profile.hf_name(t.name)
        name = dest.gguf_name(hf) if hf else None
        if name is None:
            if hf in HEADS_AND_EMBEDDINGS:
                notes.append(f"dropped {t.name}: {dest.runtime} takes the embedding and head from the target")
                continue
            raise RewriteRefused(f"{d.path}: tensor '{t.name}': the {dest.name} layout has no place for it "
                                 f"({dest.runtime}'s loader would not read it): not moved")
        dst_type, why = dest.encoding(t.type_id, name, t.ne)
        action = copy_action(t, why, name) if dst_type == t.type_id else convert_action(t, dst_type, why, name)
        actions.append(action)
    return sorted(actions, key=lambda a: dest.tensor_order(a.name))
