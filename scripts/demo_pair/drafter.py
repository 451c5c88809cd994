"""DFlash v1 drafter for the demo target, trained the DFlash way through z-lab's own forward.

For each training sequence the frozen target gives the feature taps (HF hidden_states[i + 1] for
i in target_layer_ids, concatenated) and its greedy prediction at every position. For random anchor
positions a, the drafter sees the context features of positions < a and the noise block
[x_a, MASK × (B − 1)] at positions a … a + B − 1 (embedded with the target's embedding); row j ≥ 1 is
trained with cross-entropy through the target's head to predict the target's greedy token at position
a + j. Many blocks of one sequence go through one `DFlashDraftModel.forward` call: the context is
the whole sequence, and a boolean attention mask lets block b see context positions < a_b and its own B
rows only (exactly what it sees at inference, where the context is the committed prefix).

Labels are the target's own greedy continuation: a row counts only when the text between the anchor
and that row agrees with the target's argmax (always true on target-generated text), so no row is
trained toward a token the target would not produce after the drafted prefix.
"""

import math
import time

import numpy as np
import torch
import torch.nn.functional as F
from transformers import DynamicCache, Qwen3Config

from dflash.model import extract_context_feature


def drafter_config(target_cfg, *, block_size, target_layer_ids, mask_token_id, eos_token_id, layers,
                   intermediate) -> Qwen3Config:
    cfg = Qwen3Config(
        vocab_size=target_cfg.vocab_size,
        hidden_size=target_cfg.hidden_size,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=target_cfg.num_attention_heads,
        num_key_value_heads=target_cfg.num_key_value_heads,
        head_dim=target_cfg.head_dim,
        max_position_embeddings=target_cfg.max_position_embeddings,
        rope_theta=target_cfg.rope_parameters["rope_theta"],
        rms_norm_eps=target_cfg.rms_norm_eps,
        attention_bias=False,
        tie_word_embeddings=False,
    )
    cfg.bos_token_id = cfg.eos_token_id = eos_token_id
    cfg.architectures = ["DFlashDraftModel"]
    cfg.auto_map = {"AutoModel": "dflash.DFlashDraftModel"}
    cfg.block_size = block_size
    cfg.num_target_layers = target_cfg.num_hidden_layers
    cfg.dflash_config = {"block_size": block_size, "mask_token_id": mask_token_id,
                         "target_layer_ids": list(target_layer_ids)}
    cfg._attn_implementation = "sdpa"
    return cfg


def save_drafter(drafter, out):
    """bf16 checkpoint as z-lab's save_pretrained writes it; config.json also gets a top-level rope_theta
    (as published DFlash checkpoints have it; transformers 5 itself writes only rope_parameters)."""
    import json
    import torch
    drafter.to(torch.bfloat16).save_pretrained(out)
    path = out / "config.json"
    cfg = json.loads(path.read_text())
    cfg["rope_theta"] = cfg["rope_parameters"]["rope_theta"]
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def init_from_target(drafter, target, mode="norms"):
    """Start the drafter's output norm as the target's final norm (its outputs go through the target's head);
    mode "last-layer" also copies the target's last decoder layer into every draft layer."""
    if mode in ("norms", "last-layer"):
        drafter.norm.weight.copy_(target.model.norm.weight)
    if mode == "last-layer":
        src = target.model.layers[-1].state_dict()
        for layer in drafter.layers:
            own = layer.state_dict()
            layer.load_state_dict({k: src[k] for k in own if k in src and src[k].shape == own[k].shape},
                                  strict=False)


# ---- training data --------------------------------------------------------------------------------------
@torch.no_grad()
def greedy_continuations(target, prompts: torch.Tensor, n_new: int, batch: int = 64) -> torch.Tensor:
    """Target-only greedy continuation of each prompt (KV cache), returned as prompt + continuation."""
    out = []
    for i in range(0, len(prompts), batch):
        x = prompts[i:i + batch]
        cache = DynamicCache(config=target.config)
        logits = target(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=1).logits
        toks = [logits[:, -1].argmax(-1)]
        for _ in range(n_new - 1):
            logits = target(input_ids=toks[-1][:, None], past_key_values=cache, use_cache=True).logits
            toks.append(logits[:, -1].argmax(-1))
        out.append(torch.cat([x, torch.stack(toks, 1)], 1))
    return torch.cat(out)


@torch.no_grad()
def target_features(target, seqs: torch.Tensor, layer_ids, batch: int = 32):
    """(features [N, L, n·H] f32, greedy prediction [N, L]: the target's argmax after position p)."""
    feats, preds = [], []
    for i in range(0, len(seqs), batch):
        out = target(input_ids=seqs[i:i + batch], output_hidden_states=True)
        feats.append(extract_context_feature(out.hidden_states, layer_ids).float())
        preds.append(out.logits.argmax(-1))
    return torch.cat(feats), torch.cat(preds)


# ---- one training batch ---------------------------------------------------------------------------------
def block_batch(seqs, preds, anchors, block_size, mask_token_id):
    """Noise ids, position ids, attention mask, labels and label mask for anchors [N, A] (sorted)."""
    n, length = seqs.shape
    a_count = anchors.shape[1]
    offs = torch.arange(block_size)
    pos = anchors[:, :, None] + offs                                           # [N, A, B]
    noise = torch.full((n, a_count, block_size), mask_token_id, dtype=torch.long)
    noise[:, :, 0] = seqs.gather(1, anchors)
    position_ids = torch.cat([torch.arange(length).expand(n, length), pos.reshape(n, -1)], 1)
    # visibility: block b sees context p < a_b and its own rows
    ctx_vis = torch.arange(length)[None, None, :] < anchors[:, :, None]        # [N, A, L]
    ctx_vis = ctx_vis[:, :, None, :].expand(n, a_count, block_size, length).reshape(n, a_count * block_size, length)
    blk = torch.arange(a_count).repeat_interleave(block_size)
    own = (blk[:, None] == blk[None, :]).expand(n, -1, -1)
    mask = torch.cat([ctx_vis, own], 2)[:, None]                               # [N, 1, A·B, L + A·B]
    # labels: row j predicts the target's greedy token at position a + j = preds[a + j − 1]
    lab_pos = (pos[:, :, 1:] - 1).clamp(max=length - 1)
    labels = preds.gather(1, lab_pos.reshape(n, -1)).reshape(n, a_count, block_size - 1)
    # a row counts while the text after the anchor follows the target's own argmax
    agree = seqs.gather(1, (pos[:, :, 1:]).clamp(max=length - 1).reshape(n, -1)).reshape(lab_pos.shape) == labels
    ok = torch.ones_like(labels, dtype=torch.bool)
    ok[:, :, 1:] = agree[:, :, :-1].cumprod(2).bool()
    ok &= pos[:, :, 1:] < length
    return noise, position_ids, mask, labels, ok


def sample_anchors(n, length, a_count, block_size, gen):
    hi = length - block_size + 1                    # anchors in [1, hi]
    scores = torch.rand(n, hi, generator=gen)
    return (scores.topk(a_count, dim=1).indices + 1).sort(1).values


def train_drafter(drafter, target, seqs, feats, preds, *, steps, batch, anchors_per_seq, lr, gamma, seed,
                  log=print):
    block_size = drafter.block_size
    mask_id = drafter.mask_token_id
    embed = target.get_input_embeddings().weight.detach()
    head = target.lm_head.weight.detach()
    gen = torch.Generator().manual_seed(seed)
    w_pos = torch.exp(-torch.arange(block_size - 1, dtype=torch.float32) / gamma)
    opt = torch.optim.AdamW(drafter.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, steps // 20)
    drafter.train()
    t0 = time.time()
    hist = []
    for step in range(steps):
        f = (step + 1) / warmup if step < warmup else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for g in opt.param_groups:
            g["lr"] = lr * f
        idx = torch.randint(0, len(seqs), (batch,), generator=gen)
        s, p, h = seqs[idx], preds[idx], feats[idx]
        anchors = sample_anchors(batch, s.shape[1], anchors_per_seq, block_size, gen)
        noise, position_ids, mask, labels, ok = block_batch(s, p, anchors, block_size, mask_id)
        out = drafter(target_hidden=h, noise_embedding=F.embedding(noise.reshape(batch, -1), embed),
                      position_ids=position_ids, attention_mask=mask)
        out = out.reshape(batch, anchors_per_seq, block_size, -1)[:, :, 1:]
        logits = out @ head.T
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), reduction="none")
        w = (ok.float() * w_pos).reshape(-1)
        loss = (ce * w).sum() / w.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(drafter.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            hit = (logits.argmax(-1) == labels) & ok
            hist.append((loss.item(), (hit[:, :, 0].float().mean().item())))
        if step % 25 == 0 or step == steps - 1:
            l, a1 = np.mean(hist, 0)
            hist = []
            log(f"drafter step {step:4d}/{steps} loss {l:.3f} row1-acc {a1:.3f}  {time.time() - t0:6.0f}s")
    drafter.eval()
    return drafter
