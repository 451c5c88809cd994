"""Container rules: every check llama.cpp's gguf.cpp and model loader apply, plus the ones they miss.

Each check returns Problems instead of raising, so a validator can report all of them at once.
"""

from dataclasses import dataclass

from gguf import GGUFValueType as VT

from ggtools.gguf.errors import GGUFError
from ggtools.gguf.reader import INT64_MAX, GGUFFile, pad
from ggtools.gguf.shards import KEY_COUNT, KEY_NO, KEY_TENSORS, ShardSet, parse_shard_name

MAX_NAME_BYTES = 63
MAX_DIMS = 4
# Keys whose type llama.cpp's typed getters insist on (a wrong type throws "key ... has wrong type").
KEY_TYPES = {
    "general.architecture": VT.STRING,
    "general.alignment": VT.UINT32,
    KEY_NO: VT.UINT16,
    KEY_COUNT: VT.UINT16,
    KEY_TENSORS: VT.INT32,
    "tokenizer.ggml.model": VT.STRING,
    "tokenizer.ggml.bos_token_id": VT.UINT32,
    "tokenizer.ggml.eos_token_id": VT.UINT32,
    "tokenizer.ggml.padding_token_id": VT.UINT32,
    "tokenizer.ggml.mask_token_id": VT.UINT32,
}


@dataclass
class Problem:
    path: str
    where: str            # "byte 1234", "tensor 'x'", "key 'k'", "shard set"
    rule: str
    severity: str = "error"      # "error" fails validation; "warning" is reported only

    def __str__(self):
        return f"{self.path}: {self.where}: {self.rule}"

    def as_dict(self):
        return {"file": self.path, "where": self.where, "rule": self.rule, "severity": self.severity}


def check_file(f: GGUFFile) -> list[Problem]:
    """All container rules for one parsed file."""
    return check_keys(f) + check_tensors(f)


def check_keys(f: GGUFFile) -> list[Problem]:
    """The rules on the file's KVs: no duplicates, the types llama.cpp insists on, a valid alignment."""
    return _check_kvs(f)


def check_tensors(f: GGUFFile) -> list[Problem]:
    """The rules on tensor infos and the data layout."""
    return _check_tensor_infos(f) + _check_layout(f)


def errors(problems: list[Problem]) -> list[Problem]:
    return [p for p in problems if p.severity == "error"]


def refuse(problems: list[Problem], what: str):
    """Raise (exit 2) naming the first error among problems, if any. what: e.g. 'refusing an invalid input'."""
    bad = errors(problems)
    if bad:
        more = f" ({len(bad) - 1} more: see ggtools validate)" if len(bad) > 1 else ""
        raise GGUFError(bad[0].path, f"{what}: {bad[0].rule}{more}", where=bad[0].where)


def _check_kvs(f):
    out, seen = [], {}
    for kv in f.kvs:
        where = f"key '{kv.key}'"
        if kv.key in seen:
            out.append(Problem(f.path, where, f"duplicate key (first at byte {seen[kv.key]}, again at byte "
                                              f"{kv.start})"))
            continue
        seen[kv.key] = kv.start
        expected = KEY_TYPES.get(kv.key)
        if expected is not None and kv.vtype != expected:
            out.append(Problem(f.path, where, f"has type {kv.type_label}, llama.cpp requires {expected.name}"))
    alignment = f.kv.get("general.alignment")
    if alignment is not None and alignment.vtype == VT.UINT32:
        a = alignment.value
        if a == 0 or a & (a - 1):
            out.append(Problem(f.path, "key 'general.alignment'", f"alignment {a} is not a power of 2"))
    return out


def _check_tensor_infos(f):
    out, seen = [], {}
    for i, t in enumerate(f.tensors):
        where = f"tensor '{t.name}'"
        add = lambda rule, severity="error": out.append(Problem(f.path, where, rule, severity))
        if t.name in seen:
            add(f"duplicate tensor name (tensors {seen[t.name]} and {i})")
        seen.setdefault(t.name, i)
        if len(t.name.encode()) > MAX_NAME_BYTES:
            add(f"name is {len(t.name.encode())} bytes; llama.cpp allows at most {MAX_NAME_BYTES}")
        if len(t.ne) > MAX_DIMS:
            add(f"has {len(t.ne)} dimensions; at most {MAX_DIMS} are allowed")
        if not t.ne:
            add("has 0 dimensions (ggml writes at least 1)", "warning")
        if any(d > INT64_MAX for d in t.ne):
            add(f"dimension beyond INT64_MAX in ne {list(t.ne)} (llama.cpp reads it as negative)")
        elif any(d == 0 for d in t.ne):
            add(f"zero dimension in ne {list(t.ne)} (crashes llama.cpp's reader with a division by zero)")
        block = t.block
        if block is None:
            add(f"unknown or deprecated ggml type {t.type_id}")
        elif t.ne and t.ne[0] > 0 and t.ne[0] % block[0]:
            add(f"row length ne[0]={t.ne[0]} is not a multiple of the {t.type_name} block size {block[0]}")
    return out


def _check_layout(f):
    """Dense padded offsets in info order, each tensor's region large enough, data within the file."""
    out = []
    expected = 0
    for t in f.tensors:
        where = f"tensor '{t.name}'"
        if t.offset % f.alignment:
            out.append(Problem(f.path, where, f"offset {t.offset} is not a multiple of the alignment "
                                              f"{f.alignment}"))
        elif t.offset > expected:
            out.append(Problem(f.path, where, f"gap: offset {t.offset}, expected {expected} "
                                              f"({t.offset - expected} unused bytes before it)"))
        elif t.offset < expected:
            out.append(Problem(f.path, where, f"overlap: offset {t.offset}, expected {expected} (it starts "
                                              f"inside the previous tensor)"))
        n = t.nbytes
        if n is None:
            break                       # the layout after a tensor of unknown size cannot be followed
        expected = max(expected, t.offset) + pad(n, f.alignment)
    else:
        out += _check_regions(f)
        end = f.data_offset + expected
        if f.file_size < end:
            short = end - f.file_size
            last = f.tensors[-1] if f.tensors else None
            if last is not None and last.data_start + last.nbytes <= f.file_size:
                out.append(Problem(f.path, f"byte {f.file_size}", f"the final padding is missing ({short} bytes); "
                                   "gguf_init_from_file (no_alloc=false) rejects the file"))
        elif f.file_size > end:
            out.append(Problem(f.path, f"byte {end}", f"{f.file_size - end} trailing bytes after the data "
                               "section (ignored by readers)", "warning"))
    return out


def _check_regions(f):
    """Each tensor's bytes must fit before the next tensor starts and inside the file.

    llama.cpp only checks `offset + nbytes <= file size`, so a tensor whose region is too small but still
    inside the file silently reads its neighbour's bytes (ik_llama.cpp#2437); this catches it.
    """
    out = []
    by_offset = sorted(f.tensors, key=lambda t: t.offset)
    for t, nxt in zip(by_offset, by_offset[1:] + [None]):
        limit = f.file_size if nxt is None else nxt.data_start
        room = limit - t.data_start
        if nxt is not None and t.nbytes > room:
            out.append(Problem(f.path, f"tensor '{t.name}'",
                               f"too short for its type: {t.type_name} {list(t.ne)} needs {t.nbytes} bytes, "
                               f"only {max(room, 0)} lie before tensor '{nxt.name}'"))
        elif t.data_start + t.nbytes > f.file_size:
            out.append(Problem(f.path, f"tensor '{t.name}'", _truncated(f, t, by_offset)))
            break
    return out


def _truncated(f, t, by_offset) -> str:
    """The message for the first tensor (in file order) whose data the end of the file cuts."""
    cut = len(by_offset) - by_offset.index(t)
    return (f"the file is truncated at byte {f.file_size}: this tensor needs bytes [{t.data_start}, "
            f"{t.data_start + t.nbytes}) ({cut} tensor(s) from here on are cut)")


def check_set(shards: ShardSet, replaced: dict[int, GGUFFile] | None = None) -> list[Problem]:
    """Rules across the files of one model: naming, split.* keys, tensor count, unique names, metadata.
    replaced: {shard index: file} to check in place of the shard on disk (a header still to be written)."""
    replaced = replaced or {}
    out = [Problem(shards.paths[a], "shard set", f"shard {a + 1} of {shards.count} is missing" if a == b else
                   f"shards {a + 1}-{b + 1} of {shards.count} are missing ({b - a + 1} files)")
           for a, b in _runs(shards.missing_indices)]
    present = [(i, replaced.get(i) or shards.file(i)) for i in shards.present_indices]
    if not shards.is_split:
        f = present[0][1]
        count = f.get(KEY_COUNT, 0)
        if isinstance(count, int) and count > 1:
            out.append(Problem(f.path, f"key '{KEY_COUNT}'", f"split.count is {count} but the name does not follow "
                               "<prefix>-NNNNN-of-NNNNN.gguf, so llama.cpp cannot find the other shards"))
        return out + _check_metadata(f)
    total, names = 0, {}
    for i, f in present:
        out += _check_split_keys(f, i, shards.count)
        total += len(f.tensors)
        for t in f.tensors:
            if t.name in names and names[t.name] != i:
                out.append(Problem(f.path, f"tensor '{t.name}'", f"duplicated across shards (also in shard "
                                   f"{names[t.name] + 1}); llama.cpp: invalid model: tensor is duplicated"))
            names.setdefault(t.name, i)
    if present and present[0][0] == 0 and not shards.missing_indices:
        f0 = present[0][1]
        claimed = f0.get(KEY_TENSORS)
        if isinstance(claimed, int) and claimed != total:
            out.append(Problem(f0.path, f"key '{KEY_TENSORS}'", f"split.tensors.count is {claimed} but the shards "
                               f"hold {total} tensors (llama.cpp: corrupted model)"))
    if present and present[0][0] == 0:
        out += _check_metadata(present[0][1])
    return out


def _runs(indices):
    """Sorted indices as (first, last) runs of consecutive numbers."""
    out = []
    for i in indices:
        if out and out[-1][1] == i - 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return out


def _check_split_keys(f, index, count):
    out = []
    name = parse_shard_name(f.path)
    no, n, tc = f.kv.get(KEY_NO), f.kv.get(KEY_COUNT), f.kv.get(KEY_TENSORS)
    if no is None:
        out.append(Problem(f.path, "shard set", "missing key split.no (llama.cpp: missing key split.no in GGUF split)"))
    elif no.value != index:
        out.append(Problem(f.path, f"key '{KEY_NO}'", f"split.no is {no.value} but the file name says shard "
                           f"{name.index + 1} (split.no {index}; names are 1-based, split.no 0-based)"))
    if n is None:
        out.append(Problem(f.path, "shard set", "missing key split.count"))
    elif n.value != count:
        out.append(Problem(f.path, f"key '{KEY_COUNT}'", f"split.count is {n.value} but the set has {count} "
                           "shards by name"))
    if index == 0 and tc is None:
        out.append(Problem(f.path, "shard set", "missing key split.tensors.count on the first shard"))
    return out


def _check_metadata(f):
    if "general.architecture" not in f.kv:
        return [Problem(f.path, "key 'general.architecture'", "missing: llama.cpp reads the model metadata from "
                        "the first shard")]
    return []
