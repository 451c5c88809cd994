"""Greedy decoding with a TargetModel: `greedy` from a prompt, `continue_greedy` from a row of logits."""

import numpy as np

from ggtools.runtime.model.model import TargetModel


def greedy(model: TargetModel, prompt_ids, n: int, stop_ids=()) -> tuple[list, str]:
    """Greedy continuation of prompt_ids by up to n tokens (appending to model.kv).
    Returns (generated ids, "length" or "end-of-generation")."""
    logits, _ = model.forward(prompt_ids, logits="last")
    return continue_greedy(model, logits, n, stop_ids)


def continue_greedy(model: TargetModel, logits, n: int, stop_ids=(), progress=None) -> tuple[list, str]:
    """Greedy tokens from the last row of logits on, one forward step per token after the first.
    progress(k): called with the number of new tokens as they come."""
    out = []
    while len(out) < n:
        token = int(np.argmax(logits[-1]))
        out.append(token)
        if progress:
            progress(1)
        if token in stop_ids:
            return out, "end-of-generation"
        if len(out) < n:
            logits, _ = model.forward([token], logits="last")
    return out, "length"
