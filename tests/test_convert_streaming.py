"""convert dflash streams: converting a ~230 MB checkpoint (largest tensor 16 MB) must not take much more memory
than converting a tiny one. Peak RSS of each conversion is measured in a fresh child process and printed
(run with -s to see it); only memory is asserted, never time."""

import json
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.test_convert_support import make_checkpoint, make_target_gguf, to_bf16_bits

pytestmark = pytest.mark.slow
BIG = {"hidden_size": 1024, "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
       "intermediate_size": 8192, "num_hidden_layers": 4, "vocab_size": 128, "num_target_layers": 36}


def write_big_checkpoint(d) -> int:
    """A DFlash v1 checkpoint written one tensor at a time (the test itself never holds it); returns its bytes."""
    H, I, q, kv = BIG["hidden_size"], BIG["intermediate_size"], 8 * 128, 2 * 128
    shapes = {"fc.weight": (H, 5 * H), "hidden_norm.weight": (H,), "norm.weight": (H,)}
    for i in range(BIG["num_hidden_layers"]):
        p = f"layers.{i}."
        shapes |= {p + "input_layernorm.weight": (H,), p + "post_attention_layernorm.weight": (H,),
                   p + "self_attn.q_proj.weight": (q, H), p + "self_attn.k_proj.weight": (kv, H),
                   p + "self_attn.v_proj.weight": (kv, H), p + "self_attn.o_proj.weight": (H, q),
                   p + "self_attn.q_norm.weight": (128,), p + "self_attn.k_norm.weight": (128,),
                   p + "mlp.gate_proj.weight": (I, H), p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)}
    header, offset = {}, 0
    for name in sorted(shapes):
        n = 2 * int(np.prod(shapes[name]))
        header[name] = {"dtype": "BF16", "shape": list(shapes[name]), "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    d.mkdir()
    rng = np.random.default_rng(0)
    with open(d / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for name in sorted(shapes):
            x = rng.standard_normal(int(np.prod(shapes[name])), dtype=np.float32) * 0.02
            fh.write(to_bf16_bits(x + 1 if name.endswith("norm.weight") else x).tobytes())
    cfg = BIG | {"architectures": ["DFlashDraftModel"], "model_type": "qwen3", "rms_norm_eps": 1e-6,
                 "max_position_embeddings": 4096, "rope_parameters": {"rope_theta": 1e6},
                 "dflash_config": {"block_size": 16, "mask_token_id": 100, "target_layer_ids": [1, 9, 17, 25, 33]}}
    (d / "config.json").write_text(json.dumps(cfg))
    return offset


def peak_rss_mib(ckpt, out, target, outtype) -> float:
    code = textwrap.dedent(f"""
        import resource
        from ggtools.jobs.convert import convert_dflash
        convert_dflash({str(ckpt)!r}, {str(out)!r}, target={str(target)!r}, outtype={outtype!r}, force=True)
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(done.stdout.split()[-1]) / 1024


@pytest.mark.parametrize("outtype", ["f16", "q8_0"])
def test_peak_memory_is_about_one_chunk(tmp_path, outtype):
    small = make_checkpoint(tmp_path / "small", 1)
    big_bytes = write_big_checkpoint(tmp_path / "big")
    t_small = make_target_gguf(tmp_path / "t-small.gguf")
    t_big = make_target_gguf(tmp_path / "t-big.gguf", hidden=BIG["hidden_size"], n_layer=36)
    base = peak_rss_mib(small, tmp_path / "small.gguf", t_small, outtype)
    peak = peak_rss_mib(tmp_path / "big", tmp_path / "big.gguf", t_big, outtype)
    ckpt_mib = big_bytes / 2 ** 20
    print(f"\n[streaming {outtype}] checkpoint {ckpt_mib:.0f} MiB (largest tensor 16 MiB bf16): peak RSS "
          f"{peak:.0f} MiB vs {base:.0f} MiB for a tiny checkpoint (+{peak - base:.0f} MiB)")
    assert peak - base < ckpt_mib / 3
