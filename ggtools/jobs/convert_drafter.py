"""convert drafter: any drafter checkpoint llama.cpp's converter takes -> a drafter GGUF, the family detected from
config.json (DFlash v1, DFlash2, DSpark: convert dflash's conversion; EAGLE3: dflash/eagle3_convert.py) and named
in one line (`found`).

EAGLE3 takes its target from the target's GGUF (`target`): the trunk's layer count (block_count -
nextn_predict_layers), its hidden size, its vocabulary and the tokenizer embedded in the drafter. `target_model_dir`,
llama.cpp's `--target-model-dir`, may be given too: its config.json then supplies the layer count, hidden size and
vocab_size as llama.cpp's converter reads them (and must describe the same model as the GGUF). It cannot replace the
GGUF: llama.cpp's converter builds the tokenizer from that directory's tokenizer files, which ggtools does not
reimplement; the GGUF's tokenizer is what llama.cpp built from them.
"""

import contextlib
import json
import os
from dataclasses import dataclass, field

from ggtools.dflash import eagle3 as E
from ggtools.dflash.checkpoint import files_of, read_config
from ggtools.dflash.config_reader import U32, ConfigReader
from ggtools.dflash.eagle3_checkpoint import is_eagle3, open_eagle3
from ggtools.dflash.eagle3_convert import Eagle3Config, TargetFacts, plan as plan_eagle3_tensors
from ggtools.dflash.target import OpenTarget, TargetInfo
from ggtools.gguf import ggml_type_name
from ggtools.gguf.inputs import regular_file
from ggtools.gguf.outputs import check_output
from ggtools.jobs.convert import OUTTYPES, ConvertError, _encoded, plan_convert, planned_header, write
from ggtools.jobs.errors import UsageError
from ggtools.jobs.planned_output import refuse_invalid_output
from ggtools.plan import Plan, ShardPlan, TensorAction

EAGLE3, DFLASH = "EAGLE3", "DFlash"


@dataclass
class Eagle3Plan:
    hf_dir: str
    out: str
    outtype: str
    cfg: Eagle3Config
    kvs: object
    jobs: list
    found: str
    warnings: list[str] = field(default_factory=list)
    inputs: list[str] = field(default_factory=list)
    profile: str = "llama.cpp"          # EAGLE3 GGUFs exist in llama.cpp's layout only
    family: str = EAGLE3

    @property
    def bytes_out(self) -> int:
        return sum(j.nbytes for j in self.jobs)

    def as_plan(self) -> Plan:
        actions = [TensorAction(j.name, j.ne, int(j.src.ggml_type), int(j.dst_type), f"{j.src.name}: {j.reason}",
                                j.src.nbytes, j.nbytes) for j in self.jobs]
        return Plan("convert drafter (EAGLE3)", [ShardPlan(self.hf_dir, self.out, actions)])

    def as_dict(self) -> dict:
        c = self.cfg
        return {"hf_dir": self.hf_dir, "out": self.out, "family": self.family, "profile": self.profile,
                "outtype": self.outtype, "found": self.found, "target_layers": c.target_layers,
                "target_layers_from": c.layers_from, "target_hidden_size": c.target_hidden,
                "target_hidden_size_from": c.hidden_from, "draft_vocab": c.draft_vocab, "vocab": c.vocab,
                "norm_before_residual": c.norm_before_residual, "norm_before_fc": c.norm_before_fc,
                "spec_type": E.SPEC_TYPE, "metadata": self.kvs.as_dict(), "warnings": self.warnings,
                "tensors": [{"name": j.name, "source": j.src.name, "ne": list(j.ne), "from": j.src.dtype,
                             "to": ggml_type_name(j.dst_type), "bytes": j.nbytes, "reason": j.reason}
                            for j in self.jobs]}


def drafter_family(hf_dir) -> str:
    """EAGLE3 or DFlash (v1, DFlash2, DSpark: convert dflash says which), from config.json."""
    config, _ = read_config(os.fspath(hf_dir))
    return EAGLE3 if is_eagle3(config) else DFLASH


def convert_drafter(hf_dir, out, *, target=None, target_model_dir=None, profile="llama.cpp", outtype="auto",
                    mask_token_id=None, guess_target_layers=False, name=None, dry_run=False, force=False,
                    allow_overflow=False, on_bytes=None):
    """Plan and (unless dry_run) write; returns the plan for a dry run, else convert's ConvertResult."""
    with (OpenTarget(target) if target else contextlib.nullcontext()) as tgt:
        plan = plan_drafter(hf_dir, out, target=tgt, target_model_dir=target_model_dir, profile=profile,
                            outtype=outtype, mask_token_id=mask_token_id, guess_target_layers=guess_target_layers,
                            name=name)
    if dry_run:
        return plan
    return write(plan, force=force, allow_overflow=allow_overflow, on_bytes=on_bytes)


def plan_drafter(hf_dir, out, *, target: TargetInfo | None = None, target_model_dir=None, profile="llama.cpp",
                 outtype="auto", mask_token_id=None, guess_target_layers=False, name=None):
    if not os.path.isdir(os.fspath(hf_dir)):
        raise ConvertError(f"{hf_dir}: not a directory (expected a Hugging Face model directory)")
    if drafter_family(hf_dir) == DFLASH:
        if target_model_dir is not None:
            raise UsageError("--target-model-dir", "applies to EAGLE3 drafters; a DFlash / DSpark drafter takes its "
                                                   "target from --target-gguf")
        return plan_convert(hf_dir, out, profile=profile, target=target, outtype=outtype,
                            mask_token_id=mask_token_id, guess_target_layers=guess_target_layers, name=name)
    for option, given in (("--mask-token-id", mask_token_id is not None),
                          ("--guess-target-layers", guess_target_layers), ("--profile", profile != "llama.cpp")):
        if given:
            raise UsageError(option, f"applies to DFlash / DSpark drafters; {hf_dir} is an EAGLE3 drafter"
                                     + (" (EAGLE3 GGUFs exist in llama.cpp's layout only: lucebox has no EAGLE3 "
                                        "loader)" if option == "--profile" else ""))
    return plan_eagle3(hf_dir, out, target=target, target_model_dir=target_model_dir, outtype=outtype, name=name)


def plan_eagle3(hf_dir, out, *, target: TargetInfo | None, target_model_dir=None, outtype="auto",
                name=None) -> Eagle3Plan:
    if outtype not in OUTTYPES:
        raise ConvertError(f"unknown outtype '{outtype}' (one of {', '.join(OUTTYPES)})")
    ckpt = open_eagle3(hf_dir)
    if target is None:
        raise ConvertError(f"{ckpt.path}: an EAGLE3 drafter needs its target (llama.cpp's converter: "
                           f"\"{E.SAYS_NEEDS_TARGET}\"): pass --target-gguf TARGET.gguf, whose tokenizer is "
                           "embedded and whose layer count and hidden size the drafter is checked against "
                           "(--target-model-dir alone cannot give the tokenizer: ggtools does not rebuild a GGUF "
                           "vocabulary from Hugging Face tokenizer files)")
    if not target.has_tokenizer:
        raise ConvertError(f"{target.path}: the target has no tokenizer (tokenizer.ggml.tokens): the drafter embeds "
                           "it, and llama.cpp refuses a drafter without one; pass the target's GGUF that carries its "
                           "vocabulary (shard 1 of a split set)")
    dir_inputs = files_of(target_model_dir) if target_model_dir is not None else []
    inputs = files_of(ckpt.path) + target.paths + [p for p in dir_inputs if os.path.isfile(p)]
    check_output(out, inputs, force=True)
    facts = target_facts(target, target_model_dir)
    resolved, cfg, jobs, kvs = plan_eagle3_tensors(ckpt, facts, outtype, name)
    plan = Eagle3Plan(ckpt.path, str(out), resolved, cfg, kvs, jobs, cfg.summary(ckpt),
                      tap_warnings(cfg, facts) + [f"skipped (the converter skips them too): {n}" for n in ckpt.skipped],
                      inputs)
    refuse_invalid_output(planned_header(plan), lambda n: _encoded(plan, n))
    return plan


def target_facts(target: TargetInfo, target_model_dir=None) -> TargetFacts:
    """The target's layer count, hidden size and vocabulary: from --target-model-dir's config.json as llama.cpp's
    converter reads them when it is given (and the GGUF must agree), else from the GGUF."""
    nextn = target.file.get(f"{target.arch}.nextn_predict_layers")
    trunk = target.n_layer - nextn if target.n_layer is not None and isinstance(nextn, int) and \
        not isinstance(nextn, bool) and 0 <= nextn < target.n_layer else target.n_layer
    tokenizer = tuple(target.tokenizer_kvs)
    if target_model_dir is None:
        return TargetFacts(trunk, target.hidden, target.vocab, target.path, target.arch, tokenizer, target.vocab)
    path = os.path.join(os.fspath(target_model_dir), "config.json")
    config = _target_config(path)
    n = ConfigReader(path)
    layers = n.require(config, "num_hidden_layers", U32)
    vocab = n.require(config, "vocab_size", U32)
    hidden = n.get(config, "hidden_size", U32)
    for what, there, here in (("layers", layers, trunk), ("hidden size", hidden, target.hidden)):
        if there is not None and here is not None and there != here:
            raise ConvertError(f"{path}: the target's {what} is {there}, but {target.path} has {here}: "
                               "--target-model-dir and --target-gguf describe different models")
    return TargetFacts(layers, hidden, vocab, path, target.arch, tokenizer, target.vocab)


def _target_config(path) -> dict:
    """The target dir's config.json with its text_config merged in (as the converter reads it)."""
    try:
        regular_file(path)
        with open(path, encoding="utf-8") as fh:
            config = json.load(fh)
    except FileNotFoundError:
        raise ConvertError(f"{path}: missing (--target-model-dir names the target's Hugging Face directory)") from None
    except (OSError, ValueError, RecursionError) as e:
        raise ConvertError(f"{path}: cannot read as JSON: {e}") from None
    if not isinstance(config, dict):
        raise ConvertError(f"{path}: is not a JSON object")
    text = config.get("text_config")
    return {**config, **text} if isinstance(text, dict) else config


def tap_warnings(cfg: Eagle3Config, t: TargetFacts) -> list[str]:
    """What converts but does not draft well in llama.cpp: a target arch without the tapped features."""
    out = []
    if t.arch is None or t.n_layer is None:
        return out
    below = [i for i in cfg.target_layers if i < t.n_layer]
    if below and t.arch not in E.TAP_ARCHS:
        out.append(f"target arch '{t.arch}' does not expose layer inputs in llama.cpp: drafting aborts "
                   f"(\"{E.SAYS_NO_TAP}\")")
    if t.n_layer in cfg.target_layers and t.arch not in E.NEXTN_ARCHS:
        out.append(f"target layer id {t.n_layer} is the {t.n_layer}-layer target's last output, which llama.cpp "
                   f"reads from t_h_nextn; the '{t.arch}' graph never writes it, so the drafter reads stale "
                   "features without a word (acceptance near 0)")
    return out
