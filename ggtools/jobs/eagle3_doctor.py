"""doctor and pair-check for EAGLE3 drafters (arch eagle3): the facts and llama.cpp's words are dflash/eagle3.py's,
the rules hparam_rules/eagle3.py's (the ones validate and ggtools' runtime loader apply too).

- the file alone: the container rules and the model-file rules (keys: 3 target layers, target_hidden_size, one
  layer, head sizes; tensors: the ones llama.cpp's loader requires and takes, d2t's type, length and ids), and that
  llama.cpp never detects EAGLE3 from the file (--spec-type draft-eagle3);
- --target: the target's own rules and the pair: the features' width (target_hidden_size against the target's
  embedding_length), the taps (an id beyond the target, a target arch without layer inputs, the last-output tap on
  an arch that never writes it: stale features, a warning since llama.cpp says nothing), the borrowed embedding /
  head, the vocabulary;
- --hf: every EAGLE3 key and every tensor against a fresh conversion of the checkpoint (dflash/eagle3_convert.py).

There is nothing to --fix in place: an EAGLE3 file whose values are wrong is converted again.
"""

from ggtools.dflash import eagle3 as E
from ggtools.dflash.eagle3_checkpoint import open_eagle3
from ggtools.dflash.eagle3_convert import TargetFacts, plan as plan_conversion
from ggtools.dflash.file_rules import container_findings, hparam_findings
from ggtools.dflash.findings import ERROR, WARNING, Effect, Finding, failed, ok, unchecked
from ggtools.dflash.source_check import CONVERTER_OUTTYPES, _fresh_digest
from ggtools.dflash.target import OpenTarget, TargetInfo
from ggtools.gguf import GGUFError, ShardSet
from ggtools.gguf.check import check_file
from ggtools.hparam_rules import eagle3_pair_violations, model_violations
from ggtools.hparam_rules.eagle3 import stale_tap
from ggtools.hparam_rules.tensor_shapes import locator

RUNTIMES = ("llama.cpp", "ggtools")
LAYOUT = "EAGLE3 (llama.cpp)"
RECONVERT = "ggtools convert drafter HF_DIR -o OUT --target-gguf TARGET.gguf"


def is_eagle3_draft(path) -> bool:
    try:
        with ShardSet(path) as s:
            return E.is_eagle3_arch(s.first.architecture)
    except GGUFError:
        return False                # the drafter checks report what is wrong with the file


def eagle3_doctor(draft, target=None, hf=None, runtimes=None):
    """doctor's DoctorReport on an EAGLE3 drafter, with its target and its checkpoint when given."""
    from ggtools.jobs.doctor import DoctorError, DoctorReport, _unclaimed, target_findings
    runtimes = list(runtimes or [E.RUNTIME])
    other = [r for r in runtimes if r not in RUNTIMES]
    if other:
        raise DoctorError(f"{draft}: an EAGLE3 drafter: {other[0]} has no EAGLE3 drafting (--runtime "
                          f"{' or '.join(RUNTIMES)})")
    with ShardSet(draft) as shards:
        if shards.is_split:
            raise DoctorError(f"{draft}: a drafter is one file; this is a {len(shards.paths)}-shard set")
        f = shards.first
        violations = model_violations(f)
        findings = container_findings(f.path, _unclaimed(check_file(f), violations), runtimes, what="the drafter")
        findings += hparam_findings(f.path, violations, runtimes, lambda v: RECONVERT)
        if not failed(findings):
            findings.append(ok("eagle3", _summary(f)))
        findings.append(_spec_type(f, runtimes))
        if target is not None:
            with OpenTarget(target) as t:
                findings += target_findings(t, runtimes)
                findings += pair_findings(f, t, runtimes)
                if hf:
                    findings += source_findings(f, hf, t, runtimes)
        elif hf:
            findings += source_findings(f, hf, None, runtimes)
    return DoctorReport(str(draft), LAYOUT, runtimes, findings, str(target) if target else None,
                        str(hf) if hf else None)


def _spec_type(f, runtimes) -> Finding:
    """llama.cpp runs an EAGLE3 drafter only when told to: a warning, so the command line is not forgotten."""
    if E.RUNTIME not in runtimes:
        return ok("spec_type", "ggtools' runtime takes the family from the file's arch")
    return Finding("spec_type", WARNING, E.SPEC_HINT, (Effect(E.RUNTIME, None, "without it no EAGLE3 drafting: no "
                   "speculative type is detected from the file"),), f"... -md {f.path} --spec-type {E.SPEC_TYPE}")


def _summary(f) -> str:
    ids, hidden = _ids(f), f.get(f"{E.ARCH}.{E.TARGET_HIDDEN}")
    d2t = f.tensor.get(E.D2T)
    vocab = f"draft vocabulary {d2t.ne[0]} (d2t)" if d2t is not None else "the target's vocabulary"
    own = [n for n, name in (("embedding", "token_embd.weight"), ("head", "output.weight")) if name in f.tensor]
    return (f"EAGLE3 drafter: taps target layers {ids} (3 x {hidden} features), {vocab}, "
            f"{'own ' + ' and '.join(own) if own else 'the target' + chr(39) + 's embedding and head'}")


def pair_findings(f, t: TargetInfo, runtimes) -> list[Finding]:
    """The pair's rules as findings (llama.cpp's words, or what it does), the stale last-output tap as a warning."""
    if t.n_layer is None or t.hidden is None:
        return [unchecked("pair", f"the target {t.path} has no block_count or embedding_length")]
    with ShardSet(t.path) as shards:
        t_locate = locator([shards.file(i) for i in shards.present_indices])
        violations = eagle3_pair_violations(f, t.file, t_locate)
    out = []
    for v in violations:
        effects = tuple(Effect(r, f"{f.path}: {v}") if r == "ggtools" else Effect(r, v.says, v.symptom)
                        for r in runtimes)
        out.append(Finding(v.check, ERROR, str(v), effects, "use the EAGLE3 drafter trained for this target (or "
                           f"convert its checkpoint against it: {RECONVERT.replace('TARGET.gguf', t.path)})"))
    nextn = t.file.get(f"{t.arch}.nextn_predict_layers")
    trunk = t.n_layer - nextn if isinstance(nextn, int) and not isinstance(nextn, bool) and 0 <= nextn < t.n_layer \
        else t.n_layer
    stale = stale_tap(f, t.arch, trunk)
    if stale:
        out.append(Finding("target_layers", WARNING, stale, (Effect(E.RUNTIME, None, "no error: the drafter reads "
                           "features the target never wrote"),), f"the drafter's checkpoint with "
                           f"{E.AUX_IDS} below {trunk}, converted again"))
    if not out:
        out.append(ok("pair", f"features 3 x {t.hidden}, taps {_ids(f)} inside the "
                      f"{trunk}-layer '{t.arch}' target, the same vocabulary"))
    return out


def source_findings(f, hf, t: TargetInfo | None, runtimes) -> list[Finding]:
    """Every EAGLE3 key and tensor against a fresh conversion of the checkpoint (at the file's weight type). Without
    the target, the target's facts are the file's own (the target layers then only when config.json states them)."""
    ckpt = open_eagle3(hf)
    out = []
    if t is not None:
        from ggtools.jobs.convert_drafter import target_facts
        facts = target_facts(t)
    else:
        tokens = f.kv.get("tokenizer.ggml.tokens")
        vocab = tokens.count if tokens is not None and tokens.is_array else None
        facts = TargetFacts(None, f.get(f"{E.ARCH}.{E.TARGET_HIDDEN}"), vocab, f.path, gguf_vocab=vocab)
        stored = f.get(f"{E.ARCH}.{E.TARGET_LAYERS}")
        if not ckpt.raw.get(E.AUX_IDS) and stored is not None:
            # the converter derives them from the target's layer count: compared only against the target
            ckpt.raw[E.AUX_IDS] = [int(i) for i in stored]
            out.append(unchecked("target_layers", f"{ckpt.config_path} states no {E.AUX_IDS}: the converter derives "
                                                  "the target layers from the target's layer count (pass --target)"))
    fc = f.tensor.get("fc.weight")
    outtype = CONVERTER_OUTTYPES.get(fc.type_id, "f16") if fc is not None else "f16"
    _, _, jobs, kvs = plan_conversion(ckpt, facts, outtype, None)
    return out + [_values(f, kvs, ckpt, runtimes), _tensors(f, jobs, ckpt, runtimes)]


def _values(f, kvs, ckpt, runtimes) -> Finding:
    keys = [k for k in kvs.keys() if k.startswith(f"{E.ARCH}.")]
    wrong = [k for k in keys if k not in f.kv or bytes(f.kv[k].raw) != kvs.record(k)]
    extra = [kv.key for kv in f.kvs if kv.key.startswith(f"{E.ARCH}.") and kv.key not in kvs]
    if not wrong and not extra:
        return ok("hf_values", f"all {len(keys)} {E.ARCH}.* keys equal a fresh conversion of {ckpt.path}")
    diffs = [f"{k} {_plain(f.get(k))} (checkpoint {_plain(kvs.value(k))})" for k in wrong]
    diffs += [f"{k} (not from the checkpoint)" for k in extra]
    return Finding("hf_values", ERROR, "; ".join(diffs), tuple(Effect(r, None, "drafts with other hyperparameters "
                   "than the drafter was trained with: acceptance silently low (or a file that does not load)")
                   for r in runtimes), RECONVERT.replace("HF_DIR", str(ckpt.path)))


def _tensors(f, jobs, ckpt, runtimes) -> Finding:
    differ, absent = [], []
    for job in jobs:
        t = f.tensor.get(job.name)
        if t is None:
            absent.append(job.name)
        elif tuple(t.ne) != tuple(job.ne) or _fresh_digest(job, t.type_id) != _digest(f, t):
            differ.append(job.name)
    fresh = {j.name for j in jobs}
    extra = [t.name for t in f.tensors if t.name not in fresh]
    if not (differ or absent or extra):
        return ok("tensor_data", f"all {len(jobs)} tensors equal a fresh conversion of {ckpt.path}")
    parts = [f"{len(differ)} differ ({', '.join(differ[:4])})" if differ else "",
             f"missing {absent[:4]}" if absent else "", f"not from the checkpoint {extra[:4]}" if extra else ""]
    return Finding("tensor_data", ERROR, "tensors against a fresh conversion of the checkpoint: "
                   + "; ".join(p for p in parts if p),
                   tuple(Effect(r, None, "drafts from other weights: acceptance silently low") for r in runtimes),
                   RECONVERT.replace("HF_DIR", str(ckpt.path)))


def _ids(f) -> list[int]:
    return [int(i) for i in f.get(f"{E.ARCH}.{E.TARGET_LAYERS}")]


def _digest(f, t) -> str:
    import hashlib
    return hashlib.sha256(f.tensor_data(t)).hexdigest()


def _plain(v):
    return v.tolist() if hasattr(v, "tolist") else v
