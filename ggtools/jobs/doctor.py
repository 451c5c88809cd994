"""doctor: every known fault of a drafter GGUF, for the runtimes that will read it, and the repair the evidence
given supports.

What it checks follows from what it is given:
- the file alone: the model-file rules (the container rules validate applies, and the hyperparameter rules of
  ggtools.hparam_rules, the ones the runtime's loaders apply: dflash/file_rules.py turns them into findings),
  each runtime's loader rules (llama.cpp and lucebox: dflash/loaders.py; ggtools: its own drafter loader, run on
  the file), the mask id, tokenizer, block size, DFlash2 keys, the draft size;
- --hf: every value and every tensor against the checkpoint the drafter came from (dflash/source_check.py);
- --target: the target's model-file rules, and the pair (dflash/pair_rules.py). `pair-check` is doctor with a
  target.
A Qwen3.5 / Qwen3-Next model given as the draft is an MTP draft (its MTP block, or its MTP sidecar): checked by
jobs/mtp_doctor.py.

`doctor_fix` writes a repaired copy (dflash/rewrite.py through the engine: atomic, tensors byte-copied and
verified), fixing only what the evidence supports: the mask id from the file's older key or the checkpoint,
the tokenizer from the target, RoPE base, target layer ids, block size, eps, head dims and DFlash2 keys from the
checkpoint alone, DSpark's BOOL flags from the tensors (the confidence head) or the checkpoint (the block layout).
It never writes a file that still fails a check: with nothing to fix it refuses at once; otherwise the repaired
file is written to a temporary directory and checked again, and only a file that passes is placed at the output
(FixRefused, exit 1, names what is left). With `to` it also moves the file to that layout; `move_layout` is the
move alone.
"""

import contextlib
import os
from dataclasses import dataclass, field

from gguf import GGUFValueType as VT

from ggtools.dflash.checkpoint import files_of, open_checkpoint
from ggtools.dflash.config import draft_config
from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.file_rules import container_findings, drafter_fix, hparam_findings, target_fix
from ggtools.dflash.findings import ERROR, WARNING, Effect, Finding, failed, ok
from ggtools.dflash.loaders import draft_size_findings, loader_findings
from ggtools.dflash.pair_rules import number, pair_findings, rope_against_target, rope_effects
from ggtools.dflash.profiles import LLAMACPP, LUCEBOX, PROFILES, ROLE_TYPES
from ggtools.dflash.rewrite import DrafterRewrite, move, repair
from ggtools.dflash.source_check import expected_values, source_findings
from ggtools.dflash.target import OpenTarget, TargetInfo
from ggtools.engine import planned_header, rewrite_shard
from ggtools.gguf import ShardSet
from ggtools.gguf.check import check_file, check_set
from ggtools.gguf.outputs import check_output, copy_file, temporary_directory
from ggtools.hparam_rules import model_violations
from ggtools.hparam_rules.tensor_shapes import locator
from ggtools.jobs.errors import JobError
from ggtools.jobs.planned_output import refuse_invalid_output
from ggtools.plan import Plan, ShardPlan

RUNTIMES = (LLAMACPP.runtime, LUCEBOX.runtime, "ggtools")
FLAGS = tuple(role for role, (vtype, _) in ROLE_TYPES.items() if vtype == VT.BOOL)   # DSpark's BOOL switches


class DoctorError(JobError):
    pass


class FixRefused(DoctorError):
    """--fix would write a file that still fails a check: nothing is written (a check failed: exit 1)."""
    exit_code = 1


@dataclass
class DoctorReport:
    draft: str
    profile: str | None
    runtimes: list[str]
    findings: list[Finding]
    target: str | None = None
    hf: str | None = None
    fixes: dict = field(default_factory=dict)        # role -> value the evidence supports (what --fix writes)

    @property
    def errors(self) -> list[Finding]:
        return failed(self.findings)

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    @property
    def error(self) -> str | None:
        """One line for a failed check: how many, and the first."""
        if not self.errors:
            return None
        first = self.errors[0]
        return f"{self.draft}: {len(self.errors)} check(s) failed; first: {first.check}: {first.message}"

    def as_dict(self) -> dict:
        return {"draft": self.draft, "profile": self.profile, "runtimes": self.runtimes, "target": self.target,
                "hf": self.hf, "ok": not self.errors, "exit_code": self.exit_code, "error": self.error,
                "findings": [f.as_dict() for f in self.findings],
                "fixable": {k: _plain(v) for k, v in self.fixes.items()}}


@dataclass
class FixResult:
    before: DoctorReport
    after: DoctorReport | None       # the written file, checked again (None for a dry run)
    plan: Plan
    fixed: dict                      # role -> value written
    notes: list[str]

    @property
    def exit_code(self) -> int:
        return self.after.exit_code if self.after else 0

    @property
    def error(self) -> str | None:
        return self.after.error if self.after else None

    def as_dict(self) -> dict:
        return {"exit_code": self.exit_code, "error": self.error,
                "before": self.before.as_dict(), "after": self.after.as_dict() if self.after else None,
                "fixed": {k: _plain(v) for k, v in self.fixed.items()}, "notes": self.notes,
                "plan": self.plan.as_dict()}


def doctor(draft, *, target=None, hf=None, runtimes=None, n_max=None) -> DoctorReport:
    from ggtools.jobs.mtp_doctor import is_mtp_draft, mtp_doctor
    if is_mtp_draft(draft):         # a Qwen3.5 target or its MTP sidecar, to draft with MTP (jobs/mtp_doctor.py)
        if hf:
            raise DoctorError(f"{draft}: an MTP draft: --hf checks a DFlash drafter against its checkpoint")
        return mtp_doctor(draft, target, runtimes)
    from ggtools.jobs.eagle3_doctor import eagle3_doctor, is_eagle3_draft
    if is_eagle3_draft(draft):      # an EAGLE3 drafter (jobs/eagle3_doctor.py)
        return eagle3_doctor(draft, target, hf, runtimes)
    with _open(draft) as d, (OpenTarget(target) if target else contextlib.nullcontext()) as t:
        return examine(d, t, hf, runtimes, n_max)


def examine(d: DraftFile, t: TargetInfo | None, hf, runtimes=None, n_max=None) -> DoctorReport:
    runtimes = list(runtimes or _default_runtimes(d))
    bad = [r for r in runtimes if r not in RUNTIMES]
    if bad:
        raise DoctorError(f"unknown runtime {bad[0]!r} (one of {', '.join(RUNTIMES)})")
    # the rules beyond the loader's apply to the runtimes that read this layout (else to the layout's own)
    readable = [r for r in runtimes if r == "ggtools" or (d.profile and d.profile.runtime == r)] or \
        ([d.profile.runtime] if d.profile else [])
    problems = check_file(d.file)
    violations = model_violations(d.file)
    loaders = {r: loader_findings(d, r, violations) for r in runtimes if r != "ggtools"}
    findings, fixes = container_findings(d.path, _unclaimed(problems, violations), runtimes), {}
    findings += hparam_findings(d.path, violations, readable, drafter_fix(d.path, d.profile), loaders)
    for r in runtimes:
        if r != "ggtools":
            findings += loaders[r]
        elif not violations:          # else ggtools' loader refuses the first of them (in the findings above)
            findings += ggtools_loader_findings(d)
    if d.profile is not None:
        findings += draft_size_findings(d, n_max, readable)
        if t is not None:
            findings += target_findings(t, readable)
            findings += pair_findings(d, t, readable, runtime_tap_archs(), _ggtools_refusal(t))
        evidence = {"has_confidence_head": d.has_confidence} if d.is_dspark else {}
        if hf:
            ckpt = open_checkpoint(hf)
            more, fixes = source_findings(d, ckpt, readable)
            findings += more
            evidence |= {role: v for role, (v, _) in expected_values(d, ckpt, draft_config(ckpt)).items()
                         if role in FLAGS and v is not None}
        else:
            findings += _rope_in_doubt(d, t, readable)
        fixes |= _flag_fixes(d, evidence)
    fixes |= _file_fixes(d, fixes)
    return DoctorReport(d.path, d.profile.name if d.profile else None, runtimes, findings,
                        t.path if t else None, str(hf) if hf else None, fixes)


def pair_check(target_path, draft_path) -> DoctorReport:
    """The pair rules and each runtime's loader rules: doctor with a target."""
    return doctor(draft_path, target=target_path)


def _default_runtimes(d: DraftFile) -> list[str]:
    """The runtime whose layout the file is in (both for a file in neither); ggtools' own only when asked."""
    if d.profile is None:
        return [LLAMACPP.runtime, LUCEBOX.runtime]
    return [d.profile.runtime]


def target_findings(t: TargetInfo, runtimes) -> list[Finding]:
    """The target's model-file rules (every file of its set; the hyperparameters of its first), and what ggtools'
    runtime refuses in a valid target."""
    with ShardSet(t.path) as shards:
        files = [shards.file(i) for i in shards.present_indices]
        problems = [p for f in files for p in check_file(f)] + check_set(shards)
        violations = model_violations(t.file, locator(files))
    out = container_findings(t.path, _unclaimed(problems, violations), runtimes, what="the target")
    out += hparam_findings(t.path, violations, runtimes, target_fix(t.path))
    says = _ggtools_refusal(t).get("ggtools")
    if says and not violations and "ggtools" in runtimes and t.arch in runtime_tap_archs()["ggtools"]:
        out.append(Finding("target", ERROR, f"ggtools' runtime does not run this target: {says}",
                           (Effect("ggtools", says),), "none in the file: run the pair in llama.cpp"))
    return out


def runtime_tap_archs() -> dict:
    """runtime -> the target archs whose layer inputs it taps; ggtools' from its own runtime."""
    from ggtools.runtime.model.archs import ARCHS
    return {LLAMACPP.runtime: LLAMACPP.tap_archs, LUCEBOX.runtime: LUCEBOX.tap_archs, "ggtools": frozenset(ARCHS)}


def _unclaimed(problems, violations) -> list:
    """The container problems at places no hyperparameter rule names (a key of the wrong type is one fault, which
    the rule's finding reports with the loader's words)."""
    places = {v.where for v in violations}
    return [p for p in problems if p.where not in places]


def _ggtools_refusal(t: TargetInfo) -> dict:
    """What ggtools' runtime says when it refuses this target (its own words, from running its reader: the
    model-file rules first)."""
    from ggtools.runtime.errors import ModelError
    from ggtools.runtime.model.archs import arch_of
    from ggtools.runtime.model.hparams import read_hparams
    try:
        read_hparams(t.file, t.vocab or 0, arch_of(t.file))
    except ModelError as e:
        return {"ggtools": str(e)}
    return {}


def ggtools_loader_findings(d: DraftFile) -> list[Finding]:
    """ggtools' own drafter loader (runtime/drafter/hparams.py), run on the file."""
    from ggtools.runtime.drafter.hparams import read_draft_hparams
    from ggtools.runtime.errors import ModelError
    try:
        hp = read_draft_hparams(d.file, set(d.file.tensor))
    except ModelError as e:
        return [Finding("loader", ERROR, "ggtools' drafter loader refuses the file", (Effect("ggtools", str(e)),),
                        f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT")]
    return [ok("loader", f"ggtools' drafter loader reads it ({hp.profile} layout, taps {list(hp.taps)})")]


def _rope_in_doubt(d: DraftFile, t: TargetInfo | None, runtimes) -> list[Finding]:
    """Without the checkpoint a RoPE base can only be put in doubt (reported, never rewritten): by the target's
    own base when it states one, else by being what lucebox's converter writes when config.json keeps the base
    under rope_parameters."""
    if t is not None and t.file.get(f"{t.arch}.rope.freq_base") is not None:
        rope = rope_against_target(d, t, runtimes)
        return [rope] if rope else []
    theta = number(d.value("rope.freq_base"))
    if d.profile is not LUCEBOX or theta != 1e6:
        return []
    return [Finding("rope_theta", WARNING, f"{d.key('rope.freq_base')} is 1e6, what lucebox's converter writes when "
                    "config.json keeps the base under rope_parameters; unproven without the checkpoint (not "
                    "rewritten)", rope_effects(theta, runtimes), f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT")]


def _flag_fixes(d: DraftFile, evidence: dict) -> dict:
    """DSpark's switches (FLAGS: BOOL keys) stored as another type, or another value, than the evidence gives
    (role -> value: the confidence head from the file's tensors, the block layout from the checkpoint)."""
    return {role: value for role, value in evidence.items()
            if d.profile.has_key(role) and d.file.get(d.key(role)) is not value}


def _file_fixes(d: DraftFile, fixes: dict) -> dict:
    """What the file itself proves: a mask id kept under an older key, an id count that disagrees with the ids."""
    out = {}
    if d.profile is None:
        return out
    mask, where = d.mask
    if mask is not None and where != d.key("mask") and "mask" not in fixes:
        out["mask"] = mask
    ids = d.hf_ids
    if ids is not None and d.profile.has_key("n_target_ids") and d.int_value("n_target_ids") != len(ids):
        out.setdefault("n_target_ids", len(fixes.get("target_ids", ids)))
    return out


# ---- writing ---------------------------------------------------------------------------------------------------

def doctor_fix(draft, out, *, target=None, hf=None, to=None, runtimes=None, n_max=None, force=False,
               dry_run=False) -> FixResult:
    """Write the repaired (and, with `to`, moved) drafter to out, if it then passes every check; FixRefused (exit
    1, nothing written) when the evidence fixes nothing that fails, or the fixed file still fails a check."""
    from ggtools.jobs.mtp_doctor import RECONVERT as MTP_RECONVERT, is_mtp_draft
    if is_mtp_draft(draft):
        raise DoctorError(f"{draft}: an MTP draft: --fix repairs DFlash drafters; an MTP block's values come from "
                          f"its checkpoint: {MTP_RECONVERT}")
    from ggtools.jobs.eagle3_doctor import RECONVERT, is_eagle3_draft
    if is_eagle3_draft(draft):
        raise DoctorError(f"{draft}: an EAGLE3 drafter: --fix has nothing to rewrite in place (its values come from "
                          f"the checkpoint and the target): {RECONVERT}")
    with _open(draft) as d, (OpenTarget(target) if target else contextlib.nullcontext()) as t:
        before = examine(d, t, hf, runtimes, n_max)
        dest = PROFILES[to] if to else d.profile
        tokenizer = _tokenizer_fix(d, t, dest)
        rw = _rewrite(d, dest, before.fixes, tokenizer)
        fixed = dict(before.fixes) | ({"tokenizer": f"{len(tokenizer)} keys from {t.path}"} if tokenizer else {})
        if before.errors and not fixed and dest is d.profile:
            raise FixRefused(f"{d.path}: nothing written: the evidence given fixes none of the {len(before.errors)} "
                             f"failed check(s): {_listed(before.errors)}")
        inputs = _inputs(t, hf)
        plan = _plan(d, rw, out, inputs)
        check_output(out, plan.inputs, force=force or dry_run)
        if dry_run:
            return FixResult(before, None, plan, fixed, rw.notes)
        again = dict(target=target, hf=hf, runtimes=runtimes if not to else None, n_max=n_max)
        _write_checked(plan.shards[0], out, force, inputs, again, fixed)
    return FixResult(before, doctor(out, **again), plan, fixed, rw.notes)


def _write_checked(shard: ShardPlan, out, force, inputs, again: dict, fixed: dict):
    """Write the shard to a temporary directory, check it again (doctor with the same evidence), and copy it to out
    only if it passes: doctor never writes a file its own checks (validate's among them) fail."""
    with temporary_directory("ggtools-doctor-") as tmp:
        trial = os.path.join(tmp, os.path.basename(os.fspath(out)))
        rewrite_shard(ShardPlan(shard.src, trial, shard.tensors, shard.kv_edits), inputs=inputs)
        after = doctor(trial, **again)
        if after.errors:
            done = ", ".join(fixed) or "nothing"
            raise FixRefused(f"{shard.src}: nothing written: fixed {done}, but {len(after.errors)} check(s) still "
                             f"fail: {_listed(after.errors)}")
        copy_file(trial, out, inputs=[shard.src, *inputs], force=force)


def _listed(errors) -> str:
    """The failed checks on one line: each one's class and message, and the command that fixes it."""
    return "; ".join(f"{f.check}: {f.message}" + (f" (fix: {f.fix})" if f.fix else "") for f in errors)


def move_layout(draft, out, to, *, target=None, force=False, dry_run=False) -> tuple[Plan, list[str]]:
    """`convert gguf-layout`: the drafter in another profile's layout, values unchanged. Returns the plan and notes."""
    with _open(draft) as d, (OpenTarget(target) if target else contextlib.nullcontext()) as t:
        if d.profile is PROFILES[to]:
            raise DoctorError(f"{d.path}: already in the {to} layout (arch {d.arch})")
        rw = move(d, PROFILES[to], tokenizer=t.tokenizer_kvs if t else ())
        return _write(d, rw, out, force, dry_run, _inputs(t, None)), rw.notes


def _tokenizer_fix(d: DraftFile, t: TargetInfo | None, dest) -> list:
    """The target's tokenizer, where the written layout carries one and the drafter's lacks or differs from it."""
    if t is None or dest is None or not dest.tokenizer:
        return []
    mine, theirs = d.file.kv.get("tokenizer.ggml.tokens"), t.file.kv.get("tokenizer.ggml.tokens")
    if theirs is None or (mine is not None and bytes(mine.raw) == bytes(theirs.raw)):
        return []
    return t.tokenizer_kvs


def _rewrite(d: DraftFile, dest, fixes, tokenizer) -> DrafterRewrite:
    if d.profile is None:
        raise DoctorError(f"{d.path}: arch '{d.arch}' is not a DFlash drafter layout: nothing to repair "
                          "(convert the checkpoint with `ggtools convert dflash`)")
    if dest is d.profile:
        return repair(d, fixes, tokenizer)
    return move(d, dest, fixes, tokenizer)


def _inputs(t: TargetInfo | None, hf) -> list[str]:
    """The files read besides the drafter (the output may be none of them)."""
    return (t.paths if t else []) + (files_of(hf) if hf else [])


def _plan(d: DraftFile, rw: DrafterRewrite, out, inputs) -> Plan:
    shard = ShardPlan(d.path, str(out), rw.tensors, rw.edits)
    return Plan(f"drafter to the {rw.dest.name} layout", [shard], [d.path, *inputs])


def _write(d: DraftFile, rw: DrafterRewrite, out, force, dry_run, inputs) -> Plan:
    """gguf-layout's output, checked by validate's rules before anything is written (its tensors are copies: the
    rules read the source's bytes)."""
    plan = _plan(d, rw, out, inputs)
    check_output(out, plan.inputs, force=True)
    shard = plan.shards[0]
    sources = {a.name: a.source for a in shard.tensors}
    refuse_invalid_output(planned_header(shard, d.file), lambda name: bytes(d.file.tensor_data(sources[name])))
    if not dry_run:
        rewrite_shard(plan.shards[0], force=force, inputs=inputs)
    return plan


@contextlib.contextmanager
def _open(draft):
    with ShardSet(draft) as s:
        if s.is_split:
            raise DoctorError(f"{draft}: a drafter is one file; this is a {len(s.paths)}-shard set")
        yield DraftFile.read(s.first)


def _plain(v):
    return v.tolist() if hasattr(v, "tolist") else v
