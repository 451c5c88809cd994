"""The hyperparameter rules of a DFlash drafter GGUF, in either profile (ggtools.dflash.profiles: where each value
lives). llama.cpp-profile files are read as llama.cpp's loader reads them (`load_hparams`, then
`src/models/dflash.cpp`: exact types, the required keys); lucebox-profile files as lucebox's loader does (any
integer type; the keys ggtools' runtime needs).
"""

from ggtools.dflash.profiles import LLAMACPP, V2_KEYS, profile_of
from ggtools.hparam_rules.keys import FLAG_TYPES, LLAMA_MAX_LAYERS, RUNTIME, Keys
from ggtools.hparam_rules.target import ROPE_SCALING_TYPES, _sections
from ggtools.hparam_rules.violation import Violation

MAX_BLOCK = 1 << 16      # without a context length: a block (draft positions held per step) no drafter comes near



def drafter_violations(f, mask_id: int | None = None) -> list[Violation]:
    """Every rule the drafter's keys break (empty for an arch that is no DFlash drafter: the loaders say that).
    mask_id: an id given instead of the stored one, which is then not read (the runtime checks the given id
    against the embedding it indexes)."""
    p = profile_of(f.architecture)
    if p is None:
        return []
    llama = p is LLAMACPP
    k = Keys(f, f.architecture, strict=llama)
    n_ctx = k.uint("context_length", required=llama)
    k.check("context_length", n_ctx != 0, "is 0")
    n_embd = k.uint("embedding_length", required=True)
    k.check("embedding_length", n_embd != 0, "is 0")
    n_layer = k.uint("block_count", required=True)
    if n_layer is not None and not k.check("block_count", 0 < n_layer <= LLAMA_MAX_LAYERS,
                                           f"is {n_layer}: a drafter has 1..{LLAMA_MAX_LAYERS} layers",
                                           "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= "
                                           "LLAMA_MAX_LAYERS) failed" if llama else None):
        n_layer = None
    n_ff = k.uint("feed_forward_length", required=RUNTIME)
    k.check("feed_forward_length", n_ff != 0, "is 0")
    head_dim = _heads(k, n_embd)
    eps = k.float("attention.layer_norm_rms_epsilon", required=llama)
    k.check("attention.layer_norm_rms_epsilon", eps is None or eps > 0,
            f"is {eps}: the RMS norm divides by sqrt(mean + eps), which must be above 0",
            "GGML_ASSERT(eps >= 0.0f) failed" if eps is not None and eps < 0 else None)
    _rope(k, head_dim)
    for key in ("embedding_scale", "logit_scale"):
        k.float(key)
    cap = k.float("final_logit_softcapping")
    k.check("final_logit_softcapping", cap is None or cap >= 0, f"is {cap}: a softcap cannot be negative")
    k.bool("attention.causal")
    _window(k, n_layer)
    for key in V2_KEYS:
        k.uint(key)
    _target_ids(k, p)
    _block_size(k, p, n_ctx)
    if mask_id is None:
        _mask(k, p)
    return k.violations


def _heads(k: Keys, n_embd) -> int | None:
    n_head = k.uint("attention.head_count", required=RUNTIME)
    k.check("attention.head_count", n_head != 0, "is 0: attention needs heads")
    n_head_kv = k.uint("attention.head_count_kv", n_head)
    if k.check("attention.head_count_kv", n_head_kv != 0, "is 0: attention needs key/value heads") \
            and n_head and n_head_kv:
        k.check("attention.head_count_kv", n_head % n_head_kv == 0,
                f"{n_head_kv} KV heads do not divide {n_head} heads")
    key_length = k.uint("attention.key_length")
    k.check("attention.key_length", key_length != 0, "is 0")
    value_length = k.uint("attention.value_length")
    k.check("attention.value_length", value_length != 0, "is 0")
    if key_length:
        return key_length
    if k.has("attention.key_length") or not n_head or not n_embd:
        return None
    if not k.check("embedding_length", n_embd % n_head == 0 and n_embd >= n_head,
                   f"{n_embd} is not a multiple of attention.head_count {n_head}, and attention.key_length does not "
                   "give the head size"):
        return None
    return n_embd // n_head


def _rope(k: Keys, head_dim):
    base = k.float("rope.freq_base")
    k.check("rope.freq_base", base is None or base > 0, f"is {base}: the RoPE base must be above 0", check="rope_theta")
    k.string("rope.scaling.type", None, ROPE_SCALING_TYPES,
             "GGML_ASSERT(hparams.rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED) failed")
    factor = k.float("rope.scaling.factor")
    k.check("rope.scaling.factor", factor is None or factor >= 0, f"is {factor}: it cannot be negative")
    n_rot = k.uint("rope.dimension_count", head_dim)
    if n_rot is not None and head_dim is not None:
        k.check("rope.dimension_count", 0 < n_rot <= head_dim and n_rot % 2 == 0,
                f"is {n_rot}, the head size is {head_dim}: RoPE rotates pairs of a head's dims (an even count, "
                "1 pair up to the head size)", "GGML_ASSERT(n_dims <= ne0) failed" if n_rot > head_dim else
                "GGML_ASSERT(n_dims % 2 == 0) failed" if n_rot % 2 else None)
    sections = k.int_array("rope.dimension_sections")
    if sections is not None:
        _sections(k, sections, llama_reads=True)


def _window(k: Keys, n_layer):
    """A sliding window reads the per-layer pattern (dflash.cpp: get_arr, required once the window is above 0)."""
    window = k.uint("attention.sliding_window")
    key = "attention.sliding_window_pattern"
    if not window or not k.has(key):
        return                  # no pattern: llama.cpp refuses (the loader rules quote it), ggtools slides every layer
    pattern = k.int_array(key, element_types=FLAG_TYPES)
    if pattern is not None and n_layer is not None:
        k.check(key, len(pattern) == n_layer, f"has {len(pattern)} entries for {n_layer} layers (block_count)")


def _target_ids(k: Keys, p):
    """The target layers the drafter taps: a non-empty integer array, HF ids >= 0 (in the profile's convention)."""
    key = p.keys["target_ids"]
    kv = k.f.kv.get(k.name(key))
    if kv is None:
        k.fail(key, "missing: the target layers the drafter was trained on", "DFlash model requires "
               "'target_layers' in GGUF metadata" if p is LLAMACPP else None, check="target_layers")
        return
    if not kv.is_array:
        k.fail(key, f"has type {kv.type_label}, an array of integers is required",
               "DFlash model requires 'target_layers' in GGUF metadata" if p is LLAMACPP else None,
               check="target_layers")
        return
    ids = k.int_array(key, check="target_layers")
    if ids is None:
        return
    if not k.check(key, len(ids) > 0, "is empty: the drafter taps at least one target layer", check="target_layers"):
        return
    low = p.ids_offset
    k.check(key, min(ids) >= low, f"holds {min(ids)}: stored ids are {p.id_convention}, so at least {low}",
            check="target_layers")


def _block_size(k: Keys, p, n_ctx):
    """The anchor and at least one mask; at most the drafter's context (each block position is a draft position
    the runtime holds keys and values for)."""
    key = p.keys["block_size"]
    block = k.uint(key, p.default_block_size, required=p.default_block_size is None, check="block_size")
    if block is None or not k.check(key, block >= 2, f"is {block}: a drafter's block is the anchor and at least one "
                                                     "mask (2 or more)", check="block_size"):
        return
    limit = n_ctx or MAX_BLOCK
    k.check(key, block <= limit, f"is {block}, above the drafter's " + (f"context_length {n_ctx}" if n_ctx else
            f"largest block {MAX_BLOCK}") + ": the block's positions are draft positions", check="block_size")


def _mask(k: Keys, p):
    """The stored mask id (the profile's key, or where older files keep it): a count type, inside the drafter's
    own vocabulary where its runtime reads it from the drafter (llama.cpp: the drafter's tokenizer; lucebox takes
    the target's mask id, so its stored one is only typed here, and ggtools' runtime checks it against the
    embedding it indexes)."""
    key = next((name for name in (p.keys["mask"], *p.legacy_mask_keys) if k.has(name)), None)
    if key is None:
        return                  # no mask id: the loaders report it (llama.cpp drafts nothing, ggtools refuses)
    mask = k.uint(key, check="mask_token_id")
    tokens = k.f.kv.get("tokenizer.ggml.tokens")
    if mask is None or p.mask_from_target or tokens is None or not tokens.is_array:
        return
    k.check(key, mask < tokens.count, f"mask token id {mask} is outside the drafter's {tokens.count}-token "
            "vocabulary", f"load: bad special token: '{k.name(key)}' = {mask}, using default id -1",
            check="mask_token_id")
