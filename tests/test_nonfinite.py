"""Non-finite values are never hidden: quantize and requant-trunk refuse NaN/inf source values and NaN/inf
scales (naming the tensor and the first bad row) unless --allow-nonfinite, then warn with counts; convert
warns about NaN/inf in source tensors. The bad rows are put there by the tests, which is the truth checked."""

import json
import os
import shutil
import struct

import numpy as np
import pytest

from tests.hostile_corpus import DEMO, F32, Q8_0, check_run, dense, q8_blocks


def test_quantize_refuses_nan_weights_naming_the_row(tmp_path):
    rows = np.random.default_rng(0).standard_normal((6, 64)).astype("<f4")
    rows[4, 17] = np.inf
    src = tmp_path / "src.gguf"
    src.write_bytes(dense([("blk.0.ffn_up.weight", [64, 6], F32, rows.tobytes())]))
    r = check_run(str(tmp_path), ["quantize", src, "-o", tmp_path / "q.gguf", "--scheme", "q4_0"], 2)
    assert "tensor 'blk.0.ffn_up.weight': row 4: NaN or inf values" in r.stderr
    r = check_run(str(tmp_path), ["quantize", src, "-o", tmp_path / "q.gguf", "--scheme", "q4_0", "--allow-nonfinite",
                                  "--json"], 0, [tmp_path / "q.gguf", tmp_path / "q.ggtools.json"])
    assert json.loads(r.stdout)["nonfinite"] == {str(tmp_path / "q.gguf"): {"blk.0.ffn_up.weight": 1}}


@pytest.mark.parametrize("width, bad_block, row, action", [(256, 9, 1, "NaN or inf values"),
                                                           (128, 5, 1, "refusing to copy them as verified")])
def test_requant_refuses_nan_scales(tmp_path, width, bad_block, row, action):
    """A Q8_0 block with a NaN scale, in a tensor that is converted (256 wide) or copied (128 wide)."""
    n_blocks = width // 32 * 4
    src = tmp_path / "src.gguf"
    src.write_bytes(dense([("blk.0.ffn_up.weight", [width, 4], Q8_0,
                            q8_blocks(n_blocks, np.random.default_rng(1), bad_block))]))
    r = check_run(str(tmp_path), ["requant-trunk", src, "-o", tmp_path / "out", "-q"], 2)
    assert f"tensor 'blk.0.ffn_up.weight': row {row}: " in r.stderr and action in r.stderr
    out = [tmp_path / "out"]
    r = check_run(str(tmp_path), ["requant-trunk", src, "-o", tmp_path / "out", "-q", "--allow-nonfinite"], 0, out)
    assert "tensor 'blk.0.ffn_up.weight': " in r.stderr and "NaN/inf" in r.stderr


def test_convert_warns_about_nan_in_the_checkpoint(tmp_path):
    hf = shutil.copytree(os.path.join(DEMO, "drafter"), tmp_path / "hf")
    data = bytearray((hf / "model.safetensors").read_bytes())
    (n,) = struct.unpack_from("<Q", data)
    begin = json.loads(data[8:8 + n])["hidden_norm.weight"]["data_offsets"][0]
    data[8 + n + begin + 6:8 + n + begin + 8] = struct.pack("<H", 0x7FC0)           # BF16 NaN, element 3
    (hf / "model.safetensors").write_bytes(bytes(data))
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), tmp_path / "target.gguf")
    r = check_run(str(tmp_path), ["convert", "dflash", hf, "--target-gguf", target, "-o", tmp_path / "d.gguf", "-q"], 0,
                  [tmp_path / "d.gguf"])
    assert "NaN/inf values in source tensors" in r.stderr and "hidden_norm.weight (1 value)" in r.stderr
