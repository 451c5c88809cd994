"""An EAGLE3 drafter for the demo target in the EAGLE authors' layout (`LlamaForCausalLMEagle3`: `fc`, `midlayer.*`,
`norm`, `lm_head` over a reduced draft vocabulary with `d2t` / `t2d`; no embedding: the target's), computing what
llama.cpp's eagle3 graph computes (src/models/eagle3.cpp; runtime/drafter/eagle3.py):

    g  = fc . concat(target hidden states entering layers TARGET_LAYERS)          once per position
    one step on (token x, g) at position p:
      a  = attention(concat(input_layernorm(embed(x)), hidden_norm(g)))      llama attention, RoPE at p, own KV
      r  = o_proj(a) + g;  y = r + mlp(post_attention_layernorm(r))          y: the next step's g
      logits = lm_head . norm(y)                                             draft ids; d2t maps them to the target's

Q and K use Hugging Face's rotate-half RoPE; llama.cpp's converter permutes their rows for ggml's RoPE.
"""

import json
from pathlib import Path

import torch
from torch import nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import (LlamaMLP, LlamaRMSNorm, LlamaRotaryEmbedding,
                                                      apply_rotary_pos_emb)

TARGET_LAYERS = [1, 2, 3]      # llama.cpp's eagle3.target_layers: layer inputs (HF hidden_states[i]) of the 4 layers
DRAFT_VOCAB = 512


def eagle3_config(target_cfg, *, eos: int, intermediate: int, heads: int, kv_heads: int) -> dict:
    """config.json: LlamaConfig's keys (one layer, the target's width and vocabulary) and the EAGLE3 keys."""
    return {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama",
            "hidden_size": target_cfg.hidden_size, "intermediate_size": intermediate, "num_hidden_layers": 1,
            "num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_act": "silu",
            "vocab_size": target_cfg.vocab_size, "draft_vocab_size": DRAFT_VOCAB,
            "max_position_embeddings": target_cfg.max_position_embeddings, "rms_norm_eps": target_cfg.rms_norm_eps,
            "rope_theta": 10000.0, "attention_bias": False, "tie_word_embeddings": False, "bos_token_id": eos,
            "eos_token_id": eos, "eagle_aux_hidden_state_layer_ids": list(TARGET_LAYERS), "torch_dtype": "bfloat16"}


class Eagle3Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        H, self.head_dim = cfg.hidden_size, cfg.hidden_size // cfg.num_attention_heads
        self.q_proj = nn.Linear(2 * H, cfg.num_attention_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * H, cfg.num_key_value_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * H, cfg.num_key_value_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.num_attention_heads * self.head_dim, H, bias=False)


class Eagle3Layer(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.hidden_norm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Eagle3Attention(cfg)
        self.post_attention_layernorm = LlamaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = LlamaMLP(cfg)


class Eagle3Drafter(nn.Module):
    """State_dict names are the checkpoint's (d2t / t2d added by save_checkpoint). target: the torch target whose
    embedding the drafter reads (frozen)."""

    def __init__(self, config: dict, target, draft_ids: torch.Tensor):
        super().__init__()
        cfg = LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
        H, n_taps = cfg.hidden_size, len(config["eagle_aux_hidden_state_layer_ids"])
        self.config_dict = config
        self.fc = nn.Linear(n_taps * target.config.hidden_size, H, bias=False)
        self.midlayer = Eagle3Layer(cfg)
        self.norm = LlamaRMSNorm(H, cfg.rms_norm_eps)
        self.lm_head = nn.Linear(H, len(draft_ids), bias=False)
        self.rotary = LlamaRotaryEmbedding(cfg)
        self.embed = target.get_input_embeddings().weight.detach()
        self.draft_ids = draft_ids
        self.n_head, self.n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        self.scale = self.midlayer.self_attn.head_dim ** -0.5
        with torch.no_grad():          # the head starts as the target's (tied) rows, the output norm as its final norm
            self.lm_head.weight.copy_(target.lm_head.weight[draft_ids])
            self.norm.weight.copy_(target.model.norm.weight)

    # ---- the ttt.py drafter interface ----------------------------------------------------------------
    def project(self, feats):
        return self.fc(feats)

    def qkv(self, tokens, rows, positions):
        layer, attn = self.midlayer, self.midlayer.self_attn
        x = torch.cat([layer.input_layernorm(nn.functional.embedding(tokens, self.embed)), layer.hidden_norm(rows)], -1)
        n, r, _ = x.shape
        d = attn.head_dim
        q = attn.q_proj(x).view(n, r, self.n_head, d).transpose(1, 2)
        k = attn.k_proj(x).view(n, r, self.n_kv, d).transpose(1, 2)
        v = attn.v_proj(x).view(n, r, self.n_kv, d).transpose(1, 2)
        cos, sin = self.rotary(x, positions.expand(n, -1))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, rows

    def finish(self, attn_out, g):
        layer = self.midlayer
        r = layer.self_attn.o_proj(attn_out) + g
        y = r + layer.mlp(layer.post_attention_layernorm(r))
        return y, self.lm_head(self.norm(y))


def save_checkpoint(drafter: Eagle3Drafter, out: Path) -> Path:
    """bf16 safetensors (d2t as I64 offsets, t2d as BOOL, as the EAGLE authors' checkpoints hold them) and
    config.json."""
    from safetensors.torch import save_file
    skip = ("rotary.",)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in drafter.state_dict().items()
               if not k.startswith(skip)}
    ids = drafter.draft_ids
    tensors["d2t"] = (ids - torch.arange(len(ids))).to(torch.int64)
    t2d = torch.zeros(drafter.config_dict["vocab_size"], dtype=torch.bool)
    t2d[ids] = True
    tensors["t2d"] = t2d
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(drafter.config_dict, indent=2, sort_keys=True) + "\n")
    return out
