"""The embedded demo pair (ggtools/data/demo): committed artifacts, target.gguf layout and tokenizer KVs,
drafter config vs target, and oracles: llama.cpp and torch greedy-decode the target identically, z-lab's
drafter classes load the drafter and speculative decoding reproduces greedy output with τ > 1."""

import importlib
import json
import struct
from pathlib import Path

import pytest

from ggtools.gguf import GGUFFile

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "ggtools" / "data" / "demo"
TARGET = DEMO / "target.gguf"
DRAFTER = DEMO / "drafter"
ARCH = "qwen3"


def _script_module(name):
    return importlib.import_module(f"scripts.demo_pair.{name}")


@pytest.fixture(scope="module")
def target():
    with GGUFFile(TARGET) as f:
        yield f


@pytest.fixture(scope="module")
def meta():
    return json.loads((DEMO / "demo_pair.json").read_text())


@pytest.fixture(scope="module")
def dcfg():
    return json.loads((DRAFTER / "config.json").read_text())


def _safetensors_header(path):
    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(n))


def test_artifacts_exist_and_are_small():
    files = [TARGET, DRAFTER / "config.json", DRAFTER / "model.safetensors", DEMO / "demo_pair.json",
             DEMO / "tokenizer.json", DEMO / "README.md"]
    for p in files:
        assert p.is_file(), p
    total = sum(p.stat().st_size for p in DEMO.rglob("*") if p.is_file())
    assert total <= 8 << 20, f"demo pair is {total} bytes"


def test_target_hparams_and_tensors(target):
    f = target
    assert f.architecture == ARCH
    g = lambda k: f.get(f"{ARCH}.{k}")
    n_layer, H, I = g("block_count"), g("embedding_length"), g("feed_forward_length")
    nh, nkv, d = g("attention.head_count"), g("attention.head_count_kv"), g("attention.key_length")
    assert g("attention.value_length") == d and nh % nkv == 0
    assert g("context_length") >= 256 and g("rope.freq_base") > 0 and 0 < g("attention.layer_norm_rms_epsilon") < 1e-3
    V = len(f.get("tokenizer.ggml.tokens"))
    want = {"token_embd.weight": (H, V), "output_norm.weight": (H,)}
    for i in range(n_layer):
        want.update({
            f"blk.{i}.attn_norm.weight": (H,), f"blk.{i}.ffn_norm.weight": (H,),
            f"blk.{i}.attn_q.weight": (H, nh * d), f"blk.{i}.attn_k.weight": (H, nkv * d),
            f"blk.{i}.attn_v.weight": (H, nkv * d), f"blk.{i}.attn_output.weight": (nh * d, H),
            f"blk.{i}.attn_q_norm.weight": (d,), f"blk.{i}.attn_k_norm.weight": (d,),
            f"blk.{i}.ffn_gate.weight": (H, I), f"blk.{i}.ffn_up.weight": (H, I), f"blk.{i}.ffn_down.weight": (I, H),
        })
    got = {t.name: t.ne for t in f.tensors}
    got.pop("output.weight", None)            # optional (tied embeddings)
    assert got == want
    for t in f.tensors:
        assert t.type_name == ("F32" if len(t.ne) == 1 else "F16"), t.name
        assert t.data_start + t.nbytes <= f.file_size


def test_tokenizer_kvs(target):
    f = target
    assert f.get("tokenizer.ggml.model") == "gpt2"
    assert f.get("tokenizer.ggml.pre") == "qwen2"
    tokens = f.get("tokenizer.ggml.tokens")
    types = list(f.get("tokenizer.ggml.token_type"))
    merges = f.get("tokenizer.ggml.merges")
    V = len(tokens)
    assert len(types) == V == f.tensor["token_embd.weight"].ne[1]
    assert len(set(tokens)) == V
    eos = f.get("tokenizer.ggml.eos_token_id")
    assert tokens[eos] == "<|endoftext|>" and types[eos] == 3
    assert f.get("tokenizer.ggml.bos_token_id") == eos and f.get("tokenizer.ggml.add_bos_token") is False
    control = [i for i, t in enumerate(types) if t == 3]
    assert [tokens[i] for i in control] == ["<|endoftext|>", "<|mask|>"]
    assert all(t == 1 for i, t in enumerate(types) if i not in control)
    index = {t: i for i, t in enumerate(tokens)}
    for m in merges:                          # every merge: two tokens whose concatenation is a token
        a, b = m.split(" ")
        assert a in index and b in index and a + b in index, m
    # GPT-2 byte alphabet complete (every byte encodable)
    alphabet = [chr(c) for c in range(33, 127)] + [chr(c) for c in range(161, 173)] + \
               [chr(c) for c in range(174, 256)] + [chr(256 + i) for i in range(68)]
    assert all(c in index for c in alphabet)


def test_drafter_config_matches_target(target, dcfg, meta):
    f = target
    V = len(f.get("tokenizer.ggml.tokens"))
    assert dcfg["architectures"] == ["DFlashDraftModel"] and dcfg["model_type"] == "qwen3"
    dc = dcfg["dflash_config"]
    assert set(dc) >= {"block_size", "mask_token_id", "target_layer_ids"}
    assert dc["block_size"] == dcfg["block_size"] >= 2
    assert dcfg["hidden_size"] == f.get(f"{ARCH}.embedding_length")
    assert dcfg["vocab_size"] == V
    assert dcfg["num_target_layers"] == f.get(f"{ARCH}.block_count")
    ids = dc["target_layer_ids"]
    assert ids == sorted(set(ids)) and all(0 <= i < f.get(f"{ARCH}.block_count") - 1 for i in ids)
    mask = dc["mask_token_id"]
    assert 0 <= mask < V and f.get("tokenizer.ggml.tokens")[mask] == "<|mask|>"
    assert meta["tokenizer"]["mask_token_id"] == mask


def test_drafter_tensors(dcfg):
    header = _safetensors_header(DRAFTER / "model.safetensors")
    header.pop("__metadata__", None)
    H, I = dcfg["hidden_size"], dcfg["intermediate_size"]
    nh, nkv, d = dcfg["num_attention_heads"], dcfg["num_key_value_heads"], dcfg["head_dim"]
    n = len(dcfg["dflash_config"]["target_layer_ids"])
    want = {"fc.weight": [H, n * H], "hidden_norm.weight": [H], "norm.weight": [H]}
    for i in range(dcfg["num_hidden_layers"]):
        p = f"layers.{i}."
        want.update({
            p + "input_layernorm.weight": [H], p + "post_attention_layernorm.weight": [H],
            p + "self_attn.q_proj.weight": [nh * d, H], p + "self_attn.k_proj.weight": [nkv * d, H],
            p + "self_attn.v_proj.weight": [nkv * d, H], p + "self_attn.o_proj.weight": [H, nh * d],
            p + "self_attn.q_norm.weight": [d], p + "self_attn.k_norm.weight": [d],
            p + "mlp.gate_proj.weight": [I, H], p + "mlp.up_proj.weight": [I, H], p + "mlp.down_proj.weight": [H, I],
        })
    assert {k: v["shape"] for k, v in header.items()} == want
    assert {v["dtype"] for v in header.values()} == {"BF16"}


def test_recorded_acceptance(meta):
    ev = meta["eval"]["held_out"]
    assert ev["tau_zlab"] >= 2.0 and ev["mean_accepted_length_incl_bonus"] >= 2.0
    assert 0 < ev["acceptance_rate"] <= 1
    held = set(meta["corpus"]["held_out"])
    assert all(p.split("@")[0] in held for p in meta["eval"]["prompts"]["held_out"])


@pytest.mark.oracle
def test_llama_cpp_greedy_matches_torch(meta):
    """llama.cpp decodes target.gguf greedily to the recorded torch tokens; torch on the GGUF weights too."""
    pytest.importorskip("llama_cpp")
    llama = _script_module("llama_check")
    gold = meta["golden_greedy"]
    llm = llama.load(TARGET)
    n = len(gold["greedy_ids"])
    assert n >= 32
    assert llama.llama_greedy(llm, gold["prompt_ids"], n) == gold["greedy_ids"]
    import textwrap                           # held-out module: llama.cpp's qwen2 BPE == HF tokenizers
    text = Path(textwrap.__file__).read_text(encoding="utf-8")
    assert llama.llama_tokenize(llm, text) == _hf_tokenize(text)
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError:
        return                                # the torch half needs torch + transformers
    torch.set_num_threads(1)
    model = _script_module("gguf_io").load_target_from_gguf(TARGET)
    ids = list(gold["prompt_ids"])
    with torch.no_grad():
        for _ in range(n):                    # plain greedy, full recompute (no cache API involved)
            ids.append(int(model(input_ids=torch.tensor([ids])).logits[0, -1].argmax()))
    assert ids[len(gold["prompt_ids"]):] == gold["greedy_ids"]


def _hf_tokenize(text):
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_file(str(DEMO / "tokenizer.json")).encode(text).ids


@pytest.mark.oracle
def test_zlab_drafter_speculative_on_held_out_prompt(meta, dcfg):
    """z-lab's DFlashDraftModel loads the checkpoint; T=0 speculative decoding equals greedy and drafts well."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    dflash = pytest.importorskip("dflash")
    torch.set_num_threads(1)
    spec = _script_module("speculative")
    model = _script_module("gguf_io").load_target_from_gguf(TARGET)
    drafter = dflash.DFlashDraftModel.from_pretrained(DRAFTER, dtype=torch.bfloat16).float().eval()
    assert drafter.mask_token_id == dcfg["dflash_config"]["mask_token_id"]
    assert list(drafter.target_layer_ids) == dcfg["dflash_config"]["target_layer_ids"]
    gold = meta["golden_greedy"]
    r = spec.speculative(drafter, model, gold["prompt_ids"], len(gold["greedy_ids"]))
    assert r.tokens == gold["greedy_ids"]
    tau = 1 + sum(r.accepted) / len(r.accepted)
    assert tau >= 1.5, tau
