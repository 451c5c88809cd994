"""Expected acceptance of one verified chain at temperature > 0, without the noise of one seed's draws.

The target verifies [anchor, d_1 .. d_n] in one batch: row j - 1 gives the distribution P_j its sampler draws d_j's
position from (the chain after top-k / top-p / ..., temperature; the penalties' history as if d_1 .. d_{j-1} had
been accepted). Two acceptance rules:

- llama.cpp's (exact match, common_sampler_sample_and_accept_n): d_j is accepted when the target's draw equals it,
  with probability a_j = P_j(d_j); drafting stops at the first miss.
- rejection sampling (vLLM, SGLang): the draft token is drawn from the drafter's own distribution Q_j and accepted
  with probability min(1, P/Q), which accepts with probability sum_x min(P_j(x), Q_j(x)) whatever token was drawn.
  Q_j: the same sampler chain on the drafter's logits for position j (DraftChain.rows), so both sides see the same
  truncation and temperature. Evaluated along the drafted chain (a rejection sampler's own draws would take other
  paths, whose rows this batch did not verify).

Either way, the expected number of accepted drafts of the step is sum_k prod_{j <= k} a_j (the position k is
reached only if every earlier one was accepted).
"""

from dataclasses import dataclass

import numpy as np


@dataclass
class ExpectedAcceptance:
    exact_match: float                 # expected accepted drafts under llama.cpp's rule
    rejection: float | None            # ... under rejection sampling (None: the drafter gives no distribution)


def expected_acceptance(sampler, logits, drafts: list, draft_rows=None) -> ExpectedAcceptance:
    """logits: the verified batch's rows (row 0: the anchor's); draft_rows: the drafter's logits per draft, or None.
    The sampler's history is left as it was; no draw is made."""
    exact, rejection = [], []
    with sampler.trial():
        for j, token in enumerate(drafts):
            p = sampler.probabilities(logits[j])
            exact.append(float(p[token]))
            if draft_rows is not None:
                rejection.append(float(np.minimum(p, sampler.probabilities(draft_rows[j])).sum()))
            sampler.accept(token)
    return ExpectedAcceptance(_expected_run(exact), _expected_run(rejection) if draft_rows is not None else None)


def _expected_run(rates) -> float:
    """sum over k of the probability that the first k drafts are all accepted."""
    return float(np.cumprod(rates).sum()) if len(rates) else 0.0
