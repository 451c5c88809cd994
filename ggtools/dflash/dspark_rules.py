"""The rules llama.cpp's and lucebox's loaders and graphs apply to a DSpark drafter's heads (and to d2t), as
findings quoting what each prints.

llama.cpp (src/models/dflash.cpp, common/speculative.cpp): the heads are taken when `markov_w1.weight` exists,
with the rank from its ne[0]: markov_w1 {R, n_vocab}, markov_w2 {R, n_vocab_draft} (+ scale {1}), conf_proj
{n_embd + R, 1} (+ bias {1}); d2t {n_vocab_draft}, the drafter's own output {n_embd, n_vocab_draft}. What its graph
asserts or misreads (d2t, the block size, the two flags' types) are model-file rules (ggtools.hparam_rules.dspark,
which ggtools' drafter loader applies too): here they become llama.cpp findings, beside the confidence flag against
the tensors.
lucebox (server/src/draft/draft_gguf_loader.cpp, server/src/common/dspark_head.cpp): `dflash.dspark.markov.{w1,w2}`
both {R, V}, the confidence weight {C, 1} only with its bias {1}; the chain scores C = n_embd + R (or n_embd).
"""

from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.findings import ERROR, WARNING, Effect, Finding, ok
from ggtools.dflash.profiles import CONF_B, CONF_W, LLAMACPP, LUCEBOX, MARKOV_W1, MARKOV_W2
from ggtools.hparam_rules.dspark import dspark_violations

NO_CONFIDENCE_HEAD = "DSpark draft has no confidence head: please set --spec-draft-p-min 0"
LB_MARKOV_INCOMPLETE = "draft GGUF: incomplete DSpark Markov tensors"
LB_CONF_INCOMPLETE = "draft GGUF: incomplete DSpark confidence tensors"


def llamacpp_shapes(d: DraftFile, H: int, V: int) -> tuple[dict, dict]:
    """(required, optional) ne of the DSpark tensors and d2t, as llama.cpp's loader creates them."""
    f = d.file
    d2t, w1 = f.tensor.get("d2t"), f.tensor.get("markov_w1.weight")
    Vd = int(d2t.ne[0]) if d2t is not None else V
    required, optional = {}, {"output.weight": (H, Vd)}
    if d2t is not None:
        optional["d2t"] = (Vd,)
    if w1 is not None:
        R = int(w1.ne[0])
        required |= {"markov_w1.weight": (R, V), "markov_w2.weight": (R, Vd)}
        optional |= {"markov_w2.scale": (1,), "conf_proj.weight": (H + R, 1), "conf_proj.bias": (1,)}
    return required, optional


def _llama(check, message, says, fix, symptom=None, severity=ERROR) -> Finding:
    return Finding(check, severity, message, (Effect(LLAMACPP.runtime, says, symptom),), fix)


def llamacpp_findings(d: DraftFile) -> list[Finding]:
    """The graph-time rules (the loader's shapes are checked with the other tensors): the DSpark model-file rules
    (d2t, block size, the flags' types) and the confidence flag against the tensors."""
    out = [_llama(v.check, str(v), v.says, _fix(d, v.check), v.symptom) for v in dspark_violations(d.file)]
    if d.file.tensor.get("markov_w1.weight") is None:
        return out
    out += _confidence_flag(d)
    if not [f for f in out if f.severity == ERROR]:
        out.append(ok("dspark", d.dspark_summary()))
    return out


def _fix(d: DraftFile, check: str) -> str:
    """d2t is the converter's to write; the block size and the block layout come from the checkpoint; the
    confidence flag from the file's own tensors."""
    if check == "d2t":
        return f"ggtools convert dflash HF_DIR -o OUT --profile {LLAMACPP.name}"
    if check == "confidence_head":
        return f"ggtools doctor {d.path} --fix -o OUT"
    return f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT"


def _confidence_flag(d: DraftFile) -> list[Finding]:
    """dflash.has_confidence_head against the conf_proj tensors, as llama.cpp reads the key (common/speculative.cpp:
    its text compared with "true", a missing key read as true); a flag that is no BOOL is a model-file rule's."""
    key = d.key("has_confidence_head")
    stored, has = d.file.get(key), d.tensor(CONF_W) is not None
    if stored is not None and not isinstance(stored, bool):
        return []
    says_true = stored is not False
    if says_true is has:
        return []
    fix = _fix(d, "confidence_head")
    if says_true:
        what = "is missing, which llama.cpp reads as true," if stored is None else "is true"
        return [_llama("confidence_head", f"{key} {what} but the file has no conf_proj tensors", None, fix,
                       "--spec-draft-p-min > 0 is accepted but no confidence scores the drafts")]
    return [_llama("confidence_head", f"{key} is false but conf_proj is in the file", NO_CONFIDENCE_HEAD, fix,
                   "--spec-draft-p-min > 0 is refused though the drafter has its confidence head")]


# ---- lucebox ---------------------------------------------------------------------------------------------------

def _lb(check, message, says, fix, symptom=None, severity=ERROR) -> Finding:
    return Finding(check, severity, message, (Effect(LUCEBOX.runtime, says, symptom),), fix)


def lucebox_findings(d: DraftFile, H: int) -> list[Finding]:
    """draft_gguf_loader.cpp's DSpark block, and what its Markov chain (dspark_head.cpp) can use."""
    if not d.is_dspark:
        return []
    reconvert = f"ggtools convert dflash HF_DIR -o OUT --profile {LUCEBOX.name}"
    w1, w2 = d.tensor(MARKOV_W1), d.tensor(MARKOV_W2)
    if w1 is None or w2 is None:
        return [_lb("dspark", "a DSpark head tensor or key without both Markov tensors", LB_MARKOV_INCOMPLETE,
                    reconvert, "the drafter does not load")]
    R = d.int_value("markov_rank") or int(w1.ne[0])
    V = d.int_value("dspark_vocab_size") or int(w1.ne[1])
    for t, what in ((w1, "dspark.markov.w1"), (w2, "dspark.markov.w2")):
        if _ne4(t.ne)[:2] != (R, V) or _ne4(t.ne)[2:] != (1, 1):
            return [_lb("dspark", f"{t.name} has ne {list(t.ne)}, the loader wants [{R}, {V}]",
                        f"draft GGUF: Domino tensor {what} shape mismatch: got [{t.ne[0]},{_ne4(t.ne)[1]}], "
                        f"expected [{R},{V}]", reconvert, "the drafter does not load")]
    cw, cb = d.tensor(CONF_W), d.tensor(CONF_B)
    if cw is not None or cb is not None or d.int_value("confidence_dim"):
        if cw is None or cb is None:
            return [_lb("dspark", "the confidence head lacks its weight or its bias", LB_CONF_INCOMPLETE, reconvert,
                        "the drafter does not load")]
        C = d.int_value("confidence_dim") or int(cw.ne[0])
        if _ne4(cw.ne) != (C, 1, 1, 1):
            return [_lb("dspark", f"{cw.name} has ne {list(cw.ne)}, the loader wants [{C}, 1]",
                        f"draft GGUF: Domino tensor dspark.confidence.weight shape mismatch: got "
                        f"[{cw.ne[0]},{_ne4(cw.ne)[1]}], expected [{C},1]", reconvert, "the drafter does not load")]
        if _ne4(cb.ne) != (1, 1, 1, 1):
            return [_lb("dspark", f"{cb.name} has ne {list(cb.ne)}, the loader wants [1]",
                        f"draft GGUF: Domino tensor dspark.confidence.bias shape mismatch: got [{cb.ne[0]}], "
                        "expected [1]", reconvert, "the drafter does not load")]
        if H and C not in (H + R, H):
            return [_lb("dspark", f"confidence width {C} is neither n_embd + rank ({H + R}) nor n_embd ({H})", None,
                        reconvert, "every Markov step fails and the drafter falls back to the plain DFlash "
                                   "projection", severity=WARNING)]
    return [ok("dspark", d.dspark_summary())]


def lucebox_vocab(d: DraftFile, target_vocab: int | None) -> Finding | None:
    """dspark_markov_correct_greedy_chain: the Markov head's vocabulary is the target's (pair rule)."""
    if not d.is_dspark or target_vocab is None or d.tensor(MARKOV_W1) is None:
        return None
    V = d.int_value("dspark_vocab_size") or int(d.tensor(MARKOV_W1).ne[1])
    if V == target_vocab:
        return ok("dspark_vocab", f"Markov head vocabulary {V} = the target's")
    return _lb("dspark_vocab", f"the Markov head's vocabulary {V} differs from the target's {target_vocab}",
               f"dspark_markov_correct_greedy_chain: vocab mismatch target={target_vocab} dspark={V}",
               "use the drafter trained for this target", "every Markov step fails and the drafter falls back to the "
                                                          "plain DFlash projection")


def _ne4(ne) -> tuple:
    return tuple(int(x) for x in ne) + (1,) * (4 - len(ne))


def lucebox_stray(d: DraftFile) -> list[Finding]:
    """Tensors a lucebox-layout file may carry that its loader never reads (a llama.cpp file moved by hand)."""
    stray = [n for n in ("d2t", "markov_w2.scale") if n in d.file.tensor]
    if not stray:
        return []
    return [_lb("dspark", f"tensors lucebox's loader does not read: {stray}", None,
                f"ggtools convert dflash HF_DIR -o OUT --profile {LLAMACPP.name}",
                "ignored: the drafts differ from what the drafter was trained to give", WARNING)]

