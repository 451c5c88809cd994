"""Which tensors a DFlash v1 / DFlash2 / DSpark drafter holds and the shapes its config implies (HF order,
[out, in])."""

from ggtools.dflash.checkpoint import Checkpoint
from ggtools.dflash.config import DraftConfig
from ggtools.dflash.dspark import check_heads, head_shapes, shape_rule
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.profiles import D2T, T2D
from ggtools.dflash.safetensors import FLOAT_DTYPES


def required_shapes(cfg: DraftConfig) -> dict[str, tuple]:
    H, d, I = cfg.hidden, cfg.head_dim, cfg.n_ff
    q, kv = cfg.n_head * d, cfg.n_head_kv * d
    shapes = {"fc.weight": (H, cfg.fc_in), "hidden_norm.weight": (H,)}
    if cfg.version == 2:
        R = cfg.v2["selector_rank"]
        shapes["candidate_selector.hidden_projection.weight"] = (R, H)
        for cb in ("predecessor", "successor"):
            shapes[f"candidate_selector.{cb}_codebook.weight"] = (cfg.vocab, R)
    for i in range(cfg.n_layer):
        p = f"layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
            p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
            p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
            p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
            p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I),
        }
        if cfg.version == 2:
            K, groups = cfg.v2["conv_kernel_size"], H // cfg.v2["conv_group_size"]
            for conv in ("attention_conv", "mlp_conv"):
                shapes[f"{p}{conv}.base_kernel"] = (2, K, H)
                shapes[f"{p}{conv}.kernel_projection.weight"] = (2 * K * groups, H)
    shapes["norm.weight"] = (H,)
    if cfg.dspark is not None:
        shapes |= head_shapes(cfg.dspark, H)[0]
    return shapes


def optional_shapes(cfg: DraftConfig) -> dict[str, tuple]:
    """Tensors a drafter may carry: attention biases (attention_bias), its own embedding and head."""
    H, q, kv = cfg.hidden, cfg.n_head * cfg.head_dim, cfg.n_head_kv * cfg.head_dim
    shapes = {}
    if cfg.attention_bias:
        for i in range(cfg.n_layer):
            p = f"layers.{i}.self_attn."
            shapes |= {p + "q_proj.bias": (q,), p + "k_proj.bias": (kv,), p + "v_proj.bias": (kv,),
                       p + "o_proj.bias": (H,)}
    if cfg.vocab is not None:
        shapes |= {"embed_tokens.weight": (cfg.vocab, H), "lm_head.weight": (cfg.vocab, H)}
    if cfg.dspark is not None:
        shapes |= head_shapes(cfg.dspark, H)[1]
    return shapes


def check_layout(ckpt: Checkpoint, cfg: DraftConfig):
    """Every required tensor present with the shape the config implies; nothing unknown."""
    where = ckpt.config_path
    if cfg.n_head == 0 or cfg.n_head_kv == 0 or cfg.n_head % cfg.n_head_kv:
        raise CheckpointError(where, f"num_attention_heads {cfg.n_head} is not a positive multiple of "
                                     f"num_key_value_heads {cfg.n_head_kv}", "num_key_value_heads")
    if cfg.version == 2:
        _check_v2(cfg, where)
    if cfg.dspark is not None:
        check_heads(ckpt, cfg.dspark, cfg.hidden)
    required, optional = required_shapes(cfg), optional_shapes(cfg)
    for name, shape in required.items():
        t = ckpt.tensors.get(name)
        if t is None:
            raise CheckpointError(ckpt.path, f"missing from the safetensors files ({_why(name, cfg)})",
                                  f"tensor '{name}'")
        _check_shape(t, name, shape, cfg)
    for name, t in ckpt.tensors.items():
        if name in required:
            continue
        if name not in optional:
            raise CheckpointError(t.path, f"not part of a {ckpt.family} drafter with {cfg.n_layer} layers: cannot "
                                          "map it", f"tensor '{t.name}'")
        _check_shape(t, name, optional[name], cfg)
    for name, t in ckpt.tensors.items():
        if t.dtype not in FLOAT_DTYPES and name not in (D2T, T2D):
            raise CheckpointError(t.path, f"dtype {t.dtype}: a weight must be one of {', '.join(FLOAT_DTYPES)}",
                                  f"tensor '{t.name}'")


def _check_v2(cfg, where):
    gs = cfg.v2["conv_group_size"]
    if cfg.v2["conv_kernel_size"] == 0 or gs == 0 or cfg.v2["selector_rank"] == 0 or cfg.v2["selector_top_k"] == 0:
        raise CheckpointError(where, f"conv/selector sizes must be positive: {cfg.v2}", "dflash_config")
    if cfg.hidden % gs:
        raise CheckpointError(where, f"hidden_size {cfg.hidden} is not divisible by conv_group_size {gs}",
                              "dflash_config.conv_group_size")
    if cfg.vocab is None:
        raise CheckpointError(where, "missing (a DFlash2 drafter's codebooks have one row per token)", "vocab_size")


def _check_shape(t, name, shape, cfg):
    if shape is None or tuple(t.shape) == tuple(shape):
        return
    rule = f"shape {list(t.shape)}, but config.json implies {list(shape)}"
    if cfg.dspark is not None:
        rule += shape_rule(name, cfg.dspark, cfg.hidden)
    if name == "fc.weight":
        rule += (f" (fc input width = {len(cfg.target_layer_ids)} target layer ids {cfg.target_layer_ids} "
                 f"({cfg.ids_from}) x hidden_size {cfg.hidden})")
    raise CheckpointError(t.path, rule, f"tensor '{t.name}'")


def _why(name, cfg):
    if name.startswith("layers."):
        return f"config.json: num_hidden_layers = {cfg.n_layer}"
    if name.startswith("candidate_selector."):
        return "every DFlash2 drafter has the candidate selector"
    if cfg.dspark is not None and name == "lm_head.weight":
        return f"a draft vocabulary of {cfg.dspark.draft_vocab} < {cfg.dspark.vocab} needs the drafter's own head"
    return "every DFlash drafter has it"
