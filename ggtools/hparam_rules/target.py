"""The hyperparameter rules of a target model (`<arch>.*` keys), as llama.cpp's loader reads and checks them, plus
the ones it misses that would make a runtime crash or compute garbage.

llama.cpp (llama-cpp-python 0.3.36): `llama_model_base::load_hparams` (src/llama-model.cpp) for every arch, then
the arch's `load_arch_hparams` (src/models/<arch>.cpp), ggml's RoPE (ggml-cpu/ops.cpp) and the graphs' asserts.
For the archs in ARCHS every key the arch's loader requires must be there; for any other arch the keys present
are checked (their type and value), since what else its loader requires is not known here.
"""

from dataclasses import dataclass

from ggtools.hparam_rules.keys import FLAG_TYPES, LLAMA_MAX_LAYERS, RUNTIME, Keys
from ggtools.hparam_rules.kimi_k3 import kimi_k3_rules
from ggtools.hparam_rules.sampling import sampling_violations
from ggtools.hparam_rules.mtp import nextn_rules
from ggtools.hparam_rules.violation import Violation

LLAMA_MAX_EXPERTS = 1024                                        # llama-hparams.h
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")     # llama-model.cpp: LLAMA_ROPE_SCALING_TYPES


@dataclass(frozen=True)
class ArchKeys:
    """What one arch's llama.cpp loader and graph require beyond the generic keys."""
    rot_is_head: bool = True      # the graph asserts n_embd_head == n_rot (or builds its Q/K from n_rot: gpt-oss)
    dense_ffn: bool = True        # an FFN of feed_forward_length on every layer
    experts: bool = False         # routed experts: expert_count and expert_used_count above 0
    expert_ff_required: bool = False  # expert_feed_forward_length (gpt-oss: get_key_or_arr, required)
    sliding_window: bool = False  # attention.sliding_window required; sliding_window_pattern read
    delta_net: bool = False       # Gated DeltaNet hybrid: ssm.* and rope.dimension_sections required
    rope: bool = True             # False: llama.cpp's rope type NONE; rope.dimension_count is then a size (required),
                                  # not a rotation (kimi-k3: the un-rotated tail of MLA's key)
    kda: bool = False             # kimi-k3: 0 KV heads mark a KDA layer (head_count_kv required); its own keys


ARCHS = {
    "llama": ArchKeys(),
    "qwen3": ArchKeys(),
    "qwen3moe": ArchKeys(dense_ffn=False, experts=True),
    "qwen35": ArchKeys(rot_is_head=False, delta_net=True),
    "qwen35moe": ArchKeys(rot_is_head=False, dense_ffn=False, experts=True, delta_net=True),
    "gpt-oss": ArchKeys(dense_ffn=False, experts=True, expert_ff_required=True, sliding_window=True),
    "kimi-k3": ArchKeys(rot_is_head=False, dense_ffn=False, experts=True, expert_ff_required=True, rope=False,
                        kda=True),
}


def target_violations(f) -> list[Violation]:
    """Every rule the target's `<arch>.*` keys break (empty: the runtime may read them)."""
    arch = f.architecture
    if arch is None:
        return []            # the container rules report a missing or non-string general.architecture
    spec = ARCHS.get(arch)
    known = spec is not None
    spec = spec or ArchKeys(rot_is_head=False, dense_ffn=False)
    k = Keys(f, arch)
    n_ctx = k.uint("context_length", required=known)
    k.check("context_length", n_ctx != 0, "is 0: the model has no context")
    n_embd = k.uint("embedding_length", required=known)
    k.check("embedding_length", n_embd != 0, "is 0")
    n_layer_all = _layers(k, known)
    nextn_rules(k, n_layer_all)
    _experts(k, spec, n_layer_all)
    n_ff = k.per_layer("feed_forward_length", n_layer_all)
    if spec.dense_ffn and n_ff is not None:
        k.check("feed_forward_length", min(n_ff, default=1) > 0, "is 0: every layer has a feed-forward network")
    head_dim, n_head_kv = _heads(k, spec, n_embd, n_layer_all, known)
    n_rot = _rope(k, spec, arch, head_dim)
    eps = k.float("attention.layer_norm_rms_epsilon", required=known)
    k.check("attention.layer_norm_rms_epsilon", eps is None or eps > 0,
            f"is {eps}: the RMS norm divides by sqrt(mean + eps), which must be above 0",
            "GGML_ASSERT(eps >= 0.0f) failed" if eps is not None and eps < 0 else None)
    scale = k.float("attention.scale")
    k.check("attention.scale", scale is None or scale >= 0, f"is {scale}: an attention scale cannot be negative")
    _sliding_window(k, spec, n_layer_all)
    if spec.delta_net:
        _delta_net(k, n_layer_all)
    if spec.kda:
        kimi_k3_rules(k, n_head_kv, head_dim, n_rot, n_ff)
    return k.violations + sampling_violations(f)


def _layers(k: Keys, required: bool) -> int | None:
    n = k.uint("block_count", required=required)
    if n is not None and not k.check("block_count", 0 < n <= LLAMA_MAX_LAYERS,
                                     f"is {n}: a model has 1..{LLAMA_MAX_LAYERS} layers",
                                     "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)"
                                     " failed"):
        return None
    return n


def _experts(k: Keys, spec: ArchKeys, n_layer_all):
    # llama.cpp's loader takes a MoE file without them, then its qwen3moe loader throws "n_expert must be > 0"
    n_expert = k.uint("expert_count", 0, required=RUNTIME if spec.experts else False)
    used = k.per_layer("expert_used_count", n_layer_all, default=0, required=RUNTIME if spec.experts else False)
    if n_expert is None:
        return
    k.check("expert_count", n_expert <= LLAMA_MAX_EXPERTS, f"is {n_expert}, above llama.cpp's {LLAMA_MAX_EXPERTS}",
            "GGML_ASSERT(hparams.n_expert <= LLAMA_MAX_EXPERTS) failed")
    k.check("expert_count", not spec.experts or n_expert > 0, "is 0: this arch's layers route to experts")
    if used is not None:
        top = max(used, default=0)
        k.check("expert_used_count", top <= n_expert, f"is {top}, above expert_count {n_expert}",
                "GGML_ASSERT(n_expert_used_max <= hparams.n_expert) failed")
        if n_expert > 0:
            k.check("expert_used_count", min(used, default=1) > 0,
                    f"is {'0' if k.has('expert_used_count') else 'missing (0)'} with expert_count {n_expert}: a "
                    "layer must use one", "GGML_ASSERT(n_expert_used_max > 0) failed" if top == 0 else None)
    n_ff_exp = k.per_layer("expert_feed_forward_length", n_layer_all, required=spec.expert_ff_required)
    if spec.experts and n_ff_exp is not None:
        k.check("expert_feed_forward_length", min(n_ff_exp, default=1) > 0, "is 0: an expert has no width")
    k.uint("expert_shared_feed_forward_length")
    k.float("expert_weights_scale")


def _heads(k: Keys, spec: ArchKeys, n_embd, n_layer_all, known: bool) -> tuple[int | None, list[int] | None]:
    """Head counts per layer (> 0 on the archs in ARCHS, whose every layer has attention heads, but for kimi-k3's
    KDA layers: other archs give their linear-attention layers 0 KV heads), KV heads dividing heads, and the head
    size; returns the K head size and the KV heads per layer."""
    n_head = k.per_layer("attention.head_count", n_layer_all, required=RUNTIME if known else False)
    if n_head is not None and known and not k.check("attention.head_count", min(n_head, default=1) > 0,
                                                    "is 0: attention needs heads"):
        n_head = None
    n_head_kv = k.per_layer("attention.head_count_kv", n_layer_all, required=RUNTIME if spec.kda else False)
    if n_head_kv is not None and known and not spec.kda and \
            not k.check("attention.head_count_kv", min(n_head_kv, default=1) > 0, "is 0: attention needs key/value heads"):
        return None, None
    if n_head is not None and n_head_kv is not None:
        bad = [(h, kv) for h, kv in zip(n_head, n_head_kv) if kv and h % kv]
        k.check("attention.head_count_kv", not bad,
                f"{bad[0][1] if bad else 0} KV heads do not divide {bad[0][0] if bad else 0} heads (grouped-query "
                "attention shares each KV head among a whole group)")
    return _head_size(k, n_embd, n_head), n_head_kv


def _head_size(k: Keys, n_embd, n_head) -> int | None:
    key_length = k.uint("attention.key_length")
    value_length = k.uint("attention.value_length")
    k.check("attention.value_length", value_length != 0, "is 0")
    if key_length is not None:
        return key_length if k.check("attention.key_length", key_length > 0, "is 0") else None
    if not n_head or not n_head[0] or n_embd is None or k.has("attention.key_length"):
        return None
    h = n_head[0]
    if not k.check("embedding_length", n_embd % h == 0,
                   f"{n_embd} is not a multiple of attention.head_count {h}, and attention.key_length does not "
                   "give the head size") or n_embd // h == 0:
        return None
    return n_embd // h


def _rope(k: Keys, spec: ArchKeys, arch: str, head_dim) -> int | None:
    """The RoPE keys; returns the rotated (kimi-k3: un-rotated tail) dims of a key head."""
    base = k.float("rope.freq_base", 10000.0)
    k.check("rope.freq_base", base is None or base > 0, f"is {base}: the RoPE base must be above 0")
    base_swa = k.float("rope.freq_base_swa")
    k.check("rope.freq_base_swa", base_swa is None or base_swa > 0, f"is {base_swa}: the RoPE base must be above 0")
    scaling = k.string("rope.scaling.type", "linear", ROPE_SCALING_TYPES,
                       "GGML_ASSERT(hparams.rope_scaling_type_train != LLAMA_ROPE_SCALING_TYPE_UNSPECIFIED) failed")
    for key in ("rope.scaling.factor", "rope.scale_linear"):
        factor = k.float(key)
        k.check(key, factor is None or factor >= 0, f"is {factor}: a RoPE scaling factor cannot be negative")
    attn_factor = k.float("rope.scaling.attn_factor")
    k.check("rope.scaling.attn_factor", attn_factor is None or attn_factor > 0, f"is {attn_factor}: must be above 0")
    orig = k.uint("rope.scaling.original_context_length")
    k.check("rope.scaling.original_context_length", orig != 0 or scaling != "yarn",
            "is 0: YaRN's correction range needs the original context length")
    n_rot = k.uint("rope.dimension_count", head_dim, required=False) if spec.rope else \
        k.uint("rope.dimension_count", required=RUNTIME)
    if n_rot is not None and head_dim is not None and spec.rope:
        if spec.rot_is_head:
            # llama: the loader's check; gpt-oss: its loader sizes Q, K and V by n_rot (a tensor shape error);
            # qwen3, qwen3moe: the graph's assert
            k.check("rope.dimension_count", n_rot == head_dim,
                    f"is {n_rot}, the head size is {head_dim}: llama.cpp's {arch} graph rotates whole heads",
                    f"invalid n_rot: {n_rot}, expected {head_dim}" if arch == "llama" else None if arch == "gpt-oss"
                    else "GGML_ASSERT(n_embd_head == n_rot) failed")
        elif k.check("rope.dimension_count", n_rot <= head_dim and n_rot % 2 == 0,
                     f"is {n_rot}, the head size is {head_dim}: RoPE rotates pairs of a head's dims (an even count, "
                     "at most the head size)", "GGML_ASSERT(n_dims <= ne0) failed" if n_rot > head_dim else
                     "GGML_ASSERT(n_dims % 2 == 0) failed"):
            k.check("rope.dimension_count", n_rot > 0, "is 0: ggtools' runtime needs at least one rotated pair")
    sections = k.int_array("rope.dimension_sections", required=spec.delta_net)
    if sections is not None:
        _sections(k, sections, llama_reads=spec.delta_net)
    return n_rot


def _sections(k: Keys, sections: list[int], llama_reads: bool):
    """M-RoPE's sections: 4 counts of rotated pairs (llama.cpp: get_key_or_arr(..., 4) where the arch reads them,
    ggml's mrope cache); llama_reads: whether llama.cpp reads them for this arch (ggtools' runtime always does)."""
    key = "rope.dimension_sections"
    if not k.check(key, len(sections) == 4, f"has {len(sections)} entries: M-RoPE has 4 sections",
                   f"key {k.name(key)} has wrong array length; expected 4, got {len(sections)}" if llama_reads
                   else None):
        return
    if not k.check(key, min(sections) >= 0, f"holds {min(sections)}: a section cannot be negative"):
        return
    k.check(key, sum(sections[:3]) > 0, f"is {sections}: one of the first three sections must be above 0",
            "GGML_ASSERT(sections[0] > 0 || sections[1] > 0 || sections[2] > 0) failed" if llama_reads else None)


def _sliding_window(k: Keys, spec: ArchKeys, n_layer_all):
    window = k.uint("attention.sliding_window", required=spec.sliding_window)
    k.check("attention.sliding_window", window != 0 or not spec.sliding_window,
            "is 0: this arch's sliding-window layers need a window")
    key = "attention.sliding_window_pattern"
    kv = k.f.kv.get(k.name(key))
    if kv is None:
        return
    if kv.is_array:
        pattern = k.int_array(key, element_types=FLAG_TYPES)
        if pattern is not None:
            k.check(key, len(pattern) <= LLAMA_MAX_LAYERS,
                    f"has {len(pattern)} entries, above llama.cpp's {LLAMA_MAX_LAYERS}",
                    f"array length {len(pattern)} for key {k.name(key)} exceeds max {LLAMA_MAX_LAYERS}")
    else:
        k.uint(key)


def _delta_net(k: Keys, n_layer_all):
    """Gated DeltaNet layers (qwen35, qwen35moe: load_arch_hparams reads ssm.* with get_key, required)."""
    sizes = {name: k.uint(f"ssm.{name}", required=True)
             for name in ("conv_kernel", "inner_size", "state_size", "time_step_rank", "group_count")}
    for name, v in sizes.items():
        k.check(f"ssm.{name}", v != 0, "is 0: a Gated DeltaNet layer needs it above 0")
    rank, groups = sizes["time_step_rank"], sizes["group_count"]
    if rank and groups:
        k.check("ssm.time_step_rank", rank % groups == 0,
                f"{rank} value heads are not a multiple of ssm.group_count {groups} key heads",
                "GGML_ASSERT(H_v % H_k == 0) failed")
    if k.has("attention.recurrent_layers"):
        k.per_layer("attention.recurrent_layers", n_layer_all, flags=True)
        return
    interval = k.uint("full_attention_interval", 4)
    k.check("full_attention_interval", interval != 0,
            "is 0: every interval-th layer is full attention, so it must be above 0 (a division by zero)")
