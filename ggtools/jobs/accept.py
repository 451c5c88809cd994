"""accept: an acceptance gate for drafter artifacts. Several drafters of any family (DFlash v1, DFlash2, DSpark,
EAGLE3 GGUFs, HF checkpoint directories converted on the fly, MTP sidecars, or `mtp`: the target's own MTP block)
decode one prompt set against one target; each gets the acceptance statistics, its τ per prompt, drafts and
drafting milliseconds per step, tok/s and draft-KV bytes, the delta against a baseline drafter, and a verdict.

Target-only greedy decoding of each prompt runs once (interleaved with the first drafter's prompts) and every
drafter's output is checked against it. A drafter fails when its τ (z-lab's) falls more than `max_drop`
(relative) below the baseline's (a drafter of the baseline's family), when its τ is below `min_tau` or its
acceptance below `min_acceptance`, or when its
output differs from greedy.

With temperatures (accept_temperatures.py), every drafter decodes at each: greedy at 0, sampled with each seed
above 0, against target-only decoding of the same temperature and seed; the gate applies per temperature.

With tree budgets, each drafter also decodes the prompts verifying a draft tree of each budget (DDTree; never cut:
a cut applies to the chain), reported beside its chain; a tree's output that differs from greedy fails the drafter.

`measure` is the loop behind `ggtools accept` and `ggtools demo`.
"""

import contextlib
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace

from tqdm import tqdm

from ggtools.dflash.checkpoint import files_of
from ggtools.environment import check_environment
from ggtools.errors import GGToolsError
from ggtools.gguf import ShardSet
from ggtools.gguf.inputs import regular_file
from ggtools.gguf.outputs import temporary_directory
from ggtools.hparam_rules.mtp import mtp_blocks
from ggtools.jobs.accept_temperatures import (GREEDY, Decoding, TargetOnlyAt, TemperatureResult, check_temperatures,
                                             decodings as temperature_decodings, judge_temperature, seed_list,
                                             target_only_results, temperature_results)
from ggtools.jobs.convert_drafter import convert_drafter
from ggtools.jobs.errors import JobError
from ggtools.jobs.limits import check_draft_kv, check_new_tokens, check_threads, check_tree_verify
from ggtools.jobs.prompt_set import Prompt, load_prompts
from ggtools.jobs.run import MTP, SpecRun, TargetOnly, check_whole_kv, load_tokenizer, measure_drafter, warm_up
from ggtools.runtime import DEFINITIONS, DraftSettings, TargetModel, check_settings
from ggtools.runtime.drafter.families import open_drafter

DEFAULT_RING_CAP = 4096         # lucebox's default draft context (draft_ctx_max), as `ggtools run --draft`
DEFAULT_MAX_DROP = 0.05


class AcceptError(JobError):
    pass


@dataclass
class Candidate:
    name: str
    path: str                   # drafter GGUF, or MTP: the target's own MTP block
    ring_cap: int | None        # draft KV: a ring of this many slots; None: a full draft KV


@dataclass
class Measurement:
    runs: list[SpecRun]                 # per candidate, its round with the fastest speculative decoding (1st decoding)
    reference_outputs: list[list]       # target-only tokens per prompt (the first decoding: greedy by default)
    target_tokens_per_second: float     # the fastest target-only pass of all rounds (the first decoding)
    trees: list[list[SpecRun]] = field(default_factory=list)    # per candidate, per tree budget (greedy)
    decodings: list[Decoding] = field(default_factory=lambda: [GREEDY])
    by_decoding: list[list[SpecRun]] = field(default_factory=list)      # per candidate, per decoding (as runs)
    references: list[list[list]] = field(default_factory=list)          # per decoding, per prompt
    target_tps_by_decoding: list[float] = field(default_factory=list)   # per decoding, the fastest pass


@dataclass
class TreeResult:
    """A drafter's decoding with a draft tree of `budget` nodes, beside its chain (DrafterResult.run)."""
    budget: int
    run: SpecRun
    speedup: float                      # over target-only greedy decoding, as DrafterResult.speedup
    delta_mean_len: float = 0.0         # mean accepted length incl. the bonus - the chain's
    delta_tau: float = 0.0              # tau_zlab - the chain's


@dataclass
class DrafterResult:
    name: str                   # as shown: the file or directory name (the path as given if names repeat)
    given: str                  # the --draft argument
    source: str                 # "gguf", "hf" (a checkpoint directory converted on the fly, llama.cpp profile) or
                                # "target" (mtp: the target's own MTP block)
    bytes: int                  # size of the GGUF decoded (mtp: of the block's tensors in the target)
    baseline: bool
    run: SpecRun
    speedup: float              # speculative tok/s / target-only tok/s of the same prompts in the same run
    delta_tau: float = 0.0              # tau_zlab - the baseline's
    delta_tau_relative: float = 0.0     # delta_tau / the baseline's tau_zlab
    delta_acceptance: float = 0.0       # acceptance_rate - the baseline's
    failures: list[str] = field(default_factory=list)
    trees: list[TreeResult] = field(default_factory=list)    # one per tree budget
    family: str = "dflash"      # "dflash" | "dflash2" | "dspark" | "eagle3" | "mtp"
    by_temperature: list[TemperatureResult] = field(default_factory=list)   # one per temperature, as given

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class AcceptReport:
    target: str
    prompt_source: str          # the prompts file, or "default" (ggtools/data/accept/prompts.jsonl)
    prompts: list[Prompt]
    n: int                      # new tokens per prompt at most (fewer when a stop token comes first)
    draft_kv: str               # "full" or "ring:<cap>"
    settings: dict              # DraftSettings as given (n_max None: each drafter's max_drafts)
    threads: int
    baseline: str               # the baseline drafter's name
    max_drop: float | None
    min_tau: float | None
    min_acceptance: float | None
    drafters: list[DrafterResult]
    reference_outputs: list[list]
    target_tokens_per_second: float
    seconds: float = 0.0        # time to verdict: from the call to the verdict, loading and compiling included
    tree_budgets: list[int] = field(default_factory=list)    # the draft trees measured beside each chain
    temperatures: list[float] = field(default_factory=lambda: [0.0])
    seeds: list[int] = field(default_factory=list)      # the sampler seeds of every temperature above 0
    sampling: dict | None = None    # the first sampled decoding's chain (SamplingParams.as_dict); None: greedy only
    by_temperature: list[TargetOnlyAt] = field(default_factory=list)    # target-only decoding per temperature

    @property
    def failed(self) -> list[DrafterResult]:
        return [d for d in self.drafters if not d.passed]

    @property
    def exit_code(self) -> int:
        return 1 if self.failed else 0

    @property
    def error(self) -> str | None:
        """One line for a failed gate."""
        if not self.failed:
            return None
        return f"{len(self.failed)} drafter(s) failed the gate: {', '.join(d.name for d in self.failed)}"

    def to_dict(self) -> dict:
        return asdict(self) | {"verdict": "fail" if self.failed else "pass", "exit_code": self.exit_code,
                               "error": self.error, "failed": [d.name for d in self.failed],
                               "definitions": DEFINITIONS}


def accept(target, drafts, *, prompts=None, n: int = 64, baseline=None, max_drop: float | None = DEFAULT_MAX_DROP,
           min_tau: float | None = None, min_acceptance: float | None = None, ring_cap: int | None = DEFAULT_RING_CAP, settings: DraftSettings | None = None,
           threads: int | None = None, stop_at_eog: bool = True, progress: bool = False, backend: str = "numba",
           device: str | None = None, dtype: str | None = None, tree_budgets=(), temps=(0.0,), seeds: int = 1,
           seed: int | None = None, sampling: dict | None = None) -> AcceptReport:
    """Measure every drafter of `drafts` (GGUF paths, HF checkpoint directories, MTP: the target's own MTP block) on
    the prompts file `prompts` (None: the default set) and judge it against `baseline` (default: the first);
    ring_cap None: full draft KV; backend, device, dtype: what runs the pairs (TargetModel); tree_budgets: also
    decode with a draft tree of each of these budgets (settings.tree_top_k its K), greedily; temps: the
    temperatures (0: greedy, once; above 0: `seeds` seeds from `seed`, None: a random one), sampling: the user's
    sampler options (SamplingParams fields) over the target's defaults."""
    t0 = time.perf_counter()
    settings = settings or DraftSettings()
    check_temperatures(temps, seeds, seed, tree_budgets)
    seed_values = seed_list(seed, seeds) if any(t > 0 for t in temps) else []
    base = _check_inputs(target, drafts, baseline)
    check_environment()
    check_threads(threads)
    model = TargetModel(target, threads=threads, backend=backend, device=device, dtype=dtype)
    try:
        context = model.hp.n_ctx_train
        check_new_tokens(n, context, target)
        tokenizer = load_tokenizer(model, required=False)
        prompt_set = load_prompts(prompts, tokenizer, model.n_vocab,
                                  room=(context - n, f"the context length {context} of {target} less -n {n}"))
        stop_ids = set(tokenizer.eog) if tokenizer and stop_at_eog else set()
        decoded = temperature_decodings(model, temps, seed_values, sampling or {})
        names = _names(drafts)
        with drafter_files(drafts, target) as paths:
            m = measure(model, [Candidate(name, p, ring_cap) for name, p in zip(names, paths)],
                        [p.ids for p in prompt_set], n, settings=settings, stop_ids=stop_ids, progress=progress,
                        tree_budgets=tree_budgets, decodings=decoded)
            sizes = [drafter_bytes(p, target) for p in paths]
    finally:
        model.close()
    results = _results(names, drafts, sizes, m, base, tree_budgets)
    judge(results, results[base], max_drop, min_tau, min_acceptance, named=list(temps) != [0])
    sampled = next((d.params for d in decoded if d.params is not None), None)
    return AcceptReport(
        target=str(target), prompt_source=str(prompts) if prompts else "default", prompts=prompt_set, n=n,
        draft_kv="full" if ring_cap is None else f"ring:{ring_cap}", settings=asdict(settings),
        threads=m.runs[0].threads, baseline=names[base], max_drop=max_drop, min_tau=min_tau,
        min_acceptance=min_acceptance, drafters=results,
        reference_outputs=m.reference_outputs, target_tokens_per_second=m.target_tokens_per_second,
        seconds=time.perf_counter() - t0, tree_budgets=list(tree_budgets), temperatures=list(temps),
        seeds=seed_values, sampling=sampled.as_dict() if sampled else None,
        by_temperature=target_only_results(decoded, m.references, m.target_tps_by_decoding))


def measure(model: TargetModel, candidates: list[Candidate], prompts: list[list[int]], n: int, *,
            settings: DraftSettings, stop_ids=(), rounds: int = 1, kv_type: str = "f16",
            progress: bool = False, tree_budgets=(), decodings=(GREEDY,)) -> Measurement:
    """Every candidate decodes every prompt speculatively with each of `decodings` (greedy, or sampled at a
    temperature with a seed: its chain, then, greedy only, a draft tree of each of tree_budgets), `rounds` times,
    each output checked against target-only decoding of the same kind, which runs once per prompt, decoding and
    round whatever the number of candidates. Every drafter is loaded (and so checked) before anything is decoded."""
    drafters = []
    longest = max(map(len, prompts)) + n
    chain = replace(settings, tree_top_k=None) if tree_budgets else settings     # tree_top_k: the trees' K
    trees = [tree_settings(settings, b) for b in tree_budgets]
    each = [[chain] + (trees if d.params is None else []) for d in decodings]
    try:
        for c in candidates:
            drafters.append(_load(c, model, [chain] + trees))
            check_draft_kv(drafters[-1], c.ring_cap, kv_type, longest, model.ops.device)
            check_whole_kv(drafters[-1], c.ring_cap, longest)
        for budget in tree_budgets:
            check_tree_verify(model, budget, longest)
        warm_up(model)
        best = [[[None] * len(e) for e in each] for _ in candidates]
        target_tps, references = [0.0] * len(decodings), [None] * len(decodings)
        with tqdm(total=rounds * len(candidates) * sum(map(len, each)) * len(prompts), desc="accept", unit="prompt",
                  file=sys.stderr, disable=None if progress else True, dynamic_ncols=True) as bar:
            for _ in range(rounds):
                for k, decoding in enumerate(decodings):
                    reference = TargetOnly(model, prompts, n, stop_ids, sampling=decoding.params)
                    for i, (c, drafter) in enumerate(zip(candidates, drafters)):
                        for j, s in enumerate(each[k]):
                            bar.set_postfix_str(_doing(c, s, decoding))
                            run = measure_drafter(model, drafter, prompts, n, ring_cap=c.ring_cap, settings=s,
                                                  kv_type=kv_type, stop_ids=stop_ids, reference=reference,
                                                  on_prompt=bar.update, sampling=decoding.params)
                            kept = best[i][k][j]
                            if kept is None or run.speculative_tokens_per_second > kept.speculative_tokens_per_second \
                                    or not run.outputs_match_target:
                                best[i][k][j] = run
                    target_tps[k] = max(target_tps[k], reference.tokens_per_second)
                    references[k] = reference.outputs
        greedy = next((k for k, d in enumerate(decodings) if d.params is None), None)
        return Measurement([b[0][0] for b in best], references[0], target_tps[0],
                           [b[greedy][1:] if greedy is not None else [] for b in best], list(decodings),
                           [[runs[0] for runs in b] for b in best], references, target_tps)
    finally:
        for d in drafters:
            d.close()


def _doing(c: Candidate, s: DraftSettings, decoding: Decoding) -> str:
    """What the progress bar says is decoding."""
    tree = "" if s.tree_budget is None else f", tree {s.tree_budget}"
    sampled = "" if decoding.params is None else f", T {decoding.temp:g} seed {decoding.seed}"
    return c.name + tree + sampled


def tree_settings(settings: DraftSettings, budget: int) -> DraftSettings:
    """The settings of a drafter's tree of `budget` nodes beside its chain: a tree is never cut."""
    return replace(settings, tree_budget=budget, cut="none", p_min=0.0, n_min=0)


def _load(c: Candidate, model: TargetModel, each: list[DraftSettings]):
    """The candidate's drafter, whatever its family (open_drafter), checked against each of the settings."""
    drafter = None
    try:
        drafter = open_drafter(c.path, model)
        for settings in each:
            check_settings(drafter, settings)
        return drafter
    except GGToolsError as e:
        if drafter:
            drafter.close()
        raise AcceptError(f"{c.name}: {e}") from None


def _results(names, drafts, sizes, m: Measurement, base: int, tree_budgets=()) -> list[DrafterResult]:
    def speedup(run, tps):
        return run.speculative_tokens_per_second / tps if tps else 0.0

    greedy = next((k for k, d in enumerate(m.decodings) if d.params is None), None)
    results = []
    for i, (name, d, size, runs) in enumerate(zip(names, drafts, sizes, m.by_decoding)):
        speedups = [speedup(r, tps) for r, tps in zip(runs, m.target_tps_by_decoding)]
        trees = []
        if greedy is not None:
            chain, tps = runs[greedy], m.target_tps_by_decoding[greedy]
            trees = [TreeResult(budget, tree, speedup(tree, tps),
                                delta_mean_len=tree.stats["mean_accepted_length_incl_bonus"]
                                - chain.stats["mean_accepted_length_incl_bonus"],
                                delta_tau=tree.stats["tau_zlab"] - chain.stats["tau_zlab"])
                     for budget, tree in zip(tree_budgets, m.trees[i] if m.trees else [])]
        results.append(DrafterResult(name, d, _source(d), size, i == base, runs[0], speedups[0], trees=trees,
                                     family=runs[0].family,
                                     by_temperature=temperature_results(m.decodings, runs, speedups)))
    return results


def _source(draft) -> str:
    return "target" if draft == MTP else "hf" if os.path.isdir(draft) else "gguf"


def judge(results: list[DrafterResult], base: DrafterResult, max_drop: float | None, min_tau: float | None,
          min_acceptance: float | None = None, named: bool = False) -> None:
    """Fill each result's deltas against `base` and its failures, temperature by temperature (named: each failure
    says its temperature); the deltas shown beside a drafter are its first temperature's."""
    for k, base_at in enumerate(base.by_temperature):
        for r in results:
            # a drop is measured against a variant of the same drafter: another family drafts differently by design
            drop = max_drop if r.family == base.family else None
            judge_temperature(r.by_temperature[k], base_at, drop, min_tau, min_acceptance, named)
    for r in results:
        first = r.by_temperature[0]
        r.delta_tau, r.delta_tau_relative, r.delta_acceptance = (first.delta_tau, first.delta_tau_relative,
                                                                 first.delta_acceptance)
        r.failures = [f for at in r.by_temperature for f in at.failures]
        r.failures += [f"output with a draft tree of {t.budget} differs from target-only greedy decoding on "
                       f"{len(t.run.mismatches)} of {t.run.prompts} prompts"
                       for t in r.trees if not t.run.outputs_match_target]


@contextlib.contextmanager
def drafter_files(drafts, target):
    """Each drafter as a GGUF path (MTP stays MTP): HF checkpoint directories are converted (convert drafter's
    conversion, the family detected: DFlash, DSpark or EAGLE3; llama.cpp profile, for `target`) into one temporary
    directory, removed on leaving, on errors and interrupts too."""
    with contextlib.ExitStack() as stack:
        tmp, paths = None, []
        for i, d in enumerate(drafts):
            if d == MTP or not os.path.isdir(d):
                paths.append(str(d))
                continue
            tmp = tmp or stack.enter_context(temporary_directory("ggtools-accept-"))
            out = os.path.join(tmp, f"{i}-{os.path.basename(os.path.normpath(d))}.gguf")
            try:
                convert_drafter(d, out, target=target, profile="llama.cpp")
            except GGToolsError as e:
                raise AcceptError(f"--draft {d}: an HF directory that does not convert: {e}") from None
            paths.append(out)
        yield paths


def drafter_bytes(path, target) -> int:
    """A drafter GGUF's size; for MTP, the bytes of the MTP block's own tensors in the target's files."""
    if path != MTP:
        return os.path.getsize(path)
    with ShardSet(target) as shards:
        blocks = mtp_blocks(shards.first)
        return sum(t.nbytes or 0 for f in shards.files for t in f.tensor.values() if blocks and blocks.holds(t.name))


def input_files(target, drafts, prompts) -> list[str]:
    """Every file accept reads (a report may replace none of them): the target's set, each drafter (each file
    of a checkpoint directory; MTP is the target's), the prompts."""
    files = ShardSet(target).paths if os.path.isfile(target) else [str(target)]
    for d in drafts:
        files += [] if d == MTP else files_of(d) if os.path.isdir(d) else [str(d)]
    return files + ([str(prompts)] if prompts else [])


def _check_inputs(target, drafts, baseline) -> int:
    """The index of the baseline drafter, once every path is there (MTP, the target's own block, is no path)."""
    try:
        regular_file(target)
    except GGToolsError as e:
        raise AcceptError(f"{e} (--target)") from None
    if not drafts:
        raise AcceptError("give at least one --draft")
    real = [_identity(d) for d in drafts]
    for i, d in enumerate(drafts):
        if d != MTP and not os.path.exists(d):
            raise AcceptError(f"{d}: no such file or directory (--draft)")
        if real[i] in real[:i]:
            raise AcceptError(f"{d}: given twice as --draft")
    if baseline is None:
        return 0
    if _identity(baseline) not in real:
        raise AcceptError(f"--baseline {baseline}: not one of the --draft files")
    return real.index(_identity(baseline))


def _identity(draft) -> str:
    """What tells two --draft values apart: the file's real path, or MTP (a file named mtp is ./mtp)."""
    return MTP if draft == MTP else os.path.realpath(draft)


def _names(drafts) -> list[str]:
    names = [MTP if d == MTP else os.path.basename(os.path.normpath(d)) + ("/" if os.path.isdir(d) else "")
             for d in drafts]
    return [name if names.count(name) == 1 else str(d) for name, d in zip(names, drafts)]
