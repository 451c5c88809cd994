"""requant-trunk: surgical requantization of one tensor type (the Q8_0 trunk) of a shard set, split-in = split-out.

Every tensor of type --from becomes --to (dequantize → ggml-exact quantize); everything else — MXFP4 experts,
F32 norms, any other type, anything matching --copy — is byte-copied and verified. Rows that do not fit --to (a
row length the block size does not divide: K3's attn_k_b and ssm_f_b at 128 columns for Q4_K's 256) are kept
as they are by default, as the field report's requant_trunk.c keeps them; with fallback "llama" they get
llama-quantize's fallback type instead (tensor_type_fallback: Q4_K → Q5_0, Q5_K → Q5_1, Q6_K → Q8_0, ...; F16
when even that block does not divide), byte for byte what llama-quantize writes for them.
"""

import os
import re
from dataclasses import replace

from ggtools.engine import RunReport, preflight_disk, run_plan
from ggtools.gguf import ShardSet
from ggtools.hparam_rules.mtp import MTP_PART, MtpBlocks, mtp_blocks
from ggtools.jobs.errors import UsageError
from ggtools.jobs.valid_input import require_valid_model
from ggtools.plan import Plan, ShardPlan, convert_action, copy_action
from ggtools.quants import block_size, fallback_type, has_dequantizer, has_quantizer, parse_qtype
from ggtools.tensor_rules import never_quantized

FALLBACKS = ("copy", "llama")   # rows --to cannot hold: kept as they are (requant_trunk.c), or llama-quantize's type


def plan_requant_trunk(path, out_dir, *, src_type="q8_0", dst_type="q4_k", copy_patterns=(), only=None,
                       fallback="copy", keep_mtp=False) -> Plan:
    """The plan for every shard (or the 1-based shard numbers in `only`). Refuses (exit 2) what it cannot do
    and any input `ggtools validate` fails, before anything is written. fallback: what tensors whose rows --to's
    block size does not divide become: "copy" (kept) or "llama" (llama-quantize's fallback type). The tensors of an
    MTP block are listed apart (TensorAction.part); they are treated as llama-quantize treats them (like the
    trunk's), or, keep_mtp, byte-copied whatever their type."""
    if fallback not in FALLBACKS:
        raise UsageError("--fallback", f"expected one of {', '.join(FALLBACKS)}, not {fallback!r}")
    src_t, dst_t = _types(src_type, dst_type)
    patterns = [_regex(p) for p in copy_patterns]
    with ShardSet(path) as shards:
        _check_out_dir(shards, out_dir)
        require_valid_model(shards)
        indices = _select(shards, only)
        blocks = _mtp_blocks(shards.first, keep_mtp)
        plans = []
        for i in indices:
            f = shards.file(i)
            actions = [_in_part(_decide(t, src_t, dst_t, patterns, fallback), t, blocks, keep_mtp) for t in f.tensors]
            plans.append(ShardPlan(f.path, os.path.join(out_dir, os.path.basename(f.path)), actions, ggml_dims=True))
    return Plan("requant-trunk", plans, list(shards.paths))


def check_disk(plan: Plan):
    """Refuse (exit 2) a plan whose outputs would not fit on their disks (--dry-run's disk check)."""
    preflight_disk(plan.shards)


def requant_trunk(plan: Plan, *, jobs=None, resume=False, force=False, verify=True, allow_nonfinite=False,
                  progress=None, threads=None) -> RunReport:
    """Write the plan's shards (making the output directory), each recorded in the resume manifest; with
    resume, only those not finished and intact. jobs: shards in parallel processes (None: the runner's
    default); threads: the cores the conversions may use (None: every core the process may run on)."""
    return run_plan(plan, jobs=jobs, resume=resume, force=force, verify=verify, allow_nonfinite=allow_nonfinite,
                    progress=progress, make_dirs=True, threads=threads)


def _types(src_type, dst_type):
    src_t, dst_t = parse_qtype(src_type), parse_qtype(dst_type)
    if not has_dequantizer(src_t):
        raise UsageError("--from", f"ggtools cannot read {src_t.name} tensors")
    if not has_quantizer(dst_t):
        raise UsageError("--to", f"ggtools cannot write {dst_t.name} tensors")
    return src_t, dst_t


def _decide(t, src_t, dst_t, patterns, fallback="copy"):
    for p in patterns:
        if p.search(t.name):
            return copy_action(t, f"matches --copy '{p.pattern}'")
    if t.type_id != src_t:
        return copy_action(t, f"{t.type_name} is not --from {src_t.name}")
    reason = never_quantized(t.name, t.ne)
    if reason:
        return copy_action(t, reason)
    if t.ne[0] % block_size(dst_t) == 0:
        return convert_action(t, dst_t, f"{src_t.name} trunk → {dst_t.name}")
    why = f"ne0={t.ne[0]} not divisible by {block_size(dst_t)} ({dst_t.name})"
    llama = fallback_type(dst_t, t.ne[0])      # defined, and writable, for every type ggtools writes
    if fallback == "copy":
        return copy_action(t, f"{why} → kept {t.type_name} (requant_trunk.c); --fallback llama: {llama.name}")
    return convert_action(t, llama, f"{why} → {llama.name} (llama-quantize's fallback)")


def _mtp_blocks(first, keep_mtp) -> MtpBlocks | None:
    """The model's MTP blocks (None: it has none); --keep-mtp without any is a usage error."""
    blocks = mtp_blocks(first)
    if blocks is not None and blocks.n_nextn:
        return blocks
    if keep_mtp:
        raise UsageError("--keep-mtp", f"{first.path} has no MTP block ({first.architecture}.nextn_predict_layers is "
                                       "absent or 0): nothing to keep")
    return None


def _in_part(action, t, blocks: MtpBlocks | None, keep_mtp):
    """An MTP block's tensor listed apart: decided like the trunk's (as llama-quantize does), or with --keep-mtp
    byte-copied whatever its type."""
    if blocks is None or not blocks.holds(t.name):
        return action
    if keep_mtp:
        action = copy_action(t, "MTP block (--keep-mtp): kept as it is")
    return replace(action, part=MTP_PART)


def _regex(pattern):
    try:
        return re.compile(pattern)
    except re.error as e:
        raise UsageError("--copy", f"bad regular expression {pattern!r}: {e}") from None


def _check_out_dir(shards, out_dir):
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise UsageError(out_dir, "output path exists and is not a directory")
    src_dir = os.path.dirname(os.path.abspath(shards.paths[0]))
    if os.path.isdir(out_dir) and os.path.samefile(src_dir, out_dir):
        raise UsageError(out_dir, "output directory is the input's directory; outputs keep the input names, "
                                 "so they would replace the input")
    shards.require_complete()


def _select(shards, only):
    if not only:
        return range(shards.count)
    for k in only:
        if not 1 <= k <= shards.count:
            raise UsageError(shards.paths[0], f"--shard {k} is outside 1..{shards.count}")
    return sorted(set(k - 1 for k in only))
