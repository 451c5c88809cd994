"""Required tensors: every tensor a target's loader asks for without TENSOR_NOT_REQUIRED, which the model's files
must hold.

llama.cpp (llama-cpp-python 0.3.36): `check_tensor_dims` refuses a missing tensor the arch's `load_arch_tensors`
asks for without TENSOR_NOT_REQUIRED: "check_tensor_dims: tensor '%s' not found". The names are those of the shape
tables (tensor_shapes.expected_shapes), less what the loaders take as optional or as one of two forms:
- optional everywhere: the tied output head (except gpt-oss and kimi-k3, which ask for it), rope frequency
  factors, Q / K / V biases (create_tensor_qkv), llama's output and FFN biases and its expert gate;
- either form: fused attn_qkv or attn_q / attn_k / attn_v; ffn_gate_up_exps or ffn_gate_exps and ffn_up_exps
  (create_tensor_gate_up_exps); MLA's attn_q_a / attn_q_b (when attn_q_a_norm is there) or attn_q, and attn_kv_b
  or attn_k_b and attn_v_b;
- qwen35 / qwen35moe: the MTP blocks are asked for as the trunk's layers are (a default load checks them without
  reading them: TENSOR_SKIP), less Q / K / V and the expert gate and up, which create_tensor_qkv and
  create_tensor_gate_up_exps skip altogether there, and less their nextn tensors, which hparam_rules/mtp.py reports
  in the MTP block's words; a file of MTP blocks alone (a sidecar) has no trunk to ask for. The recurrent layers'
  attn_qkv and attn_gate are optional to the loader but read by its graph, so they are required here;
- kimi-k3: the latent experts' ffn_routed_norm and the shared expert's gate (the graph does without them).
Which tensors libllama can do without is tested by removing each one (tests/test_hparam_rules.py).
The DFlash, DSpark and EAGLE3 drafters' loaders have rules of their own (dflash/loaders.py, hparam_rules/eagle3.py).
"""

from ggtools.hparam_rules.keys import Keys
from ggtools.hparam_rules.tensor_shapes import TARGETS, expected_shapes
from ggtools.hparam_rules.violation import Violation

NOT_FOUND = "check_tensor_dims: tensor '{}' not found"

OPTIONAL = frozenset({"rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight",
                      "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_qkv.bias", "ffn_gate_up_exps.weight",
                      "attn_q_a_norm.weight", "attn_kv_b.weight"})
OPTIONAL_BY_ARCH = {"llama": frozenset({"attn_output.bias", "ffn_gate.bias", "ffn_down.bias", "ffn_up.bias",
                                        "ffn_gate_exps.weight"}),
                    "kimi-k3": frozenset({"attn_gate.weight", "ffn_routed_norm.weight", "ffn_gate_shexp.weight"})}
OUTPUT_REQUIRED = frozenset({"gpt-oss", "kimi-k3"})
# a layer's tensor -> (the other form's tensor, whether that form being present is what makes this one required)
EITHER = {"attn_q.weight": ("attn_qkv.weight", False), "attn_k.weight": ("attn_qkv.weight", False),
          "attn_v.weight": ("attn_qkv.weight", False), "ffn_gate_exps.weight": ("ffn_gate_up_exps.weight", False),
          "ffn_up_exps.weight": ("ffn_gate_up_exps.weight", False), "attn_k_b.weight": ("attn_kv_b.weight", False),
          "attn_v_b.weight": ("attn_kv_b.weight", False), "attn_q_a.weight": ("attn_q_a_norm.weight", True),
          "attn_q_b.weight": ("attn_q_a_norm.weight", True)}
MLA_Q = ("attn_q.weight", "attn_q_a_norm.weight")   # kimi-k3's MLA: attn_q when there is no q LoRA
SKIPPED_IN_MTP = frozenset({"attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_qkv.weight",
                            "ffn_gate_exps.weight", "ffn_up_exps.weight"})


def missing_tensor_violations(f, locate=None) -> list[Violation]:
    """Every tensor the target's loader requires that none of its files holds. f: shard 1 (its keys); locate as
    tensor_shapes.tensor_shape_violations takes it. Call it once the keys pass the other rules."""
    if locate is None and _split_count(f) > 1:
        return []           # one shard of a set alone (a planned output, say): its other tensors lie elsewhere
    locate = locate or (lambda name: (f, f.tensor[name]) if name in f.tensor else None)
    return [Violation(None, "is missing: llama.cpp's loader requires it", NOT_FOUND.format(name), check="tensors",
                      tensor=name)
            for name in required_shapes(f, locate) if locate(name) is None]


def required_shapes(f, locate) -> dict:
    """name -> shape (tensor_shapes' Sizes) of every tensor the target's loader requires, given the tensors present
    (the form of an either-form pair the file holds; with none, the separate one)."""
    arch = f.architecture
    present = lambda name: locate(name) is not None            # noqa: E731
    if arch not in TARGETS or _mtp_sidecar(f, present):
        return {}
    k = Keys(f, arch)
    n_layer = (k.uint("block_count") or 0) - (k.uint("nextn_predict_layers", 0) or 0)
    table = expected_shapes(f, locate)
    return {name: shape for name, shape in table.items() if _required(name, arch, n_layer, table, present)}


def _split_count(f) -> int:
    count = f.kv.get("split.count")
    value = None if count is None or count.is_array else count.value
    return value if isinstance(value, int) and not isinstance(value, bool) else 1


def _mtp_sidecar(f, present) -> bool:
    """A file of MTP blocks alone (llama.cpp's mtp_only: nextn layers and no blk.0.attn_norm)."""
    nextn = Keys(f, f.architecture).uint("nextn_predict_layers", 0) or 0
    return bool(nextn) and f.architecture in ("qwen35", "qwen35moe") and not present("blk.0.attn_norm.weight")


def _required(name: str, arch: str, n_layer: int, table, present) -> bool:
    if name == "output.weight":
        return arch in OUTPUT_REQUIRED
    if not name.startswith("blk."):
        return name not in OPTIONAL
    _, layer, own = name.split(".", 2)
    if own.startswith("nextn.") or own in OPTIONAL or own in OPTIONAL_BY_ARCH.get(arch, ()) or \
            int(layer) >= n_layer and own in SKIPPED_IN_MTP:       # nextn.*: hparam_rules/mtp.py's to report
        return False
    block = f"blk.{layer}."
    if own == "attn_qkv.weight":            # the fused form; a recurrent layer (no attn_q) has no other
        return block + "attn_q.weight" not in table
    if arch == "kimi-k3" and own == MLA_Q[0] and present(block + "attn_kv_a_mqa.weight"):
        return not present(block + MLA_Q[1])
    if own in EITHER:
        other, when_present = EITHER[own]
        return present(block + other) == when_present
    return True
