"""T = 0 speculative decoding in torch, a faithful copy of z-lab's `dflash_generate` loop
(dflash/model.py; reference §10), with the statistics ggtools reports.

Per step: block [anchor, MASK × (B − 1)] at positions start … start + B − 1 → drafts d_1 … d_{B−1};
the target verifies the block in one pass; acc = leading j ≥ 1 with d_j == argmax at row j − 1;
commit d_1 … d_acc plus the bonus argmax at row acc; crop both caches; append the features of rows 0 … acc.
"""

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from dflash.model import extract_context_feature


def _cache(config):
    c = DynamicCache(config=config)
    c.activate_past_recording()
    return c


def _crop(cache, length):
    cache.crop(-(cache.get_seq_length() - length))


@dataclass
class SpecResult:
    tokens: list                      # generated tokens (after the prompt)
    accepted: list = field(default_factory=list)    # acc per step (excluding the bonus)
    drafted: list = field(default_factory=list)     # drafts offered per step
    produced: list = field(default_factory=list)    # tokens committed per step (z-lab acceptance_lengths)


@torch.inference_mode()
def greedy(target, prompt: list, n_new: int, eos: int | None = None) -> list:
    cache = _cache(target.config)
    logits = target(input_ids=torch.tensor([prompt]), past_key_values=cache, use_cache=True).logits
    out = [int(logits[0, -1].argmax())]
    while len(out) < n_new and out[-1] != eos:
        logits = target(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True).logits
        out.append(int(logits[0, -1].argmax()))
    return out


@torch.inference_mode()
def speculative(drafter, target, prompt: list, n_new: int, eos: int | None = None,
                block_size: int | None = None) -> SpecResult:
    B = block_size or drafter.block_size
    ids = torch.tensor([prompt])
    n_in = ids.shape[1]
    max_len = n_in + n_new
    out = torch.full((1, max_len + B), drafter.mask_token_id, dtype=torch.long)
    pos = torch.arange(out.shape[1])[None]
    tc, dc = _cache(target.config), _cache(drafter.config)
    o = target(input_ids=ids, position_ids=pos[:, :n_in], past_key_values=tc, use_cache=True,
               logits_to_keep=1, output_hidden_states=True)
    out[:, :n_in] = ids
    out[0, n_in] = o.logits[0, -1].argmax()
    hidden = extract_context_feature(o.hidden_states, drafter.target_layer_ids)
    embed = target.get_input_embeddings().weight
    res = SpecResult(tokens=[])
    start = n_in
    done = eos is not None and int(out[0, start]) == eos
    while start + 1 < max_len and not done:
        n = min(B, max_len - start)                   # z-lab: the last blocks shrink to fit max_new_tokens
        block = out[:, start:start + n].clone()
        if n > 1:
            h = drafter(target_hidden=hidden, noise_embedding=F.embedding(block, embed),
                        position_ids=pos[:, start - hidden.shape[1]:start + n], past_key_values=dc, use_cache=True)
            _crop(dc, start)
            block[:, 1:] = target.lm_head(h[:, 1:]).argmax(-1)
        o = target(input_ids=block, position_ids=pos[:, start:start + n], past_key_values=tc, use_cache=True,
                   output_hidden_states=n > 1)
        post = o.logits.argmax(-1)
        acc = int((block[:, 1:] == post[:, :-1]).cumprod(1).sum())
        out[:, start:start + acc + 1] = block[:, :acc + 1]
        out[0, start + acc + 1] = post[0, acc]
        produced = min(acc + 1, max_len - start - 1)
        if eos is not None:
            new = out[0, start + 1:start + produced + 1].tolist()
            if eos in new:
                produced = new.index(eos) + 1
                done = True
        res.accepted.append(min(acc, produced - 1) if n > 1 else 0)
        res.drafted.append(n - 1)
        res.produced.append(produced)
        start += produced
        _crop(tc, start)
        if n > 1:
            hidden = extract_context_feature(o.hidden_states, drafter.target_layer_ids)[:, :produced]
    res.tokens = out[0, n_in:min(start + 1, max_len)].tolist()
    return res


def summarize(results: list, block_size: int) -> dict:
    acc = [a for r in results for a in r.accepted]
    drafted = sum(d for r in results for d in r.drafted)
    steps = len(acc)
    per_pos = [sum(a > i for a in acc) / steps for i in range(block_size - 1)]
    hist = [sum(a + 1 == k for a in acc) / steps for k in range(1, block_size + 1)]
    return {
        "sequences": len(results),
        "steps": steps,
        "generated_tokens": sum(len(r.tokens) for r in results),
        "drafted_tokens": drafted,
        "accepted_tokens": sum(acc),
        "acceptance_rate": sum(acc) / drafted,
        "mean_accepted_length_incl_bonus": 1 + sum(acc) / steps,
        "tau_zlab": sum(1 + sum(r.accepted) / len(r.accepted) for r in results) / len(results),
        "per_position_accept_rate": [round(x, 4) for x in per_pos],
        "accept_length_histogram": [round(x, 4) for x in hist],
    }
