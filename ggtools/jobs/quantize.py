"""quantize: schemes (q8_0, q4-mix, q2_k, any single ggml type) plus per-tensor regex overrides, as a plan.

Which tensors may change type follows llama-quantize (tensor_rules.py), and so do shape fallbacks
(quants.fallback_type); a tensor whose chosen type equals its current type is copied byte for byte.
Shard sets stay split-in = split-out.
"""

import os
import re

from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT
from gguf import LlamaFileType

from ggtools.engine import RunReport, run_plan
from ggtools.errors import GGToolsError
from ggtools.gguf import ShardSet
from ggtools.jobs.errors import JobError
from ggtools.jobs.valid_input import require_valid_model
from ggtools.plan import KVEdits, Plan, ShardPlan, convert_action, copy_action
from ggtools.quants import fallback_type, has_dequantizer, has_quantizer, parse_qtype
from ggtools.tensor_rules import never_quantized

# Drafter "heads": the tensors outside the repeated blocks (fc, DFlash2 selector, lucebox dflash.* (its DSpark heads
# included), embeddings, DSpark's Markov and confidence heads). Which of them llama-quantize may quantize at all is
# tensor_rules' (1-D tensors, d2t and the {n_embd + R, 1} confidence weight never are).
HEAD = re.compile(r"^(fc\.|dflash[._]|selector_|token_embd\.|output\.|markov_w[12]\.|conf_proj\.)")
SCHEMES = {
    "q8_0": ("every quantizable weight Q8_0", T.Q8_0, T.Q8_0),
    "q4-mix": ("heads (fc, selector, dflash.*, DSpark markov_w1/w2) Q8_0, blk.* weights Q4_0", T.Q8_0, T.Q4_0),
    "q2_k": ("heads Q8_0, blk.* weights Q2_K", T.Q8_0, T.Q2_K),
}
K_FILE_TYPES = {T.Q3_K: "MOSTLY_Q3_K_M", T.Q4_K: "MOSTLY_Q4_K_M", T.Q5_K: "MOSTLY_Q5_K_M"}


class QuantizePlanError(JobError):
    pass


def scheme_types(scheme: str) -> tuple[str, T, T]:
    """(description, head type, block type) of a named scheme or a pure single-type scheme."""
    if scheme.lower() in SCHEMES:
        return SCHEMES[scheme.lower()]
    try:
        t = parse_qtype(scheme)
    except GGToolsError:
        raise QuantizePlanError(f"unknown scheme '{scheme}': use {', '.join(SCHEMES)} or a ggml type "
                                "(q4_0, q4_k, q6_k, f16, ...)") from None
    if not has_quantizer(t):
        raise QuantizePlanError(f"ggtools cannot write {t.name}")
    return f"pure {t.name}", t, t


def parse_overrides(items) -> list[tuple[re.Pattern, T]]:
    """REGEX=TYPE pairs; like llama-quantize's --tensor-type the first matching pattern wins."""
    out = []
    for item in items:
        pattern, sep, tname = item.rpartition("=")
        if not sep or not pattern:
            raise QuantizePlanError(f"--tensor-type '{item}': expected REGEX=TYPE, e.g. 'attn_v=q8_0'")
        try:
            qtype = parse_qtype(tname)
            out.append((re.compile(pattern), qtype))
        except re.error as e:
            raise QuantizePlanError(f"--tensor-type '{item}': bad regular expression: {e}") from None
        except GGToolsError as e:
            raise QuantizePlanError(f"--tensor-type '{item}': {e}") from None
        if not has_quantizer(qtype):
            raise QuantizePlanError(f"--tensor-type '{item}': ggtools cannot write {qtype.name} tensors")
    return out


def plan_quantize(path, out, scheme: str, overrides=(), *, allow_requantize=True) -> Plan:
    """Refuses (exit 2) a scheme or override it cannot write and any input `ggtools validate` fails."""
    desc, head_type, block_type = scheme_types(scheme)
    rules = parse_overrides(overrides)
    with ShardSet(path) as shards:
        require_valid_model(shards)
        dsts = _outputs(shards, out)
        plans = []
        for f, dst in zip(shards.files, dsts):
            actions = [_decide(t, head_type, block_type, rules, desc) for t in f.tensors]
            plans.append(ShardPlan(f.path, dst, actions, ggml_dims=True))
    _mark_file_type(plans[0], head_type if head_type == block_type else block_type)
    return Plan("quantize", plans, list(shards.paths))


def quantize(plan: Plan, *, jobs=1, force=False, allow_nonfinite=False, progress=None) -> RunReport:
    """Write (and verify) the plan's outputs; jobs: shards in parallel processes. No --resume: a rerun starts
    over."""
    return run_plan(plan, jobs=jobs, force=force, allow_nonfinite=allow_nonfinite, resumable=False,
                    progress=progress)


def _decide(t, head_type, block_type, rules, desc):
    reason = never_quantized(t.name, t.ne)
    if reason:
        return copy_action(t, reason)
    for pattern, qtype in rules:
        if pattern.search(t.name):
            want, why = qtype, f"--tensor-type '{pattern.pattern}'"
            break
    else:
        want = head_type if HEAD.match(t.name) else block_type
        why = f"{desc}: {'head' if HEAD.match(t.name) else 'block weight'}"
    if not has_dequantizer(t.type_id):
        return copy_action(t, f"cannot read {t.type_name}: copied")
    chosen = fallback_type(want, t.ne[0])
    if chosen != want:
        why += f"; ne0={t.ne[0]} does not fit {want.name} → {chosen.name} (llama-quantize fallback)"
    return convert_action(t, chosen, why)


def _mark_file_type(shard: ShardPlan, main_type: T):
    """general.file_type and general.quantization_version, as llama-quantize writes them."""
    name = K_FILE_TYPES.get(main_type, f"MOSTLY_{main_type.name}")
    if main_type == T.F32:
        name = "ALL_F32"
    edits = KVEdits()
    if name in LlamaFileType.__members__:
        edits.put("general.file_type", VT.UINT32, int(LlamaFileType[name]))
    edits.put("general.quantization_version", VT.UINT32, 2)
    shard.kv_edits = edits


def _outputs(shards, out) -> list[str]:
    if not shards.is_split:
        if os.path.isdir(out):
            raise QuantizePlanError(f"{out}: for a single file, -o names the output file")
        return [out]
    if not os.path.isdir(out):
        raise QuantizePlanError(f"{out}: for a shard set, -o names an existing directory (same shard names)")
    return [os.path.join(out, os.path.basename(p)) for p in shards.paths]
