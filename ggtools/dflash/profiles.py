"""DFlash drafter GGUF profiles: every fact about the layout one runtime's drafter loader reads, in one place.

A profile names its arch (written, and the aliases its loader takes), where each value lives (key names), the
target-layer id convention, the tensor names, the tensor encodings its runtime takes, and which target archs
expose the per-layer inputs DFlash taps in that runtime. `convert dflash` writes a profile, doctor and
pair-check check files against one, `convert gguf-layout` moves a file from one to the other, and the runtime's
drafter loader reads either through it.

- llama.cpp (0c1e570): arch `dflash`; keys `dflash.*`; target layers stored as HF id + 1 (the index into
  `t_layer_inp`, the input of layer id + 1) in `dflash.target_layers`; the mask id in the drafter's own
  tokenizer (`tokenizer.ggml.mask_token_id`; files of the converter before its refactor hold only
  `dflash.mask_token_id`); the target's tokenizer embedded; DFlash2 supported.
- lucebox (62880e20): arch `qwen35-dflash-draft` (its loader also takes `dflash-draft`, `gemma4-dflash-draft`);
  every key under `<arch>.`; raw HF ids in `<arch>.dflash.target_layer_ids`; the mask id in
  `<arch>.dflash.mask_token_id` (its runtime takes the mask from the target instead); no tokenizer; v1 only.

DSpark (a DFlash v1 backbone plus a low-rank Markov head and an optional confidence head) is a set of facts
here too: the HF architectures llama.cpp's converter converts as DSpark, the heads' HF and GGUF names in each
profile, their keys, and what each runtime's DSpark path takes (anchor-first or bonus-anchor blocks, a reduced
draft vocabulary, a scale on markov_w2, a confidence head without bias).
- llama.cpp: `markov_w1.weight`, `markov_w2.weight` (+ `.scale`), `conf_proj.{weight,bias}`, `d2t` (I64
  absolute target ids); keys `dflash.sample_from_anchor`, `dflash.has_confidence_head`; both block layouts, a
  reduced vocabulary with the drafter's own `output.weight`.
- lucebox (server/src/common/dspark_head.cpp, draft_gguf_loader.cpp): `dflash.dspark.markov.{w1,w2}`,
  `dflash.dspark.confidence.{weight,bias}`; keys `dflash.dspark.{enabled,markov_rank,vocab_size,
  confidence_dim,confidence.enabled}`; bonus-anchor blocks only (it drafts rows 1..n after the anchor), the
  target's vocabulary and head only, no scale, a confidence weight only with its bias.
"""

import importlib
import re
from dataclasses import dataclass

from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

# llama.cpp (llama-cpp-python 0.3.36's vendored tree): the GGUF arch names whose graph sets t_layer_inp (the
# per-layer inputs DFlash taps); tests/test_doctor.py derives this set from that source.
LLAMACPP_TAP_ARCHS = frozenset({
    "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp", "gemma4", "gpt-oss",
    "minimax-m2", "minimax-01", "mimo2", "nemotron_h", "bailingmoe3", "hunyuan_vl", "muse-glimmer", "nanbeige",
    "lfm2", "deepseek4"})
# lucebox at 62880e20: target archs with a DFlash target (server/src/<arch>/<arch>_dflash_target.cpp), and the
# archs its backend factory knows at all.
LUCEBOX_TAP_ARCHS = frozenset({"qwen35", "qwen35moe", "laguna", "gemma4"})
LUCEBOX_BACKEND_ARCHS = frozenset({"qwen35", "qwen35moe", "laguna", "qwen3", "gemma4", "deepseek4"})

# DSpark: the HF architectures llama.cpp's converter registers for its class DSparkModel (conversion/qwen.py: a
# DFlash v1 backbone in Qwen3 names), and those it converts with classes of their own (other backbones).
DSPARK_ARCHITECTURES = ("Qwen3DSparkModel", "DSparkDraftModel", "DSparkSpeculator", "Lfm2DSparkDraftModel",
                        "LingDSparkModel")
DSPARK_OTHER_BACKBONES = {
    "Gemma4DSparkModel": "a Gemma 4 backbone (llama.cpp: conversion/gemma.py)",
    "DeepseekV4DSparkModel": "a DeepSeek-V4 backbone exported from the target's own checkpoint (llama.cpp: "
                             "conversion/deepseek.py, --dspark-draft-only)"}
MARKOV_HEAD_TYPES = ("vanilla",)
# the heads' canonical HF names (without 'model.'), and the two vocabulary tables
MARKOV_W1, MARKOV_W2 = "markov_head.markov_w1.weight", "markov_head.markov_w2.weight"
MARKOV_W2_SCALE = "markov_head.markov_w2.scale"
CONF_W, CONF_B = "confidence_head.proj.weight", "confidence_head.proj.bias"
D2T, T2D = "d2t", "t2d"          # draft row -> target id (offsets in the checkpoint); target -> draft mask (unused)
DSPARK_HEADS = (MARKOV_W1, MARKOV_W2, MARKOV_W2_SCALE, CONF_W, CONF_B)
# DSpark roles: the block layout and confidence flag (llama.cpp); lucebox's head keys
DSPARK_ROLES = ("sample_from_anchor", "has_confidence_head", "dspark_enabled", "markov_rank", "dspark_vocab_size",
                "confidence_dim", "confidence_enabled")

# Keys both profiles hold under "<arch>.", with the same meaning.
HPARAM_KEYS = ("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
               "attention.head_count_kv", "attention.key_length", "attention.value_length",
               "attention.layer_norm_rms_epsilon", "rope.freq_base", "attention.sliding_window",
               "attention.sliding_window_pattern")
V2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")
# role -> (value type, element type) of the KV that holds it, in every profile
ROLE_TYPES = {role: (VT.UINT32, None) for role in HPARAM_KEYS + V2_KEYS + DSPARK_ROLES +
              ("block_size", "n_target_ids", "mask", "vocab_size")}
ROLE_TYPES |= {"attention.layer_norm_rms_epsilon": (VT.FLOAT32, None), "rope.freq_base": (VT.FLOAT32, None),
               "attention.sliding_window_pattern": (VT.ARRAY, VT.BOOL), "target_ids": (VT.ARRAY, VT.INT32),
               "sample_from_anchor": (VT.BOOL, None), "has_confidence_head": (VT.BOOL, None)}

_COMMON_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down"}
_LAYER = re.compile(r"(layers|blk)\.(\d+)\.(.+)")


@dataclass(frozen=True)
class Profile:
    name: str                       # "llama.cpp" | "lucebox"
    runtime: str                    # the runtime whose loader reads this layout
    arch: str                       # written by convert and gguf-layout
    archs: tuple                    # taken by the loader
    keys: dict                      # role -> key after "<arch>." ("tokenizer.*": a whole key); others: role itself
    ids_offset: int                 # stored target-layer id = HF id + ids_offset
    names: dict                     # HF tensor name -> GGUF name, model-level tensors
    layer_names: dict               # HF layer tensor (or base, see layer_suffixes) -> GGUF name within blk.N
    layer_suffixes: tuple           # suffixes a layer base may take (weight, bias)
    aliases: dict                   # GGUF name (within blk.N for layer tensors) -> other names the loader takes
    weight_types: frozenset | None  # encodings the runtime takes for weights (None: any ggml type)
    tap_archs: frozenset
    dflash2: bool
    tokenizer: bool                 # the file carries the target's tokenizer
    takes_outtype: bool             # convert --outtype chooses the weight type (else: the converter's dtype rules)
    default_mask_id: int | None     # what its converter writes without a mask id (None: refuses)
    mask_from_target: bool          # its runtime takes the mask id from the target, not from this file
    default_block_size: int | None  # what its runtime assumes without a block size (None: drafting fails)
    converter: str                  # module under ggtools.dflash that writes this profile from a HF checkpoint
    role_order: tuple               # the order its converter writes the keys of these roles in
    legacy_mask_keys: tuple = ()    # where older files of this profile keep the mask id
    # DSpark: what its runtime's DSpark path takes
    dspark_anchor_modes: tuple = (True, False)   # sample_from_anchor values it drafts (True: anchor-first blocks)
    dspark_reduced_vocab: bool = True            # a draft vocabulary smaller than the target's (d2t)
    dspark_w2_scale: bool = True                 # a scale on markov_w2
    dspark_conf_needs_bias: bool = False         # a confidence weight only together with its bias
    dspark_source: str = ""                      # where its runtime's DSpark rules come from
    dspark_target_archs: frozenset | None = None  # target archs whose backend runs the heads (None: every tap arch)

    # ---- keys ---------------------------------------------------------------------------------------------
    def key(self, role: str, arch: str | None = None) -> str:
        suffix = self.keys.get(role, role)
        if suffix is None:
            raise KeyError(f"the {self.name} profile has no key for {role}")
        return suffix if suffix.startswith("tokenizer.") else f"{arch or self.arch}.{suffix}"

    def has_key(self, role: str) -> bool:
        return self.keys.get(role, role) is not None

    def dspark_refusal(self, anchor_first: bool, reduced_vocab: bool, w2_scale: bool, conf_without_bias: bool):
        """Why this profile's runtime cannot draft a DSpark drafter with these properties, or None."""
        if anchor_first not in self.dspark_anchor_modes:
            return (f"it samples from the anchor (sample_from_anchor true: every row of the block drafts); "
                    f"{self.runtime} drafts with bonus-anchor blocks only (rows 1..n after the anchor, "
                    f"{self.dspark_source}), so each draft would land one position late")
        if reduced_vocab and not self.dspark_reduced_vocab:
            return (f"its draft vocabulary is smaller than the target's (d2t); {self.runtime} drafts over the "
                    f"target's vocabulary with the target's head ({self.dspark_source})")
        if w2_scale and not self.dspark_w2_scale:
            return f"markov_w2 has a scale; {self.runtime}'s Markov head has none ({self.dspark_source})"
        if conf_without_bias and self.dspark_conf_needs_bias:
            return (f"its confidence head has no bias; {self.runtime}'s loader takes the confidence weight only "
                    "together with its bias")
        return None

    # ---- target layer ids ---------------------------------------------------------------------------------
    def stored_ids(self, hf_ids) -> list[int]:
        return [int(i) + self.ids_offset for i in hf_ids]

    def hf_ids(self, stored_ids) -> list[int]:
        return [int(i) - self.ids_offset for i in stored_ids]

    @property
    def id_convention(self) -> str:
        return f"HF id + {self.ids_offset}" if self.ids_offset else "HF id"

    # ---- tensor names -------------------------------------------------------------------------------------
    def gguf_name(self, hf_name: str) -> str | None:
        """The GGUF name of a canonical HF tensor name, or None when this profile has no place for it."""
        if hf_name in self.names:
            return self.names[hf_name]
        m = _LAYER.fullmatch(hf_name)
        if not m or m.group(1) != "layers":
            return None
        bid, rest = m.group(2), m.group(3)
        if rest in self.layer_names:
            return f"blk.{bid}.{self.layer_names[rest]}"
        base, _, suffix = rest.rpartition(".")
        if base in self.layer_names and suffix in self.layer_suffixes:
            return f"blk.{bid}.{self.layer_names[base]}.{suffix}"
        return None

    def hf_name(self, gguf_name: str) -> str | None:
        """The canonical HF name of a GGUF tensor (aliases included), or None when it is none of this profile's."""
        canonical = self._unalias(gguf_name)
        for hf, g in self.names.items():
            if g == canonical:
                return hf
        m = _LAYER.fullmatch(canonical)
        if not m or m.group(1) != "blk":
            return None
        bid, rest = m.group(2), m.group(3)
        for hf, g in self.layer_names.items():
            if g == rest:
                return f"layers.{bid}.{hf}"
            base, _, suffix = rest.rpartition(".")
            if g == base and suffix in self.layer_suffixes:
                return f"layers.{bid}.{hf}.{suffix}"
        return None

    def _unalias(self, name: str) -> str:
        m = _LAYER.fullmatch(name)
        prefix, rest = (f"blk.{m.group(2)}.", m.group(3)) if m and m.group(1) == "blk" else ("", name)
        for canonical, others in self.aliases.items():
            if rest in others:
                return prefix + canonical
        return name

    def find_tensor(self, names, gguf_name: str) -> str | None:
        """Which of `names` (a file's tensor names) the loader takes as `gguf_name`: it, or an alias."""
        m = _LAYER.fullmatch(gguf_name)
        prefix, rest = (f"blk.{m.group(2)}.", m.group(3)) if m and m.group(1) == "blk" else ("", gguf_name)
        for candidate in (rest, *self.aliases.get(rest, ())):
            if prefix + candidate in names:
                return prefix + candidate
        return None

    # ---- encodings ----------------------------------------------------------------------------------------
    def encoding(self, type_id: int, name: str, ne) -> tuple[int, str]:
        """(the type this profile stores the tensor in, why): its own type where the runtime takes it."""
        if type_id in INTEGER_TYPES:
            return type_id, f"{T(type_id).name} table (ids): kept"
        if is_norm_or_vector(name, ne):
            if type_id == T.F32:
                return T.F32, "norm or 1-D: F32, kept"
            return T.F32, f"norm or 1-D: {self.name} stores them as F32"
        if self.weight_types is None or type_id in self.weight_types:
            return type_id, f"{self.runtime} takes {T(type_id).name}: kept"
        return T.F16, f"{self.runtime} does not take {T(type_id).name}: F16 (as its converter stores BF16)"

    def tensor_order(self, gguf_name: str) -> tuple:
        """Sort key of the order this profile's converter writes tensors in."""
        return self._converter().tensor_order(self, gguf_name)

    def plan_conversion(self, ckpt, cfg, outtype: str, target, name):
        """(resolved outtype, tensor jobs, KVList, notes) of a checkpoint written in this profile. The converter
        module takes every fact (arch, key and tensor names, id convention) from this profile."""
        return self._converter().plan(self, ckpt, cfg, outtype, target, name)

    def conversion_tensors(self, ckpt, cfg, outtype: str):
        """The tensor jobs of a conversion in this profile (what a fresh conversion writes, tensor by tensor)."""
        return self._converter().plan_tensors(self, ckpt, cfg, outtype)

    def _converter(self):
        # imported on use: the runtime's drafter loader reads these facts without loading the converters
        return importlib.import_module(f"ggtools.dflash.{self.converter}")


INTEGER_TYPES = frozenset({T.I8, T.I16, T.I32, T.I64})


def is_norm_or_vector(name: str, ne) -> bool:
    """What both converters store as F32: norms and 1-D tensors (a 2-D tensor with a dimension of 1, such as DSpark's
    confidence weight {n_embd + R, 1}, is a weight)."""
    return name.endswith("norm.weight") or len(ne) <= 1


LLAMACPP = Profile(
    name="llama.cpp", runtime="llama.cpp", arch="dflash", archs=("dflash",),
    keys={"block_size": "block_size", "target_ids": "target_layers", "n_target_ids": None,
          "mask": "tokenizer.ggml.mask_token_id", "vocab_size": None,
          "sample_from_anchor": "sample_from_anchor", "has_confidence_head": "has_confidence_head",
          "dspark_enabled": None, "markov_rank": None, "dspark_vocab_size": None, "confidence_dim": None,
          "confidence_enabled": None},
    ids_offset=1,
    names={"fc.weight": "fc.weight", "hidden_norm.weight": "enc.output_norm.weight",
           "norm.weight": "output_norm.weight", "embed_tokens.weight": "token_embd.weight",
           "lm_head.weight": "output.weight",
           "candidate_selector.hidden_projection.weight": "selector_hidden.weight",
           "candidate_selector.predecessor_codebook.weight": "selector_predecessor.weight",
           "candidate_selector.successor_codebook.weight": "selector_successor.weight",
           MARKOV_W1: "markov_w1.weight", MARKOV_W2: "markov_w2.weight", MARKOV_W2_SCALE: "markov_w2.scale",
           CONF_W: "conf_proj.weight", CONF_B: "conf_proj.bias", D2T: "d2t"},
    layer_names=_COMMON_LAYER_NAMES | {
        "attention_conv.base_kernel": "attn_conv_base", "attention_conv.kernel_projection.weight":
        "attn_conv_proj.weight", "mlp_conv.base_kernel": "ffn_conv_base",
        "mlp_conv.kernel_projection.weight": "ffn_conv_proj.weight"},
    layer_suffixes=("weight", "bias"), aliases={}, weight_types=None, tap_archs=LLAMACPP_TAP_ARCHS,
    dflash2=True, tokenizer=True, takes_outtype=True, default_mask_id=None, mask_from_target=False,
    default_block_size=16,
    converter="llamacpp",
    role_order=("block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "rope.freq_base", "attention.layer_norm_rms_epsilon",
                "attention.key_length", "attention.value_length", "block_size", *V2_KEYS, "target_ids",
                "attention.sliding_window", "attention.sliding_window_pattern", "sample_from_anchor",
                "has_confidence_head", "mask"),
    legacy_mask_keys=("dflash.mask_token_id",),
    dspark_source="src/models/dflash.cpp, build_dspark_markov_head")

LUCEBOX = Profile(
    name="lucebox", runtime="lucebox", arch="qwen35-dflash-draft",
    archs=("qwen35-dflash-draft", "dflash-draft", "gemma4-dflash-draft"),
    keys={"block_size": "dflash.block_size", "target_ids": "dflash.target_layer_ids",
          "n_target_ids": "dflash.n_target_layers", "mask": "dflash.mask_token_id", "vocab_size": "vocab_size",
          "sample_from_anchor": None, "has_confidence_head": None, "dspark_enabled": "dflash.dspark.enabled",
          "markov_rank": "dflash.dspark.markov_rank", "dspark_vocab_size": "dflash.dspark.vocab_size",
          "confidence_dim": "dflash.dspark.confidence_dim", "confidence_enabled": "dflash.dspark.confidence.enabled"},
    ids_offset=0,
    names={"fc.weight": "dflash.fc.weight", "hidden_norm.weight": "dflash.hidden_norm.weight",
           "norm.weight": "output_norm.weight", MARKOV_W1: "dflash.dspark.markov.w1",
           MARKOV_W2: "dflash.dspark.markov.w2", CONF_W: "dflash.dspark.confidence.weight",
           CONF_B: "dflash.dspark.confidence.bias"},
    layer_names=_COMMON_LAYER_NAMES, layer_suffixes=("weight",),
    aliases={"dflash.fc.weight": ("dflash_fc.weight",), "dflash.hidden_norm.weight": ("dflash_hidden_norm.weight",),
             "ffn_norm.weight": ("post_attention_norm.weight",)},
    weight_types=frozenset({T.F32, T.F16, T.Q8_0, T.Q4_0}), tap_archs=LUCEBOX_TAP_ARCHS, dflash2=False,
    tokenizer=False, takes_outtype=False, default_mask_id=248070, mask_from_target=True,
    default_block_size=None, converter="lucebox",
    role_order=("context_length", "embedding_length", "block_count", "feed_forward_length", "attention.head_count",
                "attention.head_count_kv", "attention.key_length", "attention.value_length", "vocab_size",
                "attention.layer_norm_rms_epsilon", "rope.freq_base", "n_target_ids", "block_size", "mask",
                "target_ids", "attention.sliding_window", "attention.sliding_window_pattern", "dspark_enabled",
                "markov_rank", "dspark_vocab_size", "confidence_dim", "confidence_enabled"),
    dspark_anchor_modes=(False,), dspark_reduced_vocab=False, dspark_w2_scale=False, dspark_conf_needs_bias=True,
    dspark_source="server/src/common/dspark_head.cpp",
    # 62880e20: only the laguna backend calls the Markov chain (server/src/laguna/laguna_backend.cpp); deepseek4
    # has a DSpark loader of its own (arch deepseek4-dflash-draft)
    dspark_target_archs=frozenset({"laguna"}))

PROFILES = {p.name: p for p in (LLAMACPP, LUCEBOX)}


def profile_of(arch: str | None) -> Profile | None:
    """The profile whose loader takes this arch, or None for an arch no DFlash loader takes."""
    return next((p for p in PROFILES.values() if arch in p.archs), None)

