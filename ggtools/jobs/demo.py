"""demo: the embedded demo pair end to end, with no downloads; then requant-trunk on a sample MoE shard set.

The HF drafter shipped in ggtools/data/demo is copied to a work directory, converted (llama.cpp profile, the
embedded target GGUF for tokenizer and checks), quantized (q8_0, q4-mix, q2_k), validated and pair-checked (and
so are the shipped DSpark drafter, converted to f16, and the shipped EAGLE3 drafter, converted by convert drafter),
then every variant decodes a few held-out prompts speculatively with the draft-KV ring (f16 also with a full
draft KV), each against target-only decoding of the same prompts in the same run (jobs/accept.py's `measure`,
as `ggtools accept`); the f16 drafter also decodes them sampled (T 0.8, seed 42: SAMPLED), against target-only
sampled decoding with the same seed; and the shipped Qwen3.5 target with a trained MTP block (MTP_TARGET) decodes
them drafting with its own block, against its own target-only decoding. The prompts are windows of standard-library modules the pair never trained on
(demo_pair.json: corpus.held_out, eval.prompts).

The second part writes a small Kimi-like MoE shard set (samples.py), validates it, requantizes its Q8_0 trunk to
Q4_K (experts and norms byte-copied) and validates the result.

A work directory that already holds the demo's files (drafter/, moe/, moe-q4k/) is refused unless force: they
are replaced only then.
"""

import contextlib
import json
import os
import sysconfig
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from types import SimpleNamespace

from ggtools.byte_sizes import human_bytes
from ggtools.engine.errors import Interrupted
from ggtools.environment import check_environment
from ggtools.gguf import GGUFFile
from ggtools.gguf.outputs import copy_file, make_dir
from ggtools.jobs.accept import MTP, Candidate, drafter_bytes, measure
from ggtools.jobs.accept_temperatures import Decoding
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.convert_drafter import convert_drafter
from ggtools.jobs.doctor import pair_check
from ggtools.jobs.errors import JobError, UsageError
from ggtools.jobs.limits import check_draft_kv, check_threads
from ggtools.jobs.quantize import plan_quantize, quantize
from ggtools.jobs.requant import plan_requant_trunk, requant_trunk
from ggtools.jobs.validate import validate
from ggtools.jobs.run import SpecRun
from ggtools.jobs.sampling import sampling_params
from ggtools.runtime import DraftSettings, TargetModel, Tokenizer, numerics_note
from ggtools.samples import write_moe_set

SCHEMES = ("q8_0", "q4-mix", "q2_k")
DSPARK = "dspark-anchor"        # a trained DSpark drafter for the same target (docs/dspark.md)
EAGLE3 = "eagle3"               # a trained EAGLE3 drafter for the same target (docs/eagle3.md)
MTP_TARGET = "qwen35-mtp.gguf"  # a Qwen3.5 target with a trained MTP block (docs/mtp.md), the same vocabulary
PROMPT_TOKENS = 128
SAMPLED = (0.8, 42)             # the sampled row: the f16 drafter at this temperature, with this seed
ENTRIES = ("drafter", "moe", "moe-q4k")     # what the demo writes into its work directory


class DemoError(JobError):
    exit_code = 1       # a check of the demo failed (a write error is a GGUFError, exit 2)


@dataclass
class Variant:
    name: str                       # "f16", "q8_0", ... (+ " full KV")
    path: str
    bytes: int
    checks: str                     # "validate ok, pair-check ok" or what failed
    run: SpecRun | None = None      # the round with the fastest speculative decoding
    speedup: float = 0.0            # its tok/s over the fastest target-only decoding of the whole demo (the sampled
                                    # row: of target-only sampled decoding with its seed; MTP: of its own target)
    full_kv: bool = False           # a full draft KV (EAGLE3 and MTP always: they attend to every position)


@dataclass
class DemoReport:
    work_dir: str
    prompts: list[str]              # "module.py@token offset"
    rounds: int
    variants: list[Variant] = field(default_factory=list)
    target_tokens_per_second: float = 0.0   # fastest target-only decoding seen (every run decodes both ways)

    @property
    def all_match(self) -> bool:
        return all(v.run.outputs_match_target for v in self.variants if v.run)


@dataclass
class RequantDemo:
    shards: int
    bytes_in: int                   # the sample set
    bytes_out: int                  # the requantized set (0: not written, its source failed validation)
    source: str                     # the sample set's first shard
    output: str | None              # the requantized set's first shard
    exit_code: int = 0              # 0, or the exit code of the first validation that failed (the demo stops there)

    def to_dict(self) -> dict:
        return asdict(self)


def check_work_dir(work_dir, force: bool) -> None:
    """Refuse a work directory holding the demo's files from an earlier run, unless force."""
    found = [e + "/" for e in ENTRIES if os.path.lexists(os.path.join(work_dir, e))]
    if found and not force:
        raise UsageError(work_dir, f"holds {', '.join(found)} (an earlier demo's files): pass --force to replace "
                                   "them, or choose another --work-dir")


def check_request(n: int, threads: int | None = None, ring_cap: int = 64, device: str | None = None) -> None:
    """Refuse, before anything is written, threads beyond the machine's bound, a prompt plus -n beyond the demo
    target's context length, a draft KV ring beyond the memory available, and environment settings it does not
    know."""
    check_environment()
    check_threads(threads)
    with GGUFFile(demo_data() / "target.gguf") as f:
        context = int(f.get(f"{f.get('general.architecture')}.context_length"))
    if PROMPT_TOKENS + n > context:
        raise UsageError("-n", f"{n}: the demo's prompts of {PROMPT_TOKENS} tokens plus {n} new tokens do not fit "
                               f"the demo target's context length {context} (at most -n {context - PROMPT_TOKENS})")
    config = json.loads((demo_data() / "drafter" / "config.json").read_text())
    hp = SimpleNamespace(n_layer=config["num_hidden_layers"], n_head_kv=config["num_key_value_heads"],
                         head_dim=config["head_dim"], block_size=config["block_size"])
    check_draft_kv(SimpleNamespace(hp=hp, path="the demo drafter"), ring_cap, "f16", PROMPT_TOKENS + n,
                   device or "cpu")


def demo_data() -> Path:
    return Path(str(resources.files("ggtools") / "data" / "demo"))


def held_out_prompts(tokenizer: Tokenizer, count: int, length: int = PROMPT_TOKENS) -> list[tuple[str, list]]:
    """`count` windows of held-out stdlib modules, spread over demo_pair.json's evaluation prompts."""
    names = json.loads((demo_data() / "demo_pair.json").read_text())["eval"]["prompts"]["held_out"]
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    step = max(1, len(names) // count)
    out = []
    for name in names[::step]:
        module, _, at = name.partition("@")
        path = stdlib / module
        if not path.exists():
            continue
        ids = tokenizer.encode(path.read_text(encoding="utf-8", errors="replace"))
        start = min(int(at), max(0, len(ids) - length))
        if len(ids) >= length:
            out.append((f"{module}@{start}", ids[start:start + length]))
        if len(out) == count:
            break
    if not out:
        raise DemoError(f"no held-out standard-library module found under {stdlib}")
    return out


def run_demo(work_dir, *, prompts: int = 6, n: int = 64, ring_cap: int = 64, threads: int = 1, rounds: int = 2,
             log=lambda line: None, backend: str = "numba", device: str | None = None,
             dtype: str | None = None, force: bool = False) -> DemoReport:
    """Convert, quantize, check and decode (every variant `rounds` times, each run against target-only
    decoding; speeds are best rounds, as other processes on a shared machine slow runs at random);
    log(line) reports progress; backend, device, dtype: what runs the pairs (TargetModel); force: replace the
    files of an earlier demo in work_dir."""
    work = Path(work_dir)
    target = str(demo_data() / "target.gguf")
    check_request(n, threads, ring_cap, device)
    model = TargetModel(target, threads=threads, backend=backend, device=device, dtype=dtype)
    try:
        variants = build_drafters(work, target, log, force=force)
        tokenizer = Tokenizer.from_gguf(model.weights.meta)
        chosen = held_out_prompts(tokenizer, prompts)
        report = DemoReport(str(work), [name for name, _ in chosen], rounds)
        log(f"decoding {len(chosen)} held-out prompts x {n} tokens per variant, draft KV ring of {ring_cap} slots, "
            f"{model.ops.name} backend on {model.ops.device} ({model.ops.dtype}"
            f"{'; ' + note if (note := numerics_note(model.ops.name, model.ops.dtype)) else ''}), "
            f"{threads} thread(s), {rounds} rounds; every output is checked against target-only greedy decoding "
            f"(once per prompt and round, shared by the variants); f16 also sampled at T {SAMPLED[0]:g}, seed "
            f"{SAMPLED[1]}, against target-only sampled decoding with that seed")
        f16 = variants[0]
        report.variants = [Variant("f16, full KV", f16.path, f16.bytes, f16.checks, full_kv=True)] + variants
        candidates = [Candidate(v.name, v.path, None if v.full_kv else ring_cap) for v in report.variants]
        prompt_ids = [ids for _, ids in chosen]
        m = measure(model, candidates, prompt_ids, n, settings=DraftSettings(), stop_ids=tokenizer.eog,
                    rounds=rounds)
        report.target_tokens_per_second = m.target_tokens_per_second
        for v, run in zip(report.variants, m.runs):
            _measured(v, run, m.target_tokens_per_second, log)
        temp, seed = SAMPLED
        sampled = Variant(f"f16, T {temp:g}", f16.path, f16.bytes, f16.checks)
        s = measure(model, [Candidate(sampled.name, f16.path, ring_cap)], prompt_ids, n, settings=DraftSettings(),
                    stop_ids=tokenizer.eog, rounds=rounds,
                    decodings=[Decoding(temp, seed, sampling_params(model, {}, temp, seed))])
        _measured(sampled, s.runs[0], s.target_tokens_per_second, log)
        report.variants += [sampled, _mtp_row(prompts, n, rounds, log, threads=threads, backend=backend,
                                              device=device, dtype=dtype)]
        return report
    finally:
        model.close()


def _mtp_row(prompts: int, n: int, rounds: int, log, **runs_on) -> Variant:
    """The MTP row: the Qwen3.5 demo target drafting with its own MTP block the same held-out windows, against its
    own target-only decoding; runs_on: TargetModel's threads, backend, device, dtype."""
    target = str(demo_data() / MTP_TARGET)
    report = validate([target], deep=True)
    if report.exit_code:
        raise DemoError(f"validate FAILED: {'; '.join(map(str, report.errors))}")
    v = Variant(f"mtp ({MTP_TARGET})", target, drafter_bytes(MTP, target), "validate --deep ok (its MTP block)",
                full_kv=True)
    model = TargetModel(target, **runs_on)
    try:
        tokenizer = Tokenizer.from_gguf(model.weights.meta)
        chosen = [ids for _, ids in held_out_prompts(tokenizer, prompts)]
        m = measure(model, [Candidate(v.name, MTP, None)], chosen, n, settings=DraftSettings(), stop_ids=tokenizer.eog,
                    rounds=rounds)
        _measured(v, m.runs[0], m.target_tokens_per_second, log)
        return v
    finally:
        model.close()


def _measured(v: Variant, run: SpecRun, target_tps: float, log) -> None:
    v.run, v.speedup = run, run.speculative_tokens_per_second / target_tps
    log(f"  {v.name}: acceptance {run.acceptance_rate:.3f}, tau {run.stats['tau_zlab']:.2f}, speedup {v.speedup:.2f}x")


def build_drafters(work: Path, target: str, log=lambda line: None, force: bool = True) -> list[Variant]:
    """The embedded HF drafter copied into `work`, converted to f16 (llama.cpp profile) and quantized with each
    scheme; every file validated and pair-checked against `target`. force: replace files there."""
    work = Path(work)
    hf = work / "drafter-hf"
    make_dir(hf)
    for src in sorted((demo_data() / "drafter").iterdir()):
        copy_file(src, hf / src.name, force=force)
    f16 = work / "drafter-f16.gguf"
    convert_dflash(hf, f16, profile="llama.cpp", target=target, outtype="f16", force=force)
    log(f"converted {hf.name} -> {f16.name} (llama.cpp profile, --target-gguf target.gguf)")
    paths = [("f16", f16)]
    for scheme in SCHEMES:
        out = work / f"drafter-{scheme}.gguf"
        with _plain_interruption():
            quantize(plan_quantize(str(f16), str(out), scheme), force=force, progress=False)
        paths.append((scheme, out))
        log(f"quantized {f16.name} -> {out.name} (--scheme {scheme})")
    dspark = work / f"drafter-{DSPARK}-f16.gguf"
    convert_dflash(demo_data() / DSPARK, dspark, profile="llama.cpp", target=target, outtype="f16", force=True)
    log(f"converted {DSPARK} -> {dspark.name} (DSpark: anchor-first, Markov and confidence heads)")
    paths.append(("dspark f16", dspark))
    eagle3 = work / "drafter-eagle3-f16.gguf"
    convert_drafter(demo_data() / EAGLE3, eagle3, target=target, outtype="f16", force=True)
    log(f"converted {EAGLE3} -> {eagle3.name} (EAGLE3: convert drafter, the family detected)")
    paths.append(("eagle3 f16", eagle3))
    variants = []
    for name, path in paths:
        checks = _checks(target, str(path))
        variants.append(Variant(name, str(path), os.path.getsize(path), checks, full_kv=path == eagle3))
        log(f"  {path.name}: {checks}")
    return variants


def _checks(target: str, draft: str) -> str:
    v, p = validate([draft], deep=True), pair_check(target, draft)
    if v.exit_code or p.exit_code:
        raise DemoError(f"{draft}: validate {'ok' if not v.exit_code else 'FAILED'}, pair-check "
                        f"{'ok' if not p.exit_code else 'FAILED: ' + '; '.join(f.message for f in p.errors)}")
    return "validate --deep ok, pair-check ok"


def requant_demo(root, *, log=lambda line: None, show_plan=lambda plan: None, force: bool = True) -> RequantDemo:
    """The demo's second part in root/moe and root/moe-q4k; log(line) reports each step, show_plan(plan) prints
    the plan; force: replace files there."""
    src_dir, out_dir = os.path.join(root, "moe"), os.path.join(root, "moe-q4k")
    make_dir(src_dir)
    paths = write_moe_set(os.path.join(src_dir, "kimi-like"), force=force)
    result = RequantDemo(len(paths), sum(os.path.getsize(p) for p in paths), 0, paths[0], None)
    log(f"2. requant-trunk: sample MoE shard set, {len(paths)} shards, {human_bytes(result.bytes_in)}")
    result.exit_code = _validate_deep(paths[0], log)
    if result.exit_code:
        return result
    plan = plan_requant_trunk(paths[0], out_dir)
    log("   plan (Q8_0 trunk -> Q4_K; MXFP4 experts and F32 norms byte-copied):")
    show_plan(plan)
    with _plain_interruption():
        requant_trunk(plan, jobs=1, force=force, progress=False)
    log(f"   wrote and verified {len(paths)} shards: {human_bytes(plan.bytes_in)} -> {human_bytes(plan.bytes_out)}")
    result.output = os.path.join(out_dir, os.path.basename(paths[0]))
    result.bytes_out = plan.bytes_out
    result.exit_code = _validate_deep(result.output, log)
    return result


@contextlib.contextmanager
def _plain_interruption():
    """An interrupted quantize or requant-trunk is an interrupted demo: its advice to rerun the step does not
    apply (the demo reruns it whole)."""
    try:
        yield
    except Interrupted:
        raise KeyboardInterrupt from None


def _validate_deep(path, log) -> int:
    report = validate([path], deep=True)
    status = "all good" if report.exit_code == 0 else f"{len(report.errors)} error(s)"
    log(f"   validate --deep {os.path.basename(path)} (+ its set): {status}")
    return report.exit_code
