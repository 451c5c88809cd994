"""Routed experts read only what they route to: on a qwen3moe GGUF written here with many MXFP4 experts,
bytes of experts no token routes to can be garbage without changing a bit of the output, and the resident
part of the mapped file after a run grows with the experts touched, not with the file."""

import contextlib
import gc
import inspect
import os
import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from ggtools.runtime import TargetModel
from ggtools.runtime.errors import NonFiniteError
from ggtools.runtime.model.ffn import moe
from ggtools.runtime.model.ffn.moe import RoutedExperts

VOCAB, EMBD, HEADS, HEAD_DIM, LAYERS, TOP_K = 64, 64, 2, 32, 2, 2
MXFP4_BLOCK = 17


def random_mxfp4(rng, n_rows, n_cols):
    """Random MXFP4 rows: exponents around 2^-7, random nibbles."""
    blocks = rng.integers(0, 256, (n_rows, n_cols // 32, MXFP4_BLOCK), dtype=np.uint8)
    blocks[..., 0] = rng.integers(118, 123, blocks.shape[:2])
    return blocks.reshape(n_rows, -1)


def write_moe(path, n_expert, n_ff, seed=0):
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "qwen3moe")
    for key, value in (("block_count", LAYERS), ("context_length", 256), ("embedding_length", EMBD),
                       ("feed_forward_length", n_ff), ("expert_feed_forward_length", n_ff),
                       ("expert_count", n_expert), ("expert_used_count", TOP_K), ("attention.head_count", HEADS),
                       ("attention.head_count_kv", HEADS), ("attention.key_length", HEAD_DIM),
                       ("attention.value_length", HEAD_DIM)):
        w.add_uint32(f"qwen3moe.{key}", value)
    w.add_float32("qwen3moe.attention.layer_norm_rms_epsilon", 1e-6)

    def f32(name, *shape, scale=0.3, offset=0.0):
        w.add_tensor(name, (offset + scale * rng.standard_normal(shape)).astype(np.float32))

    f32("token_embd.weight", VOCAB, EMBD, scale=1.0)
    for i in range(LAYERS):
        p = f"blk.{i}."
        for name, n in (("attn_norm", EMBD), ("ffn_norm", EMBD), ("attn_q_norm", HEAD_DIM), ("attn_k_norm", HEAD_DIM)):
            f32(p + name + ".weight", n, scale=0.1, offset=1.0)
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            f32(p + name + ".weight", EMBD, EMBD)
        f32(p + "ffn_gate_inp.weight", n_expert, EMBD)
        for name, rows, cols in (("ffn_gate_exps", n_ff, EMBD), ("ffn_up_exps", n_ff, EMBD), ("ffn_down_exps", EMBD, n_ff)):
            data = np.stack([random_mxfp4(rng, rows, cols) for _ in range(n_expert)])
            w.add_tensor(p + name + ".weight", data, raw_dtype=T.MXFP4)
    f32("output_norm.weight", EMBD, scale=0.1, offset=1.0)
    f32("output.weight", VOCAB, EMBD)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@contextlib.contextmanager
def recorded_routes(model):
    """Yields, per layer, the set of experts the model routes tokens to while the context is open: from
    RoutedExperts.route, and from the experts each layer's one-token call (moe.one_token_experts) routed to."""
    seen = [set() for _ in model.layers]
    route, saved = RoutedExperts.route, [layer.ffn.one_token_calls for layer in model.layers]
    experts_at = list(inspect.signature(moe.one_token_experts.py_func).parameters).index("experts")

    def recording(ffn, h, stepwise):
        experts, weights = route(ffn, h, stepwise)
        seen[next(i for i, layer in enumerate(model.layers) if layer.ffn is ffn)].update(experts.reshape(-1).tolist())
        return experts, weights

    def recording_call(call, layer):
        def record(*args):
            out = call(*args)
            seen[layer].update(args[experts_at].reshape(-1).tolist())
            return out
        return record

    RoutedExperts.route = recording
    for i, layer in enumerate(model.layers):
        layer.ffn.one_token_calls = tuple(recording_call(call, i) for call in layer.ffn.one_token_calls)
    try:
        yield seen
    finally:
        RoutedExperts.route = route
        for layer, calls in zip(model.layers, saved):
            layer.ffn.one_token_calls = calls


def expert_stacks(model, layer):
    """The gate, up and down expert stacks (weights.Matrix) of a layer."""
    ffn = model.layers[layer].ffn
    return [ffn.gate, ffn.up, ffn.down]


def poison(path, model, layer, experts):
    """Overwrite the given experts' gate/up/down bytes of one layer with 0xFF (exponent 255: NaN scales)."""
    with open(path, "r+b") as f:
        for m in expert_stacks(model, layer):
            per_expert = m.data.size // m.n_expert
            for e in experts:
                f.seek(m.offset + e * per_expert)
                f.write(b"\xff" * per_expert)


def test_unrouted_experts_are_never_read(tmp_path):
    path = write_moe(tmp_path / "moe.gguf", n_expert=16, n_ff=128)
    ids = [3, 17, 5, 42, 9]
    model = TargetModel(path, threads=2)
    with recorded_routes(model) as seen:
        want, _ = model.forward(ids)
    assert all(0 < len(s) < 16 for s in seen)
    garbage = shutil.copyfile(path, tmp_path / "garbage.gguf")
    for layer, used in enumerate(seen):
        poison(garbage, model, layer, sorted(set(range(16)) - used))
    got, _ = TargetModel(garbage, threads=2).forward(ids)
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    poison(garbage, model, 0, sorted(seen[0])[:1])           # a routed expert's bytes do matter: NaN stops the run
    with pytest.raises(NonFiniteError, match="tensor 'blk.0.ffn_gate_exps.weight' holds NaN/inf"):
        TargetModel(garbage, threads=2).forward(ids)


def mapped_rss(path) -> int:
    """Resident bytes of this process's mappings of `path` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:      # a mapping's header line
                inside = len(fields) >= 6 and fields[5] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


def drop_from_page_cache(path):
    """Written pages sit in the page cache in large folios, which a fault maps whole: start from disk."""
    with open(path, "rb") as f:
        os.fsync(f.fileno())
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)


def test_resident_memory_grows_with_the_experts_touched(tmp_path):
    """64 experts of 3 x 4096 x 64 MXFP4 values in each of 2 layers (51 MiB): what is resident of the mapped
    file after a run is the touched experts (one token: at most 2 per layer), the rest of the model and the
    kernel's read-around, measured from a file not in the page cache."""
    path = write_moe(tmp_path / "big.gguf", n_expert=64, n_ff=4096)
    drop_from_page_cache(path)
    model = TargetModel(path, threads=1)
    per_expert = sum(m.data.size // m.n_expert for m in expert_stacks(model, 0))
    size = path.stat().st_size
    trunk = size - LAYERS * 64 * per_expert
    with recorded_routes(model) as seen:
        model.forward([7])
        one_token = mapped_rss(path)
        touched = sum(map(len, seen))
        model.forward(list(range(1, 6)))
        many = mapped_rss(path)
    print(f"file {size / 2**20:.1f} MiB ({trunk / 2**20:.2f} MiB besides experts), an expert {per_expert / 2**10:.0f} "
          f"KiB; resident after one token {one_token / 2**20:.2f} MiB ({touched} experts touched), after 6 tokens "
          f"{many / 2**20:.2f} MiB ({sum(map(len, seen))} experts)")
    assert one_token < size / 10
    for resident, n_experts in ((one_token, touched), (many, sum(map(len, seen)))):
        read_around = 3 * n_experts * (128 << 10)     # the kernel reads a window around each faulting stack
        assert n_experts * per_expert - (64 << 10) <= resident <= n_experts * per_expert + trunk + read_around


def test_paged_experts_read_the_routed_experts_and_no_read_around(tmp_path, monkeypatch):
    """GGTOOLS_EXPERT_PAGING=on (runtime/weights.py): the expert stacks are MADV_RANDOM and each routed expert is
    asked for with MADV_WILLNEED, so what is resident of the mapped file after a token from a cold page cache is the
    touched experts and the trunk, without the kernel's read-around window around each expert's faults (the bound
    of the test above with two pages per expert and stack for the page rounding at each end instead of its
    read_around term, which grows with the experts; the trunk's own faults still read around, into the two stacks
    beside a router or a norm in each layer: one 128 KiB window each); the output's bits are those of the unpaged
    run."""
    path = write_moe(tmp_path / "big.gguf", n_expert=64, n_ff=4096)
    unpaged = TargetModel(path, threads=1)
    want, _ = unpaged.forward([7])
    unpaged.close()     # its mapping goes: its pages could neither be dropped nor told apart from the paged run's
    del unpaged
    gc.collect()
    monkeypatch.setenv("GGTOOLS_EXPERT_PAGING", "on")
    drop_from_page_cache(path)
    model = TargetModel(path, threads=1)
    assert model.weights.paged_experts
    stacks = expert_stacks(model, 0)
    per_expert = sum(m.data.size // m.n_expert for m in stacks)
    trunk = path.stat().st_size - LAYERS * 64 * per_expert
    with recorded_routes(model) as seen:
        got, _ = model.forward([7])
        resident = mapped_rss(path)
    touched = sum(map(len, seen))
    print(f"resident {resident / 2**10:.0f} KiB: {touched} experts of {per_expert / 2**10:.0f} KiB, trunk "
          f"{trunk / 2**10:.0f} KiB")
    assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    page_rounding = touched * len(stacks) * 2 * os.sysconf("SC_PAGE_SIZE")
    trunk_read_around = LAYERS * 2 * (128 << 10)
    assert touched * per_expert - (64 << 10) <= resident
    assert resident <= touched * per_expert + trunk + page_rounding + trunk_read_around
