"""EAGLE3's model-file rules: what llama.cpp asks of an `eagle3` GGUF (the family's facts and words:
ggtools/dflash/eagle3.py), alone and against its target. Applied by validate and doctor (through model_violations
and jobs/eagle3_doctor.py) and by ggtools' runtime loaders, in these words.

llama.cpp (llama-cpp-python 0.3.36):
- keys (`load_hparams`, then `llama_model_eagle3::load_arch_hparams`, src/models/eagle3.cpp): context_length,
  embedding_length, block_count and attention.layer_norm_rms_epsilon required; `eagle3.target_layers` an INT32 /
  UINT32 array of exactly 3 ("EAGLE3 model requires 'extract_layers' in GGUF metadata", "EAGLE3 requires exactly 3
  entries in 'extract_layers'"); `eagle3.target_hidden_size` u32 required; the two norm flags optional BOOLs. Its
  graph asserts one layer and equal key and value head sizes.
- tensors (`load_arch_tensors`): fc, output_norm and the layer's ten required, enc.output_norm iff norm_before_fc,
  output / token_embd / d2t / rope_freqs optional; any other tensor: "wrong number of tensors". d2t (the target id of
  each draft row) is asserted I64 and as long as the head's rows; its ids index the drafter's own vocabulary (its
  tokenizer, the target's): set_rows out of range aborts, a repeated id loses a row.
- the pair (common/speculative.cpp, llama-batch.cpp): the features are 3 x the target's hidden size wide and must be
  3 x target_hidden_size; an id below the target's layer count taps that layer's input (t_layer_inp: an arch whose
  graph never sets it asserts), the id equal to it the target's t_h_nextn (an arch that never writes it leaves the
  buffer stale: no error), an id beyond aborts; without its own token_embd / output the drafter uses the target's,
  which must fit its hidden size; the target's tokenizer is the drafter's.
"""

import numpy as np
from gguf import GGMLQuantizationType as T

from ggtools.dflash import eagle3 as E
from ggtools.hparam_rules.drafter import _heads, _rope
from ggtools.hparam_rules.dspark import d2t_id_fault
from ggtools.hparam_rules.keys import RUNTIME, Keys
from ggtools.hparam_rules.violation import MISSING, TYPE, Violation

REQUIRED = ("fc.weight", "output_norm.weight") + tuple(
    f"blk.0.{n}.weight" for n in ("attn_norm", "attn_norm_2", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm",
                                  "ffn_gate", "ffn_down", "ffn_up"))
OPTIONAL = ("output.weight", "token_embd.weight", "d2t", "rope_freqs.weight")
ENC_NORM = "enc.output_norm.weight"
FIRST_DRAFT = "the first draft aborts"


def eagle3_violations(f) -> list[Violation]:
    """Every rule the eagle3 file's keys break."""
    k = Keys(f, E.ARCH, strict=True)
    n_ctx = k.uint("context_length", required=True)
    k.check("context_length", n_ctx != 0, "is 0")
    n_embd = k.uint("embedding_length", required=True)
    k.check("embedding_length", n_embd != 0, "is 0")
    n_layer = k.uint("block_count", required=True)
    k.check("block_count", n_layer is None or n_layer == 1, f"is {n_layer}: an EAGLE3 drafter has one decoder layer",
            E.SAYS_ONE_LAYER)
    n_ff = k.uint("feed_forward_length", required=RUNTIME)
    k.check("feed_forward_length", n_ff != 0, "is 0")
    head_dim = _heads(k, n_embd)
    value_length = k.uint("attention.value_length")
    if head_dim is not None and value_length is not None:
        k.check("attention.value_length", value_length == head_dim,
                f"is {value_length}, the key head size is {head_dim}: EAGLE3's graph takes one head size",
                E.SAYS_HEAD_SIZES)
    eps = k.float("attention.layer_norm_rms_epsilon", required=True)
    k.check("attention.layer_norm_rms_epsilon", eps is None or eps > 0,
            f"is {eps}: the RMS norm divides by sqrt(mean + eps), which must be above 0",
            "GGML_ASSERT(eps >= 0.0f) failed" if eps is not None and eps < 0 else None)
    _rope(k, head_dim)
    _target_layers(k)
    hidden = k.uint(E.TARGET_HIDDEN, required=True, check="target_hidden_size")
    k.check(E.TARGET_HIDDEN, hidden != 0, "is 0: the features the drafter reads are 3 x this wide",
            check="target_hidden_size")
    for flag in (E.NORM_BEFORE_RESIDUAL, E.NORM_BEFORE_FC):
        k.bool(flag)
    return k.violations


def _target_layers(k: Keys):
    kv = k.f.kv.get(k.name(E.TARGET_LAYERS))
    if kv is None or not kv.is_array:
        rule = "missing" if kv is None else f"has type {kv.type_label}, an array of 3 layer ids is required"
        k.fail(E.TARGET_LAYERS, f"{rule}: the 3 target layers the drafter reads", E.SAYS_NO_LAYERS,
               MISSING if kv is None else TYPE, check="target_layers")
        return
    ids = k.int_array(E.TARGET_LAYERS, check="target_layers")
    if ids is None:
        return
    if not k.check(E.TARGET_LAYERS, len(ids) == E.N_TAPS, f"holds {len(ids)} ids: EAGLE3 reads exactly 3 target "
                   "layers", E.SAYS_THREE, check="target_layers"):
        return
    values = [v - (1 << 32) if v >= 1 << 31 else v for v in ids]      # llama.cpp reads them as int32
    k.check(E.TARGET_LAYERS, min(values) >= 0, f"holds {min(values)}: a target layer id is at least 0",
            check="target_layers")


def eagle3_tensor_violations(f, locate=None) -> list[Violation]:
    """The tensors llama.cpp's loader requires, and takes, of an eagle3 file; d2t's type, length and ids."""
    if f.architecture != E.ARCH:
        return []
    locate = locate or (lambda name: (f, f.tensor[name]) if name in f.tensor else None)
    names = _names(f, locate)
    fc_norm = f.get(f"{E.ARCH}.{E.NORM_BEFORE_FC}") is True
    required = REQUIRED + ((ENC_NORM,) if fc_norm else ())
    out = [Violation(None, f"missing: llama.cpp's loader requires it{_why(name)}",
                     f"check_tensor_dims: tensor '{name}' not found",
                     MISSING, "tensors", tensor=name) for name in required if name not in names]
    created = [n for n in names if n in required or n in OPTIONAL]
    for name in sorted(set(names) - set(created)):
        why = " (enc.output_norm is read only with eagle3.norm_before_fc true)" if name == ENC_NORM else \
            " (t2d is not used at run time: llama.cpp's converter drops it)" if name == E.T2D else ""
        out.append(Violation(None, f"not an EAGLE3 tensor llama.cpp's loader takes{why}",
                             f"done_getting_tensors: wrong number of tensors; expected {len(names)}, got "
                             f"{len(created)}", check="tensors", tensor=name))
    return out + _d2t(f, locate)


def _names(f, locate) -> list[str]:
    """The file's tensors (shard 1), and those of EAGLE3's that other shards of a split set hold."""
    own = [t.name for t in f.tensors]
    return own + [n for n in REQUIRED + OPTIONAL + (ENC_NORM,) if n not in own and locate(n)]


def _why(name) -> str:
    return " (eagle3.norm_before_fc is true: the encoder normalizes the features with it)" if name == ENC_NORM else ""


def _d2t(f, locate) -> list[Violation]:
    found = locate(E.D2T)
    if found is None:
        return []
    g, t = found

    def broken(rule, says=None, symptom=FIRST_DRAFT):
        return [Violation(None, rule, says, TYPE, "d2t", symptom, tensor=E.D2T)]

    if t.type_id != T.I64:
        return broken(f"is {t.type_name}, expected I64 (one target id per draft row)", E.SAYS_D2T_TYPE)
    rows = int(t.ne[0])
    tokens = f.kv.get("tokenizer.ggml.tokens")
    n_vocab = tokens.count if tokens is not None and tokens.is_array else None
    head = locate("output.weight")
    if head is not None and len(head[1].ne) > 1 and int(head[1].ne[1]) != rows:
        return []                    # the output head's shape against d2t: tensor_shapes says it
    if head is None and n_vocab is not None and n_vocab != rows:
        return broken(f"holds {rows} ids, so the drafter needs its own output.weight with {rows} rows: the target's "
                      f"head gives {n_vocab} logits", E.SAYS_D2T_HEAD)
    if n_vocab is None:
        return []
    fault = d2t_id_fault(g.tensor_data(t).view("<i8").reshape(-1), n_vocab)
    return broken(*fault) if fault else []


# ---- the pair ---------------------------------------------------------------------------------------------------

def eagle3_pair_violations(d, t, t_locate=None) -> list[Violation]:
    """What breaks drafting this eagle3 file `d` for the target `t` (GGUFFiles: their first shards; t_locate(name):
    where the target's tensors lie), as llama.cpp's speculative driver and graph meet it."""
    t_locate = t_locate or (lambda name: (t, t.tensor[name]) if name in t.tensor else None)
    arch = t.architecture
    n_layer, n_embd = _int(t.get(f"{arch}.block_count")), _int(t.get(f"{arch}.embedding_length"))
    nextn = _int(t.get(f"{arch}.nextn_predict_layers")) or 0
    trunk = n_layer - nextn if n_layer is not None and 0 <= nextn < n_layer else n_layer
    out = _features(d, n_embd) + _taps(d, arch, trunk)
    out += _borrowed(d, t_locate, n_embd)
    return out + _vocabulary(d, t)


def _int(v):
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None


def _features(d, n_embd) -> list[Violation]:
    hidden = _int(d.get(f"{E.ARCH}.{E.TARGET_HIDDEN}"))
    if hidden is None or n_embd is None or hidden == n_embd:
        return []
    draft_embd = _int(d.get(f"{E.ARCH}.embedding_length"))
    return [Violation(f"{E.ARCH}.{E.TARGET_HIDDEN}", f"is {hidden}, the target's embedding_length is {n_embd}: the "
                      f"target's features are 3 x {n_embd} wide, the drafter's fc takes 3 x {hidden}",
                      E.SAYS_FEATURES.format(3 * n_embd, draft_embd, 3 * hidden), check="target_hidden_size",
                      symptom="the draft encoder's batch is refused and the driver aborts: the drafter belongs to "
                              "another model")]


def _taps(d, arch, n_layer) -> list[Violation]:
    kv = d.kv.get(f"{E.ARCH}.{E.TARGET_LAYERS}")
    if kv is None or not kv.is_array or n_layer is None or arch is None:
        return []
    ids = [int(v) for v in np.asarray(kv.value, np.int64)]
    key, out = f"{E.ARCH}.{E.TARGET_LAYERS}", []
    beyond = [i for i in ids if i > n_layer]
    if beyond:
        out.append(Violation(key, f"holds {beyond[0]}, beyond the {n_layer}-layer target (ids 0..{n_layer - 1} tap a "
                             f"layer's input, {n_layer} its last output)", E.SAYS_BEYOND.format(beyond[0], n_layer),
                             check="target_layers", symptom="speculative decoding aborts as it starts"))
    if any(i < n_layer for i in ids) and arch not in E.TAP_ARCHS:
        out.append(Violation(key, f"the target arch '{arch}' never sets t_layer_inp (the layer inputs EAGLE3 taps "
                             f"with ids below {n_layer}) in llama.cpp", E.SAYS_NO_TAP, check="target_arch",
                             symptom="the target's graph build aborts once EAGLE3 asks for its layer inputs"))
    return out


def stale_tap(d, arch, n_layer) -> str | None:
    """Why the last-output tap (id == the target's layer count) reads stale features, or None: a warning, since
    llama.cpp says nothing (it reads a buffer the target's graph never writes)."""
    kv = d.kv.get(f"{E.ARCH}.{E.TARGET_LAYERS}")
    if kv is None or not kv.is_array or n_layer is None or arch is None or arch in E.NEXTN_ARCHS:
        return None
    if n_layer not in [int(v) for v in np.asarray(kv.value, np.int64)]:
        return None
    return (f"target layer id {n_layer} is the {n_layer}-layer target's last output, which llama.cpp reads from "
            f"t_h_nextn; the '{arch}' graph never writes it: the drafter reads stale or uninitialised features "
            "without a word (acceptance near 0)")


def _borrowed(d, t_locate, n_embd) -> list[Violation]:
    """A drafter without its own token_embd / output uses the target's, which must fit its hidden size (and the
    target must have one: a tied output is token_embd itself)."""
    out, draft_embd = [], _int(d.get(f"{E.ARCH}.embedding_length"))
    for name, says in (("token_embd.weight", E.SAYS_NO_EMBD), ("output.weight", E.SAYS_NO_OUTPUT)):
        if name in d.tensor:
            continue
        theirs = t_locate(name) or (t_locate("token_embd.weight") if name == "output.weight" else None)
        if theirs is None:
            out.append(Violation(None, "missing, and the target has none to lend", says, MISSING, "tensors",
                                 FIRST_DRAFT, tensor=name))
        elif draft_embd is not None and int(theirs[1].ne[0]) != draft_embd:
            out.append(Violation(None, f"missing: the drafter uses the target's {theirs[1].name}, "
                                 f"{int(theirs[1].ne[0])} wide, but its hidden size is {draft_embd}", None,
                                 MISSING, "tensors", "the draft graph's matrix shapes do not match: "
                                 + FIRST_DRAFT, tensor=name))
    return out


def _vocabulary(d, t) -> list[Violation]:
    a, b = d.kv.get("tokenizer.ggml.tokens"), t.kv.get("tokenizer.ggml.tokens")
    if a is None or b is None or bytes(a.raw) == bytes(b.raw):
        return []
    return [Violation("tokenizer.ggml.tokens", f"the drafter's vocabulary ({a.count} tokens) is not the target's "
                      f"({b.count}): EAGLE3 checks no vocabulary, drafted ids mean other tokens", None, check="vocab",
                      symptom="drafts are rejected; acceptance near 0")]
