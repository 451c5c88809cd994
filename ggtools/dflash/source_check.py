"""A drafter GGUF against the Hugging Face checkpoint it came from: every value (RoPE base, mask id, target layer
ids, block size, eps, head dims, DFlash2 keys) and every tensor's content against a fresh conversion.

Returns the findings and the fixes the checkpoint supports (role -> the checkpoint's value). A value the
checkpoint does not state is `unchecked`: the rule cannot pass without its evidence.
"""

import hashlib

from gguf import GGMLQuantizationType as T

from ggtools.dflash.checkpoint import Checkpoint
from ggtools.dflash.config import DraftConfig, draft_config, rope_base
from ggtools.dflash.config_reader import F32
from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.findings import ERROR, WARNING, Effect, Finding, ok, unchecked
from ggtools.dflash.loaders import speculative_log_line
from ggtools.dflash.pair_rules import rope_effects
from ggtools.dflash.profiles import DSPARK_ROLES, LLAMACPP, V2_KEYS
from ggtools.dflash.tensors import encode_chunks
from ggtools.quants import dequantize, quantize

HPARAMS = ("embedding_length", "block_count", "feed_forward_length", "attention.head_count",
           "attention.head_count_kv", "attention.key_length", "attention.value_length")
CONVERTER_OUTTYPES = {T.BF16: "bf16", T.F16: "f16", T.F32: "f32", T.Q8_0: "q8_0"}


def source_findings(d: DraftFile, ckpt: Checkpoint, runtimes) -> tuple[list[Finding], dict]:
    cfg = draft_config(ckpt)
    want = expected_values(d, ckpt, cfg)
    stored = stored_values(d)
    fixes = {role: v for role, (v, _) in want.items() if v is not None and not _same(stored.get(role), v)}
    out = [_rope(d, stored, want, runtimes), _mask(d, stored, want, runtimes), _ids(d, stored, want, runtimes),
           _block_size(d, stored, want, runtimes), _hparams(d, stored, want, runtimes)]
    if cfg.version == 2:
        out.append(_values_finding(d, "dflash2", V2_KEYS, stored, want, runtimes, "DFlash2 keys"))
    if cfg.dspark is not None:
        roles = [r for r in DSPARK_ROLES if r in want]
        out.append(_values_finding(d, "dspark", roles, stored, want, runtimes, "DSpark keys"))
    out.append(tensor_findings(d, ckpt, cfg, runtimes))
    return out, fixes


def expected_values(d: DraftFile, ckpt: Checkpoint, cfg: DraftConfig) -> dict:
    """role -> (the checkpoint's value or None, where config.json states it)."""
    theta, theta_from = rope_base(ckpt)
    eps = ckpt.numbers.get(ckpt.config, "rms_norm_eps", F32)
    want = {"rope.freq_base": (theta, theta_from), "mask": (cfg.mask_token_id, cfg.mask_from),
            "target_ids": (cfg.target_layer_ids, cfg.ids_from), "block_size": (cfg.block_size, cfg.block_size_from),
            "attention.layer_norm_rms_epsilon": (eps, "rms_norm_eps")}
    for role, v in zip(HPARAMS, (cfg.hidden, cfg.n_layer, cfg.n_ff, cfg.n_head, cfg.n_head_kv, cfg.head_dim,
                                 cfg.head_dim)):
        want[role] = (v, "config.json")
    if d.profile.has_key("n_target_ids"):
        want["n_target_ids"] = (len(cfg.target_layer_ids), "dflash_config.target_layer_ids")
    if cfg.version == 2:
        want |= {k: (cfg.v2[k], f"dflash_config.{k}") for k in V2_KEYS}
    if cfg.dspark is not None:
        want |= {role: v for role, v in _dspark_values(cfg).items() if d.profile.has_key(role)}
    return want


def _dspark_values(cfg: DraftConfig) -> dict:
    ds = cfg.dspark
    out = {"sample_from_anchor": (ds.sample_from_anchor, ds.anchor_from),
           "has_confidence_head": (ds.confidence, "confidence_head.proj tensors"),
           "dspark_enabled": (1, "the Markov head"), "markov_rank": (ds.rank, "markov_w1's shape"),
           "dspark_vocab_size": (ds.vocab, "vocab_size")}
    if ds.confidence:
        out |= {"confidence_dim": (cfg.hidden + ds.rank, "hidden_size + markov rank"),
                "confidence_enabled": (1, "confidence_head.proj tensors")}
    return out


def stored_values(d: DraftFile) -> dict:
    """role -> the number the file stores (None where it stores none, or a value of another type: a string, an
    array; the model-file rules report those, and --fix writes the checkpoint's value)."""
    out = {role: _number(d.value(role)) for role in (*HPARAMS, *V2_KEYS, "rope.freq_base", "block_size",
                                                     "n_target_ids", "attention.layer_norm_rms_epsilon")}
    out |= {role: _number(d.value(role), flags=True) for role in DSPARK_ROLES}
    return out | {"mask": _number(d.mask[0]), "target_ids": d.hf_ids}


def _number(v, flags=False):
    """v when it is a number (or, with flags, a bool: DSpark's switches), else None."""
    if isinstance(v, bool):
        return v if flags else None
    return v if isinstance(v, (int, float)) else None


def _same(a, b) -> bool:
    if a is None:
        return False
    if isinstance(b, float):
        return abs(float(a) - b) <= 1e-6 * max(abs(b), 1e-30)
    if isinstance(b, list):
        return list(a) == list(b)
    return a == b


def _fix(d: DraftFile) -> str:
    return f"ggtools doctor {d.path} --hf HF_DIR --fix -o OUT"


def _rope(d, stored, want, runtimes) -> Finding:
    theta, where = want["rope.freq_base"]
    if theta is None:
        return unchecked("rope_theta", f"config.json states no RoPE base ({where})")
    if _same(stored["rope.freq_base"], theta):
        return ok("rope_theta", f"RoPE base {theta:g} = config.json {where}")
    have = stored["rope.freq_base"]
    return Finding("rope_theta", ERROR, f"{d.key('rope.freq_base')} is {have if have is None else f'{have:g}'}, "
                   f"the checkpoint's {where} is {theta:g}", rope_effects(have or 0.0, runtimes), _fix(d))


def _mask(d, stored, want, runtimes) -> Finding:
    mask, where = want["mask"]
    if mask is None:
        return unchecked("mask_token_id", "config.json states no mask_token_id (neither dflash_config nor top "
                                          "level)")
    if stored["mask"] == mask:
        return ok("mask_token_id", f"mask token id {mask} = config.json {where}")
    effects = []
    for r in runtimes:
        if r == LLAMACPP.runtime:
            effects.append(Effect(r, speculative_log_line(d, stored["block_size"] or LLAMACPP.default_block_size),
                                  "the noise block is filled with the wrong token: acceptance near 0"))
        elif r == "ggtools":
            effects.append(Effect(r, None, "the noise block is filled with the wrong token: acceptance near 0"))
    severity = ERROR if effects else WARNING      # lucebox takes the mask id from the target
    return Finding("mask_token_id", severity, f"{d.mask[1] or d.key('mask')} is {stored['mask']}, the checkpoint's "
                   f"{where} is {mask}", tuple(effects), _fix(d))


def _ids(d, stored, want, runtimes) -> Finding:
    ids, where = want["target_ids"]
    have = stored["target_ids"]
    if have == ids:
        return ok("target_layers", f"target layers {d.stored_ids} = HF {ids} ({where}) in the {d.profile.name} "
                                   f"convention ({d.profile.id_convention})")
    shifted = have is not None and len(have) == len(ids) and {h - i for h, i in zip(have, ids)} in ({-1}, {1})
    why = (f"off by one: stored {d.stored_ids} are {'HF ids' if d.profile.ids_offset else 'HF ids + 1'}, the "
           f"{d.profile.name} layout stores {d.profile.id_convention}"
           if shifted else f"stored {d.stored_ids}")
    effects = tuple(Effect(r, None, "loads and drafts from the wrong target layers: acceptance silently low")
                    for r in runtimes)
    return Finding("target_layers", ERROR, f"{d.key('target_ids')}: {why}; the checkpoint's {where} is {ids} "
                   f"(stored as {d.profile.stored_ids(ids)})", effects, _fix(d))


def _block_size(d, stored, want, runtimes) -> Finding:
    block, where = want["block_size"]
    if stored["block_size"] == block:
        return ok("block_size", f"block size {block} = config.json {where}")
    have = stored["block_size"]
    says = {LLAMACPP.runtime: speculative_log_line(d, have or LLAMACPP.default_block_size)}
    effects = tuple(Effect(r, says.get(r), f"drafts up to {max((have or 1) - 1, 0)} tokens per step where the "
                           f"drafter was trained on {block - 1}") for r in runtimes)
    return Finding("block_size", ERROR, f"{d.key('block_size')} is {stored['block_size']}, the checkpoint's "
                   f"{where} is {block}", effects, _fix(d))


def _hparams(d, stored, want, runtimes) -> Finding:
    return _values_finding(d, "hparams", ("attention.layer_norm_rms_epsilon", *HPARAMS), stored, want, runtimes,
                           "eps and head dims")


def _values_finding(d, check, roles, stored, want, runtimes, what) -> Finding:
    missing = [r for r in roles if want[r][0] is None]
    if missing:
        return unchecked(check, f"config.json states no {', '.join(missing)}")
    wrong = [r for r in roles if not _same(stored[r], want[r][0])]
    if not wrong:
        return ok(check, f"{what} = config.json")
    diffs = "; ".join(f"{d.key(r)} {stored[r]} (checkpoint {want[r][0]})" for r in wrong)
    says = {}
    eps = stored.get("attention.layer_norm_rms_epsilon")
    if "attention.layer_norm_rms_epsilon" in wrong and eps is not None:
        says[LLAMACPP.runtime] = f"print_info: f_norm_rms_eps        = {eps:.1e}"
    effects = tuple(Effect(r, says.get(r), "wrong numbers in every draft step (or shapes that do not load)")
                    for r in runtimes)
    return Finding(check, ERROR, diffs, effects, _fix(d))


def tensor_findings(d: DraftFile, ckpt: Checkpoint, cfg: DraftConfig, runtimes) -> Finding:
    """Every tensor against a fresh conversion in the file's profile, at the file's own tensor types."""
    outtype = _outtype(d, ckpt)
    jobs = d.profile.conversion_tensors(ckpt, cfg, outtype)
    differ, absent = [], []
    for job in jobs:
        name = d.profile.find_tensor(d.file.tensor, job.name)
        if name is None:
            absent.append(job.name)
            continue
        t = d.file.tensor[name]
        if tuple(t.ne) != tuple(job.ne) or _fresh_digest(job, t.type_id) != _file_digest(d, t):
            differ.append(name)
    fresh = {d.profile.find_tensor(d.file.tensor, j.name) for j in jobs}
    extra = [t.name for t in d.file.tensors if t.name not in fresh]
    if not (differ or absent or extra):
        return ok("tensor_data", f"all {len(jobs)} tensors equal a fresh {d.profile.name} conversion")
    parts = [f"{len(differ)} differ ({', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''})" if differ else "",
             f"missing {absent[:4]}" if absent else "", f"not from the checkpoint {extra[:4]}" if extra else ""]
    return Finding("tensor_data", ERROR, "tensors against a fresh conversion of the checkpoint: " +
                   "; ".join(p for p in parts if p),
                   tuple(Effect(r, None, "drafts from other weights: acceptance silently low") for r in runtimes),
                   f"ggtools convert dflash {ckpt.path} -o OUT --profile {d.profile.name}")


def _outtype(d: DraftFile, ckpt) -> str:
    if not d.profile.takes_outtype:
        return "auto"
    fc = d.tensor("fc.weight")
    return CONVERTER_OUTTYPES.get(fc.type_id, "auto") if fc is not None else "auto"


def _fresh_digest(job, type_id) -> str:
    """sha256 of the fresh conversion of job stored as type_id (requantized from the profile's own type)."""
    h = hashlib.sha256()
    for chunk in encode_chunks(job):
        data = chunk.data
        if type_id != job.dst_type:
            data = quantize(type_id, dequantize(job.dst_type, data, job.src.row_length))
        h.update(data)
    return h.hexdigest()


def _file_digest(d: DraftFile, t) -> str:
    return hashlib.sha256(d.file.tensor_data(t)).hexdigest()
