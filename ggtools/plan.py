"""Plan: for every tensor of every shard, what happens to it (copy or convert to a type) and why.

A Plan is a job's ShardPlans (one per output file: source, destination, metadata edits) and each ShardPlan its
TensorActions (one per output tensor: source tensor, types, bytes in and out, reason).

Plans know names, types and sizes, never bytes. The same plan object is printed by --dry-run and drives the
real rewrite (ggtools/engine), so what is shown is what runs.
"""

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field, replace

from gguf import GGUFValueType as VT

from ggtools.gguf import TensorInfo, ggml_type_name
from ggtools.gguf.values import encode_kv
from ggtools.gguf.writer import ggml_dims
from ggtools.quants import row_bytes

COPY, CONVERT = "copy", "convert"


@dataclass
class TensorAction:
    name: str
    ne: tuple
    src_type: int
    dst_type: int
    reason: str
    bytes_in: int
    bytes_out: int
    src_name: str | None = None     # the source tensor's name, when the output renames it
    src_file: str | None = None     # the file it is read from, when not the shard's source (an output that
                                    # gathers tensors from several shards of a set)
    part: str | None = None         # the part of the model it belongs to, when a plan lists one apart ("MTP block")

    @property
    def source(self) -> str:
        return self.src_name or self.name

    @property
    def action(self) -> str:
        return COPY if self.src_type == self.dst_type else CONVERT

    def as_dict(self):
        return {"name": self.name, "source": self.source, "ne": list(self.ne), "action": self.action,
                "from": ggml_type_name(self.src_type), "to": ggml_type_name(self.dst_type),
                "bytes_in": self.bytes_in, "bytes_out": self.bytes_out, "reason": self.reason} | \
            {k: v for k, v in (("source_file", self.src_file), ("part", self.part)) if v is not None}


def copy_action(t: TensorInfo, reason: str, name: str | None = None) -> TensorAction:
    """Copy t byte for byte (as `name` when given)."""
    return TensorAction(name or t.name, t.ne, t.type_id, t.type_id, reason, t.nbytes, t.nbytes, _renamed(t, name))


def convert_action(t: TensorInfo, dst_type: int, reason: str, name: str | None = None) -> TensorAction:
    """Convert t to dst_type (as `name` when given)."""
    if dst_type == t.type_id:
        return copy_action(t, reason + " (already that type)", name)
    out = row_bytes(dst_type, t.ne[0]) * t.n_rows
    return TensorAction(name or t.name, t.ne, t.type_id, int(dst_type), reason, t.nbytes, out, _renamed(t, name))


def _renamed(t: TensorInfo, name: str | None) -> str | None:
    return t.name if name and name != t.name else None


@dataclass(frozen=True)
class KVRecord:
    """A KV copied byte for byte out of another file (e.g. a target's tokenizer), which may be closed by now."""
    key: str
    vtype: VT
    raw: bytes
    value: object = None     # only read for general.alignment


@dataclass
class KVEdits:
    """Metadata changes: keys set in place (or appended when new) and keys removed."""
    changes: dict[str, tuple] = field(default_factory=dict)   # key -> (value type, value, element type) | (KVRecord,)
    removed: set[str] = field(default_factory=set)

    def drop(self, key):
        self.removed.add(key)
        self.changes.pop(key, None)

    def put(self, key, vtype: VT, value, elem_type: VT | None = None):
        encode_kv(key, vtype, value, elem_type)          # fail now, at planning time, if it cannot be encoded
        self.changes[key] = (vtype, value, elem_type)
        self.removed.discard(key)

    def copy(self, kv):
        """Set kv's key to kv's record, byte for byte (kv: a parsed KV or a KVRecord)."""
        value = kv.value if kv.key == "general.alignment" else None
        self.changes[kv.key] = (KVRecord(kv.key, kv.vtype, bytes(kv.raw), value),)
        self.removed.discard(kv.key)

    def record(self, key) -> bytes:
        change = self.changes[key]
        return change[0].raw if len(change) == 1 else encode_kv(key, *change)

    def __bool__(self):
        return bool(self.changes or self.removed)


@dataclass
class ShardPlan:
    src: str
    dst: str
    tensors: list[TensorAction]
    kv_edits: KVEdits = field(default_factory=KVEdits)
    verbatim: bool = False          # the output is the source file byte for byte (a shard a patch leaves alone)
    ggml_dims: bool = False         # tensor infos as ggml writes them, not as the source has them (see below)

    def __post_init__(self):
        # An output that stands for llama-quantize's (quantize, requant-trunk) has its tensor infos as llama-quantize
        # writes every tensor's, through ggml: [224, 1] becomes [224]. One that stands for the converter's (convert,
        # patch, doctor --fix, gguf-layout) keeps each tensor's dimensions, as gguf-py writes them.
        if self.ggml_dims:
            self.tensors = [replace(a, ne=ggml_dims(a.ne)) for a in self.tensors]

    @property
    def bytes_in(self):
        return sum(a.bytes_in for a in self.tensors)

    @property
    def bytes_out(self):
        return sum(a.bytes_out for a in self.tensors)

    @property
    def converts(self) -> bool:
        return any(a.action == CONVERT for a in self.tensors)


@dataclass
class Plan:
    job: str
    shards: list[ShardPlan]
    inputs: list[str] = field(default_factory=list)     # every file the job reads: no output may be one

    @property
    def bytes_in(self):
        return sum(s.bytes_in for s in self.shards)

    @property
    def bytes_out(self):
        return sum(s.bytes_out for s in self.shards)

    def shard_fingerprint(self, shard: ShardPlan) -> str:
        """Identifies what a shard's output must be: same fingerprint, same bytes."""
        data = {"job": self.job, "src": os.path.basename(shard.src), "tensors": [_fields(a) for a in shard.tensors],
                "kv_set": {k: shard.kv_edits.record(k).hex() for k in sorted(shard.kv_edits.changes)},
                "kv_remove": sorted(shard.kv_edits.removed)} | ({"verbatim": True} if shard.verbatim else {})
        return hashlib.sha256(json.dumps(data, sort_keys=True, default=list).encode()).hexdigest()

    def as_dict(self):
        return {"job": self.job, "bytes_in": self.bytes_in, "bytes_out": self.bytes_out,
                "shards": [{"src": s.src, "dst": s.dst, "bytes_in": s.bytes_in, "bytes_out": s.bytes_out,
                            "kv_set": sorted(s.kv_edits.changes), "kv_remove": sorted(s.kv_edits.removed),
                            "tensors": [a.as_dict() for a in s.tensors]} for s in self.shards]}

    def summary(self) -> dict:
        """Per (action, from, to): tensor count and bytes in/out."""
        out = {}
        for s in self.shards:
            for a in s.tensors:
                key = (a.action, ggml_type_name(a.src_type), ggml_type_name(a.dst_type))
                e = out.setdefault(key, [0, 0, 0])
                e[0] += 1
                e[1] += a.bytes_in
                e[2] += a.bytes_out
        return out


OPTIONAL_FIELDS = ("src_name", "src_file", "part")


def _fields(a: TensorAction) -> dict:
    # the optional fields only when set, so that fingerprints of plans without them stay what they were
    return {k: v for k, v in asdict(a).items() if k not in OPTIONAL_FIELDS or v is not None}
