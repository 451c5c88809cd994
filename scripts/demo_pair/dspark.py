"""DSpark drafters for the demo target, self-distilled the way the DFlash demo drafter was (drafter.py), with the
heads llama.cpp's DSpark graph runs (reference §13):

    base logits U_i  = head(h_i)                    h_i the backbone's final normed state of drafting row i
    Markov head      L_i = U_i + W2 . W1[prev_i]   prev_i the token before row i's label (the anchor first)
    confidence head  c_i = sigmoid(proj . [h_i ; W1[prev_i]] + b)

Training is teacher-forced: prev_i is the target's greedy token before row i's label, which is what the chain
reads at inference whenever the rows before were right (the only case that matters: later drafts of a wrong chain
are rejected anyway). Loss: cross-entropy of L_i towards the target's greedy token (DFlash's decay weights
exp(-i / gamma) over the drafting rows), plus the binary cross-entropy of c_i towards "row i's argmax is the
label" (inputs detached: the confidence head learns to predict the chain's per-position acceptance given a right
prefix, what llama.cpp's per-row cut compares with p_min).

Layouts: anchor-first (DeepSpec: the block [x_a, MASK ...] at positions a ..., row r predicts the token at
a + r + 1) and bonus anchor (speculators: row r >= 1 predicts the token at a + r, as DFlash). A reduced draft
vocabulary keeps the `draft_vocab` most frequent greedy tokens of the data (and EOS), sorted by id; the drafter has
its own head (initialised from the target's tied embedding rows) and d2t / t2d as speculators exports write them.

The backbone is z-lab's DFlashDraftModel, initialised from the committed DFlash demo drafter.
"""

import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from scripts.demo_pair.drafter import sample_anchors


class DSparkHeads(nn.Module):
    """markov_head.markov_w1 (embedding [V, R]), markov_head.markov_w2 ([Vd, R]), confidence_head.proj
    ([1, H + R] + bias) and, for a reduced vocabulary, lm_head ([Vd, H]): the checkpoint names."""

    def __init__(self, vocab: int, hidden: int, rank: int, draft_ids: torch.Tensor | None, confidence: bool,
                 embedding: torch.Tensor, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        n_draft = vocab if draft_ids is None else len(draft_ids)
        self.markov_head = nn.Module()
        self.markov_head.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_head.markov_w2 = nn.Linear(rank, n_draft, bias=False)
        with torch.no_grad():
            self.markov_head.markov_w1.weight.copy_(torch.randn(vocab, rank, generator=g) * 0.1)
            self.markov_head.markov_w2.weight.zero_()
        self.confidence_head = None
        if confidence:
            self.confidence_head = nn.Module()
            self.confidence_head.proj = nn.Linear(hidden + rank, 1)
        self.draft_ids = draft_ids
        if draft_ids is not None:
            self.lm_head = nn.Linear(hidden, n_draft, bias=False)
            with torch.no_grad():
                self.lm_head.weight.copy_(embedding[draft_ids])

    def logits(self, hidden, prev, target_head):
        """hidden [..., H], prev [...] -> (L [..., Vd], W1[prev] [..., R])."""
        head = self.lm_head.weight if self.draft_ids is not None else target_head
        w1 = self.markov_head.markov_w1(prev)
        return hidden @ head.T + self.markov_head.markov_w2(w1), w1

    def confidence(self, hidden, w1):
        return self.confidence_head.proj(torch.cat([hidden, w1], -1)).squeeze(-1)


def draft_vocabulary(preds: torch.Tensor, size: int, eos: int) -> torch.Tensor:
    """The `size` most frequent greedy tokens (EOS always in), sorted by id."""
    counts = torch.bincount(preds.reshape(-1), minlength=eos + 1).float()
    counts[eos] = float("inf")
    return counts.topk(size).indices.sort().values


def block_batch(seqs, preds, anchors, block_size, mask_id, first):
    """Noise ids, position ids, attention mask, labels, prev tokens and label mask for anchors [N, A]; drafting rows
    first .. block_size - 1, row r labelled with the target's greedy token at position a + r + 1 - first."""
    n, length = seqs.shape
    a_count = anchors.shape[1]
    offs = torch.arange(block_size)
    pos = anchors[:, :, None] + offs
    noise = torch.full((n, a_count, block_size), mask_id, dtype=torch.long)
    noise[:, :, 0] = seqs.gather(1, anchors)
    position_ids = torch.cat([torch.arange(length).expand(n, length), pos.reshape(n, -1)], 1)
    ctx_vis = torch.arange(length)[None, None, :] < anchors[:, :, None]
    ctx_vis = ctx_vis[:, :, None, :].expand(n, a_count, block_size, length).reshape(n, a_count * block_size, length)
    blk = torch.arange(a_count).repeat_interleave(block_size)
    own = (blk[:, None] == blk[None, :]).expand(n, -1, -1)
    mask = torch.cat([ctx_vis, own], 2)[:, None]
    rows = block_size - first
    label_pos = anchors[:, :, None] + torch.arange(rows) + 1                     # position of row r's label
    labels = preds.gather(1, (label_pos - 1).clamp(max=length - 1).reshape(n, -1)).reshape(n, a_count, rows)
    prev = torch.cat([noise[:, :, :1], labels[:, :, :-1]], 2)
    # the text between the anchor and a label follows the target's argmax (always so on generated text)
    between = anchors[:, :, None] + torch.arange(1, rows + 1)
    agree = seqs.gather(1, between.clamp(max=length - 1).reshape(n, -1)).reshape(n, a_count, rows) == \
        preds.gather(1, (between - 1).clamp(max=length - 1).reshape(n, -1)).reshape(n, a_count, rows)
    ok = torch.ones_like(labels, dtype=torch.bool)
    ok[:, :, 1:] = agree[:, :, :-1].cumprod(2).bool()
    ok &= label_pos <= length - 1
    return noise, position_ids, mask, labels, prev, ok


def train(backbone, heads, target, seqs, feats, preds, *, anchor_first: bool, steps, batch, anchors_per_seq, lr,
          gamma, conf_weight, seed, log=print):
    block_size, mask_id = backbone.block_size, backbone.mask_token_id
    first = 0 if anchor_first else 1
    embed = target.get_input_embeddings().weight.detach()
    target_head = target.lm_head.weight.detach()
    rows = block_size - first
    w_pos = torch.exp(-torch.arange(rows, dtype=torch.float32) / gamma)
    params = list(backbone.parameters()) + list(heads.parameters())
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 20)
    to_draft = None
    if heads.draft_ids is not None:
        to_draft = torch.full((embed.shape[0],), -1, dtype=torch.long)
        to_draft[heads.draft_ids] = torch.arange(len(heads.draft_ids))
    gen = torch.Generator().manual_seed(seed)
    backbone.train()
    heads.train()
    t0, hist = time.time(), []
    for step in range(steps):
        f = (step + 1) / warmup if step < warmup else \
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for g in opt.param_groups:
            g["lr"] = lr * f
        idx = torch.randint(0, len(seqs), (batch,), generator=gen)
        s, p, h = seqs[idx], preds[idx], feats[idx]
        anchors = sample_anchors(batch, s.shape[1], anchors_per_seq, block_size, gen)
        noise, position_ids, mask, labels, prev, ok = block_batch(s, p, anchors, block_size, mask_id, first)
        out = backbone(target_hidden=h, noise_embedding=F.embedding(noise.reshape(batch, -1), embed),
                       position_ids=position_ids, attention_mask=mask)
        hidden = out.reshape(batch, anchors_per_seq, block_size, -1)[:, :, first:]
        logits, w1 = heads.logits(hidden, prev, target_head)
        target_ids = labels if to_draft is None else to_draft[labels]
        valid = ok & (target_ids >= 0)
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target_ids.clamp(min=0).reshape(-1),
                             reduction="none")
        w = (valid.float() * w_pos).reshape(-1)
        loss = (ce * w).sum() / w.sum()
        hit = (logits.argmax(-1) == target_ids) & valid
        if heads.confidence_head is not None:
            c = heads.confidence(hidden.detach(), w1.detach())
            bce = F.binary_cross_entropy_with_logits(c, hit.float(), reduction="none")
            loss = loss + conf_weight * (bce * ok.float()).sum() / ok.float().sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        hist.append((loss.item(), hit[:, :, 0].float().mean().item()))
        if step % 25 == 0 or step == steps - 1:
            l, a1 = np.mean(hist, 0)
            hist = []
            log(f"dspark step {step:4d}/{steps} loss {l:.3f} row0-acc {a1:.3f}  {time.time() - t0:6.0f}s")
    backbone.eval()
    heads.eval()


def save_checkpoint(backbone, heads, out: Path, *, anchor_first: bool, target_layer_ids, mask_id: int,
                    rank: int, eos: int) -> None:
    """bf16 safetensors with the checkpoint names llama.cpp's DSparkModel converter reads, and the config of the
    layout: DeepSpec's flat keys (anchor-first) or speculators' transformer_layer_config (bonus anchor)."""
    from safetensors.torch import save_file

    tensors = {k: v for k, v in backbone.state_dict().items()}
    tensors |= {k: v for k, v in heads.state_dict().items() if not k.startswith("lm_head") or heads.draft_ids is not None}
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in tensors.items()}
    cfg = backbone.config
    qwen3 = {k: getattr(cfg, k) for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                          "num_attention_heads", "num_key_value_heads", "head_dim",
                                          "max_position_embeddings", "rms_norm_eps", "vocab_size",
                                          "attention_bias", "hidden_act")}
    qwen3 |= {"rope_theta": cfg.rope_parameters["rope_theta"], "model_type": "qwen3", "tie_word_embeddings": False,
              "bos_token_id": eos, "eos_token_id": eos}
    common = {"block_size": backbone.block_size, "mask_token_id": mask_id, "markov_head_type": "vanilla",
              "markov_rank": rank, "torch_dtype": "bfloat16"}
    if heads.draft_ids is not None:
        ids = heads.draft_ids
        tensors["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        tensors["t2d"] = t2d
        common["draft_vocab_size"] = len(ids)
    if anchor_first:
        config = {"architectures": ["DSparkDraftModel"], **qwen3, "target_layer_ids": list(target_layer_ids),
                  "num_target_layers": cfg.num_target_layers, **common}
    else:
        config = {"architectures": ["DSparkSpeculator"], "transformer_layer_config": qwen3,
                  "aux_hidden_state_layer_ids": [i + 1 for i in target_layer_ids], "vocab_size": cfg.vocab_size,
                  **common}
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
