"""The resume manifest of a rewrite run (`<prefix>.ggtools.json` beside the outputs), and what it records: the
source's identity and the output's description (ShardResult).

One entry per finished, verified shard: the plan fingerprint, the source's identity (size, mtime, header
sha256), the output's size and content digest. Several processes may finish shards at once (-j, or
`--shard K` runs on many machines writing into one directory): each entry is added under an exclusive lock on
the directory, re-reading the file and replacing it atomically, so no process loses another's entry. A file
that is not such a manifest is refused, never overwritten.
"""

import contextlib
import fcntl
import hashlib
import json
import os
from dataclasses import dataclass, field

import numpy as np

from ggtools.engine.errors import ManifestError
from ggtools.gguf import GGUFFile, parse_shard_name
from ggtools.gguf.hashing import content_digest
from ggtools.gguf.inputs import parse_json, read_text
from ggtools.gguf.outputs import os_error, write_bytes
from ggtools.plan import Plan, ShardPlan

FORMAT = "ggtools-rewrite/1"


@dataclass
class ShardResult:
    """An output shard as written: what the manifest records and --resume checks again."""
    dst: str
    size: int
    digest: str | None                # content digest: header bytes + every tensor's sha256 (None: not hashed)
    tensors: dict[str, str] = field(default_factory=dict)   # tensor sha256 in the output
    verified: bool = False
    nonfinite: dict[str, int] = field(default_factory=dict)  # tensor -> NaN/inf values or blocks written


def describe_output(path, name=None) -> ShardResult:
    """Size and content digest of an output (what the resume manifest records and re-checks); name: the
    path to report, when path is still the temporary file."""
    with GGUFFile(path) as f:
        digest, tensors = content_digest(f)
        return ShardResult(name or path, f.file_size, digest, tensors)


def source_identity(path) -> dict:
    """What must not have changed for a finished output to still count: size, mtime, header hash."""
    st = os.stat(path)
    with GGUFFile(path) as f:
        header = hashlib.sha256(np.frombuffer(f.buf, np.uint8, count=f.data_offset)).hexdigest()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_sha256": header}


def path_for(plan: Plan) -> str:
    """`<prefix>.ggtools.json` beside the first output (prefix: the shard set's, or the file's stem)."""
    first = plan.shards[0].dst
    name = parse_shard_name(first)
    stem = name.prefix if name else os.path.splitext(first)[0]
    return f"{stem}.ggtools.json"


def read_entries(path) -> dict[str, dict]:
    """The manifest's entries by output file name ({} when there is no manifest yet)."""
    if not os.path.lexists(path):
        return {}
    data = parse_json(path, read_text(path))
    shards = data.get("shards") if isinstance(data, dict) else None
    if not isinstance(shards, dict):
        raise ManifestError(path, "not a ggtools rewrite manifest (a JSON object with a 'shards' object); "
                              "delete it to start over")
    for name, entry in shards.items():
        problem = _entry_problem(entry)
        if problem:
            raise ManifestError(path, f"{problem}; delete the manifest to start over", where=f"shard '{name}'")
    return shards


def _entry_problem(entry) -> str | None:
    if not isinstance(entry, dict):
        return "the entry is not a JSON object"
    for key, kind in (("fingerprint", str), ("source", dict), ("output", dict)):
        if not isinstance(entry.get(key), kind):
            return f"the entry has no '{key}' {'string' if kind is str else 'object'}"
    out = entry["output"]
    if not isinstance(out.get("size"), int) or not isinstance(out.get("digest"), str):
        return "the entry's 'output' needs an integer 'size' and a string 'digest'"
    return None


def still_valid(entries: dict, fingerprint: str, shard: ShardPlan) -> bool:
    """Whether shard's output is finished: recorded with this plan, from this source, and unchanged since."""
    e = entries.get(os.path.basename(shard.dst))
    if not e or e["fingerprint"] != fingerprint or not os.path.isfile(shard.dst):
        return False
    if e["source"] != source_identity(shard.src) or os.path.getsize(shard.dst) != e["output"]["size"]:
        return False
    return describe_output(shard.dst).digest == e["output"]["digest"]


def entry(fingerprint: str, source: dict, result: ShardResult) -> dict:
    return {"fingerprint": fingerprint, "source": source,
            "output": {"size": result.size, "digest": result.digest, "tensors": result.tensors},
            "verified": result.verified}


def record(path, name: str, new_entry: dict, inputs=()):
    """Add or replace one entry, safely against other processes doing the same."""
    with _locked(os.path.dirname(os.path.abspath(path))):
        entries = read_entries(path)
        entries[name] = new_entry
        data = json.dumps({"format": FORMAT, "shards": entries}, indent=1, sort_keys=True).encode()
        write_bytes(path, data, inputs=inputs, force=True)


@contextlib.contextmanager
def _locked(directory):
    """An exclusive flock on the directory (no lock file to leave behind)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError as e:
        raise os_error(directory, e) from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as e:
            raise os_error(directory, e) from None
        yield
    finally:
        os.close(fd)
