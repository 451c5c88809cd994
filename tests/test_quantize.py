"""quantize: plans follow llama-quantize's rules; output bytes equal llama-quantize with the same types."""

import os

import gguf
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.errors import GGToolsError
from ggtools.gguf import GGUFFile
from ggtools.jobs.quantize import plan_quantize
from ggtools.samples import write_moe_set

T = gguf.GGMLQuantizationType


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def llama_quantize(src, dst, ftype, type_by_name):
    """llama_model_quantize with --pure --allow-requantize and one exact-name --tensor-type per tensor."""
    pytest.importorskip("llama_cpp")
    from scripts.fixtures import llama_oracle
    overrides = [(f"^{name.replace('.', '[.]')}$", int(t)) for name, t in type_by_name.items()]
    llama_oracle.quantize(src, dst, ftype, allow_requantize=True, pure=True, tt_overrides=overrides)


def tensors_by_name(path):
    with GGUFFile(path) as f:
        return {t.name: (t.type_id, bytes(f.tensor_data(t))) for t in f.tensors}


def written_tensors(path):
    """{name: (the tensor info's bytes as written: name, n_dims, ne, type; not the offset, which follows the
    writer's tensor order), the data}."""
    with GGUFFile(path) as f:
        return {t.name: (bytes(f.buf[t.info_start:t.info_end - 8]), bytes(f.tensor_data(t))) for t in f.tensors}


def kv_records(path):
    with GGUFFile(path) as f:
        return sorted((kv.key, bytes(kv.raw)) for kv in f.kvs)


def test_scheme_decisions(tmp_path):
    path = write_moe_set(str(tmp_path / "m"), layers=1, hidden=256, ffn=256, experts=2, vocab=512, shards=1)[0]
    acts = {a.name: a for a in plan_quantize(path, str(tmp_path / "o.gguf"), "q4-mix").shards[0].tensors}
    assert acts["blk.0.attn_norm.weight"].action == "copy" and "1-D" in acts["blk.0.attn_norm.weight"].reason
    assert acts["blk.0.ffn_gate_inp.weight"].action == "copy" and "router" in acts["blk.0.ffn_gate_inp.weight"].reason
    assert acts["blk.0.attn_q.weight"].dst_type == T.Q4_0
    assert acts["token_embd.weight"].dst_type == T.Q8_0 and acts["token_embd.weight"].action == "copy"
    acts = {a.name: a for a in plan_quantize(path, str(tmp_path / "o.gguf"), "q2_k",
                                             ["attn_q=q6_k"]).shards[0].tensors}
    assert acts["blk.0.attn_q.weight"].dst_type == T.Q6_K
    assert acts["blk.0.attn_k_b.weight"].dst_type == T.Q4_0          # 128 wide: Q2_K falls back to Q4_0
    assert acts["blk.0.ffn_up_shexp.weight"].dst_type == T.Q2_K


@pytest.mark.parametrize("args,fragment", [
    (["--scheme", "q9"], "unknown scheme"),
    (["--scheme", "q8_0", "--tensor-type", "attn"], "expected REGEX=TYPE"),
    (["--scheme", "q8_0", "--tensor-type", "(=q8_0"], "bad regular expression"),
])
def test_bad_arguments(tmp_path, args, fragment):
    path = write_moe_set(str(tmp_path / "m"), layers=1, hidden=256, ffn=256, experts=2, vocab=512, shards=1)[0]
    r = cli("quantize", path, "-o", tmp_path / "o.gguf", *args)
    assert r.exit_code == 2 and fragment in r.output, r.output


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("scheme,ftype", [("q4_k", 15), ("q8_0", 7), ("q2_k", 10)])
def test_bytes_equal_llama_quantize_on_smollm2(smollm2_path, tmp_path, scheme, ftype):
    """Real model, real source types (Q4_1/Q8_0 requantized): every tensor byte-identical to libllama's."""
    ours = tmp_path / "ours.gguf"
    r = cli("quantize", smollm2_path, "-o", ours, "--scheme", scheme, "-q")
    assert r.exit_code == 0, r.output
    got = tensors_by_name(ours)
    ref = tmp_path / "ref.gguf"
    llama_quantize(smollm2_path, ref, ftype, {n: t for n, (t, _) in got.items()})
    got, want = written_tensors(ours), written_tensors(ref)
    assert got.keys() == want.keys()
    bad = [n for n in got if got[n] != want[n]]
    assert not bad, f"{len(bad)} tensors differ, e.g. {bad[:3]}"


@pytest.mark.oracle
@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("scheme,ftype", [("q8_0", 7), ("q4-mix", 2), ("q2_k", 10)])
def test_drafter_schemes_equal_llama_quantize(ref_drafter_gguf, tmp_path, version, scheme, ftype):
    """The drafter schemes on llama.cpp's own f16 conversion of tiny DFlash v1/v2 drafters."""
    src = ref_drafter_gguf(version, "f16")
    ours = tmp_path / "ours.gguf"
    r = cli("quantize", src, "-o", ours, "--scheme", scheme, "-q")
    assert r.exit_code == 0, r.output
    got = tensors_by_name(ours)
    assert any(t in (T.Q2_K, T.Q4_0, T.Q8_0) for t, _ in got.values())
    ref = tmp_path / "ref.gguf"
    llama_quantize(src, ref, ftype, {n: t for n, (t, _) in got.items()})
    assert written_tensors(ours) == written_tensors(ref)
    from tests.oracle_artifacts import llama_loads
    assert llama_loads(ours)


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="open files are counted in /proc")
def test_refused_plans_leave_no_file_open(tmp_path):
    """A library caller planning over a bad file gets the error and keeps no descriptor of it (the mapped
    input was left open: about two per refused plan)."""
    from ggtools.jobs.requant import plan_requant_trunk
    from tests.hostile_corpus import DEMO

    data = open(os.path.join(DEMO, "target.gguf"), "rb").read()
    bad = tmp_path / "cut.gguf"
    bad.write_bytes(data[:-1000])
    open_before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        with pytest.raises(GGToolsError):
            plan_quantize(str(bad), str(tmp_path / "q.gguf"), "q8_0")
        with pytest.raises(GGToolsError):
            plan_requant_trunk(str(bad), str(tmp_path / "out"))
    assert len(os.listdir("/proc/self/fd")) == open_before


@pytest.mark.oracle
@pytest.mark.parametrize("variant", ["deepspec", "speculators"])
@pytest.mark.parametrize("scheme,ftype", [("q8_0", 7), ("q4-mix", 2), ("q2_k", 10)])
def test_dspark_schemes_equal_llama_quantize(dspark_checkpoint_refs, tmp_path, variant, scheme, ftype):
    """DSpark drafters (llama.cpp's own f16 conversions, with the confidence head; speculators: reduced vocabulary
    with d2t): the same bytes as llama_model_quantize given the same types, which leaves d2t I64 and the confidence
    weight {H + R, 1}, its bias and every 1-D tensor unquantized; the output loads in libllama."""
    src = dspark_checkpoint_refs(variant, "f16")
    ours = tmp_path / "ours.gguf"
    r = cli("quantize", src, "-o", ours, "--scheme", scheme, "-q")
    assert r.exit_code == 0, r.output
    got = tensors_by_name(ours)
    assert got["conf_proj.weight"][0] == T.F16 and got["conf_proj.bias"][0] == T.F32
    assert got["markov_w1.weight"][0] == got["markov_w2.weight"][0] == T.Q8_0
    if variant == "speculators":
        assert got["d2t"][0] == T.I64 and got["d2t"][1] == tensors_by_name(src)["d2t"][1]
    ref = tmp_path / "ref.gguf"
    llama_quantize(src, ref, ftype, {n: t for n, (t, _) in got.items()})
    assert written_tensors(ours) == written_tensors(ref)
    from tests.oracle_artifacts import llama_loads
    assert llama_loads(ours)


@pytest.mark.oracle
@pytest.mark.parametrize("variant", ["deepspec", "speculators"])
def test_dspark_q8_0_is_llama_quantizes_own_choice(dspark_checkpoint_refs, tmp_path, variant):
    """--scheme q8_0 against llama_model_quantize Q8_0 left to its own type choices (no overrides, not pure): every
    tensor info and every tensor's data byte for byte, and the same KV records. The confidence weight, [H + R, 1] in
    llama.cpp's converter's file, is written [H + R] by llama-quantize (ggml_n_dims), and so by quantize. (What
    differs is order only: llama-quantize writes the tensors in its loader's order and moves the two keys it sets
    to the end.)"""
    pytest.importorskip("llama_cpp")
    from scripts.fixtures import llama_oracle
    src = dspark_checkpoint_refs(variant, "f16")
    with GGUFFile(src) as f:
        assert f.tensor["conf_proj.weight"].ne[1:] == (1,)
    ours, ref = tmp_path / "ours.gguf", tmp_path / "ref.gguf"
    assert cli("quantize", src, "-o", ours, "--scheme", "q8_0", "-q").exit_code == 0
    llama_oracle.quantize(src, ref, 7)
    assert written_tensors(ours) == written_tensors(ref)
    assert kv_records(ours) == kv_records(ref)
