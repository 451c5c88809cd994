"""requant-trunk on the tiny Kimi K3 file llama.cpp's converter made with the field report's layout (Q8_0 trunk,
MXFP4 routed experts, F32 norms, KDA scalars and router): which tensors are converted, which are kept and why,
the tensors whose rows Q4_K's 256-value blocks do not divide (attn_k_b, ssm_f_b and the other 128-column ones)
kept Q8_0 by default as requant_trunk.c keeps them, and with --fallback llama given llama-quantize's own fallback
type, byte for byte what llama_model_quantize writes."""

import gguf
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.gguf import GGUFFile
from ggtools.jobs.requant import plan_requant_trunk
from scripts.fixtures import tiny_models as tm

pytestmark = pytest.mark.oracle
T = gguf.GGMLQuantizationType


def tensors(path) -> dict:
    with GGUFFile(path) as f:
        return {t.name: (t.type_id, bytes(f.tensor_data(t))) for t in f.tensors}


def tensor_infos(path) -> dict:
    """{name: the tensor info's bytes as written (name, n_dims, ne, type; not the offset, which follows the order)}."""
    with GGUFFile(path) as f:
        return {t.name: bytes(f.buf[t.info_start:t.info_end - 8]) for t in f.tensors}


@pytest.fixture(scope="module")
def source(kimi_k3_target):
    return kimi_k3_target.gguf["q8_0"]


@pytest.fixture(scope="module")
def llama_reference(source, tmp_path_factory):
    """llama-quantize's surgical recipe (--allow-requantize --pure --tensor-type _exps=mxfp4 Q4_K_M) on the file."""
    out = tmp_path_factory.mktemp("llama") / "k3-llama-q4_k.gguf"
    result = tm.oracle_ops([{"op": "quantize", "inp": str(source), "out": str(out), "ftype": tm.FTYPES["Q4_K_M"],
                             "nthread": 2, "allow_requantize": True, "pure": True,
                             "tt_overrides": [["_exps", tm.GGML_TYPE_MXFP4]]}])
    assert result[0].get("ok"), result
    return out


def requant(source, out, *args):
    result = CliRunner().invoke(main, ["requant-trunk", str(source), "-o", str(out), "-q", "-j", "1", *args])
    assert result.exit_code == 0, result.output
    return out / source.name


def test_plan_converts_the_trunk_and_keeps_the_rest(source, tmp_path):
    actions = {a.name: a for s in plan_requant_trunk(str(source), str(tmp_path)).shards for a in s.tensors}
    for name, a in actions.items():
        if a.src_type != T.Q8_0:       # experts (MXFP4), norms, KDA scalars (ssm_a, ssm_dt, conv), router (F32)
            assert a.action == "copy" and "is not --from Q8_0" in a.reason, name
        elif a.ne[0] % 256:
            assert a.action == "copy", name
            assert a.reason == f"ne0={a.ne[0]} not divisible by 256 (Q4_K) → kept Q8_0 (requant_trunk.c); " \
                               "--fallback llama: Q5_0", name
        else:
            assert (a.action, a.dst_type) == ("convert", T.Q4_K), name
    kept_q8 = sorted(name.split(".", 2)[2] for name, a in actions.items()
                     if a.src_type == T.Q8_0 and a.action == "copy")
    assert {"attn_k_b.weight", "ssm_f_b.weight"} <= set(kept_q8)
    for name in ("blk.0.ssm_a", "blk.0.ssm_dt.bias", "blk.0.ssm_conv1d_q.weight", "blk.1.ffn_gate_inp.weight",
                 "blk.1.exp_probs_b.bias", "blk.0.ssm_norm.weight", "blk.1.ffn_gate_exps.weight"):
        assert actions[name].action == "copy", name


def test_default_keeps_the_short_rows_q8_0(source, llama_reference, tmp_path):
    """The default keeps them Q8_0 and still writes every tensor info as llama-quantize does (its recipe's output is
    what requant-trunk stands for): llama-quantize's infos, with the types of the kept tensors."""
    out_path = requant(source, tmp_path)
    src, out = tensors(source), tensors(out_path)
    ref_infos = tensor_infos(llama_reference)
    for name, info in tensor_infos(out_path).items():
        assert info[:-4] == ref_infos[name][:-4], name      # all but the type
    with GGUFFile(source) as f:
        short = [t.name for t in f.tensors if t.type_id == T.Q8_0 and t.ne[0] % 256]
    assert short and all(out[n] == src[n] for n in short)
    assert all(out[n][0] == T.Q4_K for n in src if src[n][0] == T.Q8_0 and n not in short)
    assert all(out[n] == src[n] for n in src if src[n][0] != T.Q8_0)


def test_fallback_llama_is_byte_identical_to_llama_quantize(source, llama_reference, tmp_path):
    """Every tensor has llama_model_quantize's type and bytes: the trunk (the Q8_0 ones, converted to Q4_K or to the
    fallback Q5_0), the F32 tensors, and the routed experts (llama-quantize, told to keep them MXFP4, dequantizes
    and re-encodes them to the same bytes here; requant-trunk copies them). Every tensor info too: the KDA conv taps,
    [4, 1, C, 1] in the converter's file, are written [4, 1, C] by llama-quantize (ggml_n_dims), and by requant-trunk
    although it copies them."""
    out = requant(source, tmp_path, "--fallback", "llama")
    with GGUFFile(source) as f:
        assert f.tensor["blk.0.ssm_conv1d_q.weight"].ne[3:] == (1,)
    assert tensor_infos(out) == tensor_infos(llama_reference)
    ours = tensors(out)
    ref, src = tensors(llama_reference), tensors(source)
    assert sorted(ours) == sorted(ref)       # llama-quantize writes them in its loader's order
    fell_back = [n for n, (t, _) in ours.items() if t == T.Q5_0]
    assert {"blk.2.attn_k_b.weight", "blk.0.ssm_f_b.weight"} <= set(fell_back)
    for name in ours:
        assert ours[name] == ref[name], name
        if "_exps" in name:
            assert ours[name] == src[name], name


def test_fallback_llama_plan_names_the_fallback(source, tmp_path):
    result = CliRunner().invoke(main, ["requant-trunk", str(source), "-o", str(tmp_path), "--fallback", "llama",
                                       "--dry-run"])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if "blk.2.attn_k_b.weight" in ln)
    assert "Q8_0 -> Q5_0" in line and "ne0=64 not divisible by 256 (Q4_K) → Q5_0 (llama-quantize's fallback)" in line
