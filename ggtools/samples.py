"""Synthetic sample models for demos, tests and benchmarks.

write_moe_set: a Kimi-like MoE shard set — MXFP4 routed experts, a Q8_0 trunk (attention, shared experts,
token_embd, output), F32 norms and routers, and 128-wide Q8_0 tensors (attn_k_b) that Q4_K cannot take.
"""

from types import SimpleNamespace

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

from ggtools.gguf import GGUFWriter, shard_path
from ggtools.quants import quantize, row_bytes


def tensor_specs(layers, hidden, ffn, experts, vocab):
    """(name, ne, type) in file order."""
    specs = [("token_embd.weight", (hidden, vocab), T.Q8_0)]
    for i in range(layers):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (hidden,), T.F32),
            (b + "attn_q.weight", (hidden, hidden), T.Q8_0),
            (b + "attn_kv_a_mqa.weight", (hidden, 256), T.Q8_0),
            (b + "attn_k_b.weight", (128, 512), T.Q8_0),          # 128-wide: cannot become Q4_K
            (b + "attn_output.weight", (hidden, hidden), T.Q8_0),
            (b + "ffn_norm.weight", (hidden,), T.F32),
            (b + "ffn_gate_inp.weight", (hidden, experts), T.F32),
            (b + "ffn_gate_exps.weight", (hidden, ffn, experts), T.MXFP4),
            (b + "ffn_up_exps.weight", (hidden, ffn, experts), T.MXFP4),
            (b + "ffn_down_exps.weight", (ffn, hidden, experts), T.MXFP4),
            (b + "ffn_gate_shexp.weight", (hidden, ffn), T.Q8_0),
            (b + "ffn_up_shexp.weight", (hidden, ffn), T.Q8_0),
            (b + "ffn_down_shexp.weight", (ffn, hidden), T.Q8_0),
        ]
    specs += [("output_norm.weight", (hidden,), T.F32), ("output.weight", (hidden, vocab), T.Q8_0)]
    return specs


def nbytes(ne, qtype):
    rows = int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1
    return row_bytes(qtype, ne[0]) * rows


def tensor_bytes(ne, qtype, rng, chunk_rows=4096):
    """The tensor's data in chunks: realistic Q8_0 (quantized normals), MXFP4 with valid exponents."""
    rows = int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1
    for start in range(0, rows, chunk_rows):
        n = min(chunk_rows, rows - start)
        if qtype == T.F32:
            yield (rng.standard_normal((n, ne[0]), dtype=np.float32) * 0.1 + 1).tobytes()
        elif qtype == T.Q8_0:
            yield quantize(T.Q8_0, rng.standard_normal((n, ne[0]), dtype=np.float32) * 0.02).tobytes()
        else:
            blocks = rng.integers(0, 256, (n * ne[0] // 32, 17), dtype=np.uint8)
            blocks[:, 0] = rng.integers(118, 125, len(blocks), dtype=np.uint8)
            yield blocks.tobytes()


def write_moe_set(prefix, *, layers=4, hidden=512, ffn=256, experts=8, vocab=2048, shards=3, seed=0, force=False):
    """Write the shard set; returns the shard paths."""
    rng = np.random.default_rng(seed)
    specs = tensor_specs(layers, hidden, ffn, experts, vocab)
    groups = np.array_split(np.arange(len(specs)), shards) if shards > 1 else [np.arange(len(specs))]
    paths = []
    for i, idx in enumerate(groups):
        path = shard_path(prefix, i, shards) if shards > 1 else f"{prefix}.gguf"
        with GGUFWriter(path, force=force) as w:
            if i == 0:
                w.add_kv("general.architecture", VT.STRING, "deepseek2")
                w.add_kv("general.name", VT.STRING, "synthetic-kimi-like")
                w.add_kv("deepseek2.block_count", VT.UINT32, layers)
                w.add_kv("deepseek2.embedding_length", VT.UINT32, hidden)
                w.add_kv("deepseek2.expert_count", VT.UINT32, experts)
                w.add_kv("deepseek2.expert_used_count", VT.UINT32, min(2, experts))    # llama.cpp asserts > 0
                w.add_kv("tokenizer.ggml.model", VT.STRING, "gpt2")
            if shards > 1:
                w.add_kv("split.no", VT.UINT16, i)
                w.add_kv("split.count", VT.UINT16, shards)
                w.add_kv("split.tensors.count", VT.INT32, len(specs))
            for k in idx:
                name, ne, qtype = specs[k]
                w.add_tensor_info(name, ne, qtype, nbytes(ne, qtype))
            for k in idx:
                _, ne, qtype = specs[k]
                for chunk in tensor_bytes(ne, qtype, rng):
                    w.write(chunk)
        paths.append(path)
    return paths


# ---- a runnable MoE target (qwen3moe) --------------------------------------------------------------

DEMO_TARGET = "data/demo/target.gguf"     # its tokenizer (2048-token byte-level BPE) is the sample's


def runnable_moe_specs(layers, hidden, heads, kv_heads, head_dim, ffn, experts, vocab, trunk=T.Q8_0):
    """(name, ne, type) of a qwen3moe target in file order: a `trunk`-typed (Q8_0 or Q4_K) attention, embedding
    and output, F32 norms and routers, MXFP4 routed experts."""
    specs = [("token_embd.weight", (hidden, vocab), trunk)]
    for i in range(layers):
        b = f"blk.{i}."
        specs += [
            (b + "attn_norm.weight", (hidden,), T.F32),
            (b + "attn_q.weight", (hidden, heads * head_dim), trunk),
            (b + "attn_k.weight", (hidden, kv_heads * head_dim), trunk),
            (b + "attn_v.weight", (hidden, kv_heads * head_dim), trunk),
            (b + "attn_output.weight", (heads * head_dim, hidden), trunk),
            (b + "attn_q_norm.weight", (head_dim,), T.F32),
            (b + "attn_k_norm.weight", (head_dim,), T.F32),
            (b + "ffn_norm.weight", (hidden,), T.F32),
            (b + "ffn_gate_inp.weight", (hidden, experts), T.F32),
            (b + "ffn_gate_exps.weight", (hidden, ffn, experts), T.MXFP4),
            (b + "ffn_up_exps.weight", (hidden, ffn, experts), T.MXFP4),
            (b + "ffn_down_exps.weight", (ffn, hidden, experts), T.MXFP4),
        ]
    specs += [("output_norm.weight", (hidden,), T.F32), ("output.weight", (hidden, vocab), trunk)]
    return specs


def _runnable_bytes(name, ne, qtype, rng, chunk_rows=4096):
    """Norms around 1, routers and trunk matrices of normal values scaled by 1/sqrt(row length) (activations keep
    their size through the layers), MXFP4 experts as tensor_bytes makes them."""
    if qtype == T.MXFP4:
        yield from tensor_bytes(ne, qtype, rng, chunk_rows)
        return
    rows = int(np.prod(ne[1:], dtype=np.int64)) if len(ne) > 1 else 1
    norm = name.endswith("norm.weight")
    for start in range(0, rows, chunk_rows):
        x = rng.standard_normal((min(chunk_rows, rows - start), ne[0]), dtype=np.float32)
        x = x * 0.1 + 1 if norm else x / np.float32(np.sqrt(ne[0]))
        yield (x if qtype == T.F32 else quantize(qtype, x)).tobytes()


def runnable_moe_layer_bytes(hidden, heads, kv_heads, head_dim, ffn, experts, trunk=T.Q8_0) -> int:
    """Bytes of one layer of runnable_moe_specs (to choose a layer count for a file size)."""
    return sum(nbytes(ne, t) for name, ne, t in runnable_moe_specs(1, hidden, heads, kv_heads, head_dim, ffn, experts,
                                                                   256, trunk) if name.startswith("blk."))


def write_runnable_moe(path, *, layers=4, hidden=512, heads=4, kv_heads=2, head_dim=128, ffn=256, experts=8, used=2,
                       trunk=T.Q8_0, context=2048, seed=0, force=False, progress=None) -> str:
    """A qwen3moe target the runtime (and llama.cpp) runs: the demo target's tokenizer, random weights (MXFP4
    experts, a Q8_0 or Q4_K trunk). progress(bytes) is called after each chunk written. Returns the path."""
    from importlib.resources import files

    from ggtools.gguf import GGUFFile
    rng = np.random.default_rng(seed)
    with GGUFFile(str(files("ggtools") / DEMO_TARGET)) as demo:
        tokenizer = [SimpleNamespace(key=kv.key, raw=bytes(kv.raw), vtype=kv.vtype, value=None)
                     for kv in demo.kvs if kv.key.startswith("tokenizer.")]     # copied before the file closes
        vocab = len(demo.get("tokenizer.ggml.tokens"))
    specs = runnable_moe_specs(layers, hidden, heads, kv_heads, head_dim, ffn, experts, vocab, trunk)
    with GGUFWriter(path, force=force) as w:
        w.add_kv("general.architecture", VT.STRING, "qwen3moe")
        w.add_kv("general.name", VT.STRING, "synthetic-moe")
        for key, value in (("block_count", layers), ("context_length", context), ("embedding_length", hidden),
                           ("feed_forward_length", ffn), ("expert_feed_forward_length", ffn),
                           ("expert_count", experts), ("expert_used_count", used), ("attention.head_count", heads),
                           ("attention.head_count_kv", kv_heads), ("attention.key_length", head_dim),
                           ("attention.value_length", head_dim)):
            w.add_kv(f"qwen3moe.{key}", VT.UINT32, value)
        w.add_kv("qwen3moe.attention.layer_norm_rms_epsilon", VT.FLOAT32, 1e-6)
        w.add_kv("qwen3moe.rope.freq_base", VT.FLOAT32, 1e6)
        for kv in tokenizer:
            w.add_kv_record(kv)
        for name, ne, qtype in specs:
            w.add_tensor_info(name, ne, qtype, nbytes(ne, qtype))
        for name, ne, qtype in specs:
            for chunk in _runnable_bytes(name, ne, qtype, rng):
                w.write(chunk)
                if progress:
                    progress(len(chunk))
    return str(path)
