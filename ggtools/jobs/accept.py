"""accept: an acceptance gate for drafter artifacts. Several drafters (GGUFs, or HF checkpoint directories
converted on the fly) decode one prompt set against one target; each gets the acceptance statistics, its τ
per prompt, tok/s and draft-KV bytes, the delta against a baseline drafter, and a verdict.

Target-only greedy decoding of each prompt runs once (interleaved with the first drafter's prompts) and every
drafter's output is checked against it. A drafter fails when its τ (z-lab's) falls more than `max_drop`
(relative) below the baseline's, when its τ is below `min_tau`, or when its output differs from greedy.

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
from ggtools.jobs.convert import convert_dflash
from ggtools.jobs.errors import JobError
from ggtools.jobs.limits import check_draft_kv, check_new_tokens, check_threads, check_tree_verify
from ggtools.jobs.prompt_set import Prompt, load_prompts
from ggtools.jobs.run import SpecRun, TargetOnly, load_tokenizer, measure_drafter, warm_up
from ggtools.runtime import DEFINITIONS, DraftSettings, Drafter, TargetModel, check_settings

DEFAULT_RING_CAP = 4096         # lucebox's default draft context (draft_ctx_max), as `ggtools run --draft`
DEFAULT_MAX_DROP = 0.05


class AcceptError(JobError):
    pass


@dataclass
class Candidate:
    name: str
    path: str                   # drafter GGUF
    ring_cap: int | None        # draft KV: a ring of this many slots; None: a full draft KV


@dataclass
class Measurement:
    runs: list[SpecRun]                 # per candidate, its round with the fastest speculative decoding
    reference_outputs: list[list]       # target-only greedy tokens per prompt
    target_tokens_per_second: float     # the fastest target-only pass of all rounds
    trees: list[list[SpecRun]] = field(default_factory=list)    # per candidate, per tree budget (same choice)


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
    source: str                 # "gguf", or "hf" (a checkpoint directory converted on the fly, llama.cpp profile)
    bytes: int                  # size of the GGUF decoded
    baseline: bool
    run: SpecRun
    speedup: float              # speculative tok/s / target-only tok/s of the same prompts in the same run
    delta_tau: float = 0.0              # tau_zlab - the baseline's
    delta_tau_relative: float = 0.0     # delta_tau / the baseline's tau_zlab
    delta_acceptance: float = 0.0       # acceptance_rate - the baseline's
    failures: list[str] = field(default_factory=list)
    trees: list[TreeResult] = field(default_factory=list)    # one per tree budget

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
    drafters: list[DrafterResult]
    reference_outputs: list[list]
    target_tokens_per_second: float
    seconds: float = 0.0        # time to verdict: from the call to the verdict, loading and compiling included
    tree_budgets: list[int] = field(default_factory=list)    # the draft trees measured beside each chain

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
           min_tau: float | None = None, ring_cap: int | None = DEFAULT_RING_CAP, settings: DraftSettings | None = None,
           threads: int | None = None, stop_at_eog: bool = True, progress: bool = False, backend: str = "numba",
           device: str | None = None, dtype: str | None = None, tree_budgets=()) -> AcceptReport:
    """Measure every drafter of `drafts` (GGUF paths or HF checkpoint directories) on the prompts file `prompts`
    (None: the default set) and judge it against `baseline` (default: the first); ring_cap None: full draft KV;
    backend, device, dtype: what runs the pairs (TargetModel); tree_budgets: also decode with a draft tree of
    each of these budgets (settings.tree_top_k its K)."""
    t0 = time.perf_counter()
    settings = settings or DraftSettings()
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
        names = _names(drafts)
        with drafter_files(drafts, target) as paths:
            m = measure(model, [Candidate(name, p, ring_cap) for name, p in zip(names, paths)],
                        [p.ids for p in prompt_set], n, settings=settings, stop_ids=stop_ids, progress=progress,
                        tree_budgets=tree_budgets)
            sizes = [os.path.getsize(p) for p in paths]
    finally:
        model.close()
    results = _results(names, drafts, sizes, m, base, tree_budgets)
    judge(results, results[base], max_drop, min_tau)
    return AcceptReport(
        target=str(target), prompt_source=str(prompts) if prompts else "default", prompts=prompt_set, n=n,
        draft_kv="full" if ring_cap is None else f"ring:{ring_cap}", settings=asdict(settings),
        threads=m.runs[0].threads, baseline=names[base], max_drop=max_drop, min_tau=min_tau, drafters=results,
        reference_outputs=m.reference_outputs, target_tokens_per_second=m.target_tokens_per_second,
        seconds=time.perf_counter() - t0, tree_budgets=list(tree_budgets))


def measure(model: TargetModel, candidates: list[Candidate], prompts: list[list[int]], n: int, *,
            settings: DraftSettings, stop_ids=(), rounds: int = 1, kv_type: str = "f16",
            progress: bool = False, tree_budgets=()) -> Measurement:
    """Every candidate decodes every prompt speculatively (its chain, then a draft tree of each of tree_budgets),
    `rounds` times, each output checked against target-only greedy decoding, which runs once per prompt and round
    whatever the number of candidates. Every drafter is loaded (and so checked) before anything is decoded."""
    drafters = []
    longest = max(map(len, prompts)) + n
    chain = replace(settings, tree_top_k=None) if tree_budgets else settings     # tree_top_k: the trees' K
    each = [chain] + [tree_settings(settings, b) for b in tree_budgets]
    try:
        for c in candidates:
            drafters.append(_load(c, model, each))
            check_draft_kv(drafters[-1], c.ring_cap, kv_type, longest, model.ops.device)
        for budget in tree_budgets:
            check_tree_verify(model, budget, longest)
        warm_up(model)
        best, target_tps = [[None] * len(each) for _ in candidates], 0.0
        with tqdm(total=rounds * len(candidates) * len(each) * len(prompts), desc="accept", unit="prompt",
                  file=sys.stderr, disable=None if progress else True, dynamic_ncols=True) as bar:
            for _ in range(rounds):
                reference = TargetOnly(model, prompts, n, stop_ids)
                for i, (c, drafter) in enumerate(zip(candidates, drafters)):
                    for j, s in enumerate(each):
                        bar.set_postfix_str(c.name if s.tree_budget is None else f"{c.name}, tree {s.tree_budget}")
                        run = measure_drafter(model, drafter, prompts, n, ring_cap=c.ring_cap, settings=s,
                                              kv_type=kv_type, stop_ids=stop_ids, reference=reference,
                                              on_prompt=bar.update)
                        kept = best[i][j]
                        if kept is None or run.speculative_tokens_per_second > kept.speculative_tokens_per_second \
                                or not run.outputs_match_target:
                            best[i][j] = run
                target_tps = max(target_tps, reference.tokens_per_second)
        return Measurement([b[0] for b in best], reference.outputs, target_tps, [b[1:] for b in best])
    finally:
        for d in drafters:
            d.close()


def tree_settings(settings: DraftSettings, budget: int) -> DraftSettings:
    """The settings of a drafter's tree of `budget` nodes beside its chain: a tree is never cut."""
    return replace(settings, tree_budget=budget, cut="none", p_min=0.0, n_min=0)


def _load(c: Candidate, model: TargetModel, each: list[DraftSettings]) -> Drafter:
    drafter = None
    try:
        drafter = Drafter(c.path, model)
        for settings in each:
            check_settings(drafter, settings)
        return drafter
    except GGToolsError as e:
        if drafter:
            drafter.close()
        raise AcceptError(f"{c.name}: {e}") from None


def _results(names, drafts, sizes, m: Measurement, base: int, tree_budgets=()) -> list[DrafterResult]:
    tps = m.target_tokens_per_second

    def speedup(run):
        return run.speculative_tokens_per_second / tps if tps else 0.0

    results = []
    for i, (name, d, size, run) in enumerate(zip(names, drafts, sizes, m.runs)):
        trees = [TreeResult(budget, tree, speedup(tree),
                            delta_mean_len=tree.stats["mean_accepted_length_incl_bonus"]
                            - run.stats["mean_accepted_length_incl_bonus"],
                            delta_tau=tree.stats["tau_zlab"] - run.stats["tau_zlab"])
                 for budget, tree in zip(tree_budgets, m.trees[i] if m.trees else [])]
        results.append(DrafterResult(name, d, "hf" if os.path.isdir(d) else "gguf", size, i == base, run, speedup(run),
                                     trees=trees))
    return results


def judge(results: list[DrafterResult], base: DrafterResult, max_drop: float | None, min_tau: float | None) -> None:
    """Fill each result's deltas against `base` and its failures."""
    base_tau, base_acc = base.run.stats["tau_zlab"], base.run.stats["acceptance_rate"]
    for r in results:
        tau = r.run.stats["tau_zlab"]
        r.delta_tau = tau - base_tau
        r.delta_tau_relative = r.delta_tau / base_tau if base_tau else 0.0
        r.delta_acceptance = r.run.stats["acceptance_rate"] - base_acc
        r.failures = []
        if max_drop is not None and r.delta_tau_relative < -max_drop:
            r.failures.append(f"tau {tau:.3f} is {-100 * r.delta_tau_relative:.1f}% below the baseline's "
                              f"{base_tau:.3f} (--max-drop {max_drop:g})")
        if min_tau is not None and tau < min_tau:
            r.failures.append(f"tau {tau:.3f} is below --min-tau {min_tau:g}")
        for run, what in [(r.run, "output")] + [(t.run, f"output with a draft tree of {t.budget}") for t in r.trees]:
            if not run.outputs_match_target:
                r.failures.append(f"{what} differs from target-only greedy decoding on {len(run.mismatches)} of "
                                  f"{run.prompts} prompts")


@contextlib.contextmanager
def drafter_files(drafts, target):
    """Each drafter as a GGUF path: HF checkpoint directories are converted (llama.cpp profile, for `target`)
    into one temporary directory, removed on leaving, on errors and interrupts too."""
    with contextlib.ExitStack() as stack:
        tmp, paths = None, []
        for i, d in enumerate(drafts):
            if not os.path.isdir(d):
                paths.append(str(d))
                continue
            tmp = tmp or stack.enter_context(temporary_directory("ggtools-accept-"))
            out = os.path.join(tmp, f"{i}-{os.path.basename(os.path.normpath(d))}.gguf")
            try:
                convert_dflash(d, out, profile="llama.cpp", target=target)
            except GGToolsError as e:
                raise AcceptError(f"--draft {d}: an HF directory that does not convert: {e}") from None
            paths.append(out)
        yield paths


def input_files(target, drafts, prompts) -> list[str]:
    """Every file accept reads (a report may replace none of them): the target's set, each drafter (each file
    of a checkpoint directory), the prompts."""
    files = ShardSet(target).paths if os.path.isfile(target) else [str(target)]
    for d in drafts:
        files += files_of(d) if os.path.isdir(d) else [str(d)]
    return files + ([str(prompts)] if prompts else [])


def _check_inputs(target, drafts, baseline) -> int:
    """The index of the baseline drafter, once every path is there."""
    try:
        regular_file(target)
    except GGToolsError as e:
        raise AcceptError(f"{e} (--target)") from None
    if not drafts:
        raise AcceptError("give at least one --draft")
    real = [os.path.realpath(d) for d in drafts]
    for i, d in enumerate(drafts):
        if not os.path.exists(d):
            raise AcceptError(f"{d}: no such file or directory (--draft)")
        if real[i] in real[:i]:
            raise AcceptError(f"{d}: given twice as --draft")
    if baseline is None:
        return 0
    if os.path.realpath(baseline) not in real:
        raise AcceptError(f"--baseline {baseline}: not one of the --draft files")
    return real.index(os.path.realpath(baseline))


def _names(drafts) -> list[str]:
    names = [os.path.basename(os.path.normpath(d)) + ("/" if os.path.isdir(d) else "") for d in drafts]
    return [name if names.count(name) == 1 else str(d) for name, d in zip(names, drafts)]
