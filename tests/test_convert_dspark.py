"""convert dflash on DSpark drafters against the reference converters: llama.cpp's own converter (class DSparkModel)
byte for byte on both config layouts, with and without the confidence head, full and reduced vocabulary, for
f32 / f16 / bf16 / q8_0; its refusals refused here in its words; libllama loading the outputs; and (when
GGTOOLS_LUCEBOX_CONVERTER names lucebox's convert_dflash_to_gguf.py) lucebox's converter, which reads the heads
from an aux-heads file. The checkpoints: scripts/fixtures/dspark_checkpoints.py."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner

from ggtools.cli import main
from ggtools.dflash.safetensors import read_header
from ggtools.gguf import GGUFFile
from ggtools.jobs.convert import convert_dflash
from scripts.fixtures import dspark_checkpoints as DS
from tests.oracle_artifacts import llama_load_info
from tests.test_convert_oracle import same_kvs_and_tensors

pytestmark = pytest.mark.oracle


@pytest.fixture
def refs(dspark_checkpoint_refs):
    return dspark_checkpoint_refs


@pytest.mark.parametrize("variant", DS.CONVERTED)
@pytest.mark.parametrize("outtype", DS.OUTTYPES)
def test_dspark_equals_llamacpp_converter(tmp_path, refs, tiny_target, variant, outtype):
    out = tmp_path / "d.gguf"
    convert_dflash(refs.dirs[variant], out, target=tiny_target.gguf["f16"], outtype=outtype,
                   name=f"tiny-dspark-{variant}")
    ref = refs(variant, outtype)
    assert same_kvs_and_tensors(out, ref) == []
    assert out.read_bytes() == ref.read_bytes()
    load = refs.loads[f"{variant}/{outtype}"]
    assert load["ok"], load


def test_the_fixtures_cover_every_dimension(refs):
    """Both layouts, with and without the confidence head, full and reduced vocabulary, both block layouts."""
    with_ = {}
    for variant in DS.CONVERTED:
        with GGUFFile(refs(variant, "f16")) as f:
            with_[variant] = (f.get("dflash.sample_from_anchor"), f.get("dflash.has_confidence_head"),
                              "d2t" in f.tensor, DS.VARIANTS[variant][1])
    assert {v[0] for v in with_.values()} == {True, False}
    assert {v[1] for v in with_.values()} == {True, False}
    assert {v[2] for v in with_.values()} == {True, False}
    assert {v[3] for v in with_.values()} == {"flat", "speculators"}


@pytest.mark.parametrize("name", [n for n in DS.REFUSED if n != "deepspec-w2scale"])
def test_refuses_what_the_converter_refuses_in_its_words(tmp_path, refs, tiny_target, name):
    said = refs.refusals[name]
    assert said.startswith("ValueError: ")
    r = CliRunner().invoke(main, ["convert", "dflash", str(refs.refused_dir(name)), "-o",
                                  str(tmp_path / "o.gguf"), "--target-gguf", str(tiny_target.gguf["f16"])])
    assert r.exit_code == 2, r.output
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert said.removeprefix("ValueError: ") in lines[0]
    assert not (tmp_path / "o.gguf").exists()


def test_markov_w2_scale_the_converter_cannot_map(tmp_path, refs, tiny_target):
    """llama.cpp's converter refuses markov_head.markov_w2.scale; ggtools writes it as markov_w2.scale (F32 {1}), the
    tensor llama.cpp's loader and graph take: everything else equals the converter's file of the same weights, and
    libllama loads it."""
    assert "Can not map tensor 'model.markov_head.markov_w2.scale'" in refs.refusals["deepspec-w2scale"]
    out = tmp_path / "d.gguf"
    convert_dflash(refs.dirs["deepspec-w2scale"], out, target=tiny_target.gguf["f16"], outtype="f16",
                   name="tiny-dspark-deepspec")
    ref = refs("deepspec", "f16")
    with GGUFFile(out) as f, GGUFFile(ref) as g:
        scale = f.tensor["markov_w2.scale"]
        assert (scale.type_name, tuple(scale.ne)) == ("F32", (1,))
        assert np.frombuffer(f.tensor_data(scale), "<f4").tolist() == [1.5]
        assert [t.name for t in f.tensors if t.name != "markov_w2.scale"] == [t.name for t in g.tensors]
        assert all(bytes(f.tensor_data(f.tensor[t.name])) == bytes(g.tensor_data(t)) for t in g.tensors)
        ours = {kv.key: kv.value for kv in f.kvs if kv.key not in ("general.size_label",)}
        theirs = {kv.key: kv.value for kv in g.kvs if kv.key not in ("general.size_label",)}
        assert ours.keys() == theirs.keys()
    info = llama_load_info(out)
    assert info["ok"], info


# ---- lucebox --------------------------------------------------------------------------------------------------

LUCEBOX_AUX_NAMES = {"markov_head.markov_w1.weight": "dspark_markov_head.markov_w1.weight",
                     "markov_head.markov_w2.weight": "dspark_markov_head.markov_w2.weight",
                     "confidence_head.proj.weight": "dspark_confidence_head.weight",
                     "confidence_head.proj.bias": "dspark_confidence_head.bias"}


@pytest.mark.parametrize("case", ["with-bias", "no-bias", "no-confidence"])
def test_lucebox_profile_equals_lucebox_converter(tmp_path, dspark_checkpoints, case):
    """GGTOOLS_LUCEBOX_CONVERTER: lucebox's server/scripts/convert_dflash_to_gguf.py (62880e20). It reads the
    backbone from model.safetensors and the DSpark heads from --aux-heads (its own names); given the same values,
    both files are identical (a missing confidence bias: both write a zero bias)."""
    script = os.environ.get("GGTOOLS_LUCEBOX_CONVERTER")
    if not script or not os.path.isfile(script):
        pytest.skip("oracle missing: set GGTOOLS_LUCEBOX_CONVERTER to lucebox's convert_dflash_to_gguf.py")
    d = tmp_path / "d"
    shutil.copytree(dspark_checkpoints["deepspec-bonus"], d)
    drop = {"no-bias": ["confidence_head.proj.bias"],
            "no-confidence": ["confidence_head.proj.bias", "confidence_head.proj.weight"]}.get(case, [])
    src = {t.name: t for t in read_header(d / "model.safetensors")}
    main_tensors = {n: ("BF16", t.read_all()) for n, t in src.items() if n not in drop}
    DS.write_safetensors(d / "model.safetensors", main_tensors)
    DS.write_safetensors(d / "aux.safetensors", {LUCEBOX_AUX_NAMES[n]: v for n, v in main_tensors.items()
                                                 if n in LUCEBOX_AUX_NAMES})
    ref = tmp_path / "ref.gguf"
    subprocess.run([sys.executable, script, str(d / "model.safetensors"), str(ref), "--aux-heads",
                    str(d / "aux.safetensors")], check=True, capture_output=True)
    out = tmp_path / "ours.gguf"
    convert_dflash(d, out, profile="lucebox")
    assert same_kvs_and_tensors(out, ref) == []
    assert out.read_bytes() == ref.read_bytes()


def test_lucebox_profile_refuses_what_its_runtime_cannot_draft(tmp_path, dspark_checkpoints):
    for variant, why in (("deepspec", "bonus-anchor blocks only"), ("speculators", "draft vocabulary is smaller"),
                         ("deepspec-w2scale", "bonus-anchor blocks only")):
        r = CliRunner().invoke(main, ["convert", "dflash", str(dspark_checkpoints[variant]), "-o",
                                      str(tmp_path / "o.gguf"), "--profile", "lucebox"])
        assert r.exit_code == 2 and why in r.stderr and len(r.stderr.splitlines()) == 1, r.output
    d = tmp_path / "scaled-bonus"
    shutil.copytree(dspark_checkpoints["deepspec-w2scale"], d)
    cfg = json.loads((d / "config.json").read_text()) | {"sample_from_anchor": False}
    (d / "config.json").write_text(json.dumps(cfg))
    r = CliRunner().invoke(main, ["convert", "dflash", str(d), "-o", str(tmp_path / "o.gguf"), "--profile", "lucebox"])
    assert r.exit_code == 2 and "markov_w2 has a scale" in r.stderr, r.output
    assert not (tmp_path / "o.gguf").exists()
