"""Tensor shapes: every tensor of a model file against the shape its hyperparameters give it, as llama.cpp's loader
checks them.

llama.cpp (llama-cpp-python 0.3.36): each arch's `load_arch_tensors` (src/models/<arch>.cpp, with
`create_tensor_qkv` and `create_tensor_gate_up_exps` of src/llama-model.cpp) asks for every tensor with the ne its
hyperparameters give, and `check_tensor_dims` (src/llama-model-loader.cpp) refuses one whose ne differ in any of
the four dimensions, an optional one too: "check_tensor_dims: tensor '%s' has wrong shape; expected %s, got %s".
ggtools' runtime reads the same tensors with the same shapes (runtime/model/pieces.py, kimi_k3_pieces.py).

The tables follow those create_tensor calls for llama, qwen3, qwen3moe, qwen35, qwen35moe, gpt-oss, kimi-k3 and
the DFlash / DSpark drafters (src/models/dflash.cpp; a lucebox-layout drafter by the same shapes under its own
names). Only the tensors present are checked (a missing one is the loaders' to report), and only once the keys
pass the other model-file rules, since the sizes are read from them. A tensor no table names is not checked.
"""

import re
from dataclasses import dataclass

from ggtools.dflash.eagle3 import TARGET_HIDDEN, is_eagle3_arch
from ggtools.dflash.profiles import LLAMACPP, LUCEBOX, profile_of
from ggtools.hparam_rules.keys import Keys
from ggtools.hparam_rules.violation import Violation

WRONG_SHAPE = "check_tensor_dims: tensor '{}' has wrong shape; expected {}, got {}"
WRONG_SHAPE_NAME = re.compile(r"check_tensor_dims: tensor '(.+)' has wrong shape; ")
# a DeepSeek-V4 DSpark backbone (dflash.cpp's other branch): its stages are not the tables' DFlash layers
DSV4_KEY = "hyper_connection.count"


@dataclass(frozen=True)
class Size:
    """One dimension a tensor must have: n (None: not known here, not checked) and the hyperparameters that give
    it, with their values."""
    n: int | None
    source: str

    def _join(self, other, op, sign):
        other = other if isinstance(other, Size) else Size(other, str(other))
        n = None if self.n is None or other.n is None else op(self.n, other.n)
        return Size(n, f"{_grouped(self.source)} {sign} {_grouped(other.source)}")

    def __mul__(self, other):
        return self._join(other, lambda a, b: a * b, "x")

    def __add__(self, other):
        return self._join(other, lambda a, b: a + b, "+")

    def __sub__(self, other):
        return self._join(other, lambda a, b: a - b, "-")

    def __floordiv__(self, other):
        return self._join(other, lambda a, b: a // b if b else 0, "/")


def _grouped(source: str) -> str:
    return f"({source})" if any(op in source for op in (" + ", " - ", " / ", " x ")) else source


ONE = Size(1, "1")


def tensor_shape_violations(f, locate=None) -> list[Violation]:
    """Every tensor present whose ne differ from the shape the hyperparameters give it. f: the model's GGUFFile
    (shard 1 of a set: its keys); locate(name) -> (GGUFFile, TensorInfo) or None: where a tensor lies in the
    model's files (default: in f). Call it once the keys pass the other rules (model_violations does)."""
    locate = locate or (lambda name: (f, f.tensor[name]) if name in f.tensor else None)
    says = profile_of(f.architecture) is not LUCEBOX       # llama.cpp's loader reads every other layout
    out = []
    for name, shape in expected_shapes(f, locate).items():
        found = locate(name)
        if found is not None and not fits(shape, found[1].ne):
            out.append(_wrong_shape(name, shape, tuple(int(n) for n in found[1].ne), says))
    return out


def expected_shapes(f, locate) -> dict[str, tuple]:
    """tensor name (as the file names it) -> the shape (Sizes, ne order) its hyperparameters give it."""
    p = profile_of(f.architecture)
    if p is not None:
        return _drafter(f, p, locate)
    if is_eagle3_arch(f.architecture):
        return _eagle3(_Sizes(Keys(f, f.architecture), _n_vocab(f, locate)), locate)
    build = TARGETS.get(f.architecture)
    return build(_Sizes(Keys(f, f.architecture), _n_vocab(f, locate))) if build else {}


def fits(shape, ne) -> bool:
    """check_tensor_dims: each of the four dimensions equal (beyond a shape's own, 1); a size not known fits."""
    want = tuple(shape) + (ONE,) * (4 - len(shape))
    got = tuple(int(n) for n in ne) + (1,) * (4 - len(ne))
    return len(got) == 4 and all(w.n is None or w.n == g for w, g in zip(want, got))


def _wrong_shape(name, shape, ne, says: bool) -> Violation:
    want = [s.n for s in shape]
    differ = [f"ne[{i}] is {s.source}" for i, s in enumerate(shape)
              if s.n is not None and (ne[i] if i < len(ne) else 1) != s.n and not s.source.isdigit()]
    rule = (f"has wrong shape; expected [{', '.join('?' if n is None else str(n) for n in want)}], got "
            f"[{', '.join(map(str, ne))}]" + (f" ({'; '.join(differ)})" if differ else ""))
    words = None
    if says and None not in want:
        words = WRONG_SHAPE.format(name, _ggml_shape(want), _ggml_shape(tuple(ne) + (1,) * (4 - len(ne))))
    return Violation(None, rule, words, check="dspark" if name in DSPARK_TENSORS else "tensors", tensor=name)


def shape_refused(says: str | None) -> str | None:
    """The tensor llama.cpp's words refuse for its shape (None: they say something else)."""
    m = WRONG_SHAPE_NAME.match(says or "")
    return m.group(1) if m else None


def _ggml_shape(ne) -> str:
    """llama_format_tensor_shape (src/llama-impl.cpp): each dimension as %6d, comma-separated."""
    return ", ".join(f"{n:6d}" for n in ne)


def _n_vocab(f, locate) -> int | None:
    """The vocabulary llama.cpp sizes token_embd and output by: its tokenizer's tokens (without a tokenizer, which
    llama.cpp refuses anyway, the token embedding's rows, so that the output head is checked against them)."""
    tokens = f.kv.get("tokenizer.ggml.tokens")
    if tokens is not None and tokens.is_array:
        return tokens.count
    embd = locate("token_embd.weight")
    return int(embd[1].ne[1]) if embd is not None and len(embd[1].ne) > 1 else None


class _Sizes:
    """The sizes a model's tensors are made of, read from its keys as llama.cpp's loader reads them
    (llama_model_base::load_hparams, LLAMA_LOAD_LOCALS: a per-layer count is taken from layer 0)."""

    def __init__(self, k: Keys, n_vocab: int | None):
        self.k = k
        self.n_layer_all = k.uint("block_count") or 0
        self.n_layer = self.n_layer_all - (k.uint("nextn_predict_layers", 0) or 0)
        self.vocab = Size(n_vocab, "the vocabulary's tokens" if n_vocab is not None else "?")
        self.embd = self.size("embedding_length")
        self.head = self.layer0("attention.head_count", 0)
        kv = self.layer0("attention.head_count_kv")
        self.head_kv = kv if kv.n is not None else self.head
        derived = self.embd // self.head
        self.head_k = self.size("attention.key_length", derived)
        self.head_v = self.size("attention.value_length", derived)
        self.rot = self.size("rope.dimension_count", self.head_k)
        self.ff = self.layer0("feed_forward_length", 0)
        self.expert = self.size("expert_count", 0)
        self.ff_exp = self.layer0("expert_feed_forward_length", 0)

    def size(self, key: str, default=None) -> Size:
        v = self.k.uint(key)
        if v is not None:
            return Size(v, f"{key} {v}")
        return default if isinstance(default, Size) else Size(default, f"{key} (absent: {default})")

    def layer0(self, key: str, default=None) -> Size:
        values = self.k.per_layer(key, self.n_layer_all, default=default)
        if not values:
            return Size(None, f"{key} (absent)")
        return Size(values[0], f"{key} {values[0]}" + (" (absent)" if not self.k.has(key) else ""))

    def ff_exp_or_split(self) -> Size:
        """qwen3moe, qwen35moe: expert_feed_forward_length, else feed_forward_length / expert_used_count."""
        if self.ff_exp.n:
            return self.ff_exp
        return self.ff // self.layer0("expert_used_count", 0)


# ---- the pieces llama.cpp's archs share ---------------------------------------------------------------------

def _io(s: _Sizes) -> dict:
    E, V = s.embd, s.vocab
    return {"token_embd.weight": (E, V), "output_norm.weight": (E,), "output.weight": (E, V)}


def _qkv(p: str, E: Size, q: Size, k: Size, v: Size) -> dict:
    """create_tensor_qkv: fused attn_qkv (+ bias), or attn_q / attn_k / attn_v, biases optional."""
    qkv = q + k + v
    return {p + "attn_qkv.weight": (E, qkv), p + "attn_qkv.bias": (qkv,), p + "attn_q.weight": (E, q),
            p + "attn_k.weight": (E, k), p + "attn_v.weight": (E, v), p + "attn_q.bias": (q,), p + "attn_k.bias": (k,),
            p + "attn_v.bias": (v,)}


def _attention(s: _Sizes, p: str, q_gate: int = 1) -> dict:
    """Grouped-query attention: Q of head_count heads (q_gate 2: each query followed by its gate, qwen35), K and V of
    head_count_kv heads."""
    q = s.head_k * s.head
    out = _qkv(p, s.embd, q * q_gate if q_gate > 1 else q, s.head_k * s.head_kv, s.head_v * s.head_kv)
    return out | {p + "attn_output.weight": (q, s.embd)}


def _qk_norm(s: _Sizes, p: str) -> dict:
    return {p + "attn_q_norm.weight": (s.head_k,), p + "attn_k_norm.weight": (s.head_k,)}


def _dense_ffn(p: str, E: Size, ff: Size, suffix: str = "") -> dict:
    return {p + f"ffn_gate{suffix}.weight": (E, ff), p + f"ffn_down{suffix}.weight": (ff, E),
            p + f"ffn_up{suffix}.weight": (E, ff)}


def _experts(p: str, E: Size, ff: Size, X: Size, fused: bool = False) -> dict:
    """The router and the expert stacks (fused: create_tensor_gate_up_exps' ffn_gate_up_exps too)."""
    out = {p + "ffn_gate_inp.weight": (E, X), p + "ffn_gate_exps.weight": (E, ff, X),
           p + "ffn_down_exps.weight": (ff, E, X), p + "ffn_up_exps.weight": (E, ff, X)}
    return out | ({p + "ffn_gate_up_exps.weight": (E, ff * 2, X)} if fused else {})


# ---- targets -------------------------------------------------------------------------------------------------

def _llama(s: _Sizes) -> dict:
    out, E = _io(s), s.embd
    longrope = s.k.string("rope.scaling.type") == "longrope"
    rope = {"rope_factors_long.weight": (s.rot // 2,), "rope_factors_short.weight": (s.rot // 2,)} if longrope \
        else {"rope_freqs.weight": (s.rot // 2,)}
    shexp = s.size("expert_shared_feed_forward_length", 0)
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (E,), p + "attn_output.bias": (E,), p + "ffn_norm.weight": (E,)} | rope
        out |= _attention(s, p)
        if not s.expert.n:
            out |= _dense_ffn(p, E, s.ff) | {p + "ffn_gate.bias": (s.ff,), p + "ffn_down.bias": (E,),
                                             p + "ffn_up.bias": (s.ff,)}
            continue
        out |= _experts(p, E, s.ff, s.expert)
        if shexp.n:
            out |= _dense_ffn(p, E, shexp, "_shexp")
    return out


def _qwen3(s: _Sizes) -> dict:
    out, E = _io(s), s.embd
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (E,), p + "ffn_norm.weight": (E,)} | _attention(s, p) | _qk_norm(s, p)
        out |= _experts(p, E, s.ff_exp_or_split(), s.expert) if s.k.f.architecture == "qwen3moe" else \
            _dense_ffn(p, E, s.ff)
    return out


def _qwen35(s: _Sizes) -> dict:
    """qwen35 and qwen35moe: Gated DeltaNet layers (attention.recurrent_layers, else every full_attention_interval-th
    layer is attention), gated attention, the MTP blocks after the trunk."""
    out, E, k = _io(s), s.embd, s.k
    recurrent = _recurrent_layers(s)
    moe = k.f.architecture == "qwen35moe"
    d_state, groups, dt_rank = s.size("ssm.state_size"), s.size("ssm.group_count"), s.size("ssm.time_step_rank")
    key_dim, value_dim = d_state * groups, d_state * dt_rank
    conv_dim = key_dim * 2 + value_dim
    for i in range(s.n_layer_all):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (E,), p + "post_attention_norm.weight": (E,)}
        if i < s.n_layer and recurrent[i]:         # the MTP blocks are full attention
            out |= {p + "attn_qkv.weight": (E, conv_dim), p + "attn_gate.weight": (E, value_dim),
                    p + "ssm_conv1d.weight": (s.size("ssm.conv_kernel"), conv_dim), p + "ssm_dt.bias": (dt_rank,),
                    p + "ssm_a": (dt_rank,), p + "ssm_beta.weight": (E, dt_rank), p + "ssm_alpha.weight": (E, dt_rank),
                    p + "ssm_norm.weight": (d_state,), p + "ssm_out.weight": (value_dim, E)}
        else:
            out |= _attention(s, p, q_gate=2) | _qk_norm(s, p)
        if moe:
            shexp = s.size("expert_shared_feed_forward_length", 0)
            shexp = shexp if shexp.n else s.ff
            out |= _experts(p, E, s.ff_exp_or_split(), s.expert, fused=True) | _dense_ffn(p, E, shexp, "_shexp")
            out[p + "ffn_gate_inp_shexp.weight"] = (E,)
        else:
            out |= _dense_ffn(p, E, s.ff)
        if i >= s.n_layer:
            out |= {p + "nextn.eh_proj.weight": (E * 2, E), p + "nextn.enorm.weight": (E,),
                    p + "nextn.hnorm.weight": (E,), p + "nextn.embed_tokens.weight": (E, s.vocab),
                    p + "nextn.shared_head_head.weight": (E, s.vocab), p + "nextn.shared_head_norm.weight": (E,)}
    return out


def _recurrent_layers(s: _Sizes) -> list[bool]:
    flags = s.k.per_layer("attention.recurrent_layers", s.n_layer_all, flags=True)
    if flags is not None:
        return [bool(v) for v in flags]
    interval = s.k.uint("full_attention_interval", 4) or 4
    return [i < s.n_layer and (i + 1) % interval != 0 for i in range(s.n_layer_all)]


def _gpt_oss(s: _Sizes) -> dict:
    """openai-moe: Q, K and V sized by rope.dimension_count, sinks, biases everywhere."""
    out, E, X, ff = _io(s), s.embd, s.expert, s.ff_exp
    q = s.head * s.rot
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (E,), p + "post_attention_norm.weight": (E,),
                p + "attn_output.weight": (q, E), p + "attn_sinks.weight": (s.head,), p + "attn_output.bias": (E,),
                p + "ffn_gate_inp.bias": (X,), p + "ffn_gate_exps.bias": (ff, X), p + "ffn_down_exps.bias": (E, X),
                p + "ffn_up_exps.bias": (ff, X)}
        out |= _qkv(p, E, q, s.head_kv * s.rot, s.head_kv * s.rot) | _experts(p, E, ff, X)
    return out


def _kimi_k3(s: _Sizes) -> dict:
    """KDA layers (0 KV heads) and MLA layers, leading dense FFNs, then latent routed experts with shared experts
    (moe width x expert_shared_count), the cross-layer residual attention's score vectors."""
    out, E, X, k = _io(s), s.embd, s.expert, s.k
    res = (k.uint("attn_res.block_size", 0) or 0) > 0
    if res:
        out["output_res_score.weight"] = (E,)
    kv_heads = k.per_layer("attention.head_count_kv", s.n_layer_all) or [1] * s.n_layer_all
    latent = s.size("expert_latent_length", 0)
    latent_width = latent if latent.n else E
    shared = s.size("expert_shared_count", 0)
    shexp = s.ff_exp * shared if shared.n else s.ff_exp
    lead = k.uint("leading_dense_block_count", 0) or 0
    for i in range(s.n_layer):
        p = f"blk.{i}."
        out |= {p + "attn_norm.weight": (E,), p + "ffn_norm.weight": (E,)}
        if res:
            out |= {p + "attn_res_score.weight": (E,), p + "ffn_res_score.weight": (E,)}
        out |= _kda(s, p) if kv_heads[i] == 0 else _mla(s, p)
        if i < lead:
            out |= _dense_ffn(p, E, s.ff)
            continue
        out |= _experts(p, latent_width, s.ff_exp, X) | {p + "ffn_gate_inp.weight": (E, X),
                                                          p + "exp_probs_b.bias": (X,)}
        out |= _dense_ffn(p, E, shexp, "_shexp")
        if latent.n:
            out |= {p + "ffn_routed_down.weight": (E, latent), p + "ffn_routed_up.weight": (latent, E),
                    p + "ffn_routed_norm.weight": (latent,)}
    return out


def _kda(s: _Sizes, p: str) -> dict:
    E, H = s.embd, s.head
    hd = s.size("kda.head_dim")
    d_inner, conv = hd * H, s.size("ssm.conv_kernel")
    out = {p + f"ssm_conv1d_{x}.weight": (conv, ONE, d_inner, ONE) for x in "qkv"}   # asked for 4-D first
    return out | _qkv(p, E, d_inner, d_inner, d_inner) | {
        p + "ssm_f_a.weight": (E, hd), p + "ssm_f_b.weight": (hd, d_inner), p + "ssm_beta.weight": (E, H),
        p + "ssm_a": (H,), p + "ssm_dt.bias": (d_inner,), p + "ssm_g.weight": (E, d_inner),
        p + "ssm_norm.weight": (hd,), p + "attn_output.weight": (d_inner, E)}


def _mla(s: _Sizes, p: str) -> dict:
    E, H = s.embd, s.head
    q_lora, kv_lora = s.size("attention.q_lora_rank", 0), s.size("attention.kv_lora_rank")
    head_k, head_v = s.size("attention.key_length_mla"), s.size("attention.value_length_mla")
    nope = head_k - s.rot
    return {p + "attn_q_a_norm.weight": (q_lora,), p + "attn_kv_a_norm.weight": (kv_lora,),
            p + "attn_q_a.weight": (E, q_lora), p + "attn_q_b.weight": (q_lora, head_k * H),
            p + "attn_q.weight": (E, head_k * H), p + "attn_kv_a_mqa.weight": (E, kv_lora + s.rot),
            p + "attn_kv_b.weight": (kv_lora, (nope + head_v) * H), p + "attn_k_b.weight": (nope, kv_lora, H),
            p + "attn_v_b.weight": (kv_lora, head_v, H), p + "attn_gate.weight": (E, head_v * H),
            p + "attn_output.weight": (head_v * H, E)}


TARGETS = {"llama": _llama, "qwen3": _qwen3, "qwen3moe": _qwen3, "qwen35": _qwen35, "qwen35moe": _qwen35,
           "gpt-oss": _gpt_oss, "kimi-k3": _kimi_k3}


# ---- DFlash / DSpark drafters --------------------------------------------------------------------------------

DSPARK_TENSORS = frozenset({"d2t", "markov_w1.weight", "markov_w2.weight", "markov_w2.scale", "conf_proj.weight",
                            "conf_proj.bias"})


def _drafter(f, p, locate) -> dict:
    """dflash.cpp's tensors (llama.cpp's names), under the names the file's profile gives them (a tensor its
    layout has no place for is not checked; lucebox's DSpark heads have rules of their own: dflash/dspark_rules.py)."""
    k = Keys(f, f.architecture, strict=p is LLAMACPP)
    if k.has(DSV4_KEY):
        return {}
    tokens = f.kv.get("tokenizer.ggml.tokens")
    s = _Sizes(k, tokens.count if tokens is not None and tokens.is_array else None)
    table = _dflash(s, p, locate)
    if p is LLAMACPP:
        return table
    out = {}
    for name, shape in table.items():
        hf = LLAMACPP.hf_name(name)
        own = p.gguf_name(hf) if hf and name not in DSPARK_TENSORS else None
        found = p.find_tensor(_Present(locate), own) if own else None
        if found:
            out[found] = shape
    return out


class _Present:
    """Tensor names as a container (`in`), answered by locate."""

    def __init__(self, locate):
        self.locate = locate

    def __contains__(self, name):
        return self.locate(name) is not None


def _dflash(s: _Sizes, p, locate) -> dict:
    E, V, ff = s.embd, s.vocab, s.ff
    ids = s.k.f.get(p.key("target_ids", s.k.f.architecture))
    taps = Size(len(ids), f"{len(ids)} target layers") if hasattr(ids, "__len__") else Size(None, "?")
    d2t = locate("d2t")
    V_draft = Size(int(d2t[1].ne[0]), "d2t's length") if d2t is not None else V
    out = {"token_embd.weight": (E, V), "fc.weight": (taps * E, E), "fc.scale": (ONE,),
           "enc.output_norm.weight": (E,), "output_norm.weight": (E,), "output.weight": (E, V_draft),
           "d2t": (V_draft,), "rope_freqs.weight": (s.head_k // 2,)}
    w1 = locate("markov_w1.weight")
    if w1 is not None:
        R = Size(int(w1[1].ne[0]), "markov_w1's rank")
        out |= {"markov_w1.weight": (R, V), "markov_w2.weight": (R, V_draft), "markov_w2.scale": (ONE,),
                "conf_proj.weight": (E + R, ONE), "conf_proj.bias": (ONE,)}
    v2 = locate("selector_hidden.weight") is not None
    if v2:
        rank = s.size("selector_rank")
        out |= {"selector_predecessor.weight": (rank, V), "selector_successor.weight": (rank, V),
                "selector_hidden.weight": (E, rank)}
    q = s.head_k * s.head
    for i in range(s.n_layer_all):
        b = f"blk.{i}."
        kv_k, kv_v = s.head_k * s.head_kv, s.head_v * s.head_kv
        out |= {b + "attn_norm.weight": (E,), b + "attn_q.weight": (E, q), b + "attn_k.weight": (E, kv_k),
                b + "attn_v.weight": (E, kv_v), b + "attn_output.weight": (q, E), b + "post_attention_norm.weight": (E,),
                b + "post_ffw_norm.weight": (E,), b + "layer_output_scale.weight": (ONE,),
                b + "attn_sinks.weight": (s.head,), b + "ffn_norm.weight": (E,)}
        out |= _qk_norm(s, b) | _dense_ffn(b, E, ff)
        if v2:
            kernel = s.size("conv_kernel_size")
            proj = kernel * 2 * (E // s.size("conv_group_size"))
            for side in ("attn", "ffn"):
                out |= {b + f"{side}_conv_base": (E, kernel, Size(2, "2")), b + f"{side}_conv_proj.weight": (E, proj)}
    return out


# ---- EAGLE3 drafters ------------------------------------------------------------------------------------------

def _eagle3(s: _Sizes, locate) -> dict:
    """src/models/eagle3.cpp: the encoder's fc over 3 target layers (3 x target_hidden_size wide), one decoder layer
    whose attention reads [embedding, features] (2 x embedding_length), the head over the draft vocabulary (d2t's
    length, else the vocabulary); token_embd's rows are its own (the loader takes them from the tensor)."""
    E, V = s.embd, s.vocab
    features = s.size(TARGET_HIDDEN) * 3
    d2t = locate("d2t")
    V_draft = Size(int(d2t[1].ne[0]), "d2t's length") if d2t is not None else V
    q, kv, p = s.head_k * s.head, s.head_k * s.head_kv, "blk.0."
    out = {"token_embd.weight": (E, Size(None, "its own rows")), "fc.weight": (features, E),
           "enc.output_norm.weight": (features,), "output_norm.weight": (E,), "output.weight": (E, V_draft),
           "d2t": (V_draft,), "rope_freqs.weight": (s.rot // 2,), p + "attn_norm.weight": (E,),
           p + "attn_norm_2.weight": (E,), p + "attn_q.weight": (E * 2, q), p + "attn_k.weight": (E * 2, kv),
           p + "attn_v.weight": (E * 2, s.head_v * s.head_kv), p + "attn_output.weight": (q, E),
           p + "ffn_norm.weight": (E,)}
    return out | _dense_ffn(p, E, s.ff)


def locator(files):
    """locate(name) -> (GGUFFile, TensorInfo) or None over a model's files (every shard of a split set)."""
    where = {}
    for f in files:
        for t in f.tensors:
            where.setdefault(t.name, (f, t))
    return where.get
