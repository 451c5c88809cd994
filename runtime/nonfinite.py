"""Non-finite values decide nothing: every forward's logits are checked on the host (np.isfinite on what is there
anyway), and when NaN or inf appear, the step is traced to the layer and the tensor that made them, so the run
stops with one line naming them (NonFiniteError: exit 2) instead of decoding argmax(NaN) = token 0.

The normal path pays one isfinite over the logits (over the final states when no logits are asked for); only a failed step is run again with a check after each
piece (the target: embeddings, each layer's token mixer and FFN, the head; its cache is cropped back first), and
only the tensors of the piece that failed are scanned (ggml_validate_row_data's rules: NaN/inf values or scales).
"""

import numpy as np

from ggtools.runtime.errors import NonFiniteError


def finite(ops, x) -> bool:
    return bool(np.isfinite(ops.host(x)).all())


def target_error(model, tokens, positions, start: int, stepwise: bool,
                 outcome: str = "the logits are not finite") -> NonFiniteError:
    """The error for a target step (tokens at `positions`, the cache holding `start` tokens before it) whose logits
    (or final states) are not finite: which piece first gives NaN/inf, and the first of its tensors holding them."""
    try:
        model.kv.crop(start)
        piece, names = _first_nonfinite_piece(model, tokens, positions, stepwise)
        model.kv.crop(start)
    except ValueError:           # a cache that cannot roll back: name any tensor of the model holding NaN/inf
        piece, names = "a layer", model.weights.ordered_names
    return tensors_error(model.path, model.weights, piece, names, outcome)


def _first_nonfinite_piece(model, tokens, positions, stepwise) -> tuple[str, list[str]]:
    ops, w, hp = model.ops, model.weights, model.hp
    x = model.token_embd.rows(tokens)
    if not finite(ops, x):
        return "the token embedding", ["token_embd.weight"]
    model.kv.reserve(int(positions[-1]) + 1)
    rope = model.rope_tables(positions)
    ffn_names = ("ffn_", f"{model.arch.ffn_norm}.")
    for i in range(hp.n_layer):
        layer_names = [n for n in w.ordered_names if n.startswith(f"blk.{i}.")]
        ffn = [n for n in layer_names if n[len(f"blk.{i}."):].startswith(ffn_names)]
        x = model.mix(i, x, positions, rope, stepwise)
        if not finite(ops, x):
            return f"layer {i}'s token mixer", [n for n in layer_names if n not in ffn]
        x = model.feed_forward(i, x, stepwise)
        if not finite(ops, x):
            return f"layer {i}'s feed-forward network", ffn
    head = "output.weight" if w.has("output.weight") else "token_embd.weight"
    return "the output norm and head", ["output_norm.weight", head, "rope_freqs.weight"]


def drafter_error(drafter, block_ids) -> NonFiniteError:
    """The error for a draft block whose logits are not finite: the first drafter tensor holding NaN/inf (a drafter
    is small: all of them are scanned), else an embedding row of the block, else its computation."""
    names = drafter.weights.ordered_names
    if drafter.weights.nonfinite(names) is None and not finite(drafter.ops, drafter.embedding.rows(block_ids)):
        return NonFiniteError(f"{drafter.path}: the embedding rows of the block {list(map(int, block_ids))} "
                              f"({drafter.embedding.name}) hold NaN/inf: the draft logits are not finite")
    return tensors_error(drafter.path, drafter.weights, "the drafter", names, "the draft logits are not finite")


def tensors_error(path, weights, piece: str, names, outcome: str) -> NonFiniteError:
    bad = weights.nonfinite(names)
    if bad is None:
        return NonFiniteError(f"{path}: {piece} gives NaN/inf although its tensors are finite (an overflow): "
                              f"{outcome}")
    name, where = bad
    return NonFiniteError(f"{path}: tensor '{name}' holds NaN/inf (first at {where}), so {piece} gives NaN/inf: "
                          f"{outcome}")
