"""Non-finite values are never hidden: quantize and requant-trunk refuse NaN/inf source values and NaN/inf
scales (naming the tensor and the first bad row) unless --allow-nonfinite, then warn with counts; convert
warns about NaN/inf in source tensors; the runtime stops a forward whose logits are not finite, naming the piece
and the tensor that made them. The bad values are put there by the tests, which is the truth checked."""

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


# ---- the runtime: non-finite logits stop a run, naming the piece and the tensor that made them -------------------

def _fill(src, dst, tensor, value) -> str:
    """A copy of an F32 model with every value of one tensor set to `value` (finite, but overflowing)."""
    from ggtools.gguf import GGUFFile
    data = bytearray(open(src, "rb").read())
    with GGUFFile(src) as f:
        t = f.tensor[tensor]
        assert t.type_name == "F32"
        start, n = t.data_start, t.nbytes
    data[start:start + n] = np.full(n // 4, value, "<f4").tobytes()
    with open(dst, "wb") as fh:
        fh.write(bytes(data))
    return str(dst)


@pytest.mark.parametrize("tensor, piece", [("blk.1.ffn_up.weight", "layer 1's feed-forward network"),
                                           ("blk.2.attn_k.weight", "layer 2's token mixer"),
                                           ("blk.3.attn_norm.weight", "layer 3's token mixer"),
                                           ("output_norm.weight", "the output norm and head"),
                                           ("token_embd.weight", "the token embedding")])
def test_target_nan_names_the_piece_and_the_tensor(tmp_path, tensor, piece):
    """The poisoned value is put there by the test; the error must name that tensor and the piece using it."""
    assert_forward_names_the_nan(os.path.join(DEMO, "target.gguf"), tmp_path, tensor, piece)


def assert_forward_names_the_nan(src, tmp_path, tensor, piece):
    """A forward of a copy of src with a NaN in `tensor` (hostile_corpus.poison) stops naming the tensor and the piece
    that uses it."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    model = TargetModel(poison(src, tmp_path / "m.gguf", tensor), threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([0, 1, 2])
    finally:
        model.close()
    assert f"tensor '{tensor}' holds NaN/inf" in str(e.value) and piece in str(e.value), str(e.value)


def test_nan_in_the_tied_head_is_caught(tmp_path):
    """A NaN in token_embd row 0, which the prompt never embeds: the tied head still computes logit 0 from it."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    path = poison(os.path.join(DEMO, "target.gguf"), tmp_path / "m.gguf", "token_embd.weight")   # row 0, value 40
    model = TargetModel(path, threads=1)
    try:
        logits, _ = model.forward([5, 6, 7], logits="last")
    except NonFiniteError as e:
        assert "tensor 'token_embd.weight'" in str(e) and "output norm and head" in str(e)
    else:
        pytest.fail(f"non-finite logits were returned: {logits[0, :3]}")
    finally:
        model.close()


def test_hybrid_target_nan_is_traced_after_rolling_back_the_recurrent_state(tmp_path):
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    from tests.tiny_targets import write_qwen35
    path = poison(write_qwen35(tmp_path / "q35.gguf"), tmp_path / "m.gguf", "blk.1.ssm_out.weight")
    model = TargetModel(path, threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([1, 2, 3, 4])
    finally:
        model.close()
    assert "tensor 'blk.1.ssm_out.weight'" in str(e.value) and "layer 1's token mixer" in str(e.value)


def test_an_overflow_is_named_with_finite_tensors(tmp_path):
    """Finite weights whose products overflow float32: no tensor holds NaN/inf, the piece that overflowed is named."""
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.tiny_targets import write_gpt_oss
    path = _fill(write_gpt_oss(tmp_path / "oss.gguf"), tmp_path / "m.gguf", "blk.0.attn_output.weight", 3e38)
    model = TargetModel(path, threads=1)
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([1, 2, 3])
    finally:
        model.close()
    assert "layer 0's token mixer gives NaN/inf although its tensors are finite (an overflow)" in str(e.value)


def test_torch_backend_checks_what_comes_back(tmp_path):
    pytest.importorskip("torch")
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    path = poison(os.path.join(DEMO, "target.gguf"), tmp_path / "m.gguf", "blk.1.ffn_up.weight")
    model = TargetModel(path, threads=1, backend="torch", device="cpu")
    try:
        with pytest.raises(NonFiniteError) as e:
            model.forward([1, 2, 3])
    finally:
        model.close()
    assert "tensor 'blk.1.ffn_up.weight'" in str(e.value) and "layer 1's feed-forward network" in str(e.value)


def test_drafter_nan_is_named_and_accept_fails_it(tmp_path):
    """A NaN drafter never reports acceptance 0.0: drafting stops with the tensor's name (run --draft, accept)."""
    from tests.hostile_corpus import poison
    drafter = tmp_path / "d.gguf"
    target = shutil.copy(os.path.join(DEMO, "target.gguf"), tmp_path / "target.gguf")
    from ggtools.jobs.convert import convert_dflash
    convert_dflash(os.path.join(DEMO, "drafter"), drafter, profile="llama.cpp", target=target)
    bad = poison(drafter, tmp_path / "nan.gguf", "blk.1.attn_q.weight")
    r = check_run(str(tmp_path), ["accept", "--target", target, "--draft", drafter, "--draft", bad, "-n", "6", "-q"], 2)
    assert "nan.gguf: tensor 'blk.1.attn_q.weight' holds NaN/inf" in r.stderr
    assert "the draft logits are not finite" in r.stderr


def test_a_forward_without_logits_checks_the_final_states(tmp_path):
    from ggtools.runtime import TargetModel
    from ggtools.runtime.errors import NonFiniteError
    from tests.hostile_corpus import poison
    model = TargetModel(poison(os.path.join(DEMO, "target.gguf"), tmp_path / "m.gguf", "blk.0.attn_v.weight"),
                        threads=1)
    try:
        with pytest.raises(NonFiniteError, match="tensor 'blk.0.attn_v.weight'.*final hidden states are not finite"):
            model.forward([1, 2, 3], taps=[1], logits="none")
    finally:
        model.close()


@pytest.mark.parametrize("scheme", ["q8_0", "q4_1", "q4_k", "q6_k"])
@pytest.mark.parametrize("tensor, piece", [("blk.3.attn_norm.weight", "layer 3's token mixer"),
                                           ("blk.1.ffn_norm.weight", "layer 1's feed-forward network")])
def test_nan_in_a_norm_of_a_quantized_target_is_caught(tmp_path, scheme, tensor, piece):
    """A NaN in a norm (F32 in every scheme) reaches the quantized matmuls through their inputs' rounding to Q8_0,
    Q8_1 or Q8_K, which must keep it: rounded to an integer, it left the logits finite and wrong."""
    from tests.hostile_corpus import run_cli
    quantized = tmp_path / f"{scheme}.gguf"
    assert run_cli(["quantize", os.path.join(DEMO, "target.gguf"), "-o", quantized, "--scheme", scheme]).exit_code == 0
    assert_forward_names_the_nan(quantized, tmp_path, tensor, piece)
