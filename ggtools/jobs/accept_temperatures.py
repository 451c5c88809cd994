"""`ggtools accept --temp T,T... --seeds N`: every drafter measured at every temperature.

A Decoding is one way the target chooses its tokens: greedy (T = 0, decoded once) or sampled at T > 0 with one seed
of S, S + 1, ..., S + N - 1. Target-only decoding of every prompt runs once per Decoding and serves every drafter:
each drafter's output must equal it (llama.cpp's exact-match rule makes speculative decoding's output the target's
own sampled decoding with the same seed).

A TemperatureResult gathers one drafter's runs at one temperature: τ and acceptance as the mean and the spread
(min..max) over the seeds, the other figures as means over them, and the expected acceptance under llama.cpp's
exact-match rule and under rejection sampling (runtime/expected_acceptance.py). With one run (T = 0) every mean is
that run's own value.
"""

import secrets
from dataclasses import dataclass, field

from ggtools.jobs.errors import UsageError
from ggtools.jobs.run import SpecRun
from ggtools.jobs.sampling import MAX_SEED, sampling_params
from ggtools.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class Decoding:
    temp: float
    seed: int | None                    # None: greedy
    params: SamplingParams | None       # the target's sampler chain (None: greedy)


GREEDY = Decoding(0.0, None, None)


def check_temperatures(temps, seeds: int, seed: int | None, tree_budgets=()) -> None:
    """Refuse what the temperatures cannot mean: no temperature, seeds without a temperature above 0 (greedy decoding
    has no seed), draft trees without temperature 0 (trees are measured with greedy decoding)."""
    if not temps:
        raise UsageError("--temp", "give at least one temperature")
    if not any(t > 0 for t in temps) and (seeds != 1 or seed is not None):
        option = f"--seeds {seeds}" if seeds != 1 else f"--seed {seed}"
        raise UsageError(option, "needs --temp above 0: at temperature 0 decoding is greedy, one pass with no seed")
    if tree_budgets and 0 not in temps:
        raise UsageError("--tree-budget", "draft trees are measured with greedy decoding: give 0 among the --temp "
                                          "temperatures")


def seed_list(seed: int | None, count: int) -> list[int]:
    """`count` consecutive seeds from `seed` (None: a random first seed that leaves room for them)."""
    first = secrets.randbelow(MAX_SEED + 2 - count) if seed is None else seed
    last = first + count - 1
    if last > MAX_SEED:
        raise UsageError("--seed", f"{seed} with --seeds {count}: the seeds {first}..{last} pass {MAX_SEED}, the "
                                   f"largest seed (llama.cpp reads {MAX_SEED + 1} as 'a random seed')")
    return list(range(first, first + count))


def decodings(model, temps, seeds: list[int], chain: dict) -> list[Decoding]:
    """One Decoding per temperature 0 and per (temperature above 0, seed), in the order given; chain: the user's
    sampler options (SamplingParams fields) over the model's defaults. Refused before anything is decoded."""
    out = []
    for t in temps:
        out += [GREEDY] if t == 0 else [Decoding(t, s, sampling_params(model, chain, t, s)) for s in seeds]
    return out


@dataclass
class Spread:
    mean: float
    min: float
    max: float


def spread(values) -> Spread:
    values = list(values)
    return Spread(sum(values) / len(values), min(values), max(values))


@dataclass
class TemperatureResult:
    temp: float
    seeds: list[int]                    # one run per seed ([]: T = 0, greedy, one run)
    runs: list[SpecRun]
    tau: Spread                         # tau_zlab over the seeds
    acceptance: Spread                  # acceptance_rate over the seeds
    mean_len: float                     # mean_accepted_length_incl_bonus; this and the rest: means over the seeds
    drafts_per_step: float
    draft_ms_per_step: float
    tokens_per_second: float
    speedup: float                      # over target-only decoding of the same (T, seed), then averaged
    per_position_accept_rate: list[float]
    tau_per_prompt: list[float]
    expected_acceptance: float | None             # exact match (llama.cpp's rule); None at T = 0
    expected_mean_len: float | None               # 1 + expected accepted drafts (exact match) / steps
    expected_acceptance_rejection: float | None   # rejection sampling; None where the drafter gives no distribution
    outputs_match_target: bool          # every seed's outputs equal target-only decoding with that seed
    delta_tau: float = 0.0              # tau.mean - the baseline's at this temperature
    delta_tau_relative: float = 0.0
    delta_acceptance: float = 0.0
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


@dataclass
class TargetOnlyAt:
    """Target-only decoding at one temperature: the reference every drafter's output must equal."""
    temp: float
    seeds: list[int]                    # [] at T = 0
    reference_outputs: list[list[list]]     # per seed (one at T = 0), per prompt
    target_tokens_per_second: float     # the fastest pass of each seed, averaged over the seeds


def target_only_results(decoded: list[Decoding], references: list[list[list]], tps: list[float]) -> list[TargetOnlyAt]:
    temps = list(dict.fromkeys(d.temp for d in decoded))
    out = []
    for t in temps:
        at = [k for k, d in enumerate(decoded) if d.temp == t]
        out.append(TargetOnlyAt(t, [decoded[k].seed for k in at if decoded[k].seed is not None],
                                [references[k] for k in at], _mean(tps[k] for k in at)))
    return out


def drafts_per_step(run: SpecRun) -> float:
    s = run.stats
    return s["drafted_tokens"] / s["steps"] if s["steps"] else 0.0


def draft_ms_per_step(run: SpecRun) -> float:
    """Milliseconds of drafting (draft KV appends and the drafter's forward) per verify step."""
    steps = run.stats["steps"]
    return 1000 * run.draft_seconds_share * run.decode_seconds / steps if steps else 0.0


def temperature_results(decoded: list[Decoding], runs: list[SpecRun], speedups: list[float]) -> list[TemperatureResult]:
    """One drafter's runs (one per Decoding, with its speedup) gathered per temperature, in the order given."""
    temps = list(dict.fromkeys(d.temp for d in decoded))
    return [_at(t, [(d, r, x) for d, r, x in zip(decoded, runs, speedups) if d.temp == t]) for t in temps]


def _at(temp: float, measured: list) -> TemperatureResult:
    runs = [r for _, r, _ in measured]
    stats = [r.stats for r in runs]
    return TemperatureResult(
        temp=temp, seeds=[d.seed for d, _, _ in measured if d.seed is not None], runs=runs,
        tau=spread(s["tau_zlab"] for s in stats), acceptance=spread(s["acceptance_rate"] for s in stats),
        mean_len=_mean(s["mean_accepted_length_incl_bonus"] for s in stats),
        drafts_per_step=_mean(map(drafts_per_step, runs)), draft_ms_per_step=_mean(map(draft_ms_per_step, runs)),
        tokens_per_second=_mean(r.speculative_tokens_per_second for r in runs),
        speedup=_mean(x for _, _, x in measured),
        per_position_accept_rate=_means([s["per_position_accept_rate"] for s in stats]),
        tau_per_prompt=_means([r.tau_per_prompt for r in runs]),
        expected_acceptance=_mean_of(stats, "expected_acceptance_rate"),
        expected_mean_len=_mean_of(stats, "expected_mean_accepted_length_incl_bonus"),
        expected_acceptance_rejection=_mean_of(stats, "expected_acceptance_rate_rejection"),
        outputs_match_target=all(r.outputs_match_target for r in runs))


def _mean(values) -> float:
    values = list(values)
    return sum(values) / len(values)


def _means(rows: list[list]) -> list[float]:
    """Element by element."""
    return [_mean(column) for column in zip(*rows)]


def _mean_of(stats: list[dict], name: str) -> float | None:
    """The mean of a statistic every run has (None when one lacks it: greedy, or no drafter distribution)."""
    return _mean(s[name] for s in stats) if all(name in s for s in stats) else None


def judge_temperature(result: TemperatureResult, base: TemperatureResult, max_drop: float | None,
                      min_tau: float | None, min_acceptance: float | None, named: bool) -> None:
    """Fill a drafter's deltas against the baseline's at the same temperature and its failures there; named: each
    failure says the temperature (else the words of a greedy-only gate)."""
    tau, base_tau = result.tau.mean, base.tau.mean
    result.delta_tau = tau - base_tau
    result.delta_tau_relative = result.delta_tau / base_tau if base_tau else 0.0
    result.delta_acceptance = result.acceptance.mean - base.acceptance.mean
    at = f"at T {result.temp:g}, " if named else ""
    result.failures = []
    if max_drop is not None and result.delta_tau_relative < -max_drop:
        result.failures.append(f"{at}tau {tau:.3f} is {-100 * result.delta_tau_relative:.1f}% below the baseline's "
                               f"{base_tau:.3f} (--max-drop {max_drop:g})")
    if min_tau is not None and tau < min_tau:
        result.failures.append(f"{at}tau {tau:.3f} is below --min-tau {min_tau:g}")
    if min_acceptance is not None and result.acceptance.mean < min_acceptance:
        result.failures.append(f"{at}acceptance {result.acceptance.mean:.3f} is below --min-acceptance "
                               f"{min_acceptance:g}")
    for seed, run in zip(result.seeds or [None], result.runs):
        if not run.outputs_match_target:
            result.failures.append(f"{at}output differs from target-only {_decoding(result.temp, seed)} on "
                                   f"{len(run.mismatches)} of {run.prompts} prompts")


def _decoding(temp: float, seed: int | None) -> str:
    return "greedy decoding" if seed is None else f"sampled decoding (seed {seed})"
