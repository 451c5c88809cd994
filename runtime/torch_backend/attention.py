"""Attention on torch: the target's attention mixer (over its KV cache) and the drafter's attention (over the
draft KV's stores).

The target's cache keeps llama.cpp's layout (keys (n_kv, capacity, d), values transposed (n_kv, d, capacity))
in f16 or f32 tensors on the device; a query at position p sees cache positions <= p (and, in a sliding-window
layer of n, those > p - n). The drafter's queries see the rows the draft KV lists for them, by absolute
position: non-causal unless the drafter says causal, |q - k| < window in sliding layers (z-lab's mask).

In float32 both are the numba runtime's arithmetic: the target's attention is llama.cpp's CPU attention without
flash attention (`ggml_attention`: q and the probabilities rounded to f16 over an f16 cache, the dots' lane
layouts, ggml's softmax, the cache length padded to a multiple of 32), the drafter's the numba drafter's
(`exact_draft_attention`: per-key scores, ggml's vector exp, values summed key by key, then normalized). In bf16 /
f16 both are torch's matmuls and softmax (tensor_math.attend).
"""

import numpy as np
import torch

from ggtools.runtime.model.pieces import AttentionTensors
from ggtools.runtime.torch_backend import ggml_math as gm, tensor_math
from ggtools.runtime.torch_backend.matrix import DeviceGroup
from ggtools.runtime.torch_backend.vectors import device_vector, optional_device_vector


def causal_visibility(q_positions, n_ctx: int, window: int, device) -> torch.Tensor:
    """(T, n_ctx) bool: key s visible to the query at position p iff s <= p and (no window or s > p - window)."""
    p = torch.as_tensor(np.asarray(q_positions, np.int64), device=device)[:, None]
    s = torch.arange(n_ctx, device=device)[None]
    visible = s <= p
    return visible & (s > p - window) if window else visible


class Attention(AttentionTensors):
    """The attention mixer: projections (+ biases), per-head q/k norms, RoPE, the cache write, attention over the
    cache (sliding window, sinks), sigmoid output gate (qwen35), output projection (+ bias). Runs tree batches
    (kv.tree: each row sees the cache before the tree and its own path)."""

    tree_verify = True

    def __post_init__(self):
        self.qkv = DeviceGroup(self.wq, self.wk, self.wv)
        device = self.wq.blocks.device
        self.bq, self.bk, self.bv, self.bo = (optional_device_vector(b, device) for b in (self.bq, self.bk, self.bv,
                                                                                        self.bo))
        self.q_norm, self.k_norm, self.sinks = (device_vector(v, device) for v in (self.q_norm, self.k_norm,
                                                                                  self.sinks))

    def __call__(self, h, positions, rope, kv, slot: int, hp, stepwise: bool) -> torch.Tensor:
        n_tokens = h.shape[0]
        q, k, v = self.qkv(h, stepwise)
        q, k, v = (x if b is None else x + b.to(x.dtype) for x, b in ((q, self.bq), (k, self.bk), (v, self.bv)))
        if self.output_gate:
            heads = q.reshape(n_tokens, hp.n_head, 2, hp.head_dim)
            q, gate = heads[:, :, 0].reshape(n_tokens, -1), heads[:, :, 1].reshape(n_tokens, -1)
        q = tensor_math.norm_rope(q, hp.n_head, self.q_norm, hp.rms_eps, rope, hp.rope_neox)
        k = tensor_math.norm_rope(k, hp.n_head_kv, self.k_norm, hp.rms_eps, rope, hp.rope_neox)
        start, n_ctx = int(positions[0]), int(positions[0]) + n_tokens
        keys, values_t = kv.k[slot], kv.v[slot]
        keys[:, start:n_ctx] = k.transpose(0, 1).to(keys.dtype)
        values_t[:, :, start:n_ctx] = v.reshape(n_tokens, hp.n_head_kv, hp.head_dim).permute(1, 2, 0).to(keys.dtype)
        out = cache_attention(q, keys, values_t, positions, self.window, hp.attn_scale, self.sinks,
                              n_tokens == 1 or stepwise, kv.tree)
        if self.output_gate:
            out = out * (gm.sigmoid(gate) if h.dtype == torch.float32 else torch.sigmoid(gate))
        out = self.wo(out, stepwise)
        return out if self.bo is None else out + self.bo.to(out.dtype)


KV_PAD = 32             # llama.cpp pads the cache length it attends over to a multiple of 32
SCORE_VALUES = 1 << 22  # query rows x keys x head dims per chunk of scores


def cache_attention(q: torch.Tensor, keys: torch.Tensor, values_t: torch.Tensor, positions, window: int,
                    scale: float, sinks: torch.Tensor, one_row: bool, tree=None) -> torch.Tensor:
    """q (T, n_head, d) at `positions`, whose keys and values the cache (keys (n_kv, capacity, d), values_t
    (n_kv, d_v, capacity)) holds at rows start..start + T - 1, over the cache's rows 0..start + T - 1: causal (a
    sliding window of `window`: 0 none), or a tree batch's ancestor-only rows (tree: tree_batch.TreeBatch). In
    float32 llama.cpp's arithmetic (ggml_attention), else torch's (tensor_math.attend). -> (T, n_head * d_v)."""
    n_ctx = int(positions[0]) + len(q)
    keys, values_t = keys[:, :n_ctx], values_t[:, :, :n_ctx]
    if q.dtype != torch.float32:
        visible = causal_visibility(positions, n_ctx, window, q.device) if tree is None else \
            torch.as_tensor(tree.visible(window), device=q.device)
        return tensor_math.attend(q, keys, values_t.transpose(1, 2), visible, scale, sinks)
    visible = causal_visibility(positions, n_ctx if tree is None else tree.width, window, q.device)
    return ggml_attention(q, keys, values_t, visible, scale, sinks, one_row, tree)


def ggml_attention(q: torch.Tensor, keys: torch.Tensor, values_t: torch.Tensor, visible: torch.Tensor,
                   scale: float, sinks: torch.Tensor, one_row: bool, tree=None) -> torch.Tensor:
    """llama.cpp's CPU attention (numba's mixers/attention.attention_rows) in float32: q (T, n_head, d) after
    RoPE; keys (n_kv, S, d) and values_t (n_kv, d_v, S), the cache's first S positions (f16: q and the
    probabilities are rounded to f16 too); visible (T, S); sinks: per head (empty: none); one_row: a one-token
    (or stepwise) batch, whose dots use vec_dot's layout. -> (T, n_head * d_v) float32.

    tree: a tree batch (tree_batch.TreeBatch): row t's keys are the cache rows tree.path_layout()[t], at positions
    0..W-1 as a one-token step along its path has them (numba's tree_attention_rows), visible (T, W) in those
    positions.

    scores = K . q (vec_dot's four 8-lane accumulators; tinyBLAS's 8 lanes for a batch over an f16 cache),
    scaled, masked to -inf; ggml's softmax over the positions padded to a multiple of 32; out = V^T . p
    (four accumulators of 8 positions for one row, 8 lanes for a batch: the positions a lane sums depend on
    the padding, the zero probabilities beyond it add nothing)."""
    n_tokens, n_head, d = q.shape
    n_kv, n_ctx = keys.shape[0], keys.shape[1]
    group = n_head // n_kv
    f16 = keys.dtype == torch.float16
    q = gm.to_f16(q) if f16 else q
    qg = q.reshape(n_tokens, n_kv, group, d).permute(1, 2, 0, 3)[:, :, :, None]     # (n_kv, group, T, 1, d)
    k = keys.float()[:, None, None]                                                  # (n_kv, 1, 1, S, d)
    step = max(1, SCORE_VALUES // (n_head * n_tokens * d))
    scores = torch.cat([_score_dots(qg, k[:, :, :, s:s + step], one_row or not f16, f16)
                        for s in range(0, n_ctx, step)], -1)                         # (n_kv, group, T, S)
    if tree is not None:
        layout = torch.as_tensor(tree.path_layout(), device=q.device)
        scores = scores.gather(-1, layout.expand(n_kv, group, -1, -1))
    n_keys = scores.shape[-1]
    scores = torch.where(visible, scores * gm.f32(scale), float("-inf"))
    n_pad = -(-n_keys // KV_PAD) * KV_PAD
    scores = torch.nn.functional.pad(scores, (0, n_pad - n_keys), value=float("-inf"))
    sink = sinks.reshape(n_kv, group, 1).expand(n_kv, group, n_tokens) if sinks.numel() else None
    probs = gm.soft_max(scores, sink)
    probs = gm.to_f16(probs) if f16 else probs
    p = probs[:, :, :, None]                                                          # (n_kv, group, T, 1, S_pad)
    width = 32 if one_row else 8
    if tree is None:
        v = torch.nn.functional.pad(values_t.float(), (0, n_pad - n_ctx))[:, None, None]  # (n_kv, 1, 1, d_v, S_pad)
        acc = gm.chain(p, v, width, f16)
    else:
        acc = _tree_value_chain(p, values_t, tree, visible, width, f16)
    out = gm.reduce4x8(acc) if one_row else gm.hsum8(acc)                            # (n_kv, group, T, d_v)
    return out.permute(2, 0, 1, 3).reshape(n_tokens, -1)


def _tree_value_chain(p: torch.Tensor, values_t: torch.Tensor, tree, visible: torch.Tensor, width: int,
                      f16: bool) -> torch.Tensor:
    """The value dots' fma lanes (gm.chain) of a tree batch: p (n_kv, group, T, 1, S_pad) in the rows' path layouts
    (visible (T, W)). Up to the last whole 32 positions before the tree every row has the cache's own rows, summed
    once; from there each row's values are gathered in its layout (masked keys and the padding zero, as numba's
    copy has them)."""
    layout = torch.as_tensor(tree.path_layout(), device=p.device)
    n_shared = tree.start // KV_PAD * KV_PAD
    acc = gm.chain(p[..., :n_shared], values_t[:, None, None, :, :n_shared].float(), width, f16) if n_shared else None
    tail = values_t.float()[:, :, layout[:, n_shared:]]                              # (n_kv, d_v, T, W - n_shared)
    tail = torch.where(visible[:, n_shared:], tail, 0.0).permute(0, 2, 1, 3)[:, None]  # (n_kv, 1, T, d_v, .)
    tail = torch.nn.functional.pad(tail, (0, p.shape[-1] - layout.shape[1]))
    return gm.chain(p[..., n_shared:], tail, width, f16, acc)


def _score_dots(q: torch.Tensor, k: torch.Tensor, one_row: bool, f16: bool) -> torch.Tensor:
    """numba's attention `dots` of the query rows (w) with the key rows (x)."""
    if one_row and q.shape[-1] % 32:
        return gm.dot_one_row(q, k, f16_tail=f16, exact_products=f16)
    return gm.dot_4x8(q, k, f16) if one_row else gm.dot_lanes8(q, k, f16)


def draft_attention(q, k_store, v_store, rows, k_pos, q_pos, scale: float, window: int = 0,
                    causal: bool = False) -> torch.Tensor:
    """(T, n_head, d) queries at q_pos over the keys at rows `rows` of the (rows, n_kv, d) stores (positions
    k_pos) -> (T, n_head * d)."""
    device = q.device
    index = torch.as_tensor(np.asarray(rows, np.int64), device=device)
    keys, values = (store.data[index].transpose(0, 1) for store in (k_store, v_store))     # (n_kv, S, d)
    kp = torch.as_tensor(np.asarray(k_pos, np.int64), device=device)[None]
    qp = torch.as_tensor(np.asarray(q_pos, np.int64), device=device)[:, None]
    visible = torch.ones((qp.shape[0], kp.shape[1]), dtype=torch.bool, device=device)
    if causal:
        visible &= kp <= qp
    if window:
        visible &= (qp - kp).abs() < window
    if q.dtype == torch.float32:
        return exact_draft_attention(q, keys.float(), values.float(), visible, scale)
    return tensor_math.attend(q, keys, values, visible, scale)


def exact_draft_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor,
                          scale: float) -> torch.Tensor:
    """The numba drafter's attention (drafter/attention.attention_groups) in float32: q (T, n_head, d); keys,
    values (n_kv, S, d) in the order the draft KV lists them; visible (T, S). Per key, its score against every
    query (vec_dot's 4x8 layout over the whole steps of 32 dims, the leftover dims added in order), times the
    scale; masked keys -inf; e = v_expf(w - max) over blocks of 8 keys (padded with -inf), their hsum8 added in
    float64, total rounded to float32; the values summed key by key (acc += e * v, keys with e = 0 skipped);
    out = acc * (1 / total)."""
    n_tokens, n_head, d = q.shape
    n_kv, n_keys = keys.shape[0], keys.shape[1]
    group = n_head // n_kv
    qg = q.reshape(n_tokens, n_kv, group, d).permute(1, 2, 0, 3)[:, :, :, None]    # (n_kv, group, T, 1, d)
    k = keys[:, None, None]                                                         # (n_kv, 1, 1, S, d)
    n32 = d // 32 * 32
    w = (gm.dot_4x8(k[..., :n32], qg[..., :n32]) if n32 else
         torch.zeros((n_kv, group, n_tokens, n_keys), dtype=torch.float32, device=q.device))
    for j in range(n32, d):
        w = w + k[..., j] * qg[..., j]
    w = torch.where(visible, w * gm.f32(scale), float("-inf"))
    m = w.amax(-1, keepdim=True)
    n_pad = -(-n_keys // 8) * 8
    e = gm.v_expf(torch.nn.functional.pad(w, (0, n_pad - n_keys), value=float("-inf")) - m)
    total = gm.hsum8(e.reshape(e.shape[:-1] + (n_pad // 8, 8))).double().sum(-1).float()
    acc = torch.zeros((n_kv, group, n_tokens, d), dtype=torch.float32, device=q.device)
    for i in range(n_keys):     # numba skips keys with e = 0 (their values might not be finite)
        p = e[..., i, None]
        acc += torch.where(p != 0, p * values[:, None, None, i], 0.0)
    out = acc * gm.div(torch.ones_like(total), total)[..., None]
    return out.permute(2, 0, 1, 3).reshape(n_tokens, n_head * d)
