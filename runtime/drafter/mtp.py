"""MTP (NextN) drafter: the target's own nextn block (`run --draft mtp`) or an MTP sidecar GGUF (the converter's --mtp
output: the block plus token_embd / output_norm / output), as llama.cpp's qwen35 / qwen35moe graph_mtp computes it
(src/models/qwen35.cpp, qwen35moe.cpp), run by the target's backend; the draft loop is autoregressive.py's.

    step (token x, h) at position p; h the target's state after output_norm at p - 1 (its h_nextn), or the previous
    step's output
      z   = eh_proj . concat(rms(embed(x)) * enorm, rms(h) * hnorm)     embed: nextn.embed_tokens, else token_embd
      z  += gated attention (a qwen35 full-attention layer, its own KV) of rms(z) * attn_norm
      z  += FFN(rms(z) * post_attention_norm)      dense (qwen35) or routed + shared experts (qwen35moe)
      u   = rms(z) * (nextn.shared_head_norm, else output_norm)          the next step's h
      logits = (nextn.shared_head_head, else output) . u

The block is blk.{n_layer} (n_layer = block_count - nextn_predict_layers, the trunk), loaded as the architecture's
own pieces (archs.py): an attention layer with the output gate and the layer's FFN.
"""

from dataclasses import dataclass, replace

import numpy as np

from ggtools.hparam_rules import mtp_pair_violations
from ggtools.hparam_rules.mtp import mtp_blocks
from ggtools.runtime import nonfinite
from ggtools.runtime.drafter.autoregressive import DEFAULT_DRAFTS, AutoregressiveDrafter
from ggtools.runtime.errors import ModelError, refuse_violations
from ggtools.runtime.model.archs import arch_of
from ggtools.runtime.model.hparams import read_hparams

TARGET_FILE = "mtp"              # `--draft mtp`: the target's own nextn block
MTP_ARCHS = ("qwen35", "qwen35moe")     # the archs whose graph_mtp this runtime runs


@dataclass(frozen=True)
class MtpHParams:
    """What the loop and the reports read of a drafter's hyperparameters (the block's own are the target's)."""
    n_embd: int
    n_head_kv: int
    head_dim: int
    profile: str = "llama.cpp"
    n_layer: int = 1
    block_size: int = DEFAULT_DRAFTS + 1
    v2 = None
    dspark = None


class MtpDrafter(AutoregressiveDrafter):
    """The MTP block of a target (path TARGET_FILE) or of a sidecar GGUF, bound to the target."""

    family = "mtp"
    shift = 0            # row p pairs tokens[p] with h[p - 1]

    def __init__(self, path, target):
        self.target, self.ops = target, target.ops
        own = str(path) == TARGET_FILE
        self.path = target.path if own else str(path)
        self.weights = w = target.weights if own else self.ops.open_weights(path)
        self.owns_weights = not own
        self.kind = "MTP (the target's nextn block)" if own else "MTP (sidecar)"
        hp = target.hp if own else self._sidecar_hparams(w)
        self._check_block(w)
        il = hp.n_layer
        block_hp = replace(hp, swa_layers=(False,) * (il + 1))      # the block is full attention
        pieces, p, E = self.ops.pieces, f"blk.{il}.", hp.n_embd
        arch = arch_of(w.meta)
        self.block_hp = block_hp
        self.eh_proj = w.matrix(p + "nextn.eh_proj.weight", 2 * E, E)
        self.enorm = self.ops.vector(w.vector(p + "nextn.enorm.weight", E))
        self.hnorm = self.ops.vector(w.vector(p + "nextn.hnorm.weight", E))
        self.attn_norm = self.ops.vector(w.vector(p + "attn_norm.weight", E))
        self.mixer = pieces.Attention.load(w, block_hp, il, output_gate=True)
        self.ffn_norm = self.ops.vector(w.vector(p + arch.ffn_norm + ".weight", E))
        self.ffn = arch.ffn(pieces, w, block_hp, il)
        source = target if own else None
        self.embedding = self._matrix(w, p + "nextn.embed_tokens.weight", source and source.token_embd)
        self.head_norm = self.ops.vector(w.vector(p + "nextn.shared_head_norm.weight", E)) \
            if w.has(p + "nextn.shared_head_norm.weight") else (
                target.output_norm if own else self.ops.vector(w.vector("output_norm.weight", E)))
        self.head = self._matrix(w, p + "nextn.shared_head_head.weight", source and source.output, head=True)
        if self.embedding.n_rows != self.n_vocab or self.head.n_rows != self.n_vocab:
            raise ModelError(f"{self.path}: the MTP block's embedding / head have {self.embedding.n_rows} / "
                             f"{self.head.n_rows} rows for the target's {self.n_vocab}-token vocabulary")
        self.hp = MtpHParams(n_embd=E, n_head_kv=hp.n_head_kv, head_dim=hp.head_dim)

    def _matrix(self, w, name, fallback, head=False):
        """The block's own tensor, else the target's (fallback), else the sidecar's token_embd / output."""
        if w.has(name):
            return w.matrix(name, self.target.hp.n_embd)
        if fallback is not None:
            return fallback
        if head and w.has("output.weight"):
            return w.matrix("output.weight", self.target.hp.n_embd)
        return w.matrix("token_embd.weight", self.target.hp.n_embd)

    def _sidecar_hparams(self, w):
        """The sidecar's hyperparameters, once it passes the pair rules (mtp_pair_violations: the target's arch,
        trunk, keys and vocabulary: its block was trained on that trunk's states) and its own model-file rules."""
        refuse_violations(self.path, mtp_pair_violations(w.meta, self.target.weights.meta))
        rows = w.shape("token_embd.weight")[1] if w.has("token_embd.weight") else self.n_vocab
        return read_hparams(w.meta, rows, arch_of(w.meta), w.locate)

    def _check_block(self, w):
        """A model with an MTP block whose graph this runtime runs (the block's tensors and count are model-file rules,
        applied as the model was loaded)."""
        arch, blocks = w.meta.architecture, mtp_blocks(w.meta)
        if blocks is None or not blocks.n_nextn:     # mtp_draft_violations' rule, for every arch, in libllama's words
            raise ModelError(f"{self.path}: {arch}.nextn_predict_layers is absent or 0: context type MTP requested but "
                             "model doesn't contain MTP layers (llama.cpp): the model holds no MTP block to draft with "
                             "(a --no-mtp conversion: draft with its MTP sidecar)")
        if arch not in MTP_ARCHS:
            raise ModelError(f"{self.path}: MTP drafting runs llama.cpp's graph_mtp of {', '.join(MTP_ARCHS)}, not "
                             f"'{arch}'")

    @property
    def context_length(self) -> int:
        return self.target.hp.n_ctx_train

    @property
    def taps(self) -> list[int]:
        """The target's state after output_norm (TargetModel's tap at n_layer): llama.cpp's t_h_nextn of qwen35."""
        return [self.target.hp.n_layer]

    def project(self, features):
        return features

    def decode(self, cache, tokens, h, positions, need_logits: bool):
        """The block on (tokens, h rows) at positions (their K/V written to the cache) -> (logits on the host or None,
        u: the rows after the head norm)."""
        ops, hp = self.ops, self.block_hp
        ids = np.asarray(tokens, np.int64)
        en = ops.rms_norm(self.embedding.rows(ids), self.enorm, hp.rms_eps)
        z = self.eh_proj(ops.arrays.cat([en, ops.rms_norm(h, self.hnorm, hp.rms_eps)], 1), True)
        rope = self.target.rope_tables(positions)
        z = self.mixer.with_residual(ops, z, self.attn_norm, hp.rms_eps, positions, rope, cache, 0, hp, True)
        cache.n_tokens = max(cache.n_tokens, int(positions[-1]) + 1)
        if not need_logits:
            return None, None
        u = ops.rms_norm(self.ffn.with_residual(ops, z, self.ffn_norm, hp.rms_eps, True), self.head_norm, hp.rms_eps)
        logits = ops.host(self.head(u, True))
        if not np.isfinite(logits).all():
            raise nonfinite.drafter_error(self, ids)
        return logits, u

    def close(self):
        if self.owns_weights:
            self.weights.close()
