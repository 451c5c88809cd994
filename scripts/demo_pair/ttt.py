"""Training-time test (EAGLE3's "TTT") for the one-layer autoregressive drafters (EAGLE3, MTP), unrolled the way
llama.cpp's draft-eagle3 / draft-mtp loop and the ggtools runtime draft (runtime/drafter/autoregressive.py).

The drafter's KV holds one row per committed position p, pairing a token with the target's feature row one position
before it (shift s: EAGLE3 1, MTP 0):

    step 0, row p at position p:      (tokens[p + s], F[p + s - 1])     F: the target's features (F[-1] = 0)
    step k, row p at position p + k:  (tokens[p + s + k], hidden of step k - 1's row p)
    every step's row p is labelled with the target's greedy token after tokens[p + s + k]: preds[p + s + k]

Step 0 is the seed step of a draft (the anchor paired with the last committed feature row) and the committed rows
at once; step k >= 1 is the chain's draft k + 1. At inference, draft k + 1's row attends to the committed rows up to
the seed (step 0's rows <= p) and to the chain's rows before it (steps 1 .. k at base p): the attention below, with
each step's keys on their own positions. Step k >= 1 counts only while the text between the seed and its label
follows the target's argmax (tokens[p + s + j] == preds[p + s + j - 1], j = 1 .. k): the chain fed the target's
greedy tokens, the only chains whose later drafts can be accepted. Gradients flow through the chain (the hidden
state fed back), as in EAGLE3.

A drafter provides project(features) -> feature rows, qkv(tokens, rows, positions) -> (q, k, v, state) and
finish(attention output, state) -> (hidden rows, logits), and `scale`.
"""

import time

import numpy as np
import torch
import torch.nn.functional as F

from scripts.demo_pair.target import lr_at


def unrolled_rows(seqs, preds, shift: int, steps: int):
    """For steps k = 0 .. steps - 1: input tokens, labels and validity [N, R] (R = L - shift rows per step)."""
    n, length = seqs.shape
    rows = length - shift
    base = torch.arange(rows)
    tokens, labels, ok = [], [], []
    follows = torch.ones(n, rows, dtype=torch.bool)
    for k in range(steps):
        at = base + shift + k
        inside = at < length
        idx = at.clamp(max=length - 1).expand(n, -1)
        if k:
            follows = follows & (seqs.gather(1, idx) == preds.gather(1, (idx - 1)))
        tokens.append(seqs.gather(1, idx))
        labels.append(preds.gather(1, idx))
        ok.append(follows & inside)
    return tokens, labels, ok


def first_rows(features, shift: int, rows: int):
    """Step 0's feature row of row p: F[p + shift - 1], zeros for position -1."""
    padded = torch.cat([torch.zeros_like(features[:, :1]), features], 1)
    return padded[:, shift:shift + rows]


def _repeat_kv(x, heads: int):
    return x.repeat_interleave(heads // x.shape[1], dim=1)


def unrolled_attention(q, keys, values, scale: float):
    """q [N, heads, R, d] of step k = len(keys) - 1; keys / values: steps 0 .. k, [N, kv heads, R, d]. Step 0's
    rows causally (<= p), steps 1 .. k at the same base p; -> [N, R, heads * d]."""
    heads, rows = q.shape[1], q.shape[2]
    k0, v0 = _repeat_kv(keys[0], heads), _repeat_kv(values[0], heads)
    scores = [(q @ k0.transpose(-1, -2) * scale).masked_fill(
        torch.ones(rows, rows, dtype=torch.bool).triu(1), float("-inf"))]
    scores += [(q * _repeat_kv(kj, heads)).sum(-1, keepdim=True) * scale for kj in keys[1:]]
    p = torch.softmax(torch.cat(scores, -1), -1)
    out = p[..., :rows] @ v0
    for j, vj in enumerate(values[1:]):
        out = out + p[..., rows + j:rows + j + 1] * _repeat_kv(vj, heads)
    return out.transpose(1, 2).reshape(q.shape[0], rows, -1)


def unrolled_logits(drafter, seqs, feats, preds, shift: int, steps: int):
    """Per step: (logits [N, R, V], labels, ok), the chain unrolled as above."""
    tokens, labels, ok = unrolled_rows(seqs, preds, shift, steps)
    rows = first_rows(drafter.project(feats), shift, seqs.shape[1] - shift)
    positions = torch.arange(rows.shape[1])[None]
    keys, values, out = [], [], []
    for k in range(steps):
        q, kk, vv, state = drafter.qkv(tokens[k], rows, positions + k)
        keys.append(kk)
        values.append(vv)
        rows, logits = drafter.finish(unrolled_attention(q, keys, values, drafter.scale), state)
        out.append(logits)
    return out, labels, ok


def train(drafter, params, seqs, feats, preds, *, shift: int, ttt_steps: int, steps: int, batch: int, lr: float,
          decay: float, seed: int, to_draft=None, name="drafter", log=print):
    """AdamW on the unrolled cross-entropy towards the target's greedy tokens, step k weighted decay**k (the demo's
    schedule: 5% warmup, cosine to 10%). to_draft:
    target id -> draft vocabulary id (-1: not in it; such labels are skipped), for a reduced vocabulary."""
    opt = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    drafter.train()
    t0, hist = time.time(), []
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        idx = torch.randint(0, len(seqs), (batch,), generator=gen)
        logits, labels, ok = unrolled_logits(drafter, seqs[idx], feats[idx], preds[idx], shift, ttt_steps)
        loss, weight, acc = 0.0, 0.0, []
        for k, (lg, lb, v) in enumerate(zip(logits, labels, ok)):
            ids = lb if to_draft is None else to_draft[lb]
            v = v & (ids >= 0)
            ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), ids.clamp(min=0).reshape(-1), reduction="none")
            loss = loss + decay ** k * (ce * v.reshape(-1)).sum() / v.sum().clamp(min=1)
            weight += decay ** k
            acc.append(((lg.argmax(-1) == ids) & v).sum().item() / max(1, v.sum().item()))
        loss = loss / weight
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        hist.append([loss.item(), *acc])
        if step % 25 == 0 or step == steps - 1:
            m = np.mean(hist, 0)
            hist = []
            log(f"{name} step {step:4d}/{steps} loss {m[0]:.3f} step-acc "
                + " ".join(f"{a:.3f}" for a in m[1:]) + f"  {time.time() - t0:6.0f}s")
    drafter.eval()
