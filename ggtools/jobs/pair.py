"""pair-check: does this drafter GGUF load and draft with this target GGUF?

The drafter's profile follows from its arch (`dflash` -> llama.cpp, `qwen35-dflash-draft` & aliases -> lucebox).
First the profile's loader rules (loaders.py), then the pair: hidden sizes, fc width = n_ids x target hidden,
target layers within the target's blocks in the profile's id convention, mask id within the target vocabulary,
and (llama.cpp) whether the target arch exposes layer inputs at all and shares the drafter's vocabulary.
Every failure carries the error the runtime would print and the fix. Exit 1 on any failure.
"""

from dataclasses import dataclass

from ggtools.dflash.loaders import Drafter, Finding, check_drafter
from ggtools.dflash.target import OpenTarget, TargetInfo
from ggtools.gguf import ShardSet


@dataclass
class PairReport:
    target: str
    draft: str
    profile: str
    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def exit_code(self) -> int:
        return 1 if self.errors else 0

    @property
    def error(self) -> str | None:
        """One line for a failed check: how many, and the first."""
        if not self.errors:
            return None
        first = self.errors[0]
        return f"{len(self.errors)} check(s) failed; first: {first.check}: {first.message}"

    def as_dict(self):
        return {"target": self.target, "draft": self.draft, "profile": self.profile, "ok": not self.errors,
                "exit_code": self.exit_code, "error": self.error, "findings": [f.as_dict() for f in self.findings]}


def pair_check(target_path, draft_path) -> PairReport:
    with ShardSet(draft_path) as draft_set, OpenTarget(target_path) as target:
        d = check_drafter(draft_set.first)
        findings = list(d.findings)
        if d.profile != "unknown":
            findings += pair_findings(d, target, draft_set.first)
    return PairReport(str(target_path), str(draft_path), d.profile, findings)


def pair_findings(d: Drafter, t: TargetInfo, draft_file) -> list[Finding]:
    out = [_hidden(d, t), _fc_width(d, t)]
    out += _layers(d, t)
    out.append(_mask(d, t))
    if d.profile == "llama.cpp":
        out.append(_taps(t))
        out.append(_vocab(draft_file, t))
    return [f for f in out if f is not None]


def _hidden(d, t) -> Finding | None:
    if d.hidden is None or t.hidden is None:
        return None
    if d.hidden == t.hidden:
        return Finding("hidden", "ok", f"hidden size {d.hidden} = target embedding_length")
    n = len(d.stored_ids or [])
    said = (f"encode: embd row width {n * t.hidden} does not match the encoder input {n * d.hidden}"
            if d.profile == "llama.cpp" else "no loader check: the draft graph's fc matmul fails (ggml abort)")
    return Finding("hidden", "error", f"drafter hidden size {d.hidden} != target embedding_length {t.hidden}: "
                   "the drafter belongs to another model", said, "use the drafter trained for this target")


def _fc_width(d, t) -> Finding | None:
    if d.fc_in is None or d.stored_ids is None or t.hidden is None:
        return None
    want = len(d.stored_ids) * t.hidden
    if d.fc_in == want:
        return Finding("fc", "ok", f"fc input width {d.fc_in} = {len(d.stored_ids)} ids x target hidden {t.hidden}")
    said = (f"encode: embd row width {want} does not match the encoder input {d.fc_in}"
            if d.profile == "llama.cpp" else f"GGUF shape mismatch: dflash.fc.weight->ne[0]={d.fc_in} != "
            f"n_target_layers*n_embd={len(d.stored_ids)}*{t.hidden}={want}")
    return Finding("fc", "error", f"fc takes {d.fc_in} inputs, but {len(d.stored_ids)} target layers x target "
                   f"hidden {t.hidden} = {want}", said, "the layer id list does not match the fc weight: reconvert "
                   "with the ids the drafter was trained with")


def _layers(d, t) -> list[Finding]:
    if d.stored_ids is None or t.n_layer is None:
        return []
    if d.profile == "llama.cpp":
        # GGUF id g taps t_layer_inp[g], the input of target layer g; at 0c1e570 t_layer_inp[n_layer] is never set.
        bad = [g for g in d.stored_ids if not 1 <= g <= t.n_layer - 1]
        if bad:
            return [Finding("target_layers", "error", f"dflash.target_layers {d.stored_ids} (HF ids + 1): {bad} "
                            f"outside 1..{t.n_layer - 1} for the {t.n_layer}-layer target",
                            'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")',
                            "store HF target_layer_ids + 1, each below the target's block_count "
                            "(`ggtools convert dflash` does)")]
        return [Finding("target_layers", "ok", f"target layers {d.stored_ids} (HF {d.hf_ids}) within the "
                        f"{t.n_layer}-layer target")]
    bad = [i for i in d.stored_ids if not 0 <= i < t.n_layer]
    if bad:
        return [Finding("target_layer_ids", "error", f"target_layer_ids {d.stored_ids}: {bad} not layers of the "
                        f"{t.n_layer}-layer target", f"drafter target_layer_ids invalid (n={len(d.stored_ids)}, "
                        f"slots={t.n_layer}) -- lucebox then keeps derived ids and drafts badly",
                        "write the HF target_layer_ids the drafter was trained with")]
    return [Finding("target_layer_ids", "ok", f"target layer ids {d.stored_ids} within the {t.n_layer}-layer target")]


def _mask(d, t) -> Finding | None:
    if d.mask_id is None or t.vocab is None:
        return None     # a missing llama.cpp mask id is a loader finding; lucebox takes it from the target
    if d.mask_id < t.vocab:
        return Finding("mask_token_id", "ok", f"mask token id {d.mask_id} < target vocabulary {t.vocab}")
    if d.profile == "lucebox":
        return Finding("mask_token_id", "warning", f"stored mask token id {d.mask_id} is outside the target's "
                       f"{t.vocab}-token vocabulary", "not read by lucebox (it takes the mask id from the target)",
                       f"ggtools patch set DRAFT {d.arch}.dflash.mask_token_id=u32:<the target's mask id> --in-place")
    return Finding("mask_token_id", "error", f"mask token id {d.mask_id} is outside the target's {t.vocab}-token "
                   "vocabulary", f"bad special token: 'tokenizer.ggml.mask_token_id' = {d.mask_id}, using default "
                   "id -1", "ggtools patch mask-token DRAFT --id <the target's mask token id> --in-place")


def _taps(t) -> Finding:
    if t.exposes_layer_inputs:
        return Finding("target_arch", "ok", f"target arch '{t.arch}' exposes layer inputs")
    return Finding("target_arch", "error", f"llama.cpp's '{t.arch}' graph never sets t_layer_inp",
                   'GGML_ASSERT(t_layer_inp[il] != nullptr && "layer input tensor is null")',
                   "this target arch cannot drive a DFlash drafter in llama.cpp")


def _vocab(draft_file, t) -> Finding | None:
    a, b = draft_file.kv.get("tokenizer.ggml.tokens"), t.file.kv.get("tokenizer.ggml.tokens")
    if a is None or b is None:
        return None
    if bytes(a.raw) == bytes(b.raw):
        return Finding("vocab", "ok", f"same {a.count}-token vocabulary as the target")
    return Finding("vocab", "warning", f"the drafter's vocabulary ({a.count} tokens) differs from the target's "
                   f"({b.count}): drafted token ids would mean other tokens", None,
                   "reconvert with `ggtools convert dflash --target-gguf TARGET`")
