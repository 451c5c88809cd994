"""EAGLE3 drafters: every fact about the family in one place, read by `convert drafter` (the checkpoint layouts,
the tensor names, the keys), by `validate` / `doctor` / `pair-check` (hparam_rules/eagle3.py, dflash/eagle3_rules.py:
the keys and llama.cpp's words) and by the runtime's drafter loader. The DFlash / DSpark family's facts are in
profiles.py beside this module; EAGLE3 GGUFs exist in llama.cpp's layout only.

llama.cpp (llama-cpp-python 0.3.36's vendored tree; reference eagle3-mtp-sampling.md §1.1, §1.4, §5):
- the converter (conversion/llama.py, class LlamaModel) converts a checkpoint as EAGLE3 when its config has a
  `draft_vocab_size` and `num_hidden_layers` 1; the HF architectures registered for it: HF_ARCHITECTURES (and the
  plain llama names, converted as EAGLE3 by the same test). It renames `midlayer.*` and `layers.0.*` to
  `model.layers.0.*`, merges a nested `transformer_layer_config`, writes `target_layers` (the config's
  `eagle_aux_hidden_state_layer_ids`, else [2, L // 2, L - 3] of the target's L layers), `target_hidden_size`
  (the config's, else the target's hidden size) and the two norm flags from the config's root, stores `d2t` as
  absolute target ids (I64) after checking them, drops `t2d`, permutes q / k for llama.cpp's RoPE, and generates
  `rope_freqs` for llama3 RoPE scaling.
- the loader (src/models/eagle3.cpp) requires `eagle3.target_layers` (3 entries) and `eagle3.target_hidden_size`;
  the encoder's input is 3 x target_hidden_size wide; the decoder has exactly one layer.
- the speculative driver (common/speculative.cpp) taps the input of target layer id (t_layer_inp) for id < the
  target's layer count, the target's t_h_nextn for id == that count, and aborts beyond it. The spec type is never
  detected from the file (common_speculative_types_from_gguf): `--spec-type draft-eagle3` is needed.
"""

import re

from ggtools.dflash.profiles import LLAMACPP_TAP_ARCHS

ARCH = "eagle3"
RUNTIME = "llama.cpp"                 # the runtime whose loader reads EAGLE3 GGUFs (they exist in its layout only)
# the HF architectures llama.cpp's converter registers for EAGLE3 checkpoints (conversion/llama.py), and the
# other LlamaModel names it converts as EAGLE3 when the config says so (draft_vocab_size and one layer)
HF_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM", "Eagle3Speculator", "Eagle3DraftModel")
HPARAM_DETECTED = ("LlamaForCausalLM", "LLaMAForCausalLM", "MistralForCausalLM", "LlamaModel")
N_TAPS = 3
# model_type values whose config llama.cpp's converter reads through transformers' LlamaConfig (its defaults)
LLAMA_MODEL_TYPES = ("llama",)

# roles -> key after "eagle3." (KV types: target_layers an INT32 array, target_hidden_size u32, the flags bool)
TARGET_LAYERS, TARGET_HIDDEN = "target_layers", "target_hidden_size"
NORM_BEFORE_RESIDUAL, NORM_BEFORE_FC = "norm_before_residual", "norm_before_fc"
# the config keys the converter reads from config.json's root (never from a nested config)
AUX_IDS = "eagle_aux_hidden_state_layer_ids"

# checkpoint names (after the renames, without 'model.') -> GGUF names
NAMES = {"fc.weight": "fc.weight", "input_norm.weight": "enc.output_norm.weight", "norm.weight": "output_norm.weight",
         "embed_tokens.weight": "token_embd.weight", "lm_head.weight": "output.weight", "d2t": "d2t"}
LAYER_NAMES = {"input_layernorm": "attn_norm", "hidden_norm": "attn_norm_2", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
DROPPED = ("t2d",)                                      # not used at runtime: the converter skips it
SKIPPED_SUFFIXES = (".attention.masked_bias", ".attention.bias", ".rotary_emb.inv_freq")   # prepare_tensors skips
ROPE_PERMUTED = ("self_attn.q_proj", "self_attn.k_proj")
ROPE_FREQS = "rope_freqs.weight"
D2T, T2D = "d2t", "t2d"
_LAYER = re.compile(r"layers\.0\.(.+)\.(weight|bias)")

# Target archs whose llama.cpp graph writes the tapped features: t_layer_inp (ids below the target's layer count;
# the same set DFlash taps) and t_h_nextn (id == the layer count). tests/test_eagle3_rules.py derives both from the
# vendored source.
TAP_ARCHS = LLAMACPP_TAP_ARCHS
NEXTN_ARCHS = frozenset({
    "bailingmoe3", "cohere2moe", "deepseek2", "deepseek32", "deepseek4", "gemma4", "glm-dsa", "glm4moe",
    "glm5-next", "hy_v3", "mimo2", "nemotron_h", "nemotron_h_moe", "gpt-oss", "qwen35", "qwen35moe", "qwen3next",
    "step35"})

SPEC_TYPE = "draft-eagle3"
SPEC_HINT = (f"llama.cpp never detects EAGLE3 from the file (common_speculative_types_from_gguf returns no type for "
             f"arch {ARCH}): pass --spec-type {SPEC_TYPE} -md DRAFT.gguf")

# llama.cpp's own words (src/models/eagle3.cpp, src/llama-model-loader.cpp, common/speculative.cpp)
SAYS_NO_LAYERS = "EAGLE3 model requires 'extract_layers' in GGUF metadata"
SAYS_THREE = "EAGLE3 requires exactly 3 entries in 'extract_layers'"
SAYS_NOT_EAGLE3 = "draft model is not eagle3 (expected 3 extract layers, got {})"
SAYS_ONE_LAYER = "GGML_ASSERT(n_layer == 1) failed"
SAYS_HEAD_SIZES = "GGML_ASSERT(n_embd_head == hparams.n_embd_head_k()) failed"
SAYS_D2T_TYPE = "GGML_ASSERT(model.d2t->type == GGML_TYPE_I64) failed"
SAYS_D2T_HEAD = "GGML_ASSERT(model.d2t->ne[0] == n_draft_vocab) failed"
SAYS_BEYOND = "EAGLE3: target layer id {} exceeds target n_layer {}"
SAYS_NO_TAP = 'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null") failed'
# the target's features (3 x its hidden size per row) added to the draft's encoder batch (llama-batch.cpp), whose
# input is 3 x target_hidden_size; the driver then aborts
SAYS_FEATURES = "set_token_embd: embedding size mismatch, got 1 rows x {0} = {0}, expected {1} or {2}"
SAYS_NO_EMBD = 'GGML_ASSERT(model_other->tok_embd != nullptr && "EAGLE3 decoder requires token embeddings (own or ' \
               'from target model)") failed'
SAYS_NO_OUTPUT = 'GGML_ASSERT(model_other->output != nullptr && "EAGLE3 decoder requires an output projection (own ' \
                 'or from target model)") failed'
# the converter's (conversion/llama.py)
SAYS_NEEDS_TARGET = ("EAGLE-3 model requires --target-model-dir to be specified. Please provide the path to the "
                     "target model directory to read config.json")
SAYS_D2T_RANGE = "EAGLE-3 d2t target ids out of range for target vocab size {}"
SAYS_D2T_DUPLICATE = "EAGLE-3 d2t contains duplicate target ids"


def is_eagle3_arch(arch) -> bool:
    return arch == ARCH


def gguf_name(name: str) -> str | None:
    """The GGUF name of a checkpoint tensor (canonical: renamed, without 'model.'), or None when the family has no
    place for it."""
    if name in NAMES:
        return NAMES[name]
    m = _LAYER.fullmatch(name)
    if m and m.group(1) in LAYER_NAMES:
        return f"blk.0.{LAYER_NAMES[m.group(1)]}.{m.group(2)}"
    return None


def canonical_name(name: str) -> str:
    """llama.cpp's renames (midlayer.* and layers.0.* are the decoder layer), without the 'model.' prefix."""
    if name.startswith("midlayer."):
        return "layers.0." + name[len("midlayer."):]
    return name.removeprefix("model.")


def default_target_layers(n_layer: int) -> list[int]:
    """What the converter writes without eagle_aux_hidden_state_layer_ids: low, middle and high layers."""
    return [2, n_layer // 2, n_layer - 3]
