"""Tiny random target GGUFs of the runtime's other architectures, written here in a blink (no converter): a
qwen35 hybrid (Gated DeltaNet layers and gated attention) and a gpt-oss MoE (sinks, sliding window, YaRN), with
the demo target's tokenizer. Inputs of the hostile corpus, the fuzz test and the model-file rules' oracle test
(libllama runs them): models every key of which the runtime reads, small enough to run a few tokens of
in-process. Their numerics are proven elsewhere (tests/test_hybrid_parity.py, tests/test_runtime_moe.py,
against llama.cpp on converter-built models); these only have to load and run.
"""

import os

import numpy as np
from gguf import GGUFValueType as VT
from gguf import GGUFWriter

from ggtools.gguf import GGUFFile

DEMO_TARGET = os.path.join(os.path.dirname(__file__), "..", "ggtools", "data", "demo", "target.gguf")
EMBD, HEADS, KV_HEADS, HEAD_DIM, FF, VOCAB, CTX = 64, 4, 2, 16, 128, 2048, 256


def _writer(path, arch, n_layer, keys):
    w = GGUFWriter(str(path), arch)
    for name, vtype, value, elem in [
            ("block_count", VT.UINT32, n_layer, None), ("context_length", VT.UINT32, CTX, None),
            ("embedding_length", VT.UINT32, EMBD, None), ("attention.head_count", VT.UINT32, HEADS, None),
            ("attention.head_count_kv", VT.UINT32, KV_HEADS, None), ("attention.key_length", VT.UINT32, HEAD_DIM, None),
            ("attention.value_length", VT.UINT32, HEAD_DIM, None),
            ("attention.layer_norm_rms_epsilon", VT.FLOAT32, 1e-6, None), ("rope.freq_base", VT.FLOAT32, 10000.0, None),
            *keys]:
        w.add_key_value(f"{arch}.{name}", value, vtype, elem)
    with GGUFFile(DEMO_TARGET) as demo:
        for kv in demo.kvs:
            if kv.key.startswith("tokenizer."):
                value = kv.value.tolist() if hasattr(kv.value, "tolist") else kv.value
                w.add_key_value(kv.key, value, kv.vtype, kv.elem_type)
    return w


class _Tensors:
    def __init__(self, w, seed):
        self.w, self.rng = w, np.random.default_rng(seed)

    def matrix(self, name, n_in, n_out, n_expert=None, scale=0.2):
        shape = (n_out, n_in) if n_expert is None else (n_expert, n_out, n_in)
        self.w.add_tensor(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    def vector(self, name, n, around=1.0):
        self.w.add_tensor(name, (around + 0.1 * self.rng.standard_normal(n)).astype(np.float32))


def _close(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_qwen35(path, n_layer=4, seed=0, rank=4):
    """qwen35: layers 0..2 Gated DeltaNet, layer 3 gated attention (full_attention_interval 4), partial IMROPE;
    rank: the DeltaNet's value heads (2 key heads)."""
    conv, state, groups = 4, 16, 2
    w = _writer(path, "qwen35", n_layer, [
        ("feed_forward_length", VT.UINT32, FF, None), ("rope.dimension_count", VT.UINT32, 8, None),
        ("rope.dimension_sections", VT.ARRAY, [2, 1, 1, 0], VT.INT32), ("ssm.conv_kernel", VT.UINT32, conv, None),
        ("ssm.state_size", VT.UINT32, state, None), ("ssm.group_count", VT.UINT32, groups, None),
        ("ssm.time_step_rank", VT.UINT32, rank, None), ("ssm.inner_size", VT.UINT32, rank * state, None),
        ("full_attention_interval", VT.UINT32, 4, None)])
    t = _Tensors(w, seed)
    t.matrix("token_embd.weight", EMBD, VOCAB, scale=1.0)
    value_dim, channels = rank * state, 2 * groups * state + rank * state
    for i in range(n_layer):
        p = f"blk.{i}."
        t.vector(p + "attn_norm.weight", EMBD)
        t.vector(p + "post_attention_norm.weight", EMBD)
        if (i + 1) % 4:
            t.matrix(p + "attn_qkv.weight", EMBD, channels)
            t.matrix(p + "attn_gate.weight", EMBD, value_dim)
            t.matrix(p + "ssm_beta.weight", EMBD, rank)
            t.matrix(p + "ssm_alpha.weight", EMBD, rank)
            t.matrix(p + "ssm_conv1d.weight", conv, channels)
            t.vector(p + "ssm_dt.bias", rank, 0.0)
            t.vector(p + "ssm_a", rank, -1.0)
            t.vector(p + "ssm_norm.weight", state)
            t.matrix(p + "ssm_out.weight", value_dim, EMBD)
        else:
            t.matrix(p + "attn_q.weight", EMBD, 2 * HEADS * HEAD_DIM)
            t.matrix(p + "attn_k.weight", EMBD, KV_HEADS * HEAD_DIM)
            t.matrix(p + "attn_v.weight", EMBD, KV_HEADS * HEAD_DIM)
            t.matrix(p + "attn_output.weight", HEADS * HEAD_DIM, EMBD)
            t.vector(p + "attn_q_norm.weight", HEAD_DIM)
            t.vector(p + "attn_k_norm.weight", HEAD_DIM)
        t.matrix(p + "ffn_gate.weight", EMBD, FF)
        t.matrix(p + "ffn_up.weight", EMBD, FF)
        t.matrix(p + "ffn_down.weight", FF, EMBD)
    t.vector("output_norm.weight", EMBD)
    _close(w)
    return str(path)


def write_gpt_oss(path, n_layer=2, seed=0):
    """gpt-oss: sinks, every other layer a sliding window of 8, 4 experts (2 used), YaRN."""
    experts, used, ff_exp = 4, 2, 32
    w = _writer(path, "gpt-oss", n_layer, [
        ("expert_count", VT.UINT32, experts, None), ("expert_used_count", VT.UINT32, used, None),
        ("expert_feed_forward_length", VT.UINT32, ff_exp, None), ("attention.sliding_window", VT.UINT32, 8, None),
        ("rope.scaling.type", VT.STRING, "yarn", None), ("rope.scaling.factor", VT.FLOAT32, 4.0, None),
        ("rope.scaling.original_context_length", VT.UINT32, 64, None)])
    t = _Tensors(w, seed)
    t.matrix("token_embd.weight", EMBD, VOCAB, scale=1.0)
    for i in range(n_layer):
        p = f"blk.{i}."
        t.vector(p + "attn_norm.weight", EMBD)
        t.vector(p + "post_attention_norm.weight", EMBD)
        t.matrix(p + "attn_q.weight", EMBD, HEADS * HEAD_DIM)
        t.matrix(p + "attn_k.weight", EMBD, KV_HEADS * HEAD_DIM)
        t.matrix(p + "attn_v.weight", EMBD, KV_HEADS * HEAD_DIM)
        t.matrix(p + "attn_output.weight", HEADS * HEAD_DIM, EMBD)
        t.vector(p + "attn_output.bias", EMBD, 0.0)
        t.vector(p + "attn_sinks.weight", HEADS, 0.0)
        t.matrix(p + "ffn_gate_inp.weight", EMBD, experts)
        t.vector(p + "ffn_gate_inp.bias", experts, 0.0)
        t.matrix(p + "ffn_gate_exps.weight", EMBD, ff_exp, experts)
        t.matrix(p + "ffn_up_exps.weight", EMBD, ff_exp, experts)
        t.matrix(p + "ffn_down_exps.weight", ff_exp, EMBD, experts)
        for name, n in (("ffn_gate_exps.bias", ff_exp), ("ffn_up_exps.bias", ff_exp), ("ffn_down_exps.bias", EMBD)):
            t.matrix(p + name, n, experts, scale=0.05)
    t.vector("output_norm.weight", EMBD)
    t.matrix("output.weight", EMBD, VOCAB)
    _close(w)
    return str(path)
