"""The demo target: a small Qwen3ForCausalLM trained on the stdlib sources; rounding to the stored precision."""

import math
import time

import numpy as np
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from scripts.demo_pair.common import TARGET


def target_config() -> Qwen3Config:
    cfg = Qwen3Config(**TARGET)
    cfg._attn_implementation = "sdpa"
    return cfg


def random_windows(tokens: np.ndarray, n: int, length: int, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(tokens) - length, (n,), generator=gen).numpy()
    return torch.from_numpy(np.stack([tokens[s:s + length] for s in starts]).astype(np.int64))


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def train_target(tokens: np.ndarray, *, steps: int, batch: int, seq_len: int, lr: float, seed: int,
                 log=print, make_model=None) -> Qwen3ForCausalLM:
    """make_model(): another causal LM to train the same way (default: the demo's Qwen3 target)."""
    torch.manual_seed(seed)
    model = make_model() if make_model else Qwen3ForCausalLM(target_config())
    model.train()
    gen = torch.Generator().manual_seed(seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95))
    t0 = time.time()
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, steps, lr, warmup=max(1, steps // 20))
        x = random_windows(tokens, batch, seq_len + 1, gen)
        out = model(input_ids=x[:, :-1], labels=x[:, :-1])     # HF shifts labels itself
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if step % 20 == 0 or step == steps - 1:
            log(f"target step {step:4d}/{steps} loss {out.loss.item():.3f}  {time.time() - t0:6.0f}s")
    model.eval()
    return model


def round_to_storage(model: Qwen3ForCausalLM):
    """Round every matrix to f16 (what target.gguf stores); 1-D norms stay f32 as in the GGUF."""
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.copy_(p.half().float())
    return model


@torch.no_grad()
def eval_loss(model, tokens: np.ndarray, seq_len: int, max_windows: int = 64) -> float:
    n = min(max_windows, (len(tokens) - 1) // seq_len)
    xs = torch.from_numpy(np.stack([tokens[i * seq_len:(i + 1) * seq_len] for i in range(n)]).astype(np.int64))
    losses = [model(input_ids=xs[i:i + 16], labels=xs[i:i + 16]).loss.item() for i in range(0, n, 16)]
    return float(np.mean(losses))
