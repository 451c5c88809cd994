"""The torch backend against the numba runtime on one target GGUF, for the parity tests (test_torch_parity.py):

- prompt logits, torch against numba, for a batch and for one-token steps (`stepwise`), beside numba's own
  batch-against-one-token-steps difference (llama.cpp's kernels for a batch and for one row sum float weights
  in different orders: how far its own logits move when only the summation order changes);
- teacher-forced layers: each torch layer fed numba's residual stream entering it, its output against numba's
  stream entering the next layer (no error carried from earlier layers);
- greedy paths with their top-1 / top-2 margins.

Relative differences are max |difference| / max |numba's values|.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ggtools.runtime import TargetModel


@dataclass
class LogitParity:
    rel_diff: float         # max |torch - numba| / max |numba logit| over the prompt's logits (a batch)
    step_rel_diff: float    # the same with every row a one-token step on both
    equal: bool             # both bit for bit
    own_rel_diff: float     # numba batch against numba one-token steps, relative
    max_logit: float        # max |numba logit|


def random_prompt(model: TargetModel, seed: int, n: int) -> list[int]:
    return [1] + np.random.default_rng(seed).integers(3, min(model.n_vocab, 1024), n - 1).tolist()


def relative(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def prompt_logits(model: TargetModel, ids, stepwise: bool = False) -> np.ndarray:
    model.kv.clear()
    return model.forward(ids, stepwise=stepwise)[0]


def logit_parity(numba: TargetModel, on_torch: TargetModel, ids) -> LogitParity:
    want, got = prompt_logits(numba, ids), prompt_logits(on_torch, ids)
    want_steps, got_steps = prompt_logits(numba, ids, True), prompt_logits(on_torch, ids, True)
    return LogitParity(relative(got, want), relative(got_steps, want_steps),
                       np.array_equal(got, want) and np.array_equal(got_steps, want_steps),
                       relative(want_steps, want), float(np.abs(want).max()))


def layer_errors(numba: TargetModel, on_torch: TargetModel, ids) -> list[float]:
    """Per layer, relative: torch's layer i on numba's stream entering it, against numba's stream entering layer
    i + 1 (for the last layer, both through the output norm: numba's final normed state)."""
    n_layer = numba.hp.n_layer
    numba.kv.clear()
    on_torch.kv.clear()
    _, streams = numba.forward(ids, taps=range(n_layer + 1))
    positions = np.arange(len(ids))
    on_torch.kv.reserve(len(ids))
    rope = on_torch.rope_tables(positions)
    errors = []
    for i in range(n_layer):
        out = on_torch.run_layer(i, torch.from_numpy(np.ascontiguousarray(streams[:, i])), positions, rope)
        if i == n_layer - 1:
            out = on_torch.ops.rms_norm(out, on_torch.output_norm, on_torch.hp.rms_eps)
        errors.append(relative(out.numpy(), streams[:, i + 1]))
    return errors


def greedy_path(model: TargetModel, ids, n: int) -> tuple[list[int], list[float]]:
    """Greedy tokens by one-token steps after the prompt, and the top-1 minus top-2 logit of each choice."""
    model.kv.clear()
    logits, _ = model.forward(ids, logits="last")
    tokens, margins = [], []
    while True:
        top2 = np.sort(logits[-1])[-2:]
        tokens.append(int(np.argmax(logits[-1])))
        margins.append(float(top2[1] - top2[0]))
        if len(tokens) == n:
            return tokens, margins
        logits, _ = model.forward([tokens[-1]], logits="last")
