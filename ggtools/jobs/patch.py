"""patch: metadata edits (set / remove keys, the DFlash mask-token fix) on a file or a shard set.

Only the first shard carries model metadata, so only it is rewritten; tensor data is byte-copied (kernel
copy) and verified; every other shard is copied whole. Both go through the engine's runner (atomic outputs,
fsync, rename; no resume manifest). The input is untouched unless in-place (then temp file + rename).
"""

import json
import os
from dataclasses import dataclass

from gguf import GGUFValueType as VT

from ggtools.dflash.profiles import LLAMACPP, LUCEBOX
from ggtools.engine import planned_header, run_plan
from ggtools.gguf import GGUFFile, ShardSet
from ggtools.gguf.check import check_file, check_set, check_tensors, refuse
from ggtools.gguf.outputs import check_output
from ggtools.gguf.values import encode_kv, value_type
from ggtools.jobs.errors import JobError
from ggtools.plan import KVEdits, Plan, ShardPlan, copy_action

MASK_KEY = LLAMACPP.key("mask")
IN_PLACE_HINT = " (use --in-place to edit it)"


class PatchError(JobError):
    pass


def parse_assignment(text: str) -> tuple[str, VT, object, VT | None]:
    """KEY=TYPE:VALUE → (key, value type, value, element type). Arrays: TYPE[]:a,b,c or TYPE[]:[json list]."""
    key, sep, rest = text.partition("=")
    tname, sep2, raw = rest.partition(":")
    if not sep or not sep2 or not key:
        raise PatchError(f"'{text}': expected KEY=TYPE:VALUE, e.g. tokenizer.ggml.mask_token_id=u32:151669")
    try:
        if tname.endswith("[]"):
            elem = value_type(tname[:-2])
            items = json.loads(raw) if raw.strip().startswith("[") else ([] if raw == "" else raw.split(","))
            parsed = key, VT.ARRAY, [_scalar(elem, str(v) if not isinstance(v, str) else v) for v in items], elem
        else:
            vtype = value_type(tname)
            parsed = key, vtype, _scalar(vtype, raw), None
        encode_kv(*parsed)          # does the value fit its type?
        return parsed
    except ValueError as e:
        raise PatchError(f"'{text}': {e}") from None


def _scalar(vtype: VT, raw: str):
    if vtype == VT.STRING:
        return raw
    if vtype == VT.BOOL:
        if raw.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"bool must be true/false/1/0, got {raw!r}")
        return raw.lower() in ("true", "1")
    if vtype in (VT.FLOAT32, VT.FLOAT64):
        return float(raw)
    if vtype == VT.ARRAY:
        raise ValueError("write arrays as TYPE[]:v1,v2")
    return int(raw, 0)


def mask_token_edits(f: GGUFFile, token_id: int | None, target: str | None) -> KVEdits:
    """Set tokenizer.ggml.mask_token_id (u32) from --id, else from dflash.mask_token_id / <arch>.dflash..."""
    if token_id is None:
        for key in (*LLAMACPP.legacy_mask_keys, LUCEBOX.key("mask", f.architecture)):
            if key in f.kv:
                token_id = f.kv[key].value
                break
        else:
            raise PatchError(f"{f.path}: no --id given and neither 'dflash.mask_token_id' nor "
                             f"'{f.architecture}.dflash.mask_token_id' is in the file; pass --id N (the drafter's "
                             "mask token id in the target vocabulary)")
    if not isinstance(token_id, int) or not 0 <= token_id < 2 ** 32:
        raise PatchError(f"{f.path}: mask token id {token_id!r} is not a u32")
    if target:
        vocab = target_vocab_size(target)
        if vocab is not None and token_id >= vocab:
            raise PatchError(f"mask token id {token_id} is outside the target vocabulary ({vocab} tokens in {target})")
    edits = KVEdits()
    edits.put(MASK_KEY, VT.UINT32, token_id)
    return edits


def target_files(path) -> list[str]:
    with ShardSet(path) as s:
        return list(s.paths)


def target_vocab_size(path) -> int | None:
    with ShardSet(path) as s:
        f = s.first
        kv = f.kv.get("tokenizer.ggml.tokens")
        if kv is not None:
            return kv.count
        size = f.get(f"{f.architecture}.vocab_size")
        return int(size) if isinstance(size, (int, float)) else None


@dataclass
class PatchResult:
    edits: KVEdits
    written: list[str]
    nonfinite: dict[str, int]           # tensor -> NaN/inf values or blocks (copied as they are; reported)


def patch_mask_token(path, token_id: int | None = None, target=None, **output) -> PatchResult:
    """Set tokenizer.ggml.mask_token_id (see mask_token_edits); output: out, in_place, force as for patch()."""
    with ShardSet(path) as s:
        edits = mask_token_edits(s.first, token_id, target)
    return patch(path, edits, also_read=target_files(target) if target else (), **output)


def patch_set(path, assignments, **output) -> PatchResult:
    """Add or change keys, each KEY=TYPE:VALUE (parse_assignment)."""
    edits = KVEdits()
    for a in assignments:
        edits.put(*parse_assignment(a))
    return patch(path, edits, **output)


def patch_remove(path, keys, **output) -> PatchResult:
    edits = KVEdits()
    for k in keys:
        edits.drop(k)
    return patch(path, edits, **output)


def patch(path, edits: KVEdits, *, out=None, in_place=False, force=False, also_read=()) -> PatchResult:
    """Apply `edits` to the model at path. For a shard set `out` is a directory. Refuses (exit 2), before
    writing anything, an output that `ggtools validate` would fail or that would replace an input (also_read:
    other files the command reads, e.g. --target)."""
    if bool(out) == bool(in_place):
        raise PatchError("give exactly one of -o OUT and --in-place")
    with ShardSet(path) as shards:
        shards.require_complete()
        first = shards.first
        for key in edits.removed:
            if key not in first.kv:
                raise PatchError(f"{first.path}: key '{key}' is not in the file")
        inputs = (shards.paths[1:] if in_place else shards.paths) + list(also_read)
        dsts = _outputs(shards, out, in_place, inputs)
        plan = Plan("patch", [ShardPlan(first.path, dsts[0], _copies(first, "metadata patch"), edits)] +
                    [ShardPlan(f.path, dst, _copies(f, "shard copied whole"), verbatim=True)
                     for f, dst in zip(shards.files[1:], dsts[1:])], inputs)
        _refuse_invalid_output(shards, plan.shards[0])
        for dst in dsts[1:]:
            check_output(dst, inputs, force=force)
    report = run_plan(plan, jobs=1, force=force or in_place, allow_nonfinite=True, progress=False, resumable=False,
                      record=False)
    return PatchResult(edits, report.done, report.nonfinite.get(dsts[0], {}))


def _copies(f: GGUFFile, reason: str):
    return [copy_action(t, reason) for t in f.tensors]


def _refuse_invalid_output(shards, plan):
    """The patched set must pass `ggtools validate`: check its header (and the untouched shards) first."""
    first = shards.first
    refuse(check_tensors(first), "refusing an invalid input")
    refuse([p for f in shards.files[1:] for p in check_file(f)], "refusing an invalid input")
    header = planned_header(plan, first)
    refuse(check_file(header) + check_set(shards, {0: header}), "refusing to write an output that ggtools "
           "validate would fail")


def _outputs(shards, out, in_place, inputs) -> list[str]:
    """Where shard 1 goes (rewritten), then where every other shard goes (copied; none in place)."""
    if in_place:
        check_output(shards.paths[0], inputs, force=True)
        return [shards.paths[0]]
    if not shards.is_split:
        return [check_output(out, inputs, force=True, hint=IN_PLACE_HINT)]
    if not os.path.isdir(out):
        raise PatchError(f"{out}: for a shard set, -o names an existing directory for the patched set")
    return [check_output(os.path.join(out, os.path.basename(p)), inputs, force=True, hint=IN_PLACE_HINT)
            for p in shards.paths]
