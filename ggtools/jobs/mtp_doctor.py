"""doctor and pair-check for MTP drafting: a model to draft with MTP from (a Qwen3.5 / Qwen3-Next target with its MTP
block, or its MTP sidecar), alone and against its target.

What is checked (ggtools.hparam_rules, in llama.cpp's words): the model-file rules `validate` applies, the MTP
block's among them (nextn_predict_layers, each block's nextn tensors); that the model holds an MTP block to draft
with (a --no-mtp conversion does not: "context type MTP requested but model doesn't contain MTP layers"); with a
target, the target's own rules and that the draft belongs to it (arch, width, trunk, keys, vocabulary).
"""

from ggtools.dflash.findings import ERROR, Effect, Finding, failed, ok
from ggtools.dflash.file_rules import container_findings, hparam_findings, target_fix
from ggtools.dflash.profiles import LLAMACPP, profile_of
from ggtools.dflash.target import OpenTarget
from ggtools.gguf import GGUFError, ShardSet
from ggtools.gguf.check import check_file, check_set
from ggtools.hparam_rules import model_violations
from ggtools.hparam_rules.mtp import MTP_ARCHS, mtp_blocks, mtp_draft_violations, mtp_pair_violations
from ggtools.hparam_rules.tensor_shapes import locator

MTP_RUNTIMES = (LLAMACPP.runtime, "ggtools")
LAYOUT = "MTP"
RECONVERT = ("convert the checkpoint without --no-mtp (the default conversion keeps the MTP block), or draft with the "
             "MTP sidecar: ggtools convert mtp TARGET_WITH_MTP.gguf -o mtp-TARGET.gguf")
OTHER_MODEL = ("use the sidecar of this target's own checkpoint: ggtools convert mtp TARGET_WITH_MTP.gguf -o "
               "mtp-TARGET.gguf (or llama.cpp's convert_hf_to_gguf.py --mtp)")


def is_mtp_draft(path) -> bool:
    """Whether doctor checks the file as an MTP draft: an arch with llama.cpp's Qwen MTP graph, no DFlash layout."""
    try:
        with ShardSet(path) as s:
            arch = s.first.architecture
    except GGUFError:
        return False                # the drafter checks report what is wrong with the file
    return arch in MTP_ARCHS and profile_of(arch) is None


def mtp_doctor(draft, target=None, runtimes=None):
    """The report (doctor's DoctorReport) on an MTP draft, with its target when given."""
    from ggtools.jobs.doctor import DoctorError, DoctorReport, _unclaimed, target_findings
    runtimes = list(runtimes or [LLAMACPP.runtime])
    other = [r for r in runtimes if r not in MTP_RUNTIMES]
    if other:
        raise DoctorError(f"{draft}: an MTP draft: {other[0]} does not draft with MTP (--runtime "
                          f"{' or '.join(MTP_RUNTIMES)})")
    with ShardSet(draft) as shards:
        files = [shards.file(i) for i in shards.present_indices]
        problems = [p for f in files for p in check_file(f)] + check_set(shards)
        violations = model_violations(shards.first, locator(files))
        findings = container_findings(shards.paths[0], _unclaimed(problems, violations), runtimes, what="the MTP draft")
        findings += hparam_findings(shards.paths[0], violations, runtimes, target_fix(shards.paths[0]))
        if not failed(findings):
            findings += _findings(shards.paths[0], mtp_draft_violations(shards.first), runtimes, RECONVERT)
        if target is not None:
            with OpenTarget(target) as t:
                findings += target_findings(t, runtimes)
                findings += _findings(shards.paths[0], mtp_pair_violations(shards.first, t.file), runtimes,
                                      OTHER_MODEL)
        if not failed(findings):
            findings.append(ok("mtp", _drafts_with(shards)))
    return DoctorReport(str(draft), LAYOUT, runtimes, findings, str(target) if target else None)


def _findings(path, violations, runtimes, fix) -> list[Finding]:
    """MTP drafting's rules as findings: llama.cpp's words or what it does, ggtools' runtime refusing in the rule's."""
    out = []
    for v in violations:
        effects = tuple(Effect(r, f"{path}: {v}") if r == "ggtools" else Effect(r, v.says, v.symptom)
                        for r in runtimes)
        out.append(Finding(v.check, ERROR, str(v), effects, fix))
    return out


def _drafts_with(shards) -> str:
    blocks = mtp_blocks(shards.first)
    kind = "an MTP sidecar" if "blk.0.attn_norm.weight" not in shards.tensor_shards() else "a target with its MTP block"
    return (f"{kind}: MTP block {blocks.n_layer} after {blocks.n_layer} trunk blocks; llama.cpp drafts with it "
            "(--spec-type draft-mtp)")
