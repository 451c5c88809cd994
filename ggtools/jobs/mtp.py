"""convert mtp: a target's MTP (NextN) block on its own, as llama.cpp's converter writes it with --mtp (the MTP
sidecar), or the target without it, as --no-mtp writes it (--strip); from a GGUF or a shard set (its first shard).
A Plan run by the engine: tensors byte-copied and verified, keys copied with the edits below, output atomic.

What llama.cpp's converter (conversion/qwen.py, _QwenMtpMixin: qwen35, qwen35moe, qwen3next) writes from one
checkpoint, byte for byte what these plans write from its default conversion (tests/test_mtp.py):
- --mtp: every key of the default conversion, in its order, with its value, but general.size_label (the parameter
  count of what it writes); the tensors token_embd, output_norm and output (those the model has) and every MTP
  block's, in the default conversion's order.
- --no-mtp: block_count less the MTP blocks, no nextn_predict_layers, attention.recurrent_layers over the trunk
  only, general.size_label of what it writes; every tensor but the MTP blocks', in order.
general.size_label is recomputed only where the target's is the one the converter computes from the tensors: one
from the model card or the directory name ("35B-A3B") the converter keeps in all three files, and so does this.

A shard set: the sidecar is one file, its tensors gathered from the shards. --strip keeps the set's shard
boundaries (each output shard is its input shard less the MTP tensors; a shard left with none is dropped and the
rest renumbered, split.* keys following): llama.cpp's converter, whose MTP tensors come last, writes exactly that
with the same --split-max-tensors. The output names follow the converter's --outfile: OUT.gguf gives
OUT-00001-of-0000N.gguf, ...
"""

import math
import os
from dataclasses import dataclass, field

import gguf
from gguf import GGUFValueType as VT

from ggtools.engine import RunReport, planned_header, run_plan
from ggtools.gguf import ShardSet
from ggtools.gguf.check import refuse
from ggtools.gguf.outputs import check_output
from ggtools.gguf.shards import KEY_COUNT, KEY_NO, KEY_TENSORS, parse_shard_name, shard_path
from ggtools.hparam_rules.mtp import MTP_ARCHS, NEXTN_KEY, PER_LAYER, MtpBlocks, mtp_blocks
from ggtools.jobs.errors import JobError
from ggtools.jobs.validate import validate
from ggtools.jobs.planned_output import refuse_invalid_output
from ggtools.plan import KVEdits, Plan, ShardPlan, copy_action

SIDECAR_TRUNK = {"token_embd.weight": "token embedding", "output_norm.weight": "output norm",   # what --mtp keeps
                 "output.weight": "output head"}
SIZE_LABEL = "general.size_label"


class MtpError(JobError):
    pass


@dataclass
class MtpPlan:
    plan: Plan
    blocks: MtpBlocks
    left_out: list[str] = field(default_factory=list)    # the input's tensors no output carries

    def as_dict(self) -> dict:
        return self.plan.as_dict() | {"nextn_predict_layers": self.blocks.n_nextn, "mtp_blocks": list(self.blocks.ids),
                                      "left_out": self.left_out}


def plan_sidecar(path, out) -> MtpPlan:
    """The MTP sidecar of the target at path (`convert_hf_to_gguf.py --mtp`): one file, whatever the input."""
    with ShardSet(path) as shards:
        blocks = _mtp_target(shards, "extract")
        actions, left_out = [], []
        for i, f in enumerate(shards.files):
            for t in f.tensors:
                if blocks.holds(t.name):
                    a = copy_action(t, f"MTP block {t.name.split('.')[1]}")
                elif t.name in SIDECAR_TRUNK:
                    a = copy_action(t, f"the trunk's {SIDECAR_TRUNK[t.name]} (--mtp keeps it)")
                else:
                    left_out.append(t.name)
                    continue
                a.src_file = f.path if i else None
                actions.append(a)
        edits = KVEdits()
        for key in (KEY_NO, KEY_COUNT, KEY_TENSORS):
            if key in shards.first.kv:
                edits.drop(key)
        _size_label(edits, shards, actions)
        plan = Plan("convert mtp", [ShardPlan(shards.first.path, str(out), actions, edits)], list(shards.paths))
        _refuse_invalid_output(plan, shards)
    return MtpPlan(plan, blocks, left_out)


def plan_strip(path, out) -> MtpPlan:
    """The target at path without its MTP blocks (`convert_hf_to_gguf.py --no-mtp`); a shard set keeps its shard
    boundaries (a shard left with no tensor is dropped)."""
    with ShardSet(path) as shards:
        blocks = _mtp_target(shards, "strip")
        files = shards.files
        kept = [[t for t in f.tensors if not blocks.holds(t.name)] for f in files]
        keep = [i for i, tensors in enumerate(kept) if tensors or i == 0]
        dsts = _strip_outputs(shards, out, len(keep), list(shards.paths))
        first = _trunk_edits(files[0], blocks)
        shard_plans = []
        for j, i in enumerate(keep):
            edits = first if j == 0 else KVEdits()
            if shards.is_split:
                for key, value in ((KEY_NO, j), (KEY_COUNT, len(keep)), (KEY_TENSORS, sum(map(len, kept)))):
                    _set_like(edits, files[i], key, value)
            copies = [copy_action(t, "trunk tensor") for t in kept[i]]
            shard_plans.append(ShardPlan(files[i].path, dsts[j], copies, edits))
        _size_label(first, shards, [a for s in shard_plans for a in s.tensors])
        left_out = [t.name for f in files for t in f.tensors if blocks.holds(t.name)]
        plan = Plan("convert mtp --strip", shard_plans, list(shards.paths))
        _refuse_invalid_output(plan, shards)
    return MtpPlan(plan, blocks, left_out)


def write(mtp_plan: MtpPlan, *, force=False, progress=None) -> RunReport:
    """Write the plan's files (atomic, tensors verified against the input)."""
    return run_plan(mtp_plan.plan, jobs=1, force=force, progress=progress, resumable=False, record=False)


def _mtp_target(shards: ShardSet, doing: str) -> MtpBlocks:
    """The MTP blocks of a valid target that has some, of an arch whose MTP converter this reproduces."""
    shards.require_complete()
    refuse(validate([shards.paths[0]]).problems, "refusing an invalid input")
    f = shards.first
    if f.architecture not in MTP_ARCHS:
        raise MtpError(f"{f.path}: arch '{f.architecture}': convert mtp writes what llama.cpp's Qwen MTP converter "
                       f"writes ({', '.join(MTP_ARCHS)}); other archs keep their MTP blocks in other layouts")
    blocks = mtp_blocks(f)
    if not blocks.n_nextn:
        raise MtpError(f"{f.path}: no MTP block to {doing}: {f.architecture}.{NEXTN_KEY} is "
                       f"{'0' if f.architecture + '.' + NEXTN_KEY in f.kv else 'absent'} (a --no-mtp conversion, or a "
                       "model converted without one)")
    if "blk.0.attn_norm.weight" not in shards.tensor_shards():
        raise MtpError(f"{f.path}: already an MTP sidecar (no trunk block: no blk.0.attn_norm.weight): nothing to "
                       f"{doing}")
    return blocks


def _trunk_edits(f, blocks: MtpBlocks) -> KVEdits:
    """The keys --no-mtp writes otherwise: block_count over the trunk, no nextn_predict_layers, the per-layer
    arrays over the trunk."""
    arch, edits = blocks.arch, KVEdits()
    _set_like(edits, f, f"{arch}.block_count", blocks.n_layer)
    edits.drop(f"{arch}.{NEXTN_KEY}")
    for name in PER_LAYER:
        kv = f.kv.get(f"{arch}.{name}")
        if kv is not None and kv.is_array:          # a scalar holds for every layer, however many
            edits.put(kv.key, VT.ARRAY, [_plain(v) for v in kv.value[:blocks.n_layer]], kv.elem_type)
    return edits


def _set_like(edits: KVEdits, f, key, value):
    """Set key to value in the type the file stores it in."""
    edits.put(key, f.kv[key].vtype, value)


def _plain(v):
    return v.item() if hasattr(v, "item") else v


def _size_label(edits: KVEdits, shards: ShardSet, actions):
    """general.size_label of the tensors written, where the target's is the converter's count of its own tensors."""
    kv = shards.first.kv.get(SIZE_LABEL)
    if kv is None or kv.vtype != VT.STRING:
        return
    every = [t for f in shards.files for t in f.tensors]
    if kv.value != converter_size_label((t.name, t.ne) for t in every):
        return
    label = converter_size_label((a.source, a.ne) for a in actions)
    if label != kv.value:
        edits.put(SIZE_LABEL, VT.STRING, label)


def converter_size_label(tensors) -> str:
    """general.size_label as llama.cpp's converter makes it from the (name, ne) of the tensors it writes: gguf-py's
    GGUFWriter.get_total_parameter_count (an expert tensor counts once per expert, ne[2] of them) and size_label."""
    total = shared = expert = expert_sum = n_expert_tensors = 0
    for name, ne in tensors:
        size = math.prod(int(n) for n in ne)
        if "_exps." in name and len(ne) >= 3:
            count = int(ne[1] if ".bias" in name else ne[2])
            expert += size // count
            expert_sum += count
            n_expert_tensors += 1
        else:
            shared += size
        total += size
    return gguf.size_label(total, shared, expert, expert_sum // n_expert_tensors if n_expert_tensors else 0)


def _strip_outputs(shards: ShardSet, out, n: int, inputs) -> list[str]:
    """Where each output shard goes: out itself for one file; for a set, out named as the converter's --outfile
    (OUT.gguf or one of its shard names: OUT-0000i-of-0000n.gguf)."""
    if not shards.is_split:
        return [check_output(out, inputs, force=True)]
    out = os.fspath(out)
    name = parse_shard_name(out)
    prefix = name.prefix if name else out.removesuffix(".gguf")
    return [check_output(shard_path(prefix, i, n), inputs, force=True) for i in range(n)]


def _refuse_invalid_output(plan: Plan, shards: ShardSet):
    """Never write what `ggtools validate` would fail (planned_output): each output's header, before a byte of it."""
    where = shards.tensor_shards()

    def tensor_bytes(name: str) -> bytes:
        f = shards.file(where[name])
        return f.tensor_data(f.tensor[name]).tobytes()

    for s in plan.shards:
        check_output(s.dst, plan.inputs, force=True)
        refuse_invalid_output(planned_header(s, shards.file(shards.paths.index(s.src))), tensor_bytes)
