"""TargetModel: a target GGUF run by one backend's ops: numba on the CPU (the default, as llama.cpp runs it) or torch.

Each layer is `x += mixer(norm(x)); x += ffn(norm(x))`; which mixer and which FFN a layer has comes from the
architecture table (archs.py), loaded as the backend's pieces. This loop, the inputs' checks and the RoPE angles
are the same for every backend; arrays are the backend's, logits come back as numpy on the host.

    model = TargetModel("target.gguf")
    logits, features = model.forward(prompt_ids, taps=[1, 5])   # appends to model.kv
    model.kv.crop(n)                                             # roll back to n tokens
    logits, _ = model.forward(tokens, tree=parents, stepwise=True)   # a draft tree's rows (tree_batch.py)
    model.kv.keep_path(rows)                                     # keep one path of it
"""

from dataclasses import dataclass

import numpy as np

from ggtools.runtime import nonfinite
from ggtools.runtime.errors import ModelError
from ggtools.runtime.kernels import ops as kernel_ops
from ggtools.runtime.kernels.direct_call import DirectCall
from ggtools.runtime.backends import make_ops
from ggtools.runtime.model.archs import arch_of
from ggtools.runtime.model.hparams import read_hparams
from ggtools.runtime.model.hybrid_cache import HybridCache
from ggtools.runtime.model.kvcache import KVCache
from ggtools.runtime.model.tree_batch import TreeBatch


# the pieces of a forward that the non-finite trace names (besides each layer's)
EMBEDDING, HEAD = "the token embedding", "the output norm and head"
FINAL_MIX = "the residual mix before the output norm"        # kimi-k3's residual bank


def mixer_piece(i: int) -> str:
    return f"layer {i}'s token mixer"


def ffn_piece(i: int) -> str:
    return f"layer {i}'s feed-forward network"


@dataclass
class Layer:
    attn_norm: object
    mixer: object
    ffn_norm: object
    ffn: object
    slot: int = 0       # the mixer's place in the cache: its index among the layers with the same kind of mixer


class TargetModel:
    """A target model with its own KV cache (`kv`). Not thread-safe; one sequence at a time."""

    def __init__(self, path, threads: int | None = None, kv_type: str = "f16", backend: str = "numba",
                 device: str | None = None, dtype: str | None = None):
        """path: a target GGUF (the first shard of a split model); threads: CPU threads (numba's workers are
        process-wide; default all cores); kv_type: "f16" (llama.cpp's default cache type) or "f32"; backend:
        "numba" or "torch", with torch's device ("cpu", "cuda[:N]") and compute dtype (backends.make_ops)."""
        self.ops = ops = make_ops(backend, device, dtype, threads)
        self.threads = ops.threads
        self.weights = w = ops.open_weights(path)
        self.path = str(path)
        self.arch = arch_of(w.meta)
        self.token_embd = w.matrix("token_embd.weight")
        self.hp = hp = read_hparams(w.meta, n_vocab=self.token_embd.n_rows, arch_entry=self.arch, locate=w.locate)
        # the tensors each piece of the forward reads (as its loader read them), in forward order: what the
        # non-finite check scans when that piece gives NaN/inf (nonfinite.py)
        self.piece_tensors = {EMBEDDING: ["token_embd.weight"]}
        self.output_norm = ops.vector(w.vector("output_norm.weight", hp.n_embd))
        # tied embeddings: llama.cpp uses token_embd as the head when output.weight is absent
        self.output = w.matrix("output.weight", hp.n_embd) if w.has("output.weight") else self.token_embd
        head = ["output_norm.weight", "output.weight" if w.has("output.weight") else "token_embd.weight"]
        with w.recording() as self.rope_tensors:        # every token mixer rotates by them
            freq_factors = w.optional_vector("rope_freqs.weight", hp.rope_dims // 2)
        self.rope_freq_factors = np.zeros(0, np.float32) if freq_factors is None else freq_factors
        # M-RoPE on text: pairs of the fourth section keep position 0's angles (none with Qwen3.5's sections)
        self.rope_still = np.zeros(0, bool)
        if self.arch.rope_sections:
            self.rope_still = kernel_ops.fourth_section_pairs(hp.rope_dims // 2, hp.rope_sections,
                                                       self.arch.rope_sections == "imrope")
        self.text_rope = bool(self.rope_still.any())
        self.rope_call = DirectCall(kernel_ops.rope_angles)
        # rope_angles' arguments after the positions
        self.rope_params = (hp.rope_dims, hp.rope_base, np.float32(hp.rope_freq_scale), self.rope_freq_factors,
                            np.float32(hp.rope_ext_factor), np.float32(hp.rope_attn_factor),
                            np.array(hp.rope_corr_dims, np.float32))
        self.layers = [self._load_layer(i) for i in range(hp.n_layer)]
        self.residual = None
        if self.arch.residual:
            with w.recording() as residual:
                self.residual = self.arch.residual(ops.pieces, w, hp)
            self._bank_pieces(residual)
        self.piece_tensors[HEAD] = head
        kinds = [type(layer.mixer) for layer in self.layers]
        for i, layer in enumerate(self.layers):
            layer.slot = kinds[:i].count(kinds[i])
        self.kv = (HybridCache if self.arch.hybrid else KVCache).for_layers(self.layers, hp, kv_type, ops.arrays)
        # the mixers that cannot run a tree batch (tree_batch.py), by class name
        self.no_tree_verify = sorted({type(layer.mixer).__name__ for layer in self.layers
                                      if not getattr(layer.mixer, "tree_verify", False)})

    def _load_layer(self, i: int) -> Layer:
        w, hp, arch, ops = self.weights, self.hp, self.arch, self.ops
        with w.recording() as mixer_tensors:
            attn_norm = ops.vector(w.vector(f"blk.{i}.attn_norm.weight", hp.n_embd))
            mixer = arch.mixer(ops.pieces, w, hp, i)
        with w.recording() as ffn_tensors:
            ffn_norm = ops.vector(w.vector(f"blk.{i}.{arch.ffn_norm}.weight", hp.n_embd))
            ffn = arch.ffn(ops.pieces, w, hp, i)
        self.piece_tensors[mixer_piece(i)] = mixer_tensors + self.rope_tensors
        self.piece_tensors[ffn_piece(i)] = ffn_tensors
        return Layer(attn_norm, mixer, ffn_norm, ffn)

    def _bank_pieces(self, residual: list[str]) -> None:
        """With kimi-k3's residual bank a layer is one piece (its mixer's and FFN's inputs are mixes of the bank),
        with its own score vectors (blk.i.*); the rest of the residual's tensors mix the stream before the output
        norm."""
        tensors = self.piece_tensors
        for i in range(self.hp.n_layer):
            tensors[f"layer {i}"] = tensors.pop(mixer_piece(i)) + tensors.pop(ffn_piece(i)) + [
                n for n in residual if n.startswith(f"blk.{i}.")]
        tensors[FINAL_MIX] = [n for n in residual if not n.startswith("blk.")]

    @property
    def n_vocab(self) -> int:
        return self.output.n_rows

    def forward(self, tokens, positions=None, taps=(), logits: str = "all", stepwise: bool = False, tree=None):
        """Run tokens at positions kv.n_tokens, kv.n_tokens+1, ... and append them to the cache.

        taps: layer ids j; features[:, i] is the residual stream entering layer taps[i] for every
        token (HF hidden_states[j]; j = n_layer gives the final normed state, as HF does).
        logits: "all" (one row per token), "last" or "none".
        stepwise: compute every row with the kernels llama.cpp uses for a one-token batch, so the
        results are bit-identical to feeding the tokens one at a time (speculative verification);
        by default a batch uses llama.cpp's batch kernels, as its prompt processing does.
        tree: the parent row of each token (-1 for the first, each parent before its child): a draft tree's rows
        (tree_batch.py), each at position kv.n_tokens + its depth, seeing the cache and its own path only; with
        stepwise, each row's logits are bit-identical to one-token steps along its path. The cache must then keep
        one path (kv.keep_path) or crop back to where the tree began.
        Returns (logits (rows, n_vocab) numpy float32 or None, features (T, len(taps), n_embd) float32, the
        backend's array)."""
        hp = self.hp
        tokens = np.asarray(tokens, np.int64).reshape(-1)
        start = self.kv.n_tokens
        if self.kv.verified_tree is not None:
            raise ValueError("a tree verify is followed by kv.keep_path or a crop back to its start")
        batch = None if tree is None else self._tree_batch(tree, start, len(tokens))
        expected = np.arange(start, start + len(tokens)) if batch is None else batch.positions
        # a copy of the caller's positions: the one-call kernels take C-contiguous writable arrays (DirectCall)
        positions = expected if positions is None else np.array(positions, np.int64).reshape(-1)
        if len(tokens) == 0:
            raise ValueError("forward needs at least one token")
        if positions is not expected and not np.array_equal(positions, expected):
            raise ValueError(f"positions must continue the cache: expected {start}..{start + len(tokens) - 1}")
        if not self._token_ids_in_range(tokens):
            raise ModelError(f"token id out of range [0, {self.token_embd.n_rows})")
        taps = list(taps)
        if taps and any(not 0 <= j <= hp.n_layer for j in taps):
            raise ValueError(f"tap layer ids must lie in [0, {hp.n_layer}]")
        if logits not in ("all", "last", "none"):
            raise ValueError("logits must be 'all', 'last' or 'none'")

        backend = self.ops
        features = backend.empty((len(tokens), len(taps), hp.n_embd))
        out = self._normed_states(tokens, positions, stepwise, batch, taps, features)
        self.kv.n_tokens = start + len(tokens)
        self.kv.verified_tree = batch
        self._tap(features, taps, hp.n_layer, out)
        if logits == "none":             # no logits to check: the final states (and so every tap before them)
            if not nonfinite.finite(backend, out):
                raise nonfinite.target_error(self, tokens, positions, start, stepwise, batch,
                                             "the final hidden states are not finite")
            return None, features
        rows = backend.host(self.head(out if logits == "all" else out[-1:], stepwise))
        if not kernel_ops.all_finite(rows):       # on the host already: the one check the normal path pays
            raise nonfinite.target_error(self, tokens, positions, start, stepwise, batch)
        return rows, features

    def _normed_states(self, tokens, positions, stepwise, batch, taps=(), features=None, check=None):
        """The rows' final normed states: the embedding, every layer (their cache rows written: room made here), the
        output norm; features tapped on the way. check(x, piece): called with what each piece of
        `piece_tensors` gives (nonfinite.py's trace of a failed step runs this same loop)."""
        hp = self.hp
        self.kv.reserve(self.kv.n_tokens + len(tokens))
        rope = self.rope_tables(positions)
        x = self.token_embd.rows(tokens)
        if check:
            check(x, EMBEDDING)
        bank = self.residual.begin() if self.residual else None     # kimi-k3's banked layer inputs
        self.kv.tree = batch
        try:
            for i in range(hp.n_layer):
                self._tap(features, taps, i, x)
                if bank:
                    x = bank.run_layer(self, i, x, positions, rope, stepwise)
                    if check:
                        check(x, f"layer {i}")
                    continue
                x = self.mix(i, x, positions, rope, stepwise)
                if check:
                    check(x, mixer_piece(i))
                x = self.feed_forward(i, x, stepwise)
                if check:
                    check(x, ffn_piece(i))
        finally:
            self.kv.tree = None
        if bank:
            x = bank.final(x)
            if check:
                check(x, FINAL_MIX)
        return self.ops.rms_norm(x, self.output_norm, hp.rms_eps)

    def trace(self, tokens, positions, stepwise: bool, batch, check) -> None:
        """Run a step again (the cache cropped back to where it began) with check(x, piece) after each piece of
        `piece_tensors`, the head's logits included; the cache keeps its rows (crop it back after)."""
        out = self._normed_states(tokens, positions, stepwise, batch, check=check)
        check(out, HEAD)
        check(self.ops.host(self.head(out, stepwise)), HEAD)

    def _token_ids_in_range(self, tokens) -> bool:
        if len(tokens) == 1:        # a decode step: no numpy reductions (each a few us in a tiny target's step)
            return 0 <= tokens[0] < self.token_embd.n_rows
        return tokens.min() >= 0 and tokens.max() < self.token_embd.n_rows

    def _tree_batch(self, parents, start: int, n_tokens: int) -> TreeBatch:
        if self.no_tree_verify:
            raise ModelError(f"{self.path}: the {', '.join(self.no_tree_verify)} mixer cannot verify a draft tree yet")
        batch = TreeBatch(parents, start)
        if len(batch) != n_tokens:
            raise ValueError(f"a tree of {len(batch)} rows for {n_tokens} tokens")
        return batch

    def head(self, x, stepwise: bool = False):
        """The final normed states x -> logits (the backend's array)."""
        return self.output(x, stepwise)

    def run_layer(self, i: int, x, positions, rope, stepwise: bool = False):
        """Layer i on its input x (the residual stream, the backend's array) at `positions`, whose cache rows it
        writes (the cache must have room: kv.reserve); rope: rope_tables(positions)."""
        return self.feed_forward(i, self.mix(i, x, positions, rope, stepwise), stepwise)

    def mix(self, i: int, x, positions, rope, stepwise: bool = False):
        """x plus layer i's token mixer on its normed x (run_layer's first half)."""
        layer, hp = self.layers[i], self.hp
        return layer.mixer.with_residual(self.ops, x, layer.attn_norm, hp.rms_eps, positions, rope, self.kv, layer.slot,
                                         hp, stepwise)

    def feed_forward(self, i: int, x, stepwise: bool = False):
        """x plus layer i's FFN on its normed x (run_layer's second half)."""
        layer = self.layers[i]
        return layer.ffn.with_residual(self.ops, x, layer.ffn_norm, self.hp.rms_eps, stepwise)

    def rope_tables(self, positions):
        """RoPE's cos, sin tables at positions (M-RoPE's text angles where the model has sections), as the
        backend's arrays."""
        rope = self._rope(positions)
        if self.text_rope:
            rope = kernel_ops.text_rope_angles(rope, self._rope(np.zeros(1, np.int64)), self.rope_still)
        return self.ops.tables(rope)

    def _rope(self, positions):
        return self.rope_call(positions, *self.rope_params)

    @staticmethod
    def _tap(features, taps, layer, x):
        for i, j in enumerate(taps):
            if j == layer:
                features[:, i] = x

    def close(self):
        self.weights.close()
