"""validate: container rules for files and shard sets, the model-file rules on the hyperparameters and the tensors'
shapes (the ones the runtime's loaders apply, ggtools.hparam_rules; a split set's tensors checked against the keys
of its first shard), optional deep row-data scan, sha256 manifests; for a DSpark drafter, its runtime's rules on the
heads, d2t and block size."""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.findings import FAILING, OK
from ggtools.dflash.loaders import dspark_findings
from ggtools.dflash.profiles import LLAMACPP
from ggtools.errors import located
from ggtools.gguf import GGUFError, GGUFFile, ShardSet
from ggtools.gguf.check import Problem, check_file, check_set, errors
from ggtools.gguf.hashing import hash_file
from ggtools.gguf.inputs import parse_json, read_text
from ggtools.gguf.outputs import check_output, write_bytes
from ggtools.gguf.scan import RowScan, scan_tensors
from ggtools.hparam_rules import model_violations
from ggtools.hparam_rules.tensor_shapes import locator, shape_refused
from ggtools.jobs.errors import JobError
from ggtools.quants import check_row_data


@dataclass
class FileReport:
    path: str
    readable: bool = True
    problems: list[Problem] = field(default_factory=list)
    n_tensors: int = 0
    size: int = 0
    sha256: str | None = None
    tensor_sha256: dict[str, str] = field(default_factory=dict)
    deep_bytes: int = 0


@dataclass
class Report:
    files: list[FileReport]
    set_problems: list[Problem]

    @property
    def problems(self) -> list[Problem]:
        return [p for f in self.files for p in f.problems] + self.set_problems

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]

    @property
    def exit_code(self) -> int:
        if any(not f.readable for f in self.files):
            return 2
        return 1 if self.errors else 0

    @property
    def error(self) -> str | None:
        """One line for a failed validation: how many errors, and the first."""
        if not self.errors:
            return None
        return f"{len(self.errors)} error(s) in {len(self.files)} file(s) checked; first: {self.errors[0]}"

    def as_dict(self):
        return {
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "error": self.error,
            "files": [{"path": f.path, "readable": f.readable, "size": f.size, "tensors": f.n_tensors,
                       "sha256": f.sha256, "deep_scanned_bytes": f.deep_bytes,
                       "problems": [p.as_dict() for p in f.problems]} for f in self.files],
            "set_problems": [p.as_dict() for p in self.set_problems],
        }


def validate(paths, *, deep=False, manifest=None, write_manifest=None, jobs=None, force=False) -> Report:
    """Check every file and every shard set named by `paths` (any shard of a set names the whole set); force: let
    write_manifest replace an existing file."""
    sets = _distinct_sets(paths)
    want_hashes = bool(manifest or write_manifest)
    expected = load_manifest(manifest) if manifest else None
    inputs = [p for s in sets for p in s.paths] + ([manifest] if manifest else [])
    if write_manifest:
        check_output(write_manifest, inputs, force=force)
    items = [(s, i) for s in sets for i in s.present_indices]
    workers = jobs or min(len(items), os.cpu_count() or 1) or 1
    streams = max(1, (os.cpu_count() or 1) // workers)      # a deep scan's reads at once per file: one per core
    try:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            parsed = list(pool.map(lambda item: _parse(*item), items))     # every header once, before any check
            reports = list(pool.map(lambda item, f: _check_one(item[0], item[1], f, deep, want_hashes, streams),
                                    items, parsed))
        set_problems = []
        for s in sets:
            if all(r.readable for r in reports if r.path in s.paths):
                set_problems += check_set(s)
    finally:
        for s in sets:
            s.close()
    report = Report(reports, set_problems)
    if manifest:
        report.set_problems += check_manifest(manifest, expected, reports)
    if write_manifest and report.exit_code != 2:
        save_manifest(write_manifest, reports, inputs, force=force)
    return report


def _distinct_sets(paths) -> list[ShardSet]:
    sets, seen = [], set()
    for p in paths:
        s = ShardSet(p)
        key = tuple(os.path.abspath(x) for x in s.paths)
        if key not in seen:
            seen.add(key)
            sets.append(s)
    return sets


def _parse(shards: ShardSet, index: int) -> GGUFFile | GGUFError:
    """Shard index of the set parsed (kept by the set: its set rules and its other shards' checks read the same
    object), or why it cannot be."""
    try:
        return shards.file(index)
    except GGUFError as e:
        return e


def _check_one(shards: ShardSet, index: int, f: GGUFFile | GGUFError, deep, want_hashes, streams=1) -> FileReport:
    """The report on shard index of the set (f: that shard parsed, or why it cannot be); a split set's first shard
    has its tensors checked against this file's keys; streams: the reads at once of a deep scan without hashes."""
    report = FileReport(shards.paths[index])
    if isinstance(f, GGUFError):
        report.readable = False
        report.problems.append(Problem(report.path, f.where or (f"byte {f.offset}" if f.offset is not None
                                                                else "file"), f.rule))
        return report
    report.size, report.n_tensors = f.file_size, len(f.tensors)
    report.problems = file_problems(f, _set_tensors(shards) if shards.is_split and index == 0 else None)
    intact = not errors(report.problems)
    deep = deep and intact
    if want_hashes:         # the deep scan rides on the hashing's read: every byte read once
        scan = RowScan(check_row_data) if deep else None
        report.sha256, report.tensor_sha256 = hash_file(f, tensors=intact, on_chunk=scan and scan.feed)
    if deep:
        report.problems += deep_scan(f, scan if want_hashes else None, streams)
        report.deep_bytes = sum(t.nbytes for t in f.tensors)
    return report


def file_problems(f: GGUFFile, locate=None) -> list[Problem]:
    """What validate (without --deep) reports for one file: the container rules, the model-file rules (tensors found
    through locate: a set's shards), and, when those hold, a DSpark drafter's loader rules."""
    problems = check_file(f)
    problems += hparam_problems(f, {p.where for p in problems}, locate)
    if not errors(problems):
        problems += dspark_problems(f, {p.where for p in problems})
    return problems


def _set_tensors(shards):
    """locate(name) over every shard of a complete set (None: a set the set rules fail: each file's own tensors are
    checked then)."""
    if shards.missing_indices:
        return None
    try:
        return locator(shards.files)
    except GGUFError:
        return None             # a shard that does not parse: its own report says so


def dspark_problems(f: GGUFFile, reported=()) -> list[Problem]:
    """A DSpark drafter (llama.cpp or lucebox layout): what its runtime's loader and graph do with its heads, d2t and
    block size (dflash/loaders.py), each with the runtime's own words; reported: places the model-file rules already
    name (a tensor's shape)."""
    out = []
    for x in dspark_findings(DraftFile.read(f)):
        if x.severity == OK or _reported_shape(x, reported):
            continue
        said = "; ".join(str(e) for e in x.effects)
        out.append(Problem(f.path, f"DSpark {x.check}", f"{x.message} ({said})" if said else x.message,
                           "error" if x.severity in FAILING else "warning"))
    return out


def _reported_shape(finding, reported) -> bool:
    """llama.cpp's refusal of a tensor's shape that the model-file rules report already."""
    name = shape_refused(finding.says(LLAMACPP.runtime))
    return name is not None and f"tensor '{name}'" in reported


def hparam_problems(f: GGUFFile, reported=(), locate=None) -> list[Problem]:
    """The model-file rules the file's hyperparameters and tensors break (its metadata: shard 1 of a set; locate:
    where the set's tensors lie), as the runtime words them, with llama.cpp's words where its loader refuses the
    file; reported: places the container rules already name (a key of the wrong type, say)."""
    return [Problem(f.path, v.where, v.rule + (f' (llama.cpp: "{v.says}")' if v.says else ""))
            for v in model_violations(f, locate) if v.where not in reported]


def deep_scan(f: GGUFFile, scan: RowScan | None = None, streams: int = 1) -> list[Problem]:
    """Row-data rules (ggml_validate_row_data): finite fp16 scales, finite floats, MXFP4 scale != 0xFF. scan: one
    that has seen every tensor's bytes already (fed by another pass over them); without it the tensors are read
    once, in file order (as `streams` runs read at once), the check of each chunk overlapping the read of the
    next."""
    if scan is None:
        found = scan_tensors(f, f.tensors, check_row_data, streams=streams)
    else:
        found = {t.name: scan.result(t) for t in f.tensors}
    out = []
    for t in f.tensors:
        n_bad, first = found[t.name]
        if n_bad:
            unit = "value" if t.block[0] == 1 else "block"
            out.append(Problem(f.path, f"tensor '{t.name}'", f"{n_bad} invalid {t.type_name} {unit}s, first at "
                               f"{unit} {first}: NaN/inf data or fp16 scale, or MXFP4 exponent 0xFF "
                               "(ggml_validate_row_data rejects it)"))
    return out


def save_manifest(path, reports, inputs=(), force=False):
    data = {"format": "ggtools-manifest/1",
            "files": {os.path.basename(r.path): {"size": r.size, "sha256": r.sha256, "tensors": r.tensor_sha256}
                      for r in reports}}
    write_bytes(path, json.dumps(data, indent=1, sort_keys=True).encode(), inputs=inputs, force=force)


class ManifestFileError(JobError):
    """A --manifest file that is neither a ggtools manifest nor sha256sum lines."""

    def __init__(self, path, rule: str, where: str | None = None):
        super().__init__(located(path, rule, where))


def load_manifest(path) -> dict[str, dict]:
    """A ggtools JSON manifest, or `sha256sum` text lines ('<hex>  <name>', e.g. Hugging Face LFS hashes).
    Anything else is refused (exit 2) naming the first entry that breaks the format."""
    text = read_text(path)
    if text.lstrip()[:1] in ("{", "["):
        data = parse_json(path, text)
        files = data.get("files") if isinstance(data, dict) else None
        if not isinstance(files, dict):
            raise ManifestFileError(path, "not a ggtools manifest (a JSON object with a 'files' object)")
        for name, entry in files.items():
            problem = _entry_problem(entry)
            if problem:
                raise ManifestFileError(path, problem, where=f"file '{name}'")
        return files
    files = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2 or len(parts[0]) != 64:
            raise ManifestFileError(path, f"line {n} is neither JSON nor '<sha256>  <file name>'")
        files[os.path.basename(parts[1].lstrip("*").strip())] = {"sha256": parts[0].lower()}
    return files


def _entry_problem(entry) -> str | None:
    if not isinstance(entry, dict):
        return "the entry is not a JSON object"
    if not isinstance(entry.get("size", 0), int) or not isinstance(entry.get("sha256") or "", str):
        return "'size' must be an integer and 'sha256' a string"
    tensors = entry.get("tensors", {})
    if not isinstance(tensors, dict) or not all(isinstance(v, str) for v in tensors.values()):
        return "'tensors' must map tensor names to sha256 strings"
    return None


def check_manifest(path, expected, reports) -> list[Problem]:
    """Every checked file against its manifest entry; a manifest that lists none of them checks nothing,
    which fails."""
    if not any(os.path.basename(r.path) in expected for r in reports):
        what = "is empty" if not expected else "lists none of the files checked"
        return [Problem(path, "manifest", f"{what}: nothing was checked against it")]
    out = []
    for r in reports:
        entry = expected.get(os.path.basename(r.path))
        if entry is None:
            out.append(Problem(r.path, "manifest", f"not listed in {path}", "warning"))
            continue
        if "size" in entry and entry["size"] != r.size:
            out.append(Problem(r.path, "manifest", f"size {r.size} differs from the manifest's {entry['size']}"))
        if entry.get("sha256") and entry["sha256"] != r.sha256:
            out.append(Problem(r.path, "manifest", f"sha256 {r.sha256} differs from the manifest's {entry['sha256']}"))
        for name, digest in entry.get("tensors", {}).items():
            got = r.tensor_sha256.get(name)
            if got != digest:
                out.append(Problem(r.path, f"tensor '{name}'", "missing" if got is None else
                                   "sha256 differs from the manifest"))
    return out
