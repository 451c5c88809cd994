"""convert dflash: a Hugging Face DFlash v1 / DFlash2 / DSpark drafter directory -> a drafter GGUF, profile
`llama.cpp` (llama.cpp's own converter, byte for byte) or `lucebox` (Luce-Org/lucebox's converter).

Plan first (checkpoint read and checked against its config, ids and mask id against the target, every output
tensor's name, type and reason), then one streaming pass: tensors are read, converted and written in row
chunks, so memory stays at about one chunk whatever the checkpoint size. Output is atomic; on any error,
including F16 overflow found while writing, nothing is left behind.
"""

import contextlib
from dataclasses import dataclass, field

from ggtools.dflash.checkpoint import Checkpoint, files_of, open_checkpoint
from ggtools.dflash.config import DraftConfig, draft_config
from ggtools.dflash.errors import CheckpointError
from ggtools.dflash.layout import check_layout
from ggtools.dflash.metadata import KVList
from ggtools.dflash.profiles import PROFILES, Profile
from ggtools.dflash.target import OpenTarget, TargetInfo
from ggtools.dflash.tensors import TensorJob, encode_chunks
from ggtools.gguf import GGUFFile, GGUFWriter, ggml_type_name
from ggtools.gguf.outputs import check_output
from ggtools.jobs.errors import JobError
from ggtools.jobs.planned_output import refuse_invalid_output
from ggtools.plan import Plan, ShardPlan, TensorAction

OUTTYPES = ("auto", "f32", "f16", "bf16", "q8_0")


class ConvertError(JobError):
    pass


@dataclass
class ConvertPlan:
    hf_dir: str
    out: str
    profile: str
    outtype: str                      # resolved ("auto" replaced by what it means)
    cfg: DraftConfig
    kvs: KVList
    jobs: list[TensorJob]
    warnings: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)     # the checkpoint's files and the target's: never outputs

    @property
    def bytes_out(self) -> int:
        return sum(j.nbytes for j in self.jobs)

    @property
    def found(self) -> str:
        """What the checkpoint is, in one line (DSpark: layout, heads, rank, block layout, vocabulary)."""
        if self.cfg.dspark is not None:
            return self.cfg.dspark.summary()
        return "DFlash2" if self.cfg.version == 2 else "DFlash v1"

    def as_plan(self) -> Plan:
        """The tensor plan in the shape the other rewriting commands print (--dry-run)."""
        actions = [TensorAction(j.name, j.ne, int(j.src.ggml_type), int(j.dst_type), f"{j.src.name}: {j.reason}",
                                j.src.nbytes, j.nbytes) for j in self.jobs]
        return Plan(f"convert dflash ({self.profile})", [ShardPlan(self.hf_dir, self.out, actions)])

    def as_dict(self) -> dict:
        return {"hf_dir": self.hf_dir, "out": self.out, "profile": self.profile, "outtype": self.outtype,
                "version": self.cfg.version, "target_layer_ids": self.cfg.target_layer_ids,
                "target_layer_ids_from": self.cfg.ids_from, "mask_token_id": self.cfg.mask_token_id,
                "mask_token_id_from": self.cfg.mask_from, "block_size": self.cfg.block_size,
                "found": self.found, "dspark": self.cfg.dspark.as_dict() if self.cfg.dspark else None,
                "metadata": self.kvs.as_dict(), "warnings": self.warnings,
                "tensors": [{"name": j.name, "source": j.src.name, "ne": list(j.ne),
                             "from": j.src.dtype, "to": ggml_type_name(j.dst_type), "bytes": j.nbytes,
                             "reason": j.reason} for j in self.jobs]}


@dataclass
class ConvertResult:
    path: str
    n_tensors: int
    bytes_out: int
    overflow: dict[str, int]           # source tensor -> values beyond the F16 range (written as inf)
    warnings: list[str]
    nonfinite: dict[str, int] = field(default_factory=dict)    # source tensor -> NaN/inf values in it
    found: str = ""                                            # ConvertPlan.found


def convert_dflash(hf_dir, out, *, profile="llama.cpp", target=None, outtype="auto", mask_token_id=None,
                   guess_target_layers=False, name=None, dry_run=False, force=False, allow_overflow=False,
                   on_bytes=None) -> ConvertPlan | ConvertResult:
    """Plan and (unless dry_run) write the drafter GGUF; returns the plan for a dry run, else the result."""
    with (OpenTarget(target) if target else contextlib.nullcontext()) as tgt:
        plan = plan_convert(hf_dir, out, profile=profile, target=tgt, outtype=outtype,
                            mask_token_id=mask_token_id, guess_target_layers=guess_target_layers, name=name)
    if dry_run:
        return plan
    return write(plan, force=force, allow_overflow=allow_overflow, on_bytes=on_bytes)


def plan_convert(hf_dir, out, *, profile="llama.cpp", target: TargetInfo | None = None, outtype="auto",
                 mask_token_id=None, guess_target_layers=False, name=None) -> ConvertPlan:
    if profile not in PROFILES:
        raise ConvertError(f"unknown profile '{profile}' (one of {', '.join(PROFILES)})")
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown outtype '{outtype}' (one of {', '.join(OUTTYPES)})")
    p = PROFILES[profile]
    ckpt = open_checkpoint(hf_dir)
    inputs = files_of(ckpt.path) + (target.paths if target is not None else [])
    check_output(out, inputs, force=True)
    if ckpt.version == 2 and not p.dflash2:
        raise CheckpointError(ckpt.config_path, f"DFlash2DraftModel: {p.runtime} has no DFlash2 support (no conv "
                                                "or candidate-selector tensors in its loader); use --profile "
                                                "llama.cpp", "architectures")
    if outtype != "auto" and not p.takes_outtype:
        raise ConvertError(f"--outtype applies to the llama.cpp profile; the {p.name} profile stores BF16 "
                           "and F16 sources as F16 and F32 as F32 (quantize afterwards with ggtools quantize)")
    cfg = draft_config(ckpt, mask_token_id=mask_token_id, guess_target_layers=guess_target_layers)
    check_layout(ckpt, cfg)
    if cfg.dspark is not None:
        _check_dspark_profile(ckpt, cfg, p)
    warnings = check_against_target(ckpt, cfg, target, p)
    _resolve_missing_mask(ckpt, cfg, p, warnings)
    if cfg.ids_from.startswith("guessed"):
        warnings.append(f"target layer ids guessed with build_target_layer_ids: {cfg.target_layer_ids}")
    if p.tokenizer and target is None:
        raise ConvertError(f"the {p.name} profile embeds the target's tokenizer ({p.runtime} reads the mask token "
                           "from the drafter's own vocabulary): pass --target-gguf TARGET.gguf")
    if p.tokenizer and not target.has_tokenizer:
        raise ConvertError(f"{target.path}: the target has no tokenizer (tokenizer.ggml.tokens): the {p.name} "
                           f"profile embeds it, and {p.runtime} refuses a drafter without one; pass the target's "
                           "GGUF that carries its vocabulary (shard 1 of a split set)")
    resolved, jobs, kvs, notes = p.plan_conversion(ckpt, cfg, outtype, target, name)
    plan = ConvertPlan(ckpt.path, str(out), p.name, resolved, cfg, kvs, jobs, warnings + notes, inputs)
    refuse_invalid_output(planned_header(plan), lambda name: _encoded(plan, name))
    return plan


def planned_header(plan: ConvertPlan) -> GGUFFile:
    """The output's header as a reader will see it, before anything is written."""
    w = GGUFWriter(None)
    _declare(w, plan)
    return GGUFFile.from_header(plan.out, w.header_bytes(), w.data_size)


def _declare(w: GGUFWriter, plan: ConvertPlan):
    plan.kvs.write_to(w)
    for j in plan.jobs:
        w.add_tensor_info(j.name, j.ne, j.dst_type, j.nbytes)


def _encoded(plan: ConvertPlan, name: str) -> bytes:
    """The bytes the plan writes for one tensor (the rules read small tables only: d2t)."""
    job = next(j for j in plan.jobs if j.name == name)
    return b"".join(chunk.data.tobytes() for chunk in encode_chunks(job))


def _check_dspark_profile(ckpt, cfg, p: Profile):
    """What p's runtime cannot draft; a missing confidence bias is no refusal (the lucebox converter writes zeros)."""
    ds = cfg.dspark
    why = p.dspark_refusal(ds.sample_from_anchor, ds.reduced, ds.w2_scale, conf_without_bias=False)
    if why:
        raise ConvertError(f"{ckpt.config_path}: {ckpt.architecture}: the {p.name} profile cannot hold this DSpark "
                           f"drafter: {why}; use --profile llama.cpp")


def _resolve_missing_mask(ckpt, cfg, p: Profile, warnings):
    if cfg.mask_token_id is not None:
        return
    if p.default_mask_id is not None:
        cfg.mask_token_id, cfg.mask_from = p.default_mask_id, f"{p.name}'s default (none in config.json)"
        warnings.append(f"no mask_token_id in config.json: wrote {p.name}'s default {cfg.mask_token_id} "
                        f"({p.runtime} reads the mask id from the target, not from the drafter)")
        return
    raise ConvertError(f"{ckpt.config_path}: no mask_token_id (neither dflash_config.mask_token_id nor a "
                       "top-level mask_token_id): the drafter would draft nothing (llama.cpp fills the block "
                       "with token -1, see llama.cpp#26761); pass --mask-token-id N")


def check_against_target(ckpt: Checkpoint, cfg: DraftConfig, target: TargetInfo | None, p: Profile) -> list[str]:
    """Errors for what cannot work with this target; warnings for what works only on some runtimes."""
    where, warnings = ckpt.config_path, []
    vocab = target.vocab if target is not None else cfg.vocab
    if cfg.mask_token_id is not None and vocab is not None and cfg.mask_token_id >= vocab:
        source = f"the target's vocabulary ({vocab} tokens in {target.path})" if target else \
            f"vocab_size {vocab} in {where}"
        raise ConvertError(f"mask token id {cfg.mask_token_id} ({cfg.mask_from}) is outside {source}")
    if cfg.version == 2:
        kt = cfg.v2["selector_top_k"]
        if cfg.hidden < kt * (kt + 1):
            raise ConvertError(f"{where}: hidden_size {cfg.hidden} < selector_top_k {kt} x {kt + 1}: llama.cpp "
                               "refuses it (\"DFlash2 hidden size is too small for the selector lattice\")")
    if target is None:
        return warnings
    if target.hidden is not None and target.hidden != cfg.hidden:
        raise ConvertError(f"the drafter's hidden_size {cfg.hidden} differs from the target's "
                           f"embedding_length {target.hidden} ({target.path}): this drafter belongs to another model")
    if target.n_layer is not None:
        bad = [i for i in cfg.target_layer_ids if i >= target.n_layer]
        if bad:
            raise ConvertError(f"{where}: target layer ids {bad} ({cfg.ids_from}) are not layers of the "
                               f"{target.n_layer}-layer target {target.path} (ids run 0..{target.n_layer - 1})")
        if cfg.num_target_layers is not None and cfg.num_target_layers != target.n_layer:
            warnings.append(f"num_target_layers {cfg.num_target_layers} in config.json, but the target has "
                            f"{target.n_layer} layers: is this the drafter for this target?")
        if p.ids_offset and max(p.stored_ids(cfg.target_layer_ids)) > target.n_layer - 1:
            warnings.append(f"target layer id {max(cfg.target_layer_ids)} is the target's last layer: llama.cpp "
                            "at 0c1e570 aborts (t_layer_inp[n_layer] is never set); newer revisions accept it")
    if target.arch and target.arch not in p.tap_archs:
        warnings.append(f"target arch '{target.arch}' does not expose layer inputs in {p.runtime}: "
                        f"{p.name}-profile drafting fails for it")
    elif cfg.dspark is not None and p.dspark_target_archs is not None and target.arch not in p.dspark_target_archs:
        warnings.append(f"{p.runtime} runs the DSpark heads only for {', '.join(sorted(p.dspark_target_archs))} "
                        f"targets: for '{target.arch}' it drafts with the DFlash backbone alone")
    if cfg.dspark is not None and target.vocab is not None and target.vocab != cfg.dspark.vocab:
        raise ConvertError(f"{where}: vocab_size {cfg.dspark.vocab} (the rows of the Markov embedding) differs from "
                           f"the target's vocabulary ({target.vocab} tokens in {target.path}): the Markov head is "
                           "indexed by target token ids")
    return warnings


def write(plan: ConvertPlan, *, force=False, allow_overflow=False, on_bytes=None) -> ConvertResult:
    on_bytes = on_bytes or (lambda n: None)
    overflow, nonfinite = {}, {}
    with GGUFWriter(plan.out, force=force, inputs=plan.inputs) as w:
        _declare(w, plan)
        for j in plan.jobs:
            for chunk in encode_chunks(j):
                w.write(chunk.data)
                on_bytes(chunk.data.nbytes)
                for counts, n in ((overflow, chunk.overflow), (nonfinite, chunk.nonfinite)):
                    if n:
                        counts[j.src.name] = counts.get(j.src.name, 0) + n
        if overflow and not allow_overflow:
            raise ConvertError(overflow_message(plan, overflow) + "; nothing written. Pass --allow-overflow "
                               "to write them as inf" + (", or keep the range with --outtype bf16 or f32"
                                                         if PROFILES[plan.profile].takes_outtype else ""))
    warnings = list(plan.warnings)
    if overflow:
        warnings.append(overflow_message(plan, overflow) + " (written as inf: --allow-overflow)")
    if nonfinite:
        warnings.append(f"{plan.hf_dir}: NaN/inf values in source tensors, written as they are: "
                        + ", ".join(f"{name} ({n} value{'s' if n != 1 else ''})" for name, n in nonfinite.items()))
    return ConvertResult(plan.out, len(plan.jobs), plan.bytes_out, overflow, warnings, nonfinite, plan.found)


def overflow_message(plan: ConvertPlan, overflow: dict[str, int]) -> str:
    parts = ", ".join(f"{name} ({n} value{'s' if n != 1 else ''})" for name, n in overflow.items())
    return f"{plan.hf_dir}: values beyond the F16 range ±65504 in {parts}"
