"""The `ggtools run` jobs: load a target (and a drafter), tokenize, warm up, decode, time it, measure memory.

`run`: greedy continuation of one prompt by the target alone, with prompt and generation speed and RSS.
Timing excludes numba's one-time compilation: `warm_up` runs a 2-token batch and a 1-token step first
(compiled kernels are cached on disk, so this is quick after the first use).

`run_speculative`: decode prompts with a target + drafter pair and measure it against target-only decoding.
For every prompt, in the same process and alternating: plain greedy decoding (the reference output and
speed) and speculative decoding (must give the same tokens). Both are timed from the end of the target's
prefill (the same call in both) to the last token; compilation is done beforehand. Reports the acceptance
statistics (runtime/stats.py), tok/s of each, the speedup, and the draft KV's memory next to what a full
draft KV would hold for the longest sequence.

`measure_drafter` is that per-prompt loop for one loaded drafter; its `TargetOnly` reference decodes each
prompt when first asked and keeps it, so several drafters measured on the same prompts share one target-only
pass (`ggtools accept`, the demo). `pair_warnings`: what keeps a pair from running in llama.cpp though it runs here.
"""

import resource
import time
from dataclasses import asdict, dataclass, field

from ggtools.dflash.profiles import LLAMACPP
from ggtools.dflash.target import OpenTarget
from ggtools.environment import check_environment
from ggtools.jobs.errors import JobError, UsageError
from ggtools.jobs.limits import (check_draft_kv, check_threads, check_tree_verify, longest_token_bytes,
                                 too_long_to_fit)
from ggtools.jobs.sampling import new_seed, sampling_params
from ggtools.runtime import (DEFINITIONS, DraftSettings, Drafter, ModelError, TargetModel, Tokenizer,
                             acceptance_stats, check_settings, continue_greedy, numerics_note, speculative_generate,
                             tree_top_k)
from ggtools.runtime.drafter.autoregressive import AutoregressiveDrafter
from ggtools.runtime.drafter.families import open_drafter
from ggtools.runtime.drafter.mtp import TARGET_FILE as MTP
from ggtools.runtime.sampling import Sampler, SamplingParams
from ggtools.runtime.speculative import default_n_max

# DraftSettings (what run_speculative drafts with), DEFINITIONS (what each of a SpecRun's statistics means) and
# numerics_note (whether a backend and dtype compute llama.cpp's arithmetic) are the runtime's, passed on here so
# the CLI reaches the runtime only through jobs
__all__ = ["DEFINITIONS", "DraftSettings", "MTP", "RunError", "RunResult", "SpecRun", "TargetOnly", "measure_drafter",
           "numerics_note", "pair_warnings", "run", "run_speculative", "warm_up"]


class RunError(JobError):
    """Nothing to decode: no prompts, or a prompt of no tokens."""


@dataclass
class RunResult:
    prompt_ids: list
    generated_ids: list
    text: str | None             # the continuation, when the vocabulary can be decoded
    stop: str                    # "length" or "end-of-generation"
    prompt_seconds: float
    generate_seconds: float
    prompt_tokens_per_second: float
    generate_tokens_per_second: float  # over the one-token steps (all generated tokens but the first)
    rss_bytes: int               # resident memory after the run (includes the touched, mapped weights)
    peak_rss_bytes: int
    threads: int
    backend: str = "numba"       # "numba" | "torch"
    device: str = "cpu"
    dtype: str = "f32"           # the compute dtype
    sampling: dict | None = None  # the sampler chain and seed (SamplingParams.as_dict); None: greedy

    def to_dict(self) -> dict:
        return asdict(self)


def warm_up(model: TargetModel) -> None:
    """Compile (or load from numba's cache) the batch and one-token kernels, outside any timing."""
    n = model.kv.n_tokens
    model.forward([0, 0], logits="all")
    model.forward([0], logits="last")
    model.kv.crop(n)


def check_context(model: TargetModel, n_prompt: int, n: int, n_ctx: int | None = None, *, at_least: bool = False):
    """Refuse a prompt plus n new tokens beyond the context (default: the model's trained context length).
    at_least: n_prompt is the fewest tokens the prompt's text can take (it was not tokenized)."""
    limit = n_ctx or model.hp.n_ctx_train
    if n_prompt + n > limit:
        trained = "" if n_ctx else " the model was trained for (pass --context-length N to allow more)"
        size = f"at least {n_prompt} tokens for its length" if at_least else f"{n_prompt} tokens"
        raise UsageError(model.path, f"the prompt ({size}) plus -n {n} is {'over ' if at_least else ''}"
                                     f"{n_prompt + n} tokens, beyond the context length {limit}{trained}")


def run(target, prompt: str | None = None, prompt_ids=None, n: int = 64, threads: int | None = None,
        stop_at_eog: bool = True, n_ctx: int | None = None, progress=None, backend: str = "numba",
        device: str | None = None, dtype: str | None = None, temp: float = 0.0, sampling: dict | None = None,
        seed: int | None = None) -> RunResult:
    """Load a target GGUF, continue a prompt (text or token ids) greedily (temp 0) or sampled at `temp` (sampling:
    the user's sampler options, SamplingParams fields; seed None: a random one, reported), and measure it. n_ctx:
    the most tokens allowed (default: the model's context length); progress(k): k new tokens generated; backend,
    device and dtype choose what runs it (TargetModel)."""
    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of prompt and prompt_ids")
    check_environment()
    check_threads(threads)
    model = TargetModel(target, threads=threads, backend=backend, device=device, dtype=dtype)
    try:
        tokenizer, [ids], stop_ids = prepare_prompts(model, [prompt if prompt is not None else prompt_ids], n, n_ctx,
                                                     stop_at_eog)
        params = sampling_params(model, sampling or {}, temp, new_seed() if seed is None else seed)
        sampler = new_sampler(model, params, ids)
        warm_up(model)

        t0 = time.perf_counter()
        logits, _ = model.forward(ids, logits="last")
        t1 = time.perf_counter()
        generated, stop = continue_greedy(model, logits, n, stop_ids, progress, sampler=sampler)
        t2 = time.perf_counter()
        steps = max(0, len(generated) - 1)
        return RunResult(
            prompt_ids=ids, generated_ids=generated,
            text=tokenizer.decode(generated) if tokenizer else None, stop=stop,
            prompt_seconds=t1 - t0, generate_seconds=t2 - t1,
            prompt_tokens_per_second=len(ids) / (t1 - t0),
            generate_tokens_per_second=steps / (t2 - t1) if steps else 0.0,
            **rss_fields(), threads=model.threads, **backend_fields(model),
            sampling=params.as_dict() if params else None)
    finally:
        model.close()


def new_sampler(model: TargetModel, params: SamplingParams | None, prompt=None) -> Sampler | None:
    """A fresh sampler (None for greedy decoding), the prompt's tokens accepted into it."""
    if params is None:
        return None
    sampler = Sampler(params, model.n_vocab)
    sampler.accept_tokens(prompt or [])
    return sampler


def prepare_prompts(model: TargetModel, prompts: list, n: int, n_ctx: int | None, stop_at_eog: bool):
    """Prompts (texts, tokenized with the target's vocabulary, or token ids) as token ids, each refused when
    empty, when it plus n tokens exceeds the context (a text too long to fit is refused before it is
    tokenized) or when an id lies outside the vocabulary; with the tokenizer (None when only ids are given and
    the GGUF has none) and the ids that stop generation."""
    texts = [p for p in prompts if isinstance(p, str)]
    tokenizer = load_tokenizer(model, required=bool(texts))
    if texts:
        per_token, room = longest_token_bytes(tokenizer), (n_ctx or model.hp.n_ctx_train) - n
        for text in texts:
            fewest = too_long_to_fit(text, room, per_token)
            if fewest:
                check_context(model, fewest, n, n_ctx, at_least=True)
    ids = [tokenizer.encode(p) if isinstance(p, str) else [int(t) for t in p] for p in prompts]
    n_vocab = model.token_embd.n_rows
    for p in ids:
        if not p:
            raise RunError("the prompt has no tokens")
        check_context(model, len(p), n, n_ctx)
        bad = next((t for t in p if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise UsageError(model.path, f"prompt token id {bad} is outside the vocabulary of {n_vocab} tokens "
                                         f"(0..{n_vocab - 1})")
    stop_ids = set(tokenizer.eog) if (tokenizer and stop_at_eog) else set()
    return tokenizer, ids, stop_ids


def backend_fields(model: TargetModel) -> dict:
    """What ran a model, for a report: backend, device, compute dtype."""
    return {"backend": model.ops.name, "device": model.ops.device, "dtype": model.ops.dtype}


def load_tokenizer(model: TargetModel, required: bool) -> Tokenizer | None:
    """The GGUF's tokenizer; None when there is none and only token ids are used."""
    try:
        return Tokenizer.from_gguf(model.weights.meta)
    except ModelError:
        if required:
            raise
        return None


def rss_fields() -> dict:
    """rss_bytes and peak_rss_bytes, read together (VmRSS and VmHWM of one /proc/self/status) so that the peak
    is never below the current value; getrusage's peak where there is no /proc."""
    rss = peak = None
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    value = int(line.split()[1]) * 1024
                    rss, peak = (value, peak) if line.startswith("VmRSS") else (rss, value)
    except OSError:
        pass
    if rss is None:
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    peak = max(peak or 0, rss, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
    return {"rss_bytes": rss, "peak_rss_bytes": peak}


@dataclass
class SpecRun:
    target: str
    draft: str
    profile: str
    version: int                    # 1 = DFlash v1 (and DSpark's backbone), 2 = DFlash2
    draft_kv: str                   # "full" or "ring:<cap>"
    settings: dict                  # DraftSettings, n_max resolved; tree_top_k the K a tree reads (None: chain)
    prompts: int
    outputs: list                   # generated ids per prompt
    outputs_match_target: bool      # speculative == target-only greedy, every prompt
    stats: dict                     # acceptance statistics (stats.DEFINITIONS)
    target_only_tokens_per_second: float
    speculative_tokens_per_second: float
    speedup: float                  # speculative / target-only tok/s, same prompts, same run
    draft_seconds_share: float      # of the speculative decode time, the part spent drafting
    draft_kv_bytes: int
    draft_kv_bytes_full: int        # a FullKV's bytes for the longest sequence of this run
    threads: int
    mismatches: list = field(default_factory=list)   # prompt indices whose outputs differ (should be none)
    tau_per_prompt: list = field(default_factory=list)   # stats' tau_zlab of each prompt alone
    texts: list | None = None       # decoded outputs, when the vocabulary decodes
    backend: str = "numba"          # "numba" | "torch", its device and compute dtype
    device: str = "cpu"
    dtype: str = "f32"
    family: str = "dflash"          # "dflash" | "dflash2" | "dspark" | "eagle3" | "mtp"
    drafter_kind: str = ""          # what drafts, in words (Drafter.kind)
    sampling: dict | None = None    # the sampler chain and seed (SamplingParams.as_dict); None: greedy
    decode_seconds: float = 0.0     # speculative decode time of all prompts (each after its prefill)

    @property
    def acceptance_rate(self) -> float:
        return self.stats["acceptance_rate"]

    def to_dict(self) -> dict:
        return asdict(self)


def run_speculative(target, draft, prompts: list, n: int = 64, *, ring_cap: int | None = None,
                    settings: DraftSettings | None = None, kv_type: str = "f16", threads: int | None = None,
                    stop_at_eog: bool = True, compare: bool = True, mask_id: int | None = None,
                    n_ctx: int | None = None, progress=None, backend: str = "numba", device: str | None = None,
                    dtype: str | None = None, temp: float = 0.0, sampling: dict | None = None,
                    seed: int | None = None) -> SpecRun:
    """target, draft: GGUF paths (or a loaded TargetModel for target); prompts: texts (tokenized with the
    target's vocabulary) or lists of token ids. temp, sampling, seed: as `run` (each prompt decoded with a sampler
    of that seed). compare: also run target-only decoding (reference tokens and speed). n_ctx: the most tokens a sequence may reach (default: the target's context length);
    progress(k): k new tokens decoded (both decodings count). backend, device, dtype: what runs the pair
    (TargetModel; the drafter runs on the target's backend)."""
    if not prompts:
        raise RunError("no prompts")
    check_environment()
    check_threads(threads)
    model = target if isinstance(target, TargetModel) else TargetModel(target, threads=threads, backend=backend,
                                                                        device=device, dtype=dtype)
    drafter = None
    try:
        drafter = open_drafter(draft, model, mask_id=mask_id)
        settings = settings or DraftSettings()
        check_settings(drafter, settings)
        tokenizer, ids, stop_ids = prepare_prompts(model, prompts, n, n_ctx, stop_at_eog)
        params = sampling_params(model, sampling or {}, temp, new_seed() if seed is None else seed)
        longest = max(map(len, ids)) + n
        check_draft_kv(drafter, ring_cap, kv_type, longest, model.ops.device)
        check_whole_kv(drafter, ring_cap, longest)
        check_tree_verify(model, settings.tree_budget, longest)
        warm_up(model)
        reference = TargetOnly(model, ids, n, stop_ids, progress, params) if compare else None
        measured = measure_drafter(model, drafter, ids, n, ring_cap=ring_cap, settings=settings, kv_type=kv_type,
                                   stop_ids=stop_ids, reference=reference, progress=progress, sampling=params)
        if tokenizer:
            measured.texts = [tokenizer.decode(o) for o in measured.outputs]
        return measured
    finally:
        if drafter:
            drafter.close()
        if model is not target:
            model.close()


def check_whole_kv(drafter, ring_cap: int | None, longest: int) -> None:
    """Refuse a --ring-cap below the longest sequence for an EAGLE3 / MTP drafter: its decoder attends to every
    committed position (llama.cpp keeps the draft context's whole KV), so a ring could only drop what it reads."""
    if isinstance(drafter, AutoregressiveDrafter) and ring_cap is not None and ring_cap < longest:
        raise UsageError(drafter.path, f"--ring-cap {ring_cap}: an {drafter.family.upper()} drafter attends to every "
                                       f"committed position, and a sequence here reaches {longest} (prompt + -n): use "
                                       "--full-kv or a --ring-cap of at least that")


def pair_warnings(target) -> list[str]:
    """What keeps this pair from running elsewhere though it runs here (this runtime taps every target arch)."""
    with OpenTarget(target) as t:
        if t.arch and t.arch not in LLAMACPP.tap_archs:
            return [f"target arch '{t.arch}' does not expose layer inputs in llama.cpp (DFlash aborts there with "
                    "\"layer input tensor is null\"); this runtime runs the pair"]
    return []


class TargetOnly:
    """Target-only decoding of each prompt (the reference tokens and speed), greedy or with a sampler of `sampling`,
    decoded the first time it is asked for and kept."""

    def __init__(self, model: TargetModel, prompts: list, n: int, stop_ids, progress=None,
                 sampling: SamplingParams | None = None):
        self.model, self.prompts, self.n, self.stop_ids, self.progress = model, prompts, n, stop_ids, progress
        self.sampling = sampling
        self.outputs: list[list | None] = [None] * len(prompts)
        self.seconds = [0.0] * len(prompts)

    def output(self, i: int) -> list:
        if self.outputs[i] is None:
            self.outputs[i], self.seconds[i] = _target_only(self.model, self.prompts[i], self.n, self.stop_ids,
                                                            self.progress, self.sampling)
        return self.outputs[i]

    @property
    def tokens_per_second(self) -> float:
        """Over the prompts decoded so far."""
        seconds = sum(self.seconds)
        return sum(len(o) for o in self.outputs if o is not None) / seconds if seconds else 0.0


def measure_drafter(model: TargetModel, drafter: Drafter, prompts: list, n: int, *, ring_cap: int | None,
                    settings: DraftSettings, kv_type: str = "f16", stop_ids=(), reference: TargetOnly | None = None,
                    on_prompt=lambda: None, progress=None, sampling: SamplingParams | None = None) -> SpecRun:
    """Decode every prompt (token ids) speculatively, greedily or each with a fresh sampler of `sampling`, each
    checked against `reference` (None: no check, no target-only speed); on_prompt() after each, progress(k) as
    tokens come. The drafter's kernels are compiled first, outside the timing."""
    kv = drafter.new_kv(ring_cap, kv_type)
    speculative_generate(model, drafter, kv, prompts[0][:8], min(n, 2 * drafter.block_size), stop_ids, settings)
    runs, outputs, mismatches = [], [], []
    t_spec = t_draft = 0.0
    longest = 0
    for i, prompt in enumerate(prompts):
        expected = reference.output(i) if reference else None
        out = speculative_generate(model, drafter, kv, prompt, n, stop_ids, settings, progress,
                                   sampler=new_sampler(model, sampling))
        t_spec += out.decode_seconds
        t_draft += out.draft_seconds
        runs.append(out.steps)
        outputs.append(out.tokens)
        longest = max(longest, len(prompt) + len(out.tokens))
        if reference and out.tokens != expected:
            mismatches.append(i)
        on_prompt()
    generated = sum(len(o) for o in outputs)
    n_max = default_n_max(drafter) if settings.n_max is None else settings.n_max
    target_tps = reference.tokens_per_second if reference else 0.0
    spec_tps = generated / t_spec if t_spec else 0.0
    hp = drafter.hp
    full = drafter.new_kv(None, kv_type)
    return SpecRun(
        target=model.path, draft=drafter.path, profile=hp.profile, version=2 if hp.v2 else 1,
        draft_kv="full" if ring_cap is None else f"ring:{ring_cap}",
        settings=asdict(settings) | {"n_max": n_max, "tree_top_k": None if settings.tree_budget is None
                                     else tree_top_k(drafter, settings, n_max)},
        prompts=len(prompts), outputs=outputs, outputs_match_target=reference is not None and not mismatches,
        stats=acceptance_stats(runs, n_max + 1), target_only_tokens_per_second=target_tps,
        speculative_tokens_per_second=spec_tps, speedup=spec_tps / target_tps if target_tps else 0.0,
        draft_seconds_share=t_draft / t_spec if t_spec else 0.0, draft_kv_bytes=kv.nbytes,
        draft_kv_bytes_full=full.bytes_for(longest), threads=model.threads, mismatches=mismatches,
        tau_per_prompt=[acceptance_stats([steps], n_max + 1)["tau_zlab"] for steps in runs], family=drafter.family,
        drafter_kind=drafter.kind, **backend_fields(model), sampling=sampling.as_dict() if sampling else None,
        decode_seconds=t_spec)


def _target_only(model, prompt, n, stop_ids, progress=None, sampling=None) -> tuple[list, float]:
    """Plain decoding; seconds from the end of prefill, as speculative_generate times it."""
    model.kv.clear()
    sampler = new_sampler(model, sampling, prompt)
    logits, _ = model.forward(prompt, logits="last")
    t = time.perf_counter()
    tokens, _ = continue_greedy(model, logits, n, stop_ids, progress, sampler=sampler)
    return tokens, time.perf_counter() - t
