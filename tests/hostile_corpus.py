"""The hostile corpus: bad and edge-case inputs made by code (never committed binaries), and the four
properties every run over them must keep (tests/test_hostile.py, tests/test_fuzz.py).

Properties of a run: the expected exit code; on failure exactly one line on stderr, starting "error: ", with
no traceback and no "internal error"; every file that existed before is byte-identical after; no new file
except the outputs the run is meant to write.
"""

import hashlib
import json
import os
import shutil
import struct

import numpy as np
from click.testing import CliRunner
from gguf import GGUFValueType as VT

from tests import gguf_builder as B
from tests.test_convert_support import rewrite_gguf, with_required_tensors
from tests.tiny_targets import write_gpt_oss, write_qwen35
from ggtools.cli import main
from ggtools.samples import write_moe_set

F32, F16, Q8_0, I32, I64 = 0, 1, 8, 26, 27
DEMO = os.path.join(os.path.dirname(__file__), "..", "ggtools", "data", "demo")


# ---- running a command and checking the properties ---------------------------------------------------------

def snapshot(root) -> dict[str, str]:
    """Every entry under root: sha256 of regular files, the target of links, the kind of anything else (a FIFO
    is never opened)."""
    out = {}
    for d, dirs, files in os.walk(root):
        for name in dirs + files:
            p = os.path.join(d, name)
            if os.path.islink(p):
                out[p] = "link:" + os.readlink(p)
            elif os.path.isfile(p):
                with open(p, "rb") as fh:
                    out[p] = hashlib.sha256(fh.read()).hexdigest()
            elif not os.path.isdir(p):
                out[p] = "special"
    return out


def run_cli(args):
    result = CliRunner().invoke(main, [str(a) for a in args])
    unexpected = result.exception is not None and not isinstance(result.exception, SystemExit)
    assert not unexpected, f"{args}: uncaught {type(result.exception).__name__}: {result.exception}"
    return result


def check_run(root, args, code, outputs=(), fragment=None, reports=()) -> object:
    """Run `ggtools args` and assert the four properties; code: the exit code, or a tuple of allowed ones;
    outputs: paths (files or directories) the run may create, removed after; reports: exit codes after which
    the command's stderr is a report (a failed gate of run or accept lists each failure), not one line."""
    before = snapshot(root)
    result = run_cli(args)
    after = snapshot(root)
    try:
        what = f"ggtools {' '.join(map(str, args))}\nstdout: {result.stdout}\nstderr: {result.stderr}"
        assert result.exit_code in (code if isinstance(code, tuple) else (code,)), what
        assert "Traceback" not in result.stdout + result.stderr, what
        assert "internal error" not in result.stderr, what
        if result.exit_code and result.exit_code not in reports:
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and lines[0].startswith("error: "), what
            if fragment:
                assert fragment in lines[0], what
        changed = [p for p, h in before.items() if after.get(p) != h]
        assert not changed, f"{what}\ninputs changed: {changed}"
        allowed = [os.path.abspath(p) for p in outputs]          # a file, or a directory and what it holds
        new = [p for p in after if p not in before
               and not any(os.path.abspath(p) == a or os.path.abspath(p).startswith(a + os.sep) for a in allowed)]
        assert not new, f"{what}\nnew files: {new}"
    finally:
        for p in outputs:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            elif os.path.lexists(p):
                os.unlink(p)
    return result


# ---- the corpus -------------------------------------------------------------------------------------------

def write(path, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
    return str(path)


def q8_blocks(n_blocks, rng, bad_block=None) -> bytes:
    """Q8_0 blocks with a 0.01 fp16 scale; bad_block gets a NaN scale."""
    blocks = np.zeros((n_blocks, 34), np.uint8)
    blocks[:, :2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    blocks[:, 2:] = rng.integers(0, 256, (n_blocks, 32), dtype=np.uint8)
    if bad_block is not None:
        blocks[bad_block, :2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
    return blocks.tobytes()


def dense(specs, kvs=None, alignment=32) -> bytes:
    """A valid file from (name, ne, type, data bytes) specs, offsets packed at the alignment."""
    tensors, data, off = [], bytearray(), 0
    for name, ne, t, payload in specs:
        tensors.append((name, ne, t, off, len(payload)))
        data += payload + bytes(B.pad(len(payload), alignment) - len(payload))
        off = B.pad(off + len(payload), alignment)
    return B.build(kvs if kvs is not None else B.sample_kvs(), tensors, data=bytes(data))


def whole_model(specs, kvs) -> bytes:
    """dense(specs, kvs) with a zero F32 tensor for every other tensor its arch's loader requires."""
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.gguf")
        with open(path, "wb") as fh:
            fh.write(dense(specs, kvs))
        with open(with_required_tensors(path), "rb") as fh:
            return fh.read()


def valid_llama(rng) -> bytes:
    """B.sample_file's keys and tensors, shaped as the keys give them (its attn_q is [64, 8]), and the llama loader's
    other tensors: a model validate passes, as quantize and requant-trunk ask of their input since issue 39."""
    return whole_model([("output_norm.weight", [64], F32, np.ones(64, "<f4").tobytes()),
                        ("blk.0.attn_q.weight", [64, 64], F16, rng.standard_normal(64 * 64).astype("<f2").tobytes()),
                        ("blk.0.ffn_up.weight", [64, 4], Q8_0, q8_blocks(8, rng))],
                       B.sample_kvs() + [B.kv_u32("llama.feed_forward_length", 4)])


def with_tensor(index, **change) -> bytes:
    """The sample file with one tensor info changed (ne, type_id)."""
    t = [list(x) for x in B.sample_tensors()]
    if "ne" in change:
        t[index][1] = change["ne"]
    if "type_id" in change:
        t[index][2] = change["type_id"]
    return B.build(B.sample_kvs(), [tuple(x) for x in t])


def split_set(prefix, count_on_first):
    """A 3-shard set whose first shard claims split.count = count_on_first."""
    rng = np.random.default_rng(1)
    paths = []
    for i in range(3):
        kvs = (B.sample_kvs("gpt2") if i == 0 else []) + [   # valid but for split.count (gpt2: no tensor tables)
            B.kv_u16("split.no", i), B.kv_u16("split.count", count_on_first if i == 0 else 3),
            B.kv_i32("split.tensors.count", 3)]
        payload = rng.standard_normal(64).astype("<f4").tobytes()
        paths.append(write(f"{prefix}-{i + 1:05d}-of-00003.gguf", dense([(f"t{i}.weight", [64], F32, payload)], kvs)))
    return paths


def build_corpus(root) -> dict[str, str]:
    """Write every input into root; returns name -> path."""
    root = str(root)
    rng = np.random.default_rng(0)
    c = {"root": root}
    j = lambda *p: os.path.join(root, *p)  # noqa: E731
    c["good"] = write(j("good.gguf"), valid_llama(rng))
    c["target"] = shutil.copy(os.path.join(DEMO, "target.gguf"), j("target.gguf"))
    c["hf"] = shutil.copytree(os.path.join(DEMO, "drafter"), j("hf"))
    os.makedirs(j("set"))
    c["set"] = write_moe_set(j("set", "k"), layers=1, hidden=256, ffn=256, experts=2, vocab=256, shards=3)[0]
    c["set2"] = c["set"].replace("00001-of", "00002-of")
    os.makedirs(j("badsplit"))
    c["badsplit"] = split_set(j("badsplit", "b"), 4)[0]
    c["zero_dim"] = write(j("zero_dim.gguf"), with_tensor(1, ne=[64, 0]))
    c["unknown_type"] = write(j("unknown_type.gguf"), with_tensor(1, type_id=77))
    c["bad_block"] = write(j("bad_block.gguf"), with_tensor(2, ne=[48, 4]))
    c["empty24"] = write(j("empty24.gguf"), b"GGUF" + struct.pack("<Iqq", 3, 0, 0))
    c["empty"] = write(j("empty.gguf"), b"")
    c["truncated"] = write(j("truncated.gguf"), B.sample_file()[:-100])
    c["huge_count"] = write(j("huge_count.gguf"), b"GGUF" + struct.pack("<IQQ", 3, 2 ** 64 - 1, 0) + bytes(64))
    c["fifo"] = j("fifo.gguf")
    os.mkfifo(c["fifo"])
    c["dangling"] = j("dangling.gguf")
    os.symlink(j("nowhere.gguf"), c["dangling"])
    c["missing"] = j("missing.gguf")
    os.makedirs(j("big"))
    c["big"] = shutil.copy(c["good"], j("big", "x-00001-of-99999.gguf"))
    nan_rows = rng.standard_normal((4, 64)).astype("<f4")
    nan_rows[2, 5] = np.nan
    # valid llama models (the FFN's width says the shapes they have, checked since issue 39; the loader's other
    # tensors zero) but for the NaN
    c["nan_f32"] = write(j("nan_f32.gguf"), whole_model([("blk.0.ffn_up.weight", [64, 4], F32, nan_rows.tobytes())],
                                                        B.sample_kvs() + [B.kv_u32("llama.feed_forward_length", 4)]))
    c["nan_q8"] = write(j("nan_q8.gguf"), whole_model([           # converted by requant-trunk: scale NaN in row 1
        ("blk.0.ffn_down.weight", [256, 64], Q8_0, q8_blocks(512, rng, bad_block=9))],
        B.sample_kvs() + [B.kv_u32("llama.feed_forward_length", 256)]))
    c["nan_q8_copy"] = write(j("nan_q8_copy.gguf"), whole_model([ # 128-wide: copied by requant-trunk
        ("blk.0.attn_k_b.weight", [128, 4], Q8_0, q8_blocks(16, rng, bad_block=5))],
        B.sample_kvs() + [B.kv_u32("llama.feed_forward_length", 4)]))
    c["notok"] = write(j("notok.gguf"), _without_tokenizer(c["target"]))
    for case, edits in KIMI_K3_CASES.items():
        c[f"k3_{case}"] = _kimi_k3(j(f"k3_{case}.gguf"), edits)
    os.makedirs(j("k3_kv_heads_set"))                                   # issue 39 B: a set for requant-trunk
    c["k3_kv_heads_set"] = split_in_two(c["k3_kv_heads"], j("k3_kv_heads_set", "k3"))
    c["drafter"] = _drafter(c, j("drafter.gguf"))
    c["drafter_huge_block"] = _patched(c["drafter"], j("drafter_huge_block.gguf"), "dflash.block_size=u32:4294967295")
    _model_variants(c, j)
    _dspark_variants(c, j)
    _hf_variants(c, j)
    _dspark(c, j)
    _trust3(c, j)
    _eagle3(c, j)                   # issue 41: EAGLE3 drafters
    _config_numbers(c, j)
    _shape_variants(c, j)
    _doctor_fix_variants(c, j)
    _mtp_variants(c, j)
    _drafting_variants(c, j)        # issue 41 part 5: EAGLE3 / MTP drafting
    _prompt_files(c, j)
    _manifests(c, j)
    os.makedirs(j("outdir"))
    c["outdir"] = j("outdir")
    c["afile"] = write(j("afile"), b"not a directory")
    c["existing_svg"] = write(j("existing.svg"), b"<svg/>")
    c["demo_earlier"] = j("demo_earlier")          # a demo work directory holding an earlier demo's files
    os.makedirs(os.path.join(c["demo_earlier"], "moe"))
    write(os.path.join(c["demo_earlier"], "moe", "kimi-like-00001-of-00003.gguf"), b"an earlier demo's shard")
    _aliases(c, j)
    return c


def _aliases(c, j):
    """Other names for inputs: a symbolic link, a hard link, an output directory holding a link to shard 2."""
    c["link_to_good"] = j("link_to_good.gguf")
    os.symlink(c["good"], c["link_to_good"])
    c["hard_to_good"] = j("hard_to_good.gguf")
    os.link(c["good"], c["hard_to_good"])
    c["link_to_target"] = j("link_to_target.gguf")
    os.symlink(c["target"], c["link_to_target"])
    c["link_to_drafter"] = j("link_to_drafter.gguf")
    os.symlink(c["drafter"], c["link_to_drafter"])
    c["outdir_link"] = j("outdir_link")
    os.makedirs(c["outdir_link"])
    os.symlink(c["set2"], os.path.join(c["outdir_link"], os.path.basename(c["set2"])))


# kimi-k3 files whose keys contradict each other (hparam_rules/kimi_k3.py refuses them): case -> key edits
# (None: removed)
KIMI_K3_CASES = {
    "kv_heads": {"attention.head_count_kv": [0, 2]}, "kv_heads_count": {"attention.head_count_kv": [0, 1, 1]},
    "gating": {"expert_gating_func": 1}, "key_length": {"attention.key_length": 40},
    "rope": {"rope.dimension_count": 40, "attention.key_length": 72}, "situ": {"activation.situ_beta": 0.0},
    "used": {"expert_used_count": 5}, "no_kda_head_dim": {"kda.head_dim": None},
}


K3_KEYS = {"block_count": 2, "context_length": 64, "embedding_length": 32, "attention.head_count": 2,
           "attention.head_count_kv": [0, 1], "attention.layer_norm_rms_epsilon": 1e-6, "kda.head_dim": 16,
           "ssm.conv_kernel": 4, "attention.kv_lora_rank": 32, "attention.key_length": 48,
           "rope.dimension_count": 16, "attention.key_length_mla": 32, "attention.value_length_mla": 16,
           "attention.q_lora_rank": 16, "expert_count": 4, "expert_used_count": 2, "expert_feed_forward_length": 16,
           "expert_shared_count": 1, "expert_latent_length": 16, "expert_gating_func": 2, "activation.situ_beta": 1.0,
           "activation.situ_linear_beta": 0.0, "attn_res.block_size": 0}


def _kimi_k3(path, edits, layers=False) -> str:
    """A 2-layer kimi-k3 file (KDA, MLA) with the keys its loader reads, the token embedding and output norm only
    (keys are checked before any layer tensor is looked up), with `edits` applied to the keys; with layers, every
    tensor too, shaped by K3_KEYS (before the edits: issue 39's keys that disagree with the tensors)."""
    import gguf

    keys = dict(K3_KEYS)
    keys.update(edits)
    w = gguf.GGUFWriter(path, "kimi-k3")
    for key, value in keys.items():
        if value is None:
            continue
        if isinstance(value, list):
            w.add_array(f"kimi-k3.{key}", value)
        elif isinstance(value, float):
            w.add_float32(f"kimi-k3.{key}", value)
        else:
            w.add_uint32(f"kimi-k3.{key}", value)
    rng = np.random.default_rng(3)
    w.add_tensor("token_embd.weight", rng.standard_normal((64, 32)).astype(np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, np.float32))
    for name, ne in (_kimi_k3_layers() if layers else {}).items():
        data = rng.standard_normal(ne[::-1]).astype(np.float32) * 0.1 + (1.0 if "norm" in name else 0.0)
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def _kimi_k3_layers() -> dict:
    """name -> ne of K3_KEYS' layer tensors and output head, by llama.cpp's create_tensor calls (src/models/kimi-k3.cpp,
    load_arch_tensors): n_embd 32, 2 heads; layer 0 KDA (head_dim 16: d_inner 32, conv 4), layer 1 MLA (q LoRA 16,
    kv LoRA 32, key 32 = nope 16 + rope 16, value 16); both MoE (4 experts of 16 at the latent width 16, one shared
    expert of 16)."""
    out = {"output.weight": (32, 64)}
    kda = {"ssm_conv1d_q.weight": (4, 1, 32), "ssm_conv1d_k.weight": (4, 1, 32), "ssm_conv1d_v.weight": (4, 1, 32),
           "attn_q.weight": (32, 32), "attn_k.weight": (32, 32), "attn_v.weight": (32, 32), "ssm_f_a.weight": (32, 16),
           "ssm_f_b.weight": (16, 32), "ssm_beta.weight": (32, 2), "ssm_a": (2,), "ssm_dt.bias": (32,),
           "ssm_g.weight": (32, 32), "ssm_norm.weight": (16,), "attn_output.weight": (32, 32)}
    mla = {"attn_q_a_norm.weight": (16,), "attn_kv_a_norm.weight": (32,), "attn_q_a.weight": (32, 16),
           "attn_q_b.weight": (16, 64), "attn_kv_a_mqa.weight": (32, 48), "attn_k_b.weight": (16, 32, 2),
           "attn_v_b.weight": (32, 16, 2), "attn_gate.weight": (32, 32), "attn_output.weight": (32, 32)}
    moe = {"ffn_gate_inp.weight": (32, 4), "exp_probs_b.bias": (4,), "ffn_gate_exps.weight": (16, 16, 4),
           "ffn_down_exps.weight": (16, 16, 4), "ffn_up_exps.weight": (16, 16, 4), "ffn_routed_down.weight": (32, 16),
           "ffn_routed_up.weight": (16, 32), "ffn_routed_norm.weight": (16,), "ffn_gate_shexp.weight": (32, 16),
           "ffn_down_shexp.weight": (16, 32), "ffn_up_shexp.weight": (32, 16)}
    for i, mixer in enumerate((kda, mla)):
        norms = {"attn_norm.weight": (32,), "ffn_norm.weight": (32,)}
        out |= {f"blk.{i}.{name}": ne for name, ne in (norms | mixer | moe).items()}
    return out


def _without_tokenizer(path) -> bytes:
    from ggtools.gguf import GGUFFile, GGUFWriter
    out = path + ".tmp"
    with GGUFFile(path) as f, GGUFWriter(out) as w:
        for kv in f.kvs:
            if not kv.key.startswith("tokenizer."):
                w.add_kv_record(kv)
        for t in f.tensors:
            w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
        for t in f.tensors:
            w.write(f.tensor_data(t))
    data = open(out, "rb").read()
    os.unlink(out)
    return data


def _drafter(c, path) -> str:
    """The demo drafter as a llama.cpp-profile GGUF (an input of doctor, gguf-layout, accept)."""
    from ggtools.jobs.convert import convert_dflash
    convert_dflash(c["hf"], path, profile="llama.cpp", target=c["target"])
    return path


def _patched(src, dst, assignment) -> str:
    from ggtools.jobs.patch import patch_set
    patch_set(src, [assignment], out=dst)
    return dst


# prompts files for accept: (name, bytes); a prompt of 500k newlines and a 1 MB word (longer than any context of
# the demo target: refused before tokenizing), a JSON escape of a lone surrogate, 200k-deep JSON, and valid JSONL
# holding raw U+2028 and U+0085 inside its strings (str.splitlines() would cut those lines)
PROMPT_FILES = {
    "prompts_newlines": ("newlines.jsonl", b'{"prompt": "' + b"\\n" * 500_000 + b'"}\n'),
    "prompts_word": ("word.txt", b"a" * (1 << 20) + b"\n"),
    "prompts_surrogate": ("surrogate.jsonl", b'{"prompt": "x \\ud800 y"}\n'),
    "prompts_surrogate_id": ("surrogate_id.jsonl", b'{"prompt": "x", "id": "\\udfff"}\n'),
    "prompts_deep": ("deep.jsonl", b"[" * 200_000 + b"\n"),
    "prompts_separators": ("separators.jsonl", '{"prompt": "def f():\u2028    return 1", "id": "ls"}\r\n'
                                               '{"prompt": "a\u0085b\u2029c", "id": "nel"}\n'.encode()),
}


def _prompt_files(c, j):
    os.makedirs(j("prompts"))
    for key, (name, data) in PROMPT_FILES.items():
        c[key] = write(j("prompts", name), data)


U32, I32_KV, F32_KV, STR = VT.UINT32, VT.INT32, VT.FLOAT32, VT.STRING
NAN = float("nan")
# name -> (base model, keys set (key, type, value, element type), keys dropped): models with broken hyperparameters
# (issue 21 section 2), the first six the original reproductions (memory corruption before the model-file rules)
HPARAM_VARIANTS = {
    "t_rot999": ("target", [("qwen3.rope.dimension_count", U32, 999, None)]),
    "t_rot128": ("target", [("qwen3.rope.dimension_count", U32, 128, None)]),      # head size 64
    "q35_rot999": ("q35", [("qwen35.rope.dimension_count", U32, 999, None)]),
    "q35_rot32": ("q35", [("qwen35.rope.dimension_count", U32, 32, None)]),         # head size 16
    "oss_rot999": ("oss", [("gpt-oss.rope.dimension_count", U32, 999, None)]),
    "oss_rot32": ("oss", [("gpt-oss.rope.dimension_count", U32, 32, None)]),
    "d_rot999": ("drafter", [("dflash.rope.dimension_count", U32, 999, None)]),
    "d_rot128": ("drafter", [("dflash.rope.dimension_count", U32, 128, None)]),   # head size 64
    "t_eps_nan": ("target", [("qwen3.attention.layer_norm_rms_epsilon", F32_KV, NAN, None)]),
    "t_eps_neg": ("target", [("qwen3.attention.layer_norm_rms_epsilon", F32_KV, -1e-6, None)]),
    "t_base0": ("target", [("qwen3.rope.freq_base", F32_KV, 0.0, None)]),
    "t_base_nan": ("target", [("qwen3.rope.freq_base", F32_KV, NAN, None)]),
    "oss_yarn_nan": ("oss", [("gpt-oss.rope.scaling.factor", F32_KV, NAN, None)]),
    "oss_yarn_attn_nan": ("oss", [("gpt-oss.rope.scaling.attn_factor", F32_KV, NAN, None)]),
    "t_scale_nan": ("target", [("qwen3.attention.scale", F32_KV, NAN, None)]),
    "t_layers0": ("target", [("qwen3.block_count", U32, 0, None)]),
    "t_layers_neg": ("target", [("qwen3.block_count", I32_KV, -1, None)]),
    "t_layers_f32": ("target", [("qwen3.block_count", F32_KV, 4.0, None)]),
    "q35_nextn": ("q35", [("qwen35.nextn_predict_layers", U32, 9, None)]),
    "t_heads_str": ("target", [("qwen3.attention.head_count", STR, "4", None)]),
    "t_heads0": ("target", [("qwen3.attention.head_count", U32, 0, None)]),
    "t_kv_heads0": ("target", [("qwen3.attention.head_count_kv", U32, 0, None)]),
    "q35_interval0": ("q35", [("qwen35.full_attention_interval", U32, 0, None)]),
    "q35_groups0": ("q35", [("qwen35.ssm.group_count", U32, 0, None)]),
    "d_ids_str": ("drafter", [("dflash.target_layers", VT.ARRAY, ["2", "3"], STR)]),
    "d_mask_i32": ("drafter", [("tokenizer.ggml.mask_token_id", I32_KV, -1, None)]),
    "d_block0": ("drafter", [("dflash.block_size", U32, 0, None)]),
    "d_base_nan": ("drafter", [("dflash.rope.freq_base", F32_KV, NAN, None)]),
    # issue 42: a model's sampling defaults (general.sampling.*) are model-file rules too
    "t_sampling_top_p_str": ("target", [("general.sampling.top_p", STR, "0.9", None)]),
    "t_sampling_temp_nan": ("target", [("general.sampling.temp", F32_KV, NAN, None)]),
    "t_sampling_sequence": ("target", [("general.sampling.sequence", STR, "top_k;bogus", None)]),
    "q35_sampling_top_k_huge": ("q35", [("general.sampling.top_k", VT.UINT64, 2 ** 40, None)]),
    "oss_suppress_f32": ("oss", [("tokenizer.ggml.suppress_tokens", VT.ARRAY, [1.0, 2.0], F32_KV)]),
}


def _model_variants(c, j):
    """Models of every arch the runtime runs, and broken copies: hyperparameters (HPARAM_VARIANTS), NaN weights,
    cut files."""
    c["q35"] = write_qwen35(j("q35.gguf"))
    c["oss"] = write_gpt_oss(j("oss.gguf"))
    for name, (base, keys) in HPARAM_VARIANTS.items():
        c[name] = str(rewrite_gguf(c[base], j(f"{name}.gguf"), set_keys=keys))
    c["t_nan"] = poison(c["target"], j("t_nan.gguf"), "blk.1.ffn_up.weight")
    for name in ("target", "t_rot999", "q35_rot999", "oss_rot999"):      # issue 39 B: shard sets for requant-trunk
        os.makedirs(j(f"{name}_set"))
        c[f"{name}_set"] = split_in_two(c[name], j(f"{name}_set", name))
    c["d_nan"] = poison(c["drafter"], j("d_nan.gguf"), "blk.0.ffn_up.weight")
    for name in ("target", "drafter"):
        data = open(c[name], "rb").read()
        c[f"{name}_half"] = write(j(f"{name}_half.gguf"), data[:len(data) // 2])


def split_in_two(src, prefix) -> str:
    """src as a 2-shard set (issue 39 B: requant-trunk's input): its keys on shard 1, half its tensors on each;
    returns shard 1's path."""
    from ggtools.gguf import GGUFFile, GGUFWriter, shard_path
    with GGUFFile(src) as f:
        half = len(f.tensors) // 2
        for i, tensors in enumerate((f.tensors[:half], f.tensors[half:])):
            with GGUFWriter(shard_path(prefix, i, 2)) as w:
                for kv in f.kvs if i == 0 else ():
                    w.add_kv_record(kv)
                w.add_kv("split.no", VT.UINT16, i)
                w.add_kv("split.count", VT.UINT16, 2)
                w.add_kv("split.tensors.count", VT.INT32, len(f.tensors))
                for t in tensors:
                    w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
                for t in tensors:
                    w.write(f.tensor_data(t))
    return shard_path(prefix, 0, 2)


def poison(src, dst, tensor, value=np.nan, index=40) -> str:
    """A copy of src whose tensor's value `index` is `value`, NaN by default (F32, F16 or BF16 data)."""
    from ggtools.gguf import GGUFFile
    data = bytearray(open(src, "rb").read())
    with GGUFFile(src) as f:
        t = f.tensor[tensor]
        at, kind = t.data_start, t.type_name
    bits = {"F32": np.float32(value).tobytes(), "F16": np.float16(value).tobytes(),
            "BF16": np.float32(value).tobytes()[2:]}[kind]
    at += index * len(bits)
    data[at:at + len(bits)] = bits
    return write(dst, bytes(data))


def _with_dspark_heads(src, dst, kvs=(), tensors=(), drop=()) -> str:
    """src's KVs and tensors (less `drop`), plus KVs [(key, vtype, value[, element type])] and tensors
    [(name, ne, type, bytes)]."""
    from ggtools.gguf import GGUFFile, GGUFWriter
    with GGUFFile(src) as f, GGUFWriter(dst) as w:
        kept = [t for t in f.tensors if t.name not in drop]
        for kv in f.kvs:
            if kv.key not in drop:
                w.add_kv_record(kv)
        for key, vtype, value, *elem in kvs:
            w.add_kv(key, vtype, value, *elem)
        for t in kept:
            w.add_tensor_info(t.name, t.ne, t.type_id, t.nbytes)
        for name, ne, type_id, data in tensors:
            w.add_tensor_info(name, ne, type_id, len(data))
        for t in kept:
            w.write(f.tensor_data(t))
        for *_, data in tensors:
            w.write(data)
    return dst


def _dspark_variants(c, j):
    """The demo drafter with DSpark heads (Markov rank 8, random) in ways the runtime refuses: anchor-first with
    no confidence head; a reduced vocabulary whose d2t leaves the vocabulary or repeats an id; no block size."""
    from gguf import GGUFValueType as VT
    rng = np.random.default_rng(1)
    vocab, hidden, rank, n_draft = 2048, 128, 8, 64
    f32 = lambda *shape: rng.standard_normal(shape).astype("<f4").tobytes()  # noqa: E731
    markov = [("markov_w1.weight", [rank, vocab], F32, f32(vocab, rank))]
    flags = [("dflash.sample_from_anchor", VT.BOOL, True), ("dflash.has_confidence_head", VT.BOOL, False)]
    full = markov + [("markov_w2.weight", [rank, vocab], F32, f32(vocab, rank))]
    c["dspark_noconf"] = _with_dspark_heads(c["drafter"], j("dspark_noconf.gguf"), flags, full)
    c["dspark_no_block_size"] = _with_dspark_heads(c["drafter"], j("dspark_no_block_size.gguf"), flags, full,
                                                   drop=("dflash.block_size",))

    c["dspark_flag_not_bool"] = _with_dspark_heads(c["drafter"], j("dspark_flag_not_bool.gguf"),
                                                   [("dflash.sample_from_anchor", VT.UINT8, 1)], full)
    c["dspark_flag_string"] = _with_dspark_heads(c["drafter"], j("dspark_flag_string.gguf"),     # issue 39 B
                                                 [("dflash.sample_from_anchor", VT.STRING, "true")], full)
    c["dspark_conf_flag_no_tensor"] = _with_dspark_heads(
        c["drafter"], j("dspark_conf_flag_no_tensor.gguf"),
        [("dflash.sample_from_anchor", VT.BOOL, True), ("dflash.has_confidence_head", VT.BOOL, True)], full)
    c["drafter_short_head"] = _with_dspark_heads(c["drafter"], j("drafter_short_head.gguf"), tensors=[
        ("output.weight", [hidden, n_draft], F32, f32(n_draft, hidden))])

    def reduced(name, ids, head=True, d2t_type=I64):
        tensors = markov + [("markov_w2.weight", [rank, n_draft], F32, f32(n_draft, rank)),
                            ("d2t", [n_draft], d2t_type, np.asarray(ids, "<i8" if d2t_type == I64 else "<i4").tobytes())]
        if head:
            tensors.append(("output.weight", [hidden, n_draft], F32, f32(n_draft, hidden)))
        c[name] = _with_dspark_heads(c["drafter"], j(f"{name}.gguf"), flags, tensors)

    from ggtools.jobs.convert import convert_dflash
    lucebox = convert_dflash(c["hf"], j("drafter_lucebox.gguf"), profile="lucebox", target=c["target"]).path
    c["dspark_lucebox"] = _with_dspark_heads(lucebox, j("dspark_lucebox.gguf"), tensors=[
        ("dflash.dspark.markov.w1", [rank, vocab], F32, f32(vocab, rank)),
        ("dflash.dspark.markov.w2", [rank, vocab], F32, f32(vocab, rank))])
    ids = np.arange(0, 2 * n_draft, 2)
    reduced("dspark_d2t_outside", np.r_[ids[:-1], vocab])
    reduced("dspark_d2t_repeated", np.r_[ids[:-1], ids[0]])
    reduced("dspark_d2t_without_head", ids, head=False)
    reduced("dspark_d2t_i32", ids, d2t_type=I32)


# ---- issue 39 B2: tensors whose shapes the keys do not give (hparam_rules/tensor_shapes.py) -------------------

# kimi-k3 files holding every tensor of K3_KEYS, with one key then changed: case -> key edits
KIMI_K3_SHAPE_CASES = {"latent": {"expert_latent_length": 24}, "kda_head_dim": {"kda.head_dim": 8},
                       "shared_width": {"expert_shared_count": 2}, "q_lora_rank": {"attention.q_lora_rank": 24}}
# name -> (base model, the tensor stored with its first two dimensions swapped): a shape the keys do not give
SHAPE_VARIANTS = {"llama_shape": ("llama", "blk.0.attn_q.weight"), "t_shape": ("target", "blk.1.attn_q.weight"),
                  "q3moe_shape": ("q3moe", "blk.0.attn_k.weight"), "q35_shape": ("q35", "blk.0.attn_qkv.weight"),
                  "q35moe_shape": ("q35moe", "blk.0.ffn_down_exps.weight"), "oss_shape": ("oss", "blk.1.attn_k.weight"),
                  "d_shape": ("drafter", "blk.0.attn_q.weight"), "lb_shape": ("lucebox", "blk.0.attn_q.weight")}


def _shape_variants(c, j):
    """Runnable models of the archs the corpus lacks (llama, qwen3moe, qwen35moe, a lucebox drafter), and a copy of
    each model whose one tensor has a shape its keys do not give (SHAPE_VARIANTS, KIMI_K3_SHAPE_CASES)."""
    from ggtools.jobs.convert import convert_dflash
    from ggtools.samples import write_runnable_moe
    c["llama"] = _as_arch(c["target"], j("llama.gguf"), "llama")
    c["q3moe"] = write_runnable_moe(j("q3moe.gguf"), layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, ffn=32,
                                    experts=4)
    c["q35moe"] = _qwen35moe(c["q35"], j("q35moe.gguf"))
    c["lucebox"] = convert_dflash(c["hf"], j("lucebox.gguf"), profile="lucebox").path
    for name, (base, tensor) in SHAPE_VARIANTS.items():
        c[name] = _swapped(c[base], j(f"{name}.gguf"), tensor)
    c["k3_layers"] = _kimi_k3(j("k3_layers.gguf"), {}, layers=True)
    for case, edits in KIMI_K3_SHAPE_CASES.items():
        c[f"k3_{case}"] = _kimi_k3(j(f"k3_{case}.gguf"), edits, layers=True)


def _doctor_fix_variants(c, j):
    """issue 39 A: drafters doctor --fix cannot repair from the evidence given (a DSpark block size of 0; no mask
    id, without --hf; d2t ids repeated, with --hf), one it repairs only in part (the mask id under the older key,
    and d2t repeated), and DSpark flags it repairs from the tensors (the confidence head) or the checkpoint (the
    block layout, stored as u32)."""
    c["ds_block0"] = str(rewrite_gguf(c["ds_gguf"], j("ds_block0.gguf"), set_keys=[
        ("dflash.block_size", VT.UINT32, 0, None)]))
    c["d_nomask"] = str(rewrite_gguf(c["drafter"], j("d_nomask.gguf"), drop_keys=["tokenizer.ggml.mask_token_id"]))
    from ggtools.gguf import GGUFFile
    with GGUFFile(c["ds_red_gguf"]) as f:
        ids = f.tensor_data(f.tensor["d2t"]).view("<i8").copy()
        mask = f.get("tokenizer.ggml.mask_token_id")
    ids[-1] = ids[0]
    c["ds_red_d2t_dup"] = str(rewrite_gguf(c["ds_red_gguf"], j("ds_red_d2t_dup.gguf"),
                                           retype={"d2t": (I64, ids.astype("<i8").tobytes())}))
    c["ds_red_d2t_dup_old_mask"] = str(rewrite_gguf(c["ds_red_d2t_dup"], j("ds_red_d2t_dup_old_mask.gguf"),
                                                    drop_keys=["tokenizer.ggml.mask_token_id"],
                                                    set_keys=[("dflash.mask_token_id", VT.UINT32, mask, None)]))
    c["ds_anchor_u32"] = str(rewrite_gguf(c["ds_gguf"], j("ds_anchor_u32.gguf"), set_keys=[
        ("dflash.sample_from_anchor", VT.UINT32, 1, None)]))
    c["ds_no_conf_flag"] = str(rewrite_gguf(c["ds_gguf"], j("ds_no_conf_flag.gguf"), drop_keys=[
        "dflash.has_confidence_head"], drop_tensors=["conf_proj.weight", "conf_proj.bias"]))


# ---- issue 41, MTP (tests/test_mtp.py's class): models with MTP blocks for convert mtp, requant-trunk --keep-mtp,
# validate, doctor and pair-check

def _mtp_variants(c, j):
    """A qwen35 target with its MTP block, its sidecar, the target as a 2-shard set, and the faults: two MTP blocks
    (llama.cpp's QWEN35 MTP graph runs one), no nextn.eh_proj, a --no-mtp target of another model (rope base)."""
    from tests.mtp_files import sidecar_of, write_qwen35_mtp
    c["q35_mtp"] = write_qwen35_mtp(j("q35_mtp.gguf"))
    c["q35_mtp_sidecar"] = sidecar_of(c["q35_mtp"], j("q35_mtp_sidecar.gguf"))
    os.makedirs(j("q35_mtp_set"))
    c["q35_mtp_set"] = split_in_two(c["q35_mtp"], j("q35_mtp_set", "q35_mtp"))
    c["q35_mtp_set2"] = c["q35_mtp_set"].replace("00001-of", "00002-of")
    c["q35_mtp2"] = write_qwen35_mtp(j("q35_mtp2.gguf"), n_nextn=2)
    c["q35_mtp_no_eh"] = write_qwen35_mtp(j("q35_mtp_no_eh.gguf"), drop=["blk.4.nextn.eh_proj.weight"])
    c["q35_other"] = write_qwen35_mtp(j("q35_other.gguf"), n_nextn=0,
                                      keys=[("qwen35.rope.freq_base", VT.FLOAT32, 5e5)])


# ---- issue 41 part 5, EAGLE3 / MTP drafting (tests/test_eagle3_mtp.py's class): drafters run refuses

def _drafting_variants(c, j):
    """An EAGLE3 drafter of the demo target that taps its last output (id 4, its n_layer: the h_nextn llama.cpp's
    qwen3 graph never writes)."""
    c["e3_tap_last"] = _eagle3_gguf(c["e3_gguf"], j("e3_tap_last.gguf"),
                                    [("eagle3.target_layers", VT.ARRAY, [0, 1, 4], VT.INT32)], {}, ())


def _as_arch(src, dst, arch, kvs=(), tensors=(), drop=()) -> str:
    """src's model under another general.architecture (its '<arch>.' keys renamed), as _with_dspark_heads edits it."""
    from ggtools.gguf import GGUFFile
    with GGUFFile(src) as f:
        old = f.architecture
        own = [kv for kv in f.kvs if kv.key.startswith(old + ".")]
        renamed = [(arch + kv.key[len(old):], kv.vtype, kv.value.tolist() if hasattr(kv.value, "tolist") else
                    kv.value, kv.elem_type) for kv in own]
    return _with_dspark_heads(src, dst, [("general.architecture", VT.STRING, arch), *renamed, *kvs], tensors,
                              drop=("general.architecture", *(kv.key for kv in own), *drop))


def _qwen35moe(q35, dst) -> str:
    """tiny_targets' qwen35 with routed experts (4 of 32, 2 used) and a gated shared expert in every layer."""
    from ggtools.gguf import GGUFFile
    rng = np.random.default_rng(5)
    with GGUFFile(q35) as f:
        n_layer, embd, ff = (f.get(f"qwen35.{k}") for k in ("block_count", "embedding_length", "feed_forward_length"))
    experts, ff_exp = 4, 32
    shapes = {"ffn_gate_inp.weight": [embd, experts], "ffn_gate_exps.weight": [embd, ff_exp, experts],
              "ffn_up_exps.weight": [embd, ff_exp, experts], "ffn_down_exps.weight": [ff_exp, embd, experts],
              "ffn_gate_inp_shexp.weight": [embd], "ffn_gate_shexp.weight": [embd, ff], "ffn_up_shexp.weight": [embd, ff],
              "ffn_down_shexp.weight": [ff, embd]}
    tensors = [(f"blk.{i}.{name}", ne, F32, (rng.standard_normal(int(np.prod(ne))) * 0.2).astype("<f4").tobytes())
               for i in range(n_layer) for name, ne in shapes.items()]
    keys = [(f"qwen35moe.{k}", VT.UINT32, v) for k, v in (("expert_count", experts), ("expert_used_count", 2),
                                                          ("expert_feed_forward_length", ff_exp))]
    dense = [f"blk.{i}.ffn_{x}.weight" for i in range(n_layer) for x in ("gate", "up", "down")]
    return _as_arch(q35, dst, "qwen35moe", keys, tensors, drop=dense)


def _swapped(src, dst, name) -> str:
    """src with tensor `name` stored with its first two dimensions swapped (the same bytes)."""
    from ggtools.gguf import GGUFFile
    with GGUFFile(src) as f:
        t = f.tensor[name]
        ne, type_id, data = [t.ne[1], t.ne[0], *t.ne[2:]], t.type_id, bytes(f.tensor_data(t))
    assert ne != list(t.ne), name
    return _with_dspark_heads(src, dst, tensors=[(name, ne, type_id, data)], drop=(name,))


def _hf_variants(c, j):
    c["hf_fifo"] = j("hf_fifo")
    os.makedirs(c["hf_fifo"])
    shutil.copy(os.path.join(DEMO, "drafter", "config.json"), c["hf_fifo"])
    os.mkfifo(os.path.join(c["hf_fifo"], "model.safetensors"))
    c["hf_badjson"] = shutil.copytree(os.path.join(DEMO, "drafter"), j("hf_badjson"))
    write(os.path.join(c["hf_badjson"], "config.json"), b"[" * 100000)


# DSpark checkpoints on the demo drafter's backbone (hidden 128, vocabulary 2048 of the demo target): name ->
# (architecture, config layout, confidence head, reduced vocabulary, markov_w2 scale, config edits, tensor edit)
DSPARK_RANK = 32


def _d2t(offsets_edit):
    return lambda t: t | {"d2t": ("I64", offsets_edit(t["d2t"][1].copy()))}


def _set(a, i, v):
    a[i] = v
    return a


DSPARK_CASES = {
    "base": ("Qwen3DSparkModel", "flat", True, False, False, {}, None),
    "bonus": ("Qwen3DSparkModel", "flat", True, False, False, {"sample_from_anchor": False}, None),
    "reduced-bonus": ("DSparkSpeculator", "speculators", True, True, False, {}, None),
    "scaled-bonus": ("Qwen3DSparkModel", "flat", True, False, True, {"sample_from_anchor": False}, None),
    "markov-type": ("Qwen3DSparkModel", "flat", True, False, False, {"markov_head_type": "gated"}, None),
    "no-d2t": ("DSparkSpeculator", "speculators", True, True, False, {}, lambda t: {k: v for k, v in t.items()
                                                                                   if k != "d2t"}),
    "d2t-size": ("DSparkSpeculator", "speculators", True, True, False, {}, _d2t(lambda a: a[:-3])),
    "d2t-duplicate": ("DSparkSpeculator", "speculators", True, True, False, {}, _d2t(lambda a: _set(a, 20, a[21] + 1))),
    "d2t-range": ("DSparkSpeculator", "speculators", True, True, False, {}, _d2t(lambda a: _set(a, 0, -1))),
    "d2t-bool": ("DSparkSpeculator", "speculators", True, True, False, {},
                 lambda t: t | {"d2t": ("BOOL", np.ones(t["d2t"][1].size, bool))}),
    "d2t-fraction": ("DSparkSpeculator", "speculators", True, True, False, {},
                     lambda t: t | {"d2t": ("F32", t["d2t"][1].astype(np.float32) + 0.5)}),
    "no-markov": ("Qwen3DSparkModel", "flat", False, False, False, {},
                  lambda t: {k: v for k, v in t.items() if not k.startswith("markov_head.")}),
    "w1-vocab": ("Qwen3DSparkModel", "flat", True, False, False, {},
                 lambda t: t | {"markov_head.markov_w1.weight": ("BF16", np.zeros((1024, DSPARK_RANK), np.float32))}),
    "w2-rank": ("Qwen3DSparkModel", "flat", True, False, False, {},
                lambda t: t | {"markov_head.markov_w2.weight": ("BF16", np.zeros((2048, 16), np.float32))}),
    "rank-config": ("Qwen3DSparkModel", "flat", True, False, False, {"markov_rank": 64}, None),
    "conf-shape": ("Qwen3DSparkModel", "flat", True, False, False, {},
                   lambda t: t | {"confidence_head.proj.weight": ("BF16", np.zeros((1, 128), np.float32))}),
    "conf-bias-only": ("Qwen3DSparkModel", "flat", True, False, False, {},
                       lambda t: {k: v for k, v in t.items() if k != "confidence_head.proj.weight"}),
    "reduced-no-head": ("DSparkSpeculator", "speculators", True, True, False, {},
                        lambda t: {k: v for k, v in t.items() if k != "lm_head.weight"}),
    "draft-vocab-too-big": ("Qwen3DSparkModel", "flat", True, False, False, {"draft_vocab_size": 4096}, None),
    "anchor-not-bool": ("Qwen3DSparkModel", "flat", True, False, False, {"sample_from_anchor": "yes"}, None),
    "tlc-not-object": ("DSparkSpeculator", "speculators", True, False, False, {"transformer_layer_config": [1]},
                       None),
    "aux-zero": ("DSparkSpeculator", "speculators", True, False, False, {"aux_hidden_state_layer_ids": [0, 2]},
                 None),
    "int-weight": ("Qwen3DSparkModel", "flat", True, False, False, {},
                   lambda t: t | {"norm.weight": ("I32", np.ones(128, np.int32))}),
    "scale-size": ("Qwen3DSparkModel", "flat", True, False, True, {},
                   lambda t: t | {"markov_head.markov_w2.scale": ("BF16", np.ones(2, np.float32))}),
    "gemma4": ("Gemma4DSparkModel", "flat", True, False, False, {}, None),
    "no-vocab": ("Qwen3DSparkModel", "flat", True, False, False, {"vocab_size": None}, None),
    "draft-vocab-type": ("Qwen3DSparkModel", "flat", True, False, False, {"draft_vocab_size": "512"}, None),
    "w1-1d": ("Qwen3DSparkModel", "flat", True, False, False, {},
              lambda t: t | {"markov_head.markov_w1.weight": ("BF16", np.zeros(2048 * DSPARK_RANK, np.float32))}),
    "vocab-4096": ("Qwen3DSparkModel", "flat", True, False, False, {"vocab_size": 4096},
                   lambda t: t | {"markov_head.markov_w1.weight": ("BF16", np.zeros((4096, DSPARK_RANK), np.float32)),
                                  "markov_head.markov_w2.weight": ("BF16", np.zeros((4096, DSPARK_RANK), np.float32))}),
}


def _dspark(c, j):
    """DSpark checkpoints (DSPARK_CASES) on the demo drafter's backbone, and GGUFs converted from three of them."""
    from scripts.fixtures import dspark_checkpoints as DS
    from tests.test_convert_support import rewrite_gguf
    from ggtools.jobs.convert import convert_dflash

    demo = json.loads(open(os.path.join(DEMO, "drafter", "config.json")).read())
    h = {k: v for k, v in demo.items() if k not in ("architectures", "auto_map", "dflash_config", "block_size")}
    for name, (arch, layout, conf, reduced, scale, edits, tensor_edit) in DSPARK_CASES.items():
        vd = 512 if reduced else None
        hh = h | {k: v for k, v in edits.items() if k == "vocab_size"}
        cfg = DS.dspark_config(arch, layout, hh, draft_vocab=vd, rank=DSPARK_RANK, target_layer_ids=[1, 2],
                               mask_token_id=2047, block_size=8, num_target_layers=4)
        cfg |= {k: v for k, v in edits.items() if k != "vocab_size"}
        if edits.get("vocab_size", 0) is None:
            del cfg["vocab_size"]
        tensors = DS.dspark_tensors(h, confidence=conf, draft_vocab=vd, w2_scale=scale, rank=DSPARK_RANK)
        c[f"ds_{name}"] = str(DS.write_dspark(j("dspark", name), cfg, tensor_edit(tensors) if tensor_edit else tensors))
    for name, src in (("ds_gguf", "base"), ("ds_red_gguf", "reduced-bonus"), ("ds_bonus_gguf", "bonus")):
        convert_dflash(c[f"ds_{src}"], j(f"{name}.gguf"), target=c["target"])
        c[name] = j(f"{name}.gguf")
    c["ds_nobias_gguf"] = str(rewrite_gguf(c["ds_bonus_gguf"], j("ds_nobias.gguf"), drop_tensors=["conf_proj.bias"]))
    c["ds_nobs_gguf"] = str(rewrite_gguf(c["ds_gguf"], j("ds_nobs.gguf"), drop_keys=["dflash.block_size"]))
    c["ds_now1_gguf"] = str(rewrite_gguf(c["ds_bonus_gguf"], j("ds_now1.gguf"), drop_tensors=["markov_w1.weight"]))


# ---- issue 39 (Trust III): a DFlash2 drafter (the third family a draft tree reads), NaN/inf in DSpark's confidence
# head and in DFlash2's candidate selector, MXFP4 experts whose E8M0 scale bytes are 0xFF (E8M0's NaN)

def _trust3(c, j):
    from tests.test_runtime_experts import write_moe
    c["dflash2"] = dflash2_drafter(j("dflash2"), j("dflash2.gguf"), c["target"])
    c["d2_nan_selector"] = poison(c["dflash2"], j("d2_nan_selector.gguf"), "selector_hidden.weight")
    c["ds_nan_conf"] = poison(c["ds_gguf"], j("ds_nan_conf.gguf"), "conf_proj.weight")
    c["ds_nan_conf_bias"] = poison(c["ds_gguf"], j("ds_nan_conf_bias.gguf"), "conf_proj.bias", index=0)
    c["ds_inf_conf_bias"] = poison(c["ds_gguf"], j("ds_inf_conf_bias.gguf"), "conf_proj.bias", np.inf, index=0)
    c["moe"] = str(write_moe(j("moe.gguf"), n_expert=4, n_ff=64))
    c["moe_mxfp4_ff"] = mxfp4_scales_0xff(c["moe"], j("moe_mxfp4_ff.gguf"), "blk.1.ffn_up_exps.weight")
    c["t_nan_norm"] = poison(c["target"], j("t_nan_norm.gguf"), "output_norm.weight")


# ---- issue 39 (Trust III), convert: every number of config.json through one checked reader (each layout: DFlash's
# dflash_config, DFlash2, DSpark's flat and speculators layouts); values of the right type that the model-file rules
# refuse (refused before anything is written, in validate's words); safetensors ranges that overlap

# name -> (the checkpoint it edits: hf (DFlash v1), dflash2, ds_base (DSpark flat), ds_reduced-bonus (speculators);
# config.json edits: (key path, value))
HF_NUMBER_CASES = {
    "v1_block_2p32": ("hf", [(("dflash_config", "block_size"), 2 ** 32)]),
    "v1_layers_1e9": ("hf", [(("num_hidden_layers",), 10 ** 9)]),
    "v1_theta_str": ("hf", [(("rope_theta",), "abc"), (("rope_parameters", "rope_theta"), "abc")]),
    "v1_eps_nan": ("hf", [(("rms_norm_eps",), NAN)]),
    "v1_ctx_fraction": ("hf", [(("max_position_embeddings",), 512.5)]),
    "v1_ids_2p40": ("hf", [(("dflash_config", "target_layer_ids"), [1, 2 ** 40])]),
    "v1_mask_2p32": ("hf", [(("dflash_config", "mask_token_id"), 2 ** 32)]),
    "v1_rope_scaling_list": ("hf", [(("rope_parameters",), [1, 2])]),
    "v1_block_1": ("hf", [(("dflash_config", "block_size"), 1)]),
    "v1_block_2p31": ("hf", [(("dflash_config", "block_size"), 2 ** 31)]),
    "v1_eps_negative": ("hf", [(("rms_norm_eps",), -1e-6)]),
    "v2_rank_2p32": ("dflash2", [(("dflash_config", "selector_rank"), 2 ** 32)]),
    "v2_theta_inf": ("dflash2", [(("rope_parameters", "rope_theta"), float("inf"))]),
    "v2_block_1": ("dflash2", [(("dflash_config", "block_size"), 1)]),
    "flat_theta_str": ("ds_base", [(("rope_theta",), "abc"), (("rope_parameters", "rope_theta"), "abc")]),
    "flat_block_2p32": ("ds_base", [(("block_size",), 2 ** 32)]),
    "flat_draft_vocab_2p40": ("ds_base", [(("draft_vocab_size",), 2 ** 40)]),
    "flat_block_1": ("ds_base", [(("block_size",), 1)]),
    "spec_theta_str": ("ds_reduced-bonus", [(("transformer_layer_config", "rope_theta"), "abc"),
                                            (("transformer_layer_config", "rope_parameters", "rope_theta"), "abc")]),
    "spec_theta_nan": ("ds_reduced-bonus", [(("transformer_layer_config", "rope_parameters", "rope_theta"), NAN)]),
    "spec_layers_1e9": ("ds_reduced-bonus", [(("transformer_layer_config", "num_hidden_layers"), 10 ** 9)]),
    "spec_aux_2p33": ("ds_reduced-bonus", [(("aux_hidden_state_layer_ids",), [2, 2 ** 33])]),
    "spec_block_1": ("ds_reduced-bonus", [(("block_size",), 1)]),
    "spec_block_2p31": ("ds_reduced-bonus", [(("block_size",), 2 ** 31)]),
}


def _config_numbers(c, j):
    """HF_NUMBER_CASES; a config.json holding an integer of 5000 digits; a DSpark checkpoint whose markov_w2 has
    markov_w1's data_offsets."""
    bases = {"hf": c["hf"], "dflash2": j("dflash2"), "ds_base": c["ds_base"],
             "ds_reduced-bonus": c["ds_reduced-bonus"]}
    for name, (base, edits) in HF_NUMBER_CASES.items():
        d = shutil.copytree(bases[base], j("numbers", name))
        config = json.loads(open(os.path.join(d, "config.json")).read())
        for path, value in edits:
            node = config
            for key in path[:-1]:
                node = node[key]
            node[path[-1]] = value
        write(os.path.join(d, "config.json"), json.dumps(config).encode())
        c[f"hf_{name}"] = d
    d = c["hf_v1_digits"] = shutil.copytree(c["hf"], j("numbers", "v1_digits"))
    text = open(os.path.join(d, "config.json")).read().replace('"vocab_size": 2048', '"vocab_size": ' + "9" * 5000)
    write(os.path.join(d, "config.json"), text.encode())
    d = c["hf_ds_overlap"] = shutil.copytree(c["ds_base"], j("numbers", "ds_overlap"))
    st = os.path.join(d, "model.safetensors")
    data = open(st, "rb").read()
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    header["markov_head.markov_w2.weight"]["data_offsets"] = header["markov_head.markov_w1.weight"]["data_offsets"]
    raw = json.dumps(header).encode()
    write(st, struct.pack("<Q", len(raw)) + raw + data[8 + n:])


def dflash2_drafter(hf_dir, out, target) -> str:
    """The demo drafter's shapes as a DFlash2 checkpoint (reference §5: a dynamic convolution around each sublayer,
    a candidate selector of rank 8 scoring its top 4), random weights, converted for `target`."""
    from scripts.fixtures import dspark_checkpoints as DS
    from ggtools.jobs.convert import convert_dflash
    cfg = json.loads(open(os.path.join(DEMO, "drafter", "config.json")).read())
    kernel, group, rank = 2, 16, 8
    cfg["architectures"] = ["DFlash2DraftModel"]
    cfg["dflash_config"] |= {"conv_kernel_size": kernel, "conv_group_size": group, "selector_rank": rank,
                             "selector_top_k": 4}
    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    shapes = DS.backbone_shapes(cfg, 2) | {"candidate_selector.hidden_projection.weight": (rank, hidden),
                                           "candidate_selector.predecessor_codebook.weight": (vocab, rank),
                                           "candidate_selector.successor_codebook.weight": (vocab, rank)}
    for i in range(cfg["num_hidden_layers"]):
        for conv in ("attention_conv", "mlp_conv"):
            shapes[f"layers.{i}.{conv}.base_kernel"] = (2, kernel, hidden)
            shapes[f"layers.{i}.{conv}.kernel_projection.weight"] = (2 * kernel * (hidden // group), hidden)
    rng = np.random.default_rng(5)
    tensors = {name: ("BF16", rng.normal(0, 0.05, shape).astype(np.float32) + name.endswith("norm.weight"))
               for name, shape in sorted(shapes.items())}
    convert_dflash(DS.write_dspark(hf_dir, cfg, tensors), out, profile="llama.cpp", target=target)
    return str(out)


MXFP4_BLOCK = 17        # ggml-common.h block_mxfp4: one E8M0 exponent byte, then 16 bytes of 32 nibbles


def mxfp4_scales_0xff(src, dst, tensor, expert=None) -> str:
    """A copy of src whose MXFP4 tensor has every block's E8M0 exponent set to 0xFF (NaN), its nibbles kept; with
    expert, only that expert's blocks (a stack ne [cols, rows, experts])."""
    from ggtools.gguf import GGUFFile
    data = bytearray(open(src, "rb").read())
    with GGUFFile(src) as f:
        t = f.tensor[tensor]
        assert t.type_name == "MXFP4"
        start, n = t.data_start, t.nbytes
        if expert is not None:
            n //= int(t.ne[2])
            start += expert * n
    data[start:start + n:MXFP4_BLOCK] = b"\xff" * (n // MXFP4_BLOCK)
    return write(dst, bytes(data))


HOSTILE_MANIFESTS = {"binary": bytes(range(256)) * 4, "list": b"[]", "files_number": b'{"files": 5}',
                     "shards_null": b'{"shards": null}', "deep": b"[" * 100000,
                     "no_source": b'{"shards": {"k-00001-of-00003.gguf": {"fingerprint": "x", "output": {}}}}'}


def _manifests(c, j):
    os.makedirs(j("manifests"))
    for name, data in HOSTILE_MANIFESTS.items():
        c[f"manifest_{name}"] = write(j("manifests", f"{name}.json"), data)
        resume_dir = j("resume", name)
        os.makedirs(resume_dir)
        c[f"resume_{name}"] = resume_dir
        write(os.path.join(resume_dir, "k.ggtools.json"), data)
    c["manifest_empty"] = write(j("manifests", "empty.sha256"), b"")
    c["manifest_other"] = write(j("manifests", "other.sha256"), b"0" * 64 + b"  other.gguf\n")


# ---- issue 41: EAGLE3 drafters (HF checkpoints convert drafter refuses; GGUFs validate, doctor, pair-check and
# quantize refuse), all for the demo target (scripts/fixtures/eagle3_drafters.demo_checkpoint: numpy only)

def _e3_aux(ids):
    return lambda cfg, t: cfg.__setitem__("eagle_aux_hidden_state_layer_ids", ids)


def _e3_d2t(row, target_id):
    def edit(cfg, t):
        d2t = t["d2t"][1].copy()
        d2t[row] = target_id - row
        t["d2t"] = ("I64", d2t)
    return edit


def _e3_d2t_twice(cfg, t):
    d2t = t["d2t"][1].copy()
    d2t[20] = d2t[21] + 1
    t["d2t"] = ("I64", d2t)


# name -> config.json / tensor edit of the demo EAGLE3 checkpoint that `convert drafter` refuses, and its words
EAGLE3_HF_CASES = {
    "two_layers": (lambda cfg, t: cfg.__setitem__("num_hidden_layers", 2), "exactly one decoder layer"),
    "two_taps": (_e3_aux([0, 1]), "EAGLE3 requires exactly 3 entries in 'extract_layers'"),
    "tap_beyond": (_e3_aux([0, 1, 5]), "EAGLE3: target layer id 5 exceeds target n_layer 4"),
    "target_hidden": (lambda cfg, t: cfg.__setitem__("target_hidden_size", 256), "embedding size mismatch"),
    "d2t_range": (_e3_d2t(511, 2048), "EAGLE-3 d2t target ids out of range for target vocab size 2048"),
    "d2t_twice": (_e3_d2t_twice, "EAGLE-3 d2t contains duplicate target ids"),
    "no_d2t": (lambda cfg, t: t.pop("d2t"), "without d2t llama.cpp's loader refuses output.weight"),
    "unknown_tensor": (lambda cfg, t: t.__setitem__("midlayer.extra.weight", ("BF16", np.ones(4, np.float32))),
                       "Can not map tensor 'midlayer.extra.weight'"),
    "fc_norm_flag": (lambda cfg, t: cfg.__setitem__("norm_before_fc", True), "requires enc.output_norm.weight"),
    "model_type": (lambda cfg, t: cfg.__setitem__("model_type", "qwen3"), "LlamaConfig's only"),
    "aux_2p40": (_e3_aux([0, 1, 2 ** 40]), "key 'eagle_aux_hidden_state_layer_ids[2]': 1099511627776 is outside"),
}
# name -> (key edits, tensors: name -> (ne, type, data) added or replaced, tensors dropped), what validate says
EAGLE3_GGUF_CASES = {
    "two_taps": ([("eagle3.target_layers", VT.ARRAY, [0, 1], VT.INT32)], {}, (), "exactly 3"),
    "no_target_hidden": ([], {}, ("eagle3.target_hidden_size",), "eagle3.target_hidden_size"),
    "two_layers": ([("eagle3.block_count", VT.UINT32, 2, None)], {}, (), "one decoder layer"),
    "d2t_i32": ([], {"d2t": ((512,), I32, bytes(2048))}, (), "expected I64"),
    "t2d": ([], {"t2d": ((2048,), 24, bytes(2048))}, (), "not an EAGLE3 tensor"),
}


def _eagle3_gguf(src, dst, set_keys, tensors, drop_keys) -> str:
    from ggtools.gguf import GGUFFile, GGUFWriter
    tmp = str(rewrite_gguf(src, dst + ".keys", set_keys=set_keys, drop_keys=drop_keys))
    with GGUFFile(tmp) as f, GGUFWriter(dst, force=True) as w:
        for kv in f.kvs:
            w.add_kv_record(kv)
        keep = [(t.name, tuple(t.ne), t.type_id, None) for t in f.tensors if t.name not in tensors]
        keep += [(name, ne, type_id, data) for name, (ne, type_id, data) in tensors.items()]
        for name, ne, type_id, data in keep:
            w.add_tensor_info(name, ne, type_id, len(data) if data is not None else f.tensor[name].nbytes)
        for name, ne, type_id, data in keep:
            w.write(data if data is not None else f.tensor_data(f.tensor[name]))
    os.remove(tmp)
    return dst


def _eagle3(c, j):
    from ggtools.jobs.convert_drafter import convert_drafter
    from scripts.fixtures import dspark_checkpoints as DS
    from scripts.fixtures import eagle3_drafters as E3
    c["e3_hf"] = str(DS.write_dspark(j("e3_hf"), *E3.demo_checkpoint()))
    for name, (edit, _) in EAGLE3_HF_CASES.items():
        cfg, tensors = E3.demo_checkpoint()
        edit(cfg, tensors)
        c[f"e3_hf_{name}"] = str(DS.write_dspark(j(f"e3_hf_{name}"), cfg, tensors))
    c["e3_hf_bin"] = shutil.copytree(c["e3_hf"], j("e3_hf_bin"))
    os.rename(os.path.join(c["e3_hf_bin"], "model.safetensors"), os.path.join(c["e3_hf_bin"], "pytorch_model.bin"))
    c["e3_gguf"] = convert_drafter(c["e3_hf"], j("e3.gguf"), target=c["target"], outtype="f16").path
    for name, (keys, tensors, drop, _) in EAGLE3_GGUF_CASES.items():
        c[f"e3_{name}"] = _eagle3_gguf(c["e3_gguf"], j(f"e3_{name}.gguf"), keys, tensors, drop)
