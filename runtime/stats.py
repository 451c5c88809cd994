"""Acceptance statistics of speculative runs, with the names and definitions of reference §11.

`acceptance_stats(runs, block)` takes each sequence's steps (speculative.Step: drafted, accepted, produced, and for a
sampled chain its expected acceptance) and the verified block length (n_max + 1); `DEFINITIONS` says what every
number means, so reports can print the definition beside the value.
"""

DEFINITIONS = {
    "sequences": "prompts decoded",
    "steps": "verify passes (llama.cpp n_call_accept)",
    "generated_tokens": "tokens committed by the verify steps (the first token of each sequence comes from prefill)",
    "drafted_tokens": "sum of drafts offered per step (llama.cpp #gen tokens; with a draft tree, its nodes)",
    "accepted_tokens": "sum of accepted drafts, excluding the bonus (llama.cpp #acc tokens)",
    "acceptance_rate": "accepted_tokens / drafted_tokens (llama-server draft acceptance)",
    "mean_accepted_length_incl_bonus": "1 + accepted_tokens / steps (llama.cpp mean acc len)",
    "tau_zlab": "mean over sequences of (mean over steps of accepted + 1) (z-lab tau)",
    "per_position_accept_rate": "[i] = steps with more than i accepted / steps (llama.cpp acc rate/pos)",
    "steps_with_any_accept": "steps with at least one accepted draft (llama.cpp #acc drafts)",
    "accept_length_histogram": "[k-1] = fraction of steps with accepted + 1 = k (z-lab histogram)",
    "lucebox_accept_rate": "sum(min(1 + accepted, produced)) / (steps * block), block = n_max + 1 (lucebox "
                           "accept_rate, about tau / block)",
    "verified_per_step": "tokens in the verify batch per step: 1 + drafted (a tree's root and nodes)",
    "accepted_per_step": "accepted_tokens / steps",
    "avg_commit_per_step": "generated tokens / steps (lucebox avg_commit)",
}
# sampled decoding (temperature > 0) only: what the steps' drafts are worth on average over the target's draws
EXPECTED_DEFINITIONS = {
    "expected_acceptance_rate": "sum over steps of the expected accepted drafts under llama.cpp's exact-match rule "
                                "(the target's draw equals the draft: P(draft) per position) / drafted_tokens",
    "expected_mean_accepted_length_incl_bonus": "1 + the expected accepted drafts (exact match) / steps",
    "expected_acceptance_rate_rejection": "the same under rejection sampling (vLLM, SGLang: sum of min(P, Q) per "
                                          "position, Q the drafter's distribution through the same sampler chain) / "
                                          "drafted_tokens",
}
DEFINITIONS = DEFINITIONS | EXPECTED_DEFINITIONS


def acceptance_stats(runs: list, block: int) -> dict:
    """runs: one list of Steps per sequence; block: n_max + 1."""
    steps = [s for run in runs for s in run]
    n = len(steps)
    drafted = sum(s.drafted for s in steps)
    accepted = sum(s.accepted for s in steps)
    per_run = [1 + sum(s.accepted for s in run) / len(run) for run in runs if run]
    return {
        "sequences": len(runs),
        "steps": n,
        "generated_tokens": sum(s.produced for s in steps),
        "drafted_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "mean_accepted_length_incl_bonus": 1 + accepted / n if n else 0.0,
        "tau_zlab": sum(per_run) / len(per_run) if per_run else 0.0,
        "per_position_accept_rate": [sum(s.accepted > i for s in steps) / n if n else 0.0 for i in range(block - 1)],
        "steps_with_any_accept": sum(s.accepted > 0 for s in steps),
        "accept_length_histogram": [sum(s.accepted + 1 == k for s in steps) / n if n else 0.0
                                    for k in range(1, block + 1)],
        "lucebox_accept_rate": sum(min(1 + s.accepted, s.produced) for s in steps) / (n * block) if n else 0.0,
        "verified_per_step": sum(1 + s.drafted for s in steps) / n if n else 0.0,
        "accepted_per_step": accepted / n if n else 0.0,
        "avg_commit_per_step": sum(s.produced for s in steps) / n if n else 0.0,
    } | _expected(steps, drafted)


def _expected(steps, drafted: int) -> dict:
    """The expected-acceptance statistics, where every step of a sampled chain recorded them."""
    if not steps or any(s.expected is None for s in steps):
        return {}
    exact = sum(s.expected.exact_match for s in steps)
    out = {"expected_acceptance_rate": exact / drafted if drafted else 0.0,
           "expected_mean_accepted_length_incl_bonus": 1 + exact / len(steps)}
    if all(s.expected.rejection is not None for s in steps):
        rejection = sum(s.expected.rejection for s in steps)
        out["expected_acceptance_rate_rejection"] = rejection / drafted if drafted else 0.0
    return out
