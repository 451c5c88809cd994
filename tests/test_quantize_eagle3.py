"""quantize on EAGLE3 drafters: the drafter schemes (q8_0, q4-mix, q2_k) on llama.cpp's own conversions of every
layout equal llama_model_quantize byte for byte (d2t I64 and the norms F32 kept, the heads fc / token_embd / output
Q8_0), --scheme q8_0 equals llama-quantize's own Q8_0 choices, and a drafter validate rejects is refused."""

import pytest
from click.testing import CliRunner
from gguf import GGMLQuantizationType as T
from gguf import GGUFValueType as VT

from ggtools.cli import main
from scripts.fixtures import eagle3_drafters as E3
from tests.test_convert_support import rewrite_gguf
from tests.test_quantize import kv_records, llama_quantize, tensors_by_name, written_tensors

LAYOUTS = tuple(E3.LAYOUTS)


def cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


@pytest.mark.oracle
@pytest.mark.parametrize("scheme,ftype", [("q8_0", 7), ("q4-mix", 2), ("q2_k", 10)])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_schemes_equal_llama_quantize(eagle3_drafters, tmp_path, layout, scheme, ftype):
    src = eagle3_drafters(layout, "f16")
    ours = tmp_path / "ours.gguf"
    r = cli("quantize", src, "-o", ours, "--scheme", scheme, "-q")
    assert r.exit_code == 0, r.output
    got, before = tensors_by_name(ours), tensors_by_name(src)
    assert got["fc.weight"][0] == T.Q8_0
    for name, (type_id, data) in got.items():
        if name == "d2t" or before[name][0] == T.F32:
            assert (type_id, data) == before[name], name            # d2t I64, norms and rope_freqs F32: copied
    ref = tmp_path / "ref.gguf"
    llama_quantize(src, ref, ftype, {n: t for n, (t, _) in got.items()})
    assert written_tensors(ours) == written_tensors(ref)


@pytest.mark.oracle
@pytest.mark.parametrize("layout", LAYOUTS)
def test_q8_0_is_llama_quantizes_own_choice(eagle3_drafters, tmp_path, layout):
    """Against llama_model_quantize Q8_0 left to its own type choices (the fixture's): every tensor info and data
    byte for byte, and the same KV records."""
    ours = tmp_path / "ours.gguf"
    assert cli("quantize", eagle3_drafters(layout, "f16"), "-o", ours, "--scheme", "q8_0", "-q").exit_code == 0
    ref = eagle3_drafters.quants[f"{layout}/Q8_0"]
    assert written_tensors(ours) == written_tensors(ref)
    assert kv_records(ours) == kv_records(ref)


@pytest.mark.oracle
def test_refuses_what_validate_rejects(eagle3_drafters, tmp_path):
    bad = rewrite_gguf(eagle3_drafters("speculators", "f16"), tmp_path / "bad.gguf",
                       set_keys=[("eagle3.target_layers", VT.ARRAY, [2, 4], VT.INT32)])
    r = cli("quantize", bad, "-o", tmp_path / "q.gguf", "--scheme", "q8_0")
    assert r.exit_code == 2 and "eagle3.target_layers" in r.stderr and "exactly 3" in r.stderr, r.output
    assert not (tmp_path / "q.gguf").exists()
