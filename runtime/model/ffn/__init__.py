"""Feed-forward blocks of a target layer: `ffn(h, stepwise) -> (T, n_embd)`."""
