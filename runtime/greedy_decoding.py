"""Target-only decoding with a TargetModel: greedy (temperature 0), or sampled through a `Sampler` (sampling.py).

`greedy` / `continue_greedy` take the argmax of each row; given a sampler they draw from its chain instead, the
prompt's tokens and every generated one accepted into it first (its penalties' history), as llama-server does.
"""

import numpy as np

from ggtools.runtime.model.model import TargetModel


def greedy(model: TargetModel, prompt_ids, n: int, stop_ids=(), sampler=None) -> tuple[list, str]:
    """The continuation of prompt_ids by up to n tokens (appending to model.kv).
    Returns (generated ids, "length" or "end-of-generation")."""
    logits, _ = model.forward(prompt_ids, logits="last")
    if sampler is not None:
        sampler.accept_tokens(prompt_ids)
    return continue_greedy(model, logits, n, stop_ids, sampler=sampler)


def continue_greedy(model: TargetModel, logits, n: int, stop_ids=(), progress=None, sampler=None) -> tuple[list, str]:
    """Tokens from the last row of logits on, one forward step per token after the first: each the row's argmax, or
    the sampler's draw. progress(k): called with the number of new tokens as they come."""
    out = []
    while len(out) < n:
        token = next_token(logits[-1], sampler)
        out.append(token)
        if progress:
            progress(1)
        if token in stop_ids:
            return out, "end-of-generation"
        if len(out) < n:
            logits, _ = model.forward([token], logits="last")
    return out, "length"


def next_token(row, sampler=None) -> int:
    """The token a row of logits gives: its argmax (temperature 0), or the sampler's draw, accepted into it."""
    if sampler is None:
        return int(np.argmax(row))
    token = sampler.sample(row)
    sampler.accept(token)
    return token
