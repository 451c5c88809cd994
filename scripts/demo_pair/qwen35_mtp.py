"""The demo's Qwen3.5 target with an MTP block: a tiny Qwen3_5ForCausalLM (one Gated DeltaNet layer, one gated
full-attention layer) trained on the demo corpus, plus the multi-token prediction block Qwen3.5 checkpoints carry,
trained on the target's own states; the Hugging Face checkpoint and llama.cpp's conversion of it.

The MTP block as llama.cpp's qwen35 graph_mtp runs it (runtime/drafter/mtp.py), on position p:

    z = fc . concat(pre_fc_norm_embedding(embed(x_p)), pre_fc_norm_hidden(h_{p-1}))
    z = decoder layer (a full-attention layer of the trunk's shape, its own KV) on z
    u = norm(z);  logits = lm_head . u  (the target's tied embedding)      u: the next draft step's h

h_{p-1} is the target's last state after its final norm (what predicted x_p), so the block predicts x_{p+1}: token
t + 2 from the target's state at t and token t + 1. Transformers' Qwen3_5 classes make no MTP module, so the block
here is built from their decoder layer and norm classes (zero-centred RMSNorm weights, as the checkpoints store
them) and written under the names real Qwen3.5 checkpoints use: `mtp.fc`, `mtp.pre_fc_norm_embedding`,
`mtp.pre_fc_norm_hidden`, `mtp.norm`, `mtp.layers.0.*` (llama.cpp's `_QwenMtpMixin` maps them to
`blk.{n}.nextn.*` and `blk.{n}.*`).
"""

import json
import shutil
from pathlib import Path

import torch
from torch import nn

from scripts.demo_pair.common import OUT_DIR, VOCAB_SIZE

NAME = "qwen35-mtp"
HF_DIR = OUT_DIR / NAME                       # config.json, model.safetensors, tokenizer_config.json
GGUF = OUT_DIR / f"{NAME}.gguf"               # llama.cpp's default conversion: the target with its MTP block
MODEL_NAME = "ggtools demo qwen35-mtp"
# llama.cpp's converter on the checkpoint (with the demo's tokenizer.json beside it): exactly what made GGUF
CONVERTER_ARGS = ["--outtype", "f16", "--model-name", MODEL_NAME]
EOS_ID = 2046

LAYER_TYPES = ["linear_attention", "full_attention"]
FULL_LAYER = LAYER_TYPES.index("full_attention")
QWEN35 = dict(
    vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=192, num_hidden_layers=len(LAYER_TYPES),
    layer_types=LAYER_TYPES, full_attention_interval=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32,
    linear_num_key_heads=1, linear_num_value_heads=2, linear_key_head_dim=32, linear_value_head_dim=32,
    linear_conv_kernel_dim=4, max_position_embeddings=512, rms_norm_eps=1e-6, tie_word_embeddings=True,
    bos_token_id=EOS_ID, eos_token_id=EOS_ID, pad_token_id=EOS_ID,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                     "mrope_section": [3, 3, 2], "mrope_interleaved": True},
)
TOKENIZER_CONFIG = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>",
                    "pad_token": "<|endoftext|>", "add_bos_token": False,
                    "model_max_length": QWEN35["max_position_embeddings"]}


def qwen35_config():
    from transformers import Qwen3_5TextConfig
    cfg = Qwen3_5TextConfig(**QWEN35)
    cfg._attn_implementation = "sdpa"
    return cfg


def new_target(seed: int):
    from transformers import Qwen3_5ForCausalLM
    torch.manual_seed(seed)
    return Qwen3_5ForCausalLM(qwen35_config())


class MtpBlock(nn.Module):
    """The MTP block (module docstring); state_dict names are the checkpoint's less the `mtp.` prefix. head: the
    target's output matrix (frozen)."""

    def __init__(self, target):
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5RMSNorm
        super().__init__()
        cfg = target.config
        H, eps = cfg.hidden_size, cfg.rms_norm_eps
        self.fc = nn.Linear(2 * H, H, bias=False)
        self.pre_fc_norm_embedding = Qwen3_5RMSNorm(H, eps)
        self.pre_fc_norm_hidden = Qwen3_5RMSNorm(H, eps)
        self.norm = Qwen3_5RMSNorm(H, eps)
        self.layers = nn.ModuleList([Qwen3_5DecoderLayer(cfg, FULL_LAYER)])
        self.embed = target.get_input_embeddings().weight.detach()
        self.head = target.lm_head.weight.detach()
        self.rotary = target.model.rotary_emb

    @torch.no_grad()
    def init_from_target(self, target):
        """The decoder layer starts as the trunk's full-attention layer, the output norm as its final norm."""
        self.layers[0].load_state_dict(target.model.layers[FULL_LAYER].state_dict())
        self.norm.weight.copy_(target.model.norm.weight)

    # ---- the ttt.py drafter interface ----------------------------------------------------------------
    def project(self, feats):
        return feats

    def qkv(self, tokens, rows, positions):
        """(q [N, heads, R, d], k, v [N, kv heads, R, d], what finish needs)."""
        from transformers.models.qwen3_5.modeling_qwen3_5 import apply_rotary_pos_emb
        layer = self.layers[0]
        attn = layer.self_attn
        e = self.pre_fc_norm_embedding(nn.functional.embedding(tokens, self.embed))
        z = self.fc(torch.cat([e, self.pre_fc_norm_hidden(rows)], -1))
        x = layer.input_layernorm(z)
        n, r, _ = x.shape
        q, gate = torch.chunk(attn.q_proj(x).view(n, r, -1, attn.head_dim * 2), 2, dim=-1)
        q = attn.q_norm(q).transpose(1, 2)
        k = attn.k_norm(attn.k_proj(x).view(n, r, -1, attn.head_dim)).transpose(1, 2)
        v = attn.v_proj(x).view(n, r, -1, attn.head_dim).transpose(1, 2)
        cos, sin = self.rotary(x, positions.expand(n, -1))
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v, (z, gate.reshape(n, r, -1))

    def finish(self, attn_out, state):
        """attention output [N, R, heads * d] -> (u: the next step's rows, logits over the target vocabulary)."""
        layer = self.layers[0]
        z, gate = state
        z = z + layer.self_attn.o_proj(attn_out * torch.sigmoid(gate))
        z = z + layer.mlp(layer.post_attention_layernorm(z))
        u = self.norm(z)
        return u, u @ self.head.T

    @property
    def scale(self) -> float:
        return self.layers[0].self_attn.scaling


def save_checkpoint(target, block: MtpBlock, out: Path) -> Path:
    """The trunk as save_pretrained writes it (bf16; the target is cast back to f32 after), the block's tensors added
    under `mtp.*`, config.json with `mtp_num_hidden_layers` 1 as Qwen3.5 configs carry it, and the tokenizer config
    (the tokenizer itself is the demo's tokenizer.json: converter_dir adds it); no generation_config.json."""
    from safetensors.torch import load_file, save_file
    if out.exists():
        shutil.rmtree(out)
    target.to(torch.bfloat16).save_pretrained(out)
    target.float()
    (out / "generation_config.json").unlink(missing_ok=True)
    weights = out / "model.safetensors"
    tensors = load_file(str(weights))
    tensors |= {f"mtp.{k}": v.detach().to(torch.bfloat16).contiguous() for k, v in block.state_dict().items()}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    cfg_path = out / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg |= {"mtp_num_hidden_layers": 1, "mtp_use_dedicated_embeddings": False}
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    (out / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG, indent=2, sort_keys=True) + "\n")
    return out


def converter_dir(hf_dir: Path, tmp: Path) -> Path:
    """A copy of the checkpoint with the demo's tokenizer.json: what llama.cpp's converter reads."""
    out = Path(tmp) / NAME
    shutil.copytree(hf_dir, out)
    shutil.copyfile(OUT_DIR / "tokenizer.json", out / "tokenizer.json")
    return out


def convert_with_llama_cpp(hf_dir: Path, out_gguf: Path, src: Path, tmp: Path) -> Path:
    """llama.cpp's convert_hf_to_gguf.py (default mode: the MTP block after the trunk), the demo tokenizer's BPE
    pre-tokenizer declared as qwen2 (scripts/fixtures/run_converter.py)."""
    from scripts.fixtures import tiny_models as tm
    from scripts.fixtures.dspark_drafters import DEMO_TOKENIZER_CHKHSH
    tm.run_converter(src, [[converter_dir(hf_dir, tmp), *CONVERTER_ARGS, "--outfile", out_gguf]],
                     pre_tokenizers={DEMO_TOKENIZER_CHKHSH: "qwen2"})
    return out_gguf
