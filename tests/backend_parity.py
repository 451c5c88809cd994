"""The torch backend against the numba runtime on one target GGUF, for the parity tests and
scripts/bench/torch_backend.py:

- prompt logits, torch (f32, CPU) against numba, beside numba's own batch-against-one-token-steps difference
  (llama.cpp's kernels for a batch and for one row sum in different orders: how far its own logits move when
  only the summation order changes);
- teacher-forced layers: each torch layer fed numba's residual stream entering it, its output against numba's
  stream entering the next layer (no error carried from earlier layers);
- greedy paths with their top-1 / top-2 margins; routing margins of routed-expert layers (a router's k-th and
  (k+1)-th logits that close swap experts on any difference, a discontinuity no arithmetic is spared).

Relative differences are max |difference| / max |numba's values|.
"""

from dataclasses import dataclass

import numpy as np
import torch

from ggtools.runtime import TargetModel


@dataclass
class LogitParity:
    abs_diff: float         # max |torch - numba| over the prompt's logits
    rel_diff: float         # abs_diff / max |numba logit|
    own_rel_diff: float     # numba batch against numba one-token steps, relative


def random_prompt(model: TargetModel, seed: int, n: int) -> list[int]:
    return [1] + np.random.default_rng(seed).integers(3, min(model.n_vocab, 1024), n - 1).tolist()


def relative(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def logit_parity(numba: TargetModel, on_torch: TargetModel, ids) -> LogitParity:
    numba.kv.clear()
    on_torch.kv.clear()
    want, _ = numba.forward(ids)
    got, _ = on_torch.forward(ids)
    numba.kv.clear()
    steps, _ = numba.forward(ids, stepwise=True)
    return LogitParity(float(np.abs(got - want).max()), relative(got, want), relative(steps, want))


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


def routing_margin(model: TargetModel, ids) -> float:
    """The smallest gap between the k-th and (k+1)-th router logit (the experts' ranking, whatever the gating)
    over the prompt's tokens and the model's routed-expert layers (inf without any), on the model's own stream."""
    n_layer, ops, hp = model.hp.n_layer, model.ops, model.hp
    model.kv.clear()
    _, streams = model.forward(ids, taps=range(n_layer))
    model.kv.clear()
    model.kv.reserve(len(ids))
    positions = np.arange(len(ids))
    rope = model.rope_tables(positions)
    margin = float("inf")
    for i, layer in enumerate(model.layers):
        routed = getattr(layer.ffn, "routed", layer.ffn)
        if not hasattr(routed, "router"):
            continue
        x = streams[:, i]
        mid = layer.mixer(ops.rms_norm(x, layer.attn_norm, hp.rms_eps), positions, rope, model.kv, layer.slot, hp,
                          False) + x
        ranked = np.sort(routed.router(ops.rms_norm(mid, layer.ffn_norm, hp.rms_eps)), 1)[:, ::-1]
        k = routed.n_expert_used
        margin = min(margin, float((ranked[:, k - 1] - ranked[:, k]).min()))
    return margin


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
