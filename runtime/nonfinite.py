"""Non-finite values decide nothing: every forward's logits are checked on the host (np.isfinite on what is there
anyway), and so is every other number a draft is chosen by (a DSpark confidence, a DFlash2 selector's scores, a
Markov head's bias); when NaN or inf appear, the step is traced to the piece and the tensor that made them, so the
run stops with one line naming them (NonFiniteError: exit 2) instead of decoding argmax(NaN) = token 0.

The normal path pays one isfinite over the logits (over the final states when no logits are asked for); only a
failed step is run again, the same forward with a check after each piece (TargetModel.trace: the embedding, each
layer's token mixer and FFN, or each layer of kimi-k3's residual bank, its final mix, the output norm and head; its
cache is cropped back first), and the tensors of the piece that failed are scanned (ggml_validate_row_data's rules:
NaN/inf values, NaN/inf scales, MXFP4's exponent 0xFF). Which tensors a piece reads is what its loader read
(WeightFile.recording), never a list of names. When they are finite, every tensor the model read is scanned before
the piece is said to overflow: a NaN whose effect shows only later (through a mix, or an activation that squashes
inf, as tanh and sigmoid do) is still named. Vectors (norms, biases, scales, score vectors) never get this far: read
whole at load, they are refused there when not finite (WeightFile.vector), whether or not they reach the logits.
"""

import numpy as np

from ggtools.runtime.errors import NonFiniteError


def finite(ops, x) -> bool:
    return bool(np.isfinite(ops.host(x)).all())


class _Found(Exception):
    """The first piece of a traced step that gives NaN/inf."""

    def __init__(self, piece: str):
        super().__init__(piece)
        self.piece = piece


def target_error(model, tokens, positions, start: int, stepwise: bool, batch=None,
                 outcome: str = "the logits are not finite") -> NonFiniteError:
    """The error for a target step (tokens at `positions`, a tree's rows when batch is its TreeBatch, the cache
    holding `start` tokens before it) whose logits (or final states) are not finite: which piece first gives NaN/inf,
    and the first of its tensors holding them."""
    w = model.weights
    try:
        model.kv.crop(start)
    except ValueError:           # a cache that cannot roll back: name any tensor the model read holding NaN/inf
        return tensors_error(model.path, w, "a layer", w.read_names, outcome)
    piece = "the forward"        # the trace found nothing (it computes the same numbers): scan every tensor
    try:
        model.trace(tokens, positions, stepwise, batch, lambda x, name: _check(model.ops, x, name))
    except _Found as found:
        piece = found.piece
    finally:
        model.kv.crop(start)
    return tensors_error(model.path, w, piece, model.piece_tensors.get(piece, w.read_names), outcome)


def _check(ops, x, piece: str) -> None:
    if not finite(ops, x):
        raise _Found(piece)


def drafter_error(drafter, block_ids) -> NonFiniteError:
    """The error for a draft block whose logits are not finite: the first tensor the drafter read holding NaN/inf (a
    drafter is small: all of them are scanned), else an embedding row of the block, else a tensor of the target the
    drafter reads (its embedding or head), else its computation."""
    w, outcome = drafter.weights, "the draft logits are not finite"
    if w.nonfinite(w.read_names) is None:
        if len(block_ids) and not finite(drafter.ops, drafter.embedding.rows(block_ids)):
            return NonFiniteError(f"{drafter.path}: the embedding rows of the block {list(map(int, block_ids))} "
                                  f"({drafter.embedding.name}) hold NaN/inf: {outcome}")
        target = drafter.target
        borrowed = [m.name for m in (drafter.embedding, drafter.head) if m is target.token_embd or m is target.output]
        if target.weights.nonfinite(borrowed) is not None:
            return tensors_error(target.path, target.weights, f"the drafter {drafter.path}", borrowed, outcome)
    return tensors_error(drafter.path, w, "the drafter", w.read_names, outcome)


def tensors_error(path, weights, piece: str, names, outcome: str) -> NonFiniteError:
    """NaN/inf that `piece` gives, traced to the first of its tensors `names` holding NaN/inf, else to the first of
    every tensor `weights` has read, else an overflow."""
    bad = weights.nonfinite(names)
    if bad is not None:
        name, where = bad
        return NonFiniteError(f"{path}: tensor '{name}' holds NaN/inf (first at {where}), so {piece} gives NaN/inf: "
                              f"{outcome}")
    scanned = set(names)
    bad = weights.nonfinite([n for n in weights.read_names if n not in scanned])
    if bad is not None:
        name, where = bad
        return NonFiniteError(f"{path}: tensor '{name}' holds NaN/inf (first at {where}), and {piece} gives NaN/inf: "
                              f"{outcome}")
    return NonFiniteError(f"{path}: {piece} gives NaN/inf although its tensors are finite (an overflow): {outcome}")
