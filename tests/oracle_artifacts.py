"""Oracle artifacts as session-scoped pytest fixtures: llama.cpp sources, tiny HF models and the reference
GGUFs llama.cpp's own converter and quantizer make of them (docs/fixtures.md).

Built on first use by scripts/fixtures/tiny_models.py into `$GGTOOLS_CACHE` (default `~/.cache/ggtools`),
keyed by a hash of the recipe (script sources + tool versions), so later sessions reuse them. A fixture whose
oracle is missing (llama-cpp-python, torch, transformers, dflash, sentencepiece, the llama.cpp sdist) skips
with the reason; a misconfiguration (GGTOOLS_LLAMA_CPP_SRC / GGTOOLS_LLAMA_CPP_SDIST pointing at the wrong
thing) or a failing build is an error.

The fixtures are registered for every test by conftest.py (`pytest_plugins`); import the helpers and types by
name: `from tests.oracle_artifacts import llama_loads`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from scripts.fixtures import llama_cpp_src as _lcs
from scripts.fixtures import llama_oracle as _oracle
from scripts.fixtures import tiny_models as _tm

QUANT_FTYPES = {"Q8_0": 7, "Q4_K_M": 15, "Q2_K": 10}


def oracle_unit(unit: str) -> tuple[Path, dict]:
    """Build (or reuse) a tiny_models unit; skip the test when an oracle it needs is missing."""
    try:
        return _tm.ensure(unit)
    except _tm.OracleMissing as e:
        pytest.skip(f"oracle missing: {e}")


def _paths(d: Path, entries: dict) -> dict[str, Path]:
    """{key: file} of a unit manifest's file entries (paths relative to the unit's directory d)."""
    return {k: d / e["path"] for k, e in entries.items()}


# ----------------------------------------------------------------------------------------------------------
# libllama helpers


def llama_load_info(path) -> dict:
    """Load `path` (first shard of a split) with `llama_model_load_from_file` in a child process.
    Returns {"ok": bool, "desc", "n_params", "n_vocab"} or {"ok": False, "error": ...}."""
    pytest.importorskip("llama_cpp")
    return _oracle.run_ops_subprocess([{"op": "load", "path": str(path)}])[0]


def llama_loads(path) -> bool:
    """True when libllama loads `path` (checked in a child process, so an abort cannot kill pytest)."""
    return bool(llama_load_info(path).get("ok"))


def llama_greedy(path, prompt_ids, n: int) -> list[int]:
    """Greedy continuation of `prompt_ids` by `n` tokens with libllama (n_threads 2, in process)."""
    pytest.importorskip("llama_cpp")
    return _oracle.greedy(str(path), list(prompt_ids), n, n_threads=2)


# ----------------------------------------------------------------------------------------------------------
# result types


@dataclass
class TinyTarget:
    """Tiny Qwen3 target: HF dir (bf16 safetensors + SentencePiece tokenizer.model) and llama.cpp GGUFs."""
    hf_dir: Path
    tokenizer_model: Path
    gguf: dict[str, Path]           # {"f32": path, "f16": path}
    manifest: dict = field(repr=False)


@dataclass
class DrafterRefs:
    """llama.cpp converter outputs. Call with (version, outtype): version 1 / 2 / "v1" / "v2" or a layout
    variant name ("v2-sharded", ...; those only with outtype "f16"); outtype f16 / bf16 / q8_0 / f32."""
    paths: dict[str, Path]          # "v1/f16" -> path
    manifest: dict = field(repr=False)

    def __call__(self, version, outtype: str = "f16") -> Path:
        key = f"{_version_key(version)}/{outtype.lower()}"
        if key not in self.paths:
            raise KeyError(f"no reference drafter {key!r}; have {sorted(self.paths)}")
        return self.paths[key]


@dataclass
class DrafterQuants:
    """llama_model_quantize outputs of the f16 references. Call with (version, ftype): ftype "Q8_0" /
    "Q4_K_M" / "Q2_K" or the llama_ftype number 7 / 15 / 10. `loads` records what libllama loaded at build
    time, for every reference and quantized drafter ("ref:v1/f16", "quant:v2/Q2_K", ...)."""
    paths: dict[str, Path]          # "v1/Q8_0" -> path
    loads: dict[str, dict]
    manifest: dict = field(repr=False)

    def __call__(self, version, ftype) -> Path:
        if isinstance(ftype, int):
            ftype = {v: k for k, v in QUANT_FTYPES.items()}[ftype]
        key = f"{_version_key(version)}/{ftype.upper()}"
        if key not in self.paths:
            raise KeyError(f"no quantized drafter {key!r}; have {sorted(self.paths)}")
        return self.paths[key]


@dataclass
class Qwen35MoeSet:
    """Tiny qwen35moe surgical-requant reference set (test-artifacts.md §6)."""
    hf_dir: Path
    f16: Path                       # llama.cpp converter, --no-mtp --outtype f16
    mxfp4_moe: Path                 # llama_model_quantize MXFP4_MOE (38): Q8_0 trunk, MXFP4 experts
    surgical: Path                  # ... requantized: allow_requantize, pure, _exps=MXFP4, Q4_K_M (15)
    split: list[Path]               # mxfp4_moe as 3 shards (gguf-py split writer)
    split_surgical: list[Path]      # the surgical recipe applied to `split` with keep_split
    loads: dict[str, dict]
    manifest: dict = field(repr=False)


@dataclass
class HybridTarget:
    """A tiny Gated DeltaNet hybrid target (hybrid_targets.py) with the DFlash drafters built for it."""
    arch: str                       # "qwen35" | "qwen35moe"
    hf_dir: Path
    gguf: dict[str, Path]           # llama.cpp GGUFs by encoding: f32, f16, q8_0 (qwen35) / mxfp4_moe (qwen35moe)
    drafter_dirs: dict[str, Path]   # "v1" / "v2": z-lab HF dirs (target_layer_ids in drafter_layer_ids)
    drafter_refs: dict[str, Path]   # "v1" / "v2": llama.cpp's f16 conversions (--target-model-dir hf_dir)
    drafter_layer_ids: list[int]
    split: list[Path] = field(default_factory=list)   # a split set of one encoding, when the unit has one


def _hybrid_target(arch: str, hf_dir: Path, gguf: dict, split=()) -> HybridTarget:
    d, m = oracle_unit("hybrid-drafters")
    return HybridTarget(arch=arch, hf_dir=hf_dir, gguf=gguf, split=list(split),
                        drafter_dirs={v: d / m["dirs"][f"{arch}/{v}"] for v in ("v1", "v2")},
                        drafter_refs={v: d / m["refs"][f"{arch}/{v}"]["path"] for v in ("v1", "v2")},
                        drafter_layer_ids=m["target_layer_ids"][arch])


@dataclass
class DSparkCheckpointRefs:
    """dspark_checkpoints.py: tiny DSpark HF dirs and llama.cpp's conversions. Call with (variant, outtype) for the
    reference GGUF; `dirs[variant]` the HF dir (refused ones under "refused/<name>" unless a variant),
    `refusals[name]` the converter's last line for each REFUSED name, `loads` libllama's load results."""
    dirs: dict[str, Path]
    paths: dict[str, Path]          # "deepspec/f16" -> path
    refusals: dict[str, str]
    loads: dict[str, dict]
    manifest: dict = field(repr=False)

    def __call__(self, variant: str, outtype: str = "f16") -> Path:
        return self.paths[f"{variant}/{outtype}"]

    def refused_dir(self, name: str) -> Path:
        return self.dirs[name] if name in self.dirs else self.dirs[f"refused/{name}"]


@dataclass
class MoeTarget:
    """Tiny routed-expert target (moe_targets.py): HF dir and llama.cpp GGUFs "f32", "f16" and the quantized
    one ("Q8_0" for qwen3moe, "MXFP4_MOE" for gpt-oss)."""
    arch: str
    hf_dir: Path
    gguf: dict[str, Path]
    manifest: dict = field(repr=False)


@dataclass
class KimiK3Target:
    """The tiny Kimi K3 target (kimi_k3_targets.py): HF dirs (bf16; MXFP4 experts; the plain variant) and llama.cpp's
    converter GGUFs "f32", "f16", "q8_0" (Q8_0 trunk, MXFP4 experts, F32 norms) and "plain-f32"."""
    hf_dir: Path
    hf_dir_mxfp4: Path
    gguf: dict[str, Path]
    manifest: dict = field(repr=False)


@dataclass
class DSparkDrafters:
    """Tiny random DSpark drafters for the tiny qwen3 target (scripts/fixtures/dspark_drafters.py): HF dirs by
    variant ("anchor-conf", "anchor-noconf", "bonus-reduced", "bonus-full") and llama.cpp's conversions, called
    with (variant, outtype) (f32 / f16)."""
    dirs: dict[str, Path]
    paths: dict[str, Path]          # "anchor-conf/f32" -> path
    manifest: dict = field(repr=False)

    def __call__(self, variant: str, outtype: str = "f32") -> Path:
        return self.paths[f"{variant}/{outtype}"]


@dataclass
class MtpTarget:
    """A tiny Qwen3.5 target whose HF checkpoint carries an MTP block (scripts/fixtures/mtp_targets.py) and llama.cpp's
    conversions of it. Call with (mode, outtype): mode "default" (the nextn block in the target), "mtp" (the
    sidecar, --mtp) or "no-mtp" (stripped); outtype "f16" or "q8_0"."""
    arch: str                       # "qwen35" | "qwen35moe"
    hf_dir: Path
    gguf: dict[str, Path]           # "default/f16", ..., "no-mtp/q8_0"; qwen35moe also "mxfp4_moe", "surgical"
    split: dict[str, list[Path]]    # "default/f16", "no-mtp/f16": the converter's --split-max-tensors sets
    loads: dict[str, dict]          # libllama's load of each file ("mtp/f16+load_mtp": the sidecar with load_mtp)

    def __call__(self, mode: str, outtype: str = "f16") -> Path:
        return self.gguf[f"{mode}/{outtype}"]


@dataclass
class Eagle3Drafters:
    """Tiny random EAGLE3 drafters for the tiny qwen3 target (scripts/fixtures/eagle3_drafters.py), one per HF layout
    llama.cpp's converter takes ("llama-eagle3", "specforge", "speculators", "draft-model", "eagle3.1"): `dirs` the HF
    dirs, called with (layout, outtype) for llama.cpp's conversion (f32 / f16 / bf16 / q8_0, --target-model-dir the
    tiny target), `quants["<layout>/Q8_0" | "Q4_0" | "Q2_K"]` llama_model_quantize of each f16 conversion,
    `refused_dirs` / `refusals` the checkpoints the converter refuses and its last line, `target_layers` what the
    converter wrote per layout, `loads` libllama's load of every GGUF."""
    dirs: dict[str, Path]
    paths: dict[str, Path]          # "speculators/f16" -> path
    quants: dict[str, Path]         # "speculators/Q8_0" -> path
    refused_dirs: dict[str, Path]
    refusals: dict[str, str]
    target_layers: dict[str, list[int]]
    loads: dict[str, dict]
    manifest: dict = field(repr=False)

    def __call__(self, layout: str, outtype: str = "f16") -> Path:
        return self.paths[f"{layout}/{outtype}"]


def _version_key(version) -> str:
    if isinstance(version, int):
        return f"v{version}"
    return str(version)


# ----------------------------------------------------------------------------------------------------------
# fixtures


@pytest.fixture(scope="session")
def llama_cpp_src() -> Path:
    """The llama.cpp tree (vendor/llama.cpp of the llama-cpp-python sdist): convert_hf_to_gguf.py,
    conversion/, gguf-py/, models/ggml-vocab-*.gguf(.inp/.out), tools/{quantize,gguf-split}/ sources."""
    try:
        return _lcs.llama_cpp_src()
    except _lcs.LlamaCppSrcMismatch:
        raise
    except _lcs.LlamaCppSrcError as e:
        pytest.skip(f"oracle missing: llama.cpp sources: {e}")


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Path:
    """SentencePiece BPE tokenizer.model (vocab 1024, <unk> 0, <s> 1, </s> 2, byte fallback)."""
    d, m = oracle_unit("tokenizer")
    return d / m["tokenizer_model"]


@pytest.fixture(scope="session")
def tiny_target() -> TinyTarget:
    d, m = oracle_unit("target")
    return TinyTarget(hf_dir=d / m["hf_dir"], tokenizer_model=d / m["hf_dir"] / "tokenizer.model",
                      gguf=_paths(d, m["gguf"]), manifest=m)


@pytest.fixture(scope="session")
def tiny_drafters() -> dict[str, Path]:
    """{variant: HF dir}: "v1", "v2" (z-lab classes, save_pretrained bf16) and the layout variants
    v1/v2-sharded, v1/v2-prefixed, v2-hub-codebooks, v1-toplevel-mask, v1-toplevel-block-size."""
    d, m = oracle_unit("drafters")
    return {k: d / p for k, p in m["dirs"].items()}


@pytest.fixture(scope="session")
def ref_drafter_gguf() -> DrafterRefs:
    d, m = oracle_unit("drafter-refs")
    return DrafterRefs(paths=_paths(d, m["refs"]), manifest=m)


@pytest.fixture(scope="session")
def ref_drafter_quant() -> DrafterQuants:
    d, m = oracle_unit("drafter-quants")
    return DrafterQuants(paths=_paths(d, m["quants"]), loads=m["loads"], manifest=m)


@pytest.fixture(scope="session")
def dspark_drafters() -> DSparkDrafters:
    d, m = oracle_unit("dspark-drafters")
    return DSparkDrafters(dirs={k: d / p for k, p in m["dirs"].items()},
                          paths=_paths(d, m["refs"]), manifest=m)


@pytest.fixture(scope="session")
def dspark_demo() -> dict[str, Path]:
    """llama.cpp's f16 conversions of the trained DSpark drafters of the demo target (ggtools/data/demo/dspark-*):
    {"dspark-anchor", "dspark-speculators", and each "<name>-no-markov" (its Markov head zeroed)}: Path."""
    d, m = oracle_unit("dspark-demo")
    return _paths(d, m["refs"])


@pytest.fixture(scope="session")
def qwen35moe_set() -> Qwen35MoeSet:
    d, m = oracle_unit("qwen35moe")
    f = _paths(d, m["files"])
    return Qwen35MoeSet(hf_dir=d / m["hf_dir"], f16=f["f16"], mxfp4_moe=f["mxfp4_moe"], surgical=f["surgical"],
                        split=[d / e["path"] for e in m["split"]],
                        split_surgical=[d / e["path"] for e in m["split_surgical"]], loads=m["loads"], manifest=m)


@pytest.fixture(scope="session")
def mtp_targets() -> dict[str, MtpTarget]:
    """{"qwen35", "qwen35moe"}: tiny Qwen3.5 dense / MoE targets with an MTP block (one full-attention decoder layer,
    `mtp_num_hidden_layers` 1) and llama.cpp's conversions: default, --mtp, --no-mtp at f16 and q8_0, split sets of
    the default and --no-mtp f16 (--split-max-tensors 40); the MoE's MXFP4_MOE and surgical Q4_K_M files."""
    d, m = oracle_unit("qwen35-mtp")
    return {arch: MtpTarget(arch, d / m[arch]["hf_dir"], _paths(d, m[arch]["gguf"]),
                            {k: [d / x["path"] for x in shards] for k, shards in m[arch]["split"].items()},
                            m[arch]["loads"])
            for arch in ("qwen35", "qwen35moe")}


@pytest.fixture(scope="session")
def qwen35_target() -> HybridTarget:
    """Tiny dense qwen35: 6 layers (linear, full, linear, linear, linear, full), f32 / f16 / q8_0 GGUFs."""
    d, m = oracle_unit("qwen35")
    return _hybrid_target("qwen35", d / m["hf_dir"], _paths(d, m["gguf"]))


@pytest.fixture(scope="session")
def qwen35moe_target(qwen35moe_set) -> HybridTarget:
    """Tiny qwen35moe (3 linear + 1 full layer, 8 experts top-2): f32 / f16 / mxfp4_moe GGUFs and the
    MXFP4_MOE file as 3 shards."""
    d, m = oracle_unit("qwen35moe-f32")
    gguf = {"f32": d / m["gguf"]["path"], "f16": qwen35moe_set.f16, "mxfp4_moe": qwen35moe_set.mxfp4_moe}
    return _hybrid_target("qwen35moe", qwen35moe_set.hf_dir, gguf, qwen35moe_set.split)


def _moe_target(arch: str) -> MoeTarget:
    d, m = oracle_unit(f"{arch}-target")
    return MoeTarget(arch=arch, hf_dir=d / m["hf_dir"], gguf=_paths(d, m["gguf"]),
                     manifest=m)


@pytest.fixture(scope="session")
def qwen3moe_target() -> MoeTarget:
    return _moe_target("qwen3moe")


@pytest.fixture(scope="session")
def gpt_oss_target() -> MoeTarget:
    return _moe_target("gpt-oss")


@pytest.fixture(scope="session")
def moe_drafters() -> dict[str, dict[str, Path]]:
    """{"qwen3moe" | "gpt-oss": {"v1": HF dir, "v2": HF dir}}: z-lab drafters for the tiny MoE targets
    (target_layer_ids [1, 2])."""
    d, m = oracle_unit("moe-drafters")
    return {arch: {v: d / p for v, p in dirs.items()} for arch, dirs in m["dirs"].items()}


@pytest.fixture(scope="session")
def kimi_k3_target() -> KimiK3Target:
    d, m = oracle_unit("kimi-k3")
    return KimiK3Target(hf_dir=d / m["hf_dir"], hf_dir_mxfp4=d / m["hf_dir_mxfp4"],
                        gguf=_paths(d, m["gguf"]), manifest=m)


@pytest.fixture(scope="session")
def kimi_k3_drafters() -> dict:
    """{"dirs": {"v1", "v2": z-lab HF dir}, "refs": {"v1", "v2": llama.cpp's f16 GGUF}, "target_layer_ids"}: DFlash
    drafters for the tiny K3 target."""
    return _converted_drafters("kimi-k3-drafters")


@pytest.fixture(scope="session")
def kimi_k3_dspark() -> dict:
    """{"dirs", "refs": {"anchor-conf", "bonus-reduced"}, "target_layer_ids"}: tiny DSpark drafters for the tiny K3
    target (dspark_drafters.py's recipe, the K3 target's taps) and llama.cpp's f16 conversions."""
    return _converted_drafters("kimi-k3-dspark")


def _converted_drafters(unit: str) -> dict:
    """{"dirs": HF dirs, "refs": llama.cpp's conversions, "target_layer_ids"} of a unit of drafters for a target."""
    d, m = oracle_unit(unit)
    return {"dirs": {v: d / p for v, p in m["dirs"].items()}, "refs": _paths(d, m["refs"]),
            "target_layer_ids": m["target_layer_ids"]}


@pytest.fixture(scope="session")
def dspark_checkpoints() -> dict[str, Path]:
    """{variant: HF dir} of the tiny DSpark checkpoints (scripts/fixtures/dspark_checkpoints.py; numpy only)."""
    d, m = oracle_unit("dspark-checkpoints")
    return {k: d / p for k, p in m["dirs"].items()}


@pytest.fixture(scope="session")
def dspark_checkpoint_refs(dspark_checkpoints) -> DSparkCheckpointRefs:
    """llama.cpp's converter on the tiny DSpark checkpoints (f32 / f16 / bf16 / q8_0), what it says refusing the
    broken ones, and libllama's load results."""
    d, m = oracle_unit("dspark-checkpoint-refs")
    return DSparkCheckpointRefs(dirs=dspark_checkpoints, paths=_paths(d, m["refs"]),
                      refusals=m["refusals"], loads=m["loads"], manifest=m)


@pytest.fixture(scope="session")
def eagle3_drafters() -> Eagle3Drafters:
    """Tiny random EAGLE3 drafters in every HF layout, llama.cpp's conversions and quantizations of them
    (scripts/fixtures/eagle3_drafters.py; the target: tiny_target)."""
    d, m = oracle_unit("eagle3-drafters")
    return Eagle3Drafters({k: d / p for k, p in m["dirs"].items()}, _paths(d, m["refs"]), _paths(d, m["quants"]),
                          {k: d / p for k, p in m["refused_dirs"].items()}, m["refusals"], m["target_layers"],
                          m["loads"], m)


@pytest.fixture(scope="session")
def eagle3_demo() -> dict:
    """An EAGLE3 drafter for the demo target (ggtools/data/demo/target.gguf): {"hf_dir", "ref" (llama.cpp's f16
    conversion), "target_layers", "load"}."""
    d, m = oracle_unit("eagle3-demo")
    return {"hf_dir": d / m["hf_dir"], "ref": d / m["ref"]["path"], "target_layers": m["target_layers"],
            "load": m["load"]}
