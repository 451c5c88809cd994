"""Token mixers of a target layer: `mixer(h, positions, rope, kv, layer, hp, stepwise) -> (T, n_embd)`."""
