"""The hostile corpus over every command: one row per (case class, command invocation).

Each row runs in-process against one corpus directory and checks the four properties (hostile_corpus.py):
the exit code, one line on stderr without a traceback, every input unchanged, no new file but the intended
output. A new command is one more row. Rows that fail get the same run with --json, which must print
{"error": ..., "exit_code": ...} on stdout.
"""

import json
import os

import pytest

from tests.hostile_corpus import (HOSTILE_MANIFESTS, HPARAM_VARIANTS, SHAPE_VARIANTS,
                                  build_corpus, check_run)
from tests.hostile_corpus import EAGLE3_GGUF_CASES, EAGLE3_HF_CASES      # issue 41

E3_OUT = ["-o", "{root}/e3_new.gguf"]       # issue 41: convert drafter's output in the corpus


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"))


CONVERT = ["convert", "dflash", "{hf}", "--target-gguf", "{target}"]
CONVERT_TO = ["convert", "dflash", "--target-gguf", "{target}"]      # issue 39: the checkpoint follows
TO_D = ["-o", "{root}/d.gguf"]
REFUSED = "refusing to write an output that ggtools validate would fail: "
RUN_DRAFT = ["run", "--target", "{target}", "--prompt-ids", "1,2,3", "-n", "4", "--draft"]
Q8 = ["--scheme", "q8_0"]
RUN = ["run", "--target", "{target}", "--prompt-ids", "1,2", "-n", "4"]
ACCEPT = ["accept", "--target", "{target}", "--draft", "{drafter}", "-q", "-n", "4"]
FEW = ["--prompt-ids", "1,2,3", "-n", "2"]


def _hparam_rows():
    """Every broken-hyperparameter model (hostile_corpus.HPARAM_VARIANTS) through run, validate and doctor: one line
    naming the key, the same rule everywhere (run exit 2, validate and doctor exit 1)."""
    rows = []
    for name, (base, keys) in HPARAM_VARIANTS.items():
        key = "{%s}" % name
        where = f"key '{keys[0][0]}'"
        if base == "drafter":
            run = ["run", "--target", "{target}", "--draft", key, *FEW]
            doctor = ["doctor", key]
        else:
            run = ["run", "--target", key, *FEW]
            doctor = ["doctor", "{drafter}", "--target", key] if base == "target" else None
        rows += [(f"hparams/run-{name}", run, 2, [], where), (f"hparams/validate-{name}", ["validate", key], 1, [], where),
                 (f"hparams/quantize-{name}", ["quantize", key, "-o", "{root}/q.gguf", *Q8], 2, [], where)]  # issue 39
        if doctor:
            rows.append((f"hparams/doctor-{name}", doctor, 1, [], where))
    return rows


# the first tensor whose shape the edited key no longer gives, in each of hostile_corpus.KIMI_K3_SHAPE_CASES
K3_SHAPE_TENSOR = {"latent": "blk.0.ffn_gate_exps.weight", "kda_head_dim": "blk.0.ssm_conv1d_q.weight",
                   "shared_width": "blk.0.ffn_gate_shexp.weight", "q_lora_rank": "blk.1.attn_q_a_norm.weight"}


def _shape_rows():
    """issue 39 B2: a tensor whose shape its keys do not give (hostile_corpus.SHAPE_VARIANTS, one per arch and drafter
    layout; KIMI_K3_SHAPE_CASES, keys that disagree with kimi-k3's tensors) through run, validate and doctor: one
    line naming the tensor in llama.cpp's words (run exit 2, validate and doctor exit 1)."""
    cases = {name: (base, tensor) for name, (base, tensor) in SHAPE_VARIANTS.items()}
    cases |= {f"k3_{case}": ("k3", tensor) for case, tensor in K3_SHAPE_TENSOR.items()}
    rows = []
    for name, (base, tensor) in cases.items():
        key, where = "{%s}" % name, f"tensor '{tensor}': has wrong shape; expected ["
        if base in ("drafter", "lucebox"):
            run, doctor = ["run", "--target", "{target}", "--draft", key, *FEW], ["doctor", key, "--runtime", "ggtools"]
        else:
            run, doctor = ["run", "--target", key, *FEW], ["doctor", "{drafter}", "--target", key]
        rows += [(f"shapes/run-{name}", run, 2, [], where), (f"shapes/validate-{name}", ["validate", key], 1, [], where),
                 (f"shapes/doctor-{name}", doctor, 1, [], where)]
    return rows


FIXED = "{root}/fixed.gguf"

# (id, args, exit code, outputs the run may create, fragment of the error line)
ROWS = [
    # 1. no command ever writes over one of its own inputs (with --force, through links, through a manifest)
    ("alias/validate-manifest-over-model", ["validate", "--write-manifest", "{good}", "{good}"], 2, [], "is an input"),
    ("alias/validate-manifest-over-shard2", ["validate", "--write-manifest", "{set2}", "{set}"], 2, [], "is an input"),
    ("alias/validate-manifest-over-manifest-input", ["validate", "--manifest", "{manifest_other}",
                                                     "--write-manifest", "{manifest_other}", "{good}"], 2, [], None),
    ("alias/quantize-over-input", ["quantize", "{good}", "-o", "{good}", *Q8, "--force"], 2, [], "is an input"),
    ("alias/quantize-over-symlink", ["quantize", "{good}", "-o", "{link_to_good}", *Q8, "--force"], 2, [],
     "is an input"),
    ("alias/quantize-over-hardlink", ["quantize", "{good}", "-o", "{hard_to_good}", *Q8, "--force"], 2, [],
     "is an input"),
    ("alias/convert-over-target", [*CONVERT, "-o", "{target}", "--force"], 2, [], "is an input"),
    ("alias/convert-over-target-link", [*CONVERT, "-o", "{link_to_target}", "--force"], 2, [], "is an input"),
    ("alias/convert-over-checkpoint", [*CONVERT, "-o", "{hf}/model.safetensors", "--force"], 2, [], "is an input"),
    ("alias/convert-over-config", [*CONVERT, "-o", "{hf}/config.json", "--force"], 2, [], "is an input"),
    ("alias/patch-over-input", ["patch", "set", "{good}", "x.y=u8:1", "-o", "{good}", "--force"], 2, [],
     "use --in-place"),
    ("alias/patch-set-into-its-dir", ["patch", "set", "{set}", "x.y=u8:1", "-o", "{root}/set", "--force"], 2, [],
     "is an input"),
    ("alias/doctor-fix-over-draft", ["doctor", "{drafter}", "--fix", "-o", "{drafter}", "--force"], 2, [],
     "is an input"),
    ("alias/doctor-fix-over-target", ["doctor", "{drafter}", "--target", "{target}", "--fix", "-o", "{target}",
                                      "--force"], 2, [], "is an input"),
    ("alias/gguf-layout-over-draft", ["convert", "gguf-layout", "{drafter}", "--to", "lucebox", "-o",
                                      "{link_to_drafter}", "--force"], 2, [], "is an input"),
    ("alias/accept-report-over-target", ["accept", "--target", "{target}", "--draft", "{drafter}", "--report",
                                         "{target}"], 2, [], "is an input"),
    ("alias/patch-mask-token-over-target", ["patch", "mask-token", "{drafter}", "--id", "5", "--target", "{target}",
                                            "-o", "{target}", "--force"], 2, [], "is an input"),
    ("alias/requant-over-linked-shard", ["requant-trunk", "{set}", "-o", "{outdir_link}", "--force", "-q"], 2, [],
     "is an input"),
    # 3. an OS error is an input error: missing parent, a directory or a device as the output
    ("os/quantize-missing-parent", ["quantize", "{good}", "-o", "{root}/no/dir/q.gguf", *Q8], 2, [],
     "does not exist"),
    ("os/convert-missing-parent", [*CONVERT, "-o", "{root}/no/dir/d.gguf"], 2, [], "does not exist"),
    ("os/patch-missing-parent", ["patch", "set", "{good}", "x.y=u8:1", "-o", "{root}/no/p.gguf"], 2, [],
     "does not exist"),
    ("os/manifest-missing-parent", ["validate", "--write-manifest", "{root}/no/m.json", "{good}"], 2, [],
     "does not exist"),
    ("os/patch-output-is-a-directory", ["patch", "set", "{good}", "x.y=u8:1", "-o", "{outdir}", "--force"], 2, [],
     "is a directory"),
    ("os/quantize-output-is-a-directory", ["quantize", "{good}", "-o", "{outdir}", *Q8, "--force"], 2, [], None),
    ("os/quantize-output-is-a-device", ["quantize", "{good}", "-o", "/dev/null", *Q8, "--force"], 2, [],
     "not a regular file"),
    ("os/requant-output-is-a-file", ["requant-trunk", "{set}", "-o", "{afile}"], 2, [], "is a file"),
    ("os/requant-output-under-a-file", ["requant-trunk", "{set}", "-o", "{afile}/sub"], 2, [], None),
    ("os/accept-report-missing-parent", ["accept", "--target", "{target}", "--draft", "{drafter}", "--report",
                                         "{root}/no/r.md"], 2, [], None),
    ("os/demo-work-dir-under-a-file", ["demo", "--work-dir", "{afile}/sub", "--skip-requant"], 2, [], None),
    # 4. no traceback on any input
    *[(f"input/{cmd[0]}-{case}", [*cmd[1], "{%s}" % case, *cmd[2]], code, [], None)
      for case in ("zero_dim", "unknown_type", "bad_block", "empty24", "truncated")
      for cmd, code in ((("quantize", ["quantize"], ["-o", "{root}/q.gguf", *Q8]), 2),
                        (("requant", ["requant-trunk"], ["-o", "{root}/rq", "-q"]), 2),
                        (("patch", ["patch", "set"], ["x.y=u8:1", "-o", "{root}/p.gguf"]), 2),
                        (("validate", ["validate"], []), 1),
                        (("inspect", ["inspect"], []), 0))],
    ("input/validate-empty", ["validate", "{empty}"], 2, [], "file is empty"),
    ("input/validate-huge-count", ["validate", "{huge_count}"], 2, [], "18446744073709551615"),
    ("input/patch-f32-overflow", ["patch", "set", "{good}", "x.v=f32:1e39", "-o", "{root}/p.gguf"], 2, [],
     "does not fit FLOAT32"),
    ("input/patch-f32-array-overflow", ["patch", "set", "{good}", "x.v=f32[]:1,1e39", "-o", "{root}/p.gguf"], 2, [],
     "do not fit FLOAT32"),
    ("input/run-prompt-id-overflow", ["run", "--target", "{target}", "--prompt-ids", "99999999999999999999999"], 2,
     [], "outside 0..2147483647"),
    ("input/run-prompt-id-outside-vocab", ["run", "--target", "{target}", "--prompt-ids", "5000"], 2, [],
     "target.gguf: prompt token id 5000 is outside the vocabulary of 2048 tokens"),
    # kimi-k3's own keys (hparam_rules/kimi_k3.py): run refuses them (exit 2), validate reports them (exit 1)
    *[row for case, fragment in [
        ("kv_heads", "'kimi-k3.attention.head_count_kv': holds [2]: a kimi-k3 layer has 0 KV heads (KDA) or 1"),
        ("kv_heads_count", "'kimi-k3.attention.head_count_kv': has 3 entries for 2 layers"),
        ("gating", "'kimi-k3.expert_gating_func': is 1: kimi-k3 routes its experts by sigmoid (2"),
        ("key_length", "'kimi-k3.attention.key_length': is 40: kimi-k3's MLA cache holds kv_lora_rank + "
                       "rope.dimension_count = 32 + 16"),
        ("rope", "'kimi-k3.rope.dimension_count': is 40, not below attention.key_length_mla 32"),
        ("situ", "'kimi-k3.activation.situ_beta': is 0: situ divides the gate by it"),
        ("used", "'kimi-k3.expert_used_count': is 5, above expert_count 4"),
        ("no_kda_head_dim", "'kimi-k3.kda.head_dim': missing (llama.cpp's loader requires it)")]
      for row in ((f"input/run-kimi-k3-{case}", ["run", "--target", "{k3_%s}" % case, "--prompt-ids", "1"], 2, [],
                   fragment), (f"input/validate-kimi-k3-{case}", ["validate", "{k3_%s}" % case], 1, [], None))],
    *[(f"input/manifest-{name}/validate", ["validate", "--manifest", "{manifest_%s}" % name, "{good}"], 2, [], None)
      for name in HOSTILE_MANIFESTS],
    *[(f"input/manifest-{name}/requant-resume", ["requant-trunk", "{set}", "-o", "{resume_%s}" % name, "--resume",
                                                 "-q"], 2, [], None) for name in HOSTILE_MANIFESTS],
    *[(f"input/fifo/{name}", [*args], 2, [], "not a regular file") for name, args in [
        ("inspect", ["inspect", "{fifo}"]), ("validate", ["validate", "{fifo}"]),
        ("quantize", ["quantize", "{fifo}", "-o", "{root}/q.gguf", *Q8]),
        ("patch", ["patch", "set", "{fifo}", "x.y=u8:1", "-o", "{root}/p.gguf"]),
        ("requant", ["requant-trunk", "{fifo}", "-o", "{root}/rq"]),
        ("convert-target", ["convert", "dflash", "{hf}", "--target-gguf", "{fifo}", "-o", "{root}/d.gguf"]),
        ("convert-checkpoint", ["convert", "dflash", "{hf_fifo}", "--target-gguf", "{target}", "-o", "{root}/d.gguf"]),
        ("pair-check", ["pair-check", "{target}", "{fifo}"]),
        ("run", ["run", "--target", "{fifo}", "--prompt-ids", "1"]),
        ("doctor", ["doctor", "{fifo}"]), ("doctor-target", ["doctor", "{drafter}", "--target", "{fifo}"]),
        ("gguf-layout", ["convert", "gguf-layout", "{fifo}", "--to", "lucebox", "-o", "{root}/l.gguf"]),
        ("accept-draft", ["accept", "--target", "{target}", "--draft", "{fifo}", "-q"]),
        ("accept-prompts", ["accept", "--target", "{target}", "--draft", "{drafter}", "--prompts", "{fifo}", "-q"]),
        ("validate-manifest", ["validate", "--manifest", "{fifo}", "{good}"])]],
    ("input/dev-zero", ["validate", "/dev/zero"], 2, [], "character device, not a regular file"),
    ("input/convert-config-nested", ["convert", "dflash", "{hf_badjson}", "--target-gguf", "{target}", "-o",
                                     "{root}/d.gguf"], 2, [], None),
    # 9. messages: not found is not found; a missing shard list answers at once
    ("message/validate-dangling-link", ["validate", "{dangling}"], 2, [], "dangling symbolic link"),
    ("message/validate-missing", ["validate", "{missing}"], 2, [], "not found"),
    ("message/inspect-missing", ["inspect", "{missing}"], 2, [], "not found"),
    ("message/validate-99999-shards", ["validate", "{big}"], 1, [], None),
    ("message/validate-existing-manifest", ["validate", "--write-manifest", "{afile}", "{good}"], 2, [],
     "output exists; pass --force to overwrite it"),
    ("message/run-empty-prompt-ids", [*RUN[:3], "--prompt-ids", ""], 2, [], "--prompt-ids"),
    ("message/quantize-existing-output", ["quantize", "{good}", "-o", "{afile}", *Q8], 2, [],
     "output exists; pass --force to overwrite it"),
    ("message/requant-existing-output", ["requant-trunk", "{set}", "-o", "{outdir_link}", "-q"], 2, [],
     "or --resume to continue"),
    # 5. a check never passes what it did not check; nothing is written that validate rejects
    ("check/validate-empty-manifest", ["validate", "--manifest", "{manifest_empty}", "{good}"], 1, [], None),
    ("check/validate-manifest-lists-none", ["validate", "--manifest", "{manifest_other}", "{good}"], 1, [], None),
    ("check/requant-split-count-disagrees", ["requant-trunk", "{badsplit}", "-o", "{root}/rq", "-q"], 2, [],
     "split.count"),
    # issue 39 B: quantize and requant-trunk refuse a model validate fails on its model-file rules (DSpark drafters,
    # DFlash, every target arch; requant-trunk's shard sets), naming the file, the place and the rule, writing nothing
    *[(f"check/{cmd}-{case}", [cmd, "{%s}" % case, "-o", out, *more], 2, [], fragment)
      for case, fragment in (
        ("dspark_d2t_outside", "tensor 'd2t': row 63 maps to 2048, outside the target ids 0..2047"),
        ("dspark_d2t_repeated", "tensor 'd2t': maps two draft rows to one target id (rows 0 and 63 to 0)"),
        ("dspark_d2t_i32", "tensor 'd2t': is I32, expected I64"),
        ("d_block0", "key 'dflash.block_size': refusing an invalid input: is 0"),
        ("ds_nobs_gguf", "key 'dflash.block_size': missing: llama.cpp's DSpark Markov head asserts it"),
        ("dspark_conf_flag_no_tensor", "dflash.has_confidence_head is true but the file has no conf_proj tensors"),
        ("dspark_flag_string", "key 'dflash.sample_from_anchor': is 'true', expected a boolean"),
        ("k3_kv_heads", "key 'kimi-k3.attention.head_count_kv': refusing an invalid input: holds [2]"))
      for cmd, out, more in (("quantize", "{root}/q.gguf", Q8), ("requant-trunk", "{root}/rq", ["-q"]))],
    *[(f"check/requant-set-{case}", ["requant-trunk", "{%s_set}" % case, "-o", "{root}/rq", "-q"], 2, [],
       f"-00001-of-00002.gguf: key '{key}': refusing an invalid input: ") for case, key in (
        ("t_rot999", "qwen3.rope.dimension_count"), ("q35_rot999", "qwen35.rope.dimension_count"),
        ("oss_rot999", "gpt-oss.rope.dimension_count"), ("k3_kv_heads", "kimi-k3.attention.head_count_kv"))],
    ("check/requant-set-valid", ["requant-trunk", "{target_set}", "-o", "{root}/rq", "-q"], 0, ["{root}/rq"], None),
    ("check/patch-rm-architecture", ["patch", "rm", "{good}", "general.architecture", "-o", "{root}/p.gguf"], 2, [],
     "general.architecture"),
    ("check/patch-split-count-on-single-file", ["patch", "set", "{good}", "split.count=u16:5", "-o",
                                                "{root}/p.gguf"], 2, [], "split.count"),
    ("check/patch-alignment-not-a-power-of-two", ["patch", "set", "{good}", "general.alignment=u32:48", "-o",
                                                  "{root}/p.gguf"], 2, [], None),
    ("check/convert-target-without-tokenizer", ["convert", "dflash", "{hf}", "--target-gguf", "{notok}", "-o",
                                                "{root}/d.gguf"], 2, [], "no tokenizer"),
    # issue 41, MTP (test_mtp.py's class): convert mtp refuses what it cannot write as llama.cpp's converter would,
    # and what validate fails; validate, doctor and pair-check name MTP faults in llama.cpp's words
    *[(f"mtp/convert{strip}-{case}", ["convert", "mtp", *strip.split(), "{%s}" % case, "-o", "{root}/m.gguf"], 2,
       [], fragment) for strip in ("", " --strip") for case, fragment in (
        ("q35", "q35.gguf: no MTP block to " + ("strip" if strip else "extract")),
        ("q35_mtp_sidecar", "already an MTP sidecar (no trunk block"),
        ("q35_mtp2", "QWEN35 MTP currently only supports a single MTP block"),
        ("q35_mtp_no_eh", "check_tensor_dims: tensor 'blk.4.nextn.eh_proj.weight' not found"),
        ("target", "arch 'qwen3': convert mtp writes what llama.cpp's Qwen MTP converter writes"),
        ("truncated", None))],
    ("mtp/convert-over-input", ["convert", "mtp", "--strip", "{q35_mtp}", "-o", "{q35_mtp}", "--force"], 2, [],
     "is an input"),
    ("mtp/convert-over-shard2", ["convert", "mtp", "{q35_mtp_set}", "-o", "{q35_mtp_set2}", "--force"], 2, [],
     "is an input"),
    ("mtp/convert-existing-output", ["convert", "mtp", "{q35_mtp}", "-o", "{afile}"], 2, [],
     "output exists; pass --force to overwrite it"),
    ("mtp/convert-missing-parent", ["convert", "mtp", "{q35_mtp}", "-o", "{root}/no/m.gguf"], 2, [], "does not exist"),
    ("mtp/convert-sidecar", ["convert", "mtp", "{q35_mtp}", "-o", "{root}/m.gguf", "-q"], 0, ["{root}/m.gguf"], None),
    ("mtp/convert-set-sidecar", ["convert", "mtp", "{q35_mtp_set}", "-o", "{root}/m.gguf", "-q"], 0, ["{root}/m.gguf"],
     None),
    ("mtp/convert-set-strip", ["convert", "mtp", "--strip", "{q35_mtp_set}", "-o", "{root}/s.gguf", "-q"], 0,
     ["{root}/s-00001-of-00002.gguf", "{root}/s-00002-of-00002.gguf"], None),
    ("mtp/requant-keep-mtp-without-block", ["requant-trunk", "{q35}", "-o", "{root}/rq", "--keep-mtp"], 2, [],
     "--keep-mtp"),
    ("mtp/validate-two-blocks", ["validate", "{q35_mtp2}"], 1, [], "QWEN35 MTP currently only supports a single MTP "
                                                                  "block"),
    ("mtp/validate-no-eh-proj", ["validate", "{q35_mtp_no_eh}"], 1, [], "MTP block missing nextn.eh_proj"),
    ("mtp/doctor-no-block", ["doctor", "{q35}"], 1, [], "the model holds no MTP block to draft with"),
    ("mtp/doctor-two-blocks", ["doctor", "{q35_mtp2}"], 1, [], "QWEN35 MTP graph runs a single MTP block"),
    ("mtp/pair-check-other-model", ["pair-check", "{q35_other}", "{q35_mtp_sidecar}"], 1, [],
     "key 'qwen35.rope.freq_base': is 10000.0, the target's is 500000.0"),
    ("mtp/pair-check-no-mtp-target", ["pair-check", "{q35}", "{q35_mtp_sidecar}"], 0, [], None),
    ("mtp/doctor-lucebox", ["doctor", "{q35_mtp}", "--runtime", "lucebox"], 2, [], "lucebox does not draft with MTP"),
    ("mtp/doctor-hf", ["doctor", "{q35_mtp}", "--hf", "{hf}"], 2, [], "--hf checks a DFlash drafter"),
    ("mtp/doctor-fix", ["doctor", "{q35_mtp}", "--fix", "-o", "{root}/f.gguf"], 2, [], "--fix repairs DFlash drafters"),
    # issue 41 part 5 (test_eagle3_mtp.py's class): run drafts with EAGLE3 and MTP and refuses, in llama.cpp's words
    # where it has them, what cannot draft
    *[(f"draft/run-{name}", ["run", "--target", target, "--draft", draft, *FEW], 2, [], fragment)
      for name, target, draft, fragment in (
        ("mtp-no-block", "{q35}", "mtp", "the model holds no MTP block to draft with"),
        ("mtp-qwen3", "{target}", "mtp", "context type MTP requested but model doesn't contain MTP layers"),
        ("mtp-two-blocks", "{q35_mtp2}", "mtp", "single MTP block"),
        ("mtp-no-eh-proj", "{q35_mtp_no_eh}", "mtp", "nextn.eh_proj"),
        ("sidecar-other-model", "{q35_other}", "{q35_mtp_sidecar}", "key 'qwen35.rope.freq_base': is 10000.0"),
        ("sidecar-other-arch", "{target}", "{q35_mtp_sidecar}", "'qwen35' differs from the target's 'qwen3'"),
        ("eagle3-other-target", "{q35}", "{e3_gguf}", "target_hidden_size"),
        ("eagle3-two-taps", "{target}", "{e3_two_taps}", "exactly 3"),
        ("eagle3-last-output", "{target}", "{e3_tap_last}", "never writes it"))],
    ("draft/run-eagle3-short-ring", [*RUN_DRAFT, "{e3_gguf}", "--ring-cap", "4"], 2, [],
     "--ring-cap 4: an EAGLE3 drafter attends to every committed position"),
    ("draft/run-mtp-n-max-beyond-context", ["run", "--target", "{q35_mtp}", "--draft", "mtp", *FEW, "--n-max",
                                           "2147483647"], 2, [], "fit the drafter's context of"),
    ("draft/run-eagle3", [*RUN_DRAFT, "{e3_gguf}"], 0, [], None),
    ("draft/run-eagle3-tree", [*RUN_DRAFT, "{e3_gguf}", "--tree-budget", "5"], 0, [], None),
    ("draft/run-mtp", ["run", "--target", "{q35_mtp}", "--draft", "mtp", *FEW], 0, [], None),
    ("draft/run-mtp-sidecar", ["run", "--target", "{q35}", "--draft", "{q35_mtp_sidecar}", *FEW], 0, [], None),
    # 6. non-finite values are never hidden
    ("nonfinite/quantize-nan-weights", ["quantize", "{nan_f32}", "-o", "{root}/q.gguf", *Q8], 2, [], "row 2"),
    ("nonfinite/quantize-nan-weights-allowed", ["quantize", "{nan_f32}", "-o", "{root}/q.gguf", *Q8,
                                                "--allow-nonfinite"], 0, ["{root}/q.gguf", "{root}/q.ggtools.json"],
     None),
    ("nonfinite/requant-nan-scale", ["requant-trunk", "{nan_q8}", "-o", "{root}/rq", "-q"], 2, [], "row 1"),
    ("nonfinite/requant-copied-nan-scale", ["requant-trunk", "{nan_q8_copy}", "-o", "{root}/rq", "-q"], 2, [],
     "refusing to copy them as verified"),
    ("nonfinite/run-nan-target", ["run", "--target", "{t_nan}", *FEW], 2, [], "tensor 'blk.1.ffn_up.weight'"),
    ("nonfinite/run-draft-nan-target", ["run", "--target", "{t_nan}", "--draft", "{drafter}", *FEW], 2, [],
     "tensor 'blk.1.ffn_up.weight'"),
    ("nonfinite/run-draft-nan-drafter", ["run", "--target", "{target}", "--draft", "{d_nan}", *FEW], 2, [],
     "tensor 'blk.0.ffn_up.weight'"),
    ("nonfinite/accept-nan-target", ["accept", "--target", "{t_nan}", "--draft", "{drafter}", "-n", "4", "-q"], 2, [],
     "tensor 'blk.1.ffn_up.weight'"),
    ("nonfinite/accept-nan-drafter", ["accept", "--target", "{target}", "--draft", "{d_nan}", "-n", "4", "-q"], 2, [],
     "tensor 'blk.0.ffn_up.weight'"),
    ("nonfinite/validate-deep-nan-target", ["validate", "--deep", "{t_nan}"], 1, [], "tensor 'blk.1.ffn_up.weight'"),
    ("nonfinite/validate-deep-nan-drafter", ["validate", "--deep", "{d_nan}"], 1, [], "tensor 'blk.0.ffn_up.weight'"),
    # issue 39 (Trust III) B: NaN/inf decide no cut and no draft: a DSpark confidence head (the weight NaN: the
    # confidence is NaN, never below --p-min; the bias NaN or +inf: a vector, refused as it is loaded), a DFlash2
    # candidate selector; D: the cause named as validate --deep names it (an MXFP4 exponent 0xFF), and a vector
    # (norm) of the target
    *[(f"nonfinite/{cmd}-dspark-{case}", [*args, "{ds_%s}" % case, "--cut", "confidence", "--p-min", "0.5"], 2, [],
       f"tensor '{tensor}' holds NaN/inf")
      for cmd, args in (("run", RUN_DRAFT), ("accept", [*ACCEPT[:3], "-q", "-n", "4", "--draft"]))
      for case, tensor in (("nan_conf", "conf_proj.weight"), ("nan_conf_bias", "conf_proj.bias"),
                           ("inf_conf_bias", "conf_proj.bias"))],
    ("nonfinite/run-dflash2-nan-selector", [*RUN_DRAFT, "{d2_nan_selector}"], 2, [],
     "tensor 'selector_hidden.weight' holds NaN/inf (first at value 40), so the candidate selector gives NaN/inf"),
    ("nonfinite/run-mxfp4-exponent-0xff", ["run", "--target", "{moe_mxfp4_ff}", *FEW], 2, [],
     "tensor 'blk.1.ffn_up_exps.weight' holds NaN/inf (first at block 0: MXFP4 exponent 0xFF), so layer 1's "
     "feed-forward network gives NaN/inf"),
    ("nonfinite/validate-deep-mxfp4-exponent-0xff", ["validate", "--deep", "{moe_mxfp4_ff}"], 1, [],
     "MXFP4 exponent 0xFF"),
    ("nonfinite/run-nan-norm", ["run", "--target", "{t_nan_norm}", *FEW], 2, [],
     "tensor 'output_norm.weight' holds NaN/inf (first at value 40): the runtime refuses it as it loads it"),
    # 10. model-file rules: a hyperparameter the runtime reads is checked where the runtime reads it, by validate
    # and by doctor, in the same words; doctor never says OK to a file run refuses
    *_hparam_rows(),
    *_shape_rows(),
    ("shapes/run-kimi-k3-layers", ["run", "--target", "{k3_layers}", *FEW], 0, [], None),       # the keys' own shapes
    ("shapes/validate-kimi-k3-layers", ["validate", "{k3_layers}"], 0, [], None),
    # issue 39 A: doctor --fix writes nothing that still fails a check: not what the evidence cannot fix (a DSpark
    # block size of 0, no mask id, without --hf; d2t ids repeated, with --hf; a u32 block layout, without --hf), not
    # what a fix leaves (the mask id fixed, d2t still repeated); it fixes what the evidence gives (the block layout
    # from --hf, the confidence flag from the tensors)
    *[(f"doctor/fix-refused-{name}", ["doctor", "{%s}" % src, *extra, "--fix", "-o", FIXED], 1, [], fragment)
      for name, src, extra, fragment in (
          ("dspark-block-size-0", "ds_block0", [], "nothing written: the evidence given fixes none of the"),
          ("no-mask-without-hf", "d_nomask", [], "nothing written: the evidence given fixes none of the"),
          ("d2t-repeated-with-hf", "ds_red_d2t_dup", ["--hf", "{ds_reduced-bonus}"], "maps two draft rows"),
          ("anchor-u32-without-hf", "ds_anchor_u32", [], "'dflash.sample_from_anchor': is 1, expected a boolean"),
          ("fix-leaves-d2t-repeated", "ds_red_d2t_dup_old_mask", ["--hf", "{ds_reduced-bonus}"],
           "nothing written: fixed mask, but"))],
    ("doctor/fix-anchor-u32-with-hf", ["doctor", "{ds_anchor_u32}", "--hf", "{ds_base}", "--fix", "-o", FIXED], 0,
     [FIXED], None),
    ("doctor/fix-missing-confidence-flag", ["doctor", "{ds_no_conf_flag}", "--fix", "-o", FIXED], 0, [FIXED], None),
    ("dspark/validate-missing-confidence-flag", ["validate", "{ds_no_conf_flag}"], 1, [],
     "dflash.has_confidence_head is missing, which llama.cpp reads as true, but the file has no conf_proj tensors"),
    ("doctor/truncated-drafter", ["doctor", "{drafter_half}"], 1, [], "the file is truncated"),
    ("doctor/truncated-target", ["doctor", "{drafter}", "--target", "{target_half}"], 1, [], "the file is truncated"),
    ("input/run-truncated-target", ["run", "--target", "{target_half}", *FEW], 2, [], "end of the file"),
    ("input/run-truncated-drafter", ["run", "--target", "{target}", "--draft", "{drafter_half}", *FEW], 2, [],
     "end of the file"),
    # 5b. DSpark drafters (reference §13): what llama.cpp refuses or would crash on, refused in its words
    ("check/run-dspark-confidence-cut-without-head", [*RUN_DRAFT, "{dspark_noconf}", "--cut", "confidence",
                                                      "--p-min", "0.5"], 2, [],
     "DSpark draft has no confidence head: please set --spec-draft-p-min 0"),
    ("check/run-confidence-cut-on-dflash", [*RUN_DRAFT, "{drafter}", "--cut", "confidence", "--p-min", "0.5"], 2, [],
     "the confidence cut needs a DSpark drafter"),
    ("check/run-dspark-n-max-over-block", [*RUN_DRAFT, "{dspark_noconf}", "--n-max", "9"], 2, [],
     "drafts at most 8 tokens per step, the anchor's row included"),
    ("check/run-dspark-without-block-size", [*RUN_DRAFT, "{dspark_no_block_size}"], 2, [], "dflash.block_size"),
    ("check/run-dspark-d2t-outside-vocabulary", [*RUN_DRAFT, "{dspark_d2t_outside}"], 2, [],
     "tensor 'd2t': row 63 maps to 2048, outside the target ids 0..2047"),
    ("check/run-dspark-d2t-repeated-id", [*RUN_DRAFT, "{dspark_d2t_repeated}"], 2, [],
     "tensor 'd2t': maps two draft rows to one target id (rows 0 and 63 to 0)"),
    ("check/run-dspark-flag-not-bool", [*RUN_DRAFT, "{dspark_flag_not_bool}"], 2, [],
     "key 'dflash.sample_from_anchor': is 1, expected a boolean"),
    ("check/run-dspark-confidence-flag-without-tensor", [*RUN_DRAFT, "{dspark_conf_flag_no_tensor}", "--cut",
                                                         "confidence", "--p-min", "0.5"], 2, [],
     "says dflash.has_confidence_head but holds no conf_proj.weight"),
    ("check/run-drafter-head-rows-without-d2t", [*RUN_DRAFT, "{drafter_short_head}"], 2, [],      # llama.cpp's shape rule
     "tensor 'output.weight': has wrong shape; expected [128, 2048], got [128, 64]"),
    ("check/run-dspark-d2t-without-head", [*RUN_DRAFT, "{dspark_d2t_without_head}"], 2, [],
     "tensor 'd2t': holds 64 ids, so the drafter needs its own output.weight with 64 rows"),
    ("check/run-dspark-d2t-not-i64", [*RUN_DRAFT, "{dspark_d2t_i32}"], 2, [], "tensor 'd2t': is I32, expected I64"),
    ("check/run-dspark-lucebox-layout", [*RUN_DRAFT, "{dspark_lucebox}"], 2, [],
     "DSpark heads in the lucebox layout"),
    ("check/accept-dspark-confidence-cut-without-head", ["accept", "--target", "{target}", "--draft",
                                                         "{dspark_noconf}", "--cut", "confidence", "--p-min", "0.5",
                                                         "-q"], 2, [], "DSpark draft has no confidence head"),
    # 5c. draft trees (DDTree, reference §15): what a tree cannot mean, refused before any decoding
    ("check/run-tree-with-a-cut", [*RUN_DRAFT, "{drafter}", "--tree-budget", "22", "--cut", "margin", "--p-min",
                                   "0.35"], 2, [], "a cut stops a chain at its first unsure draft"),
    ("check/run-tree-top-k-beyond-vocabulary", [*RUN_DRAFT, "{drafter}", "--tree-budget", "22", "--tree-top-k",
                                                "4096"], 2, [], "--tree-top-k 4096: must lie in 1..2048"),
    ("check/run-tree-top-k-without-budget", [*RUN_DRAFT, "{drafter}", "--tree-top-k", "4"], 2, [],
     "--tree-top-k 4: needs --tree-budget"),
    ("check/run-tree-budget-zero", [*RUN_DRAFT, "{drafter}", "--tree-budget", "0"], 2, [], "1<=x<=2147483647"),
    ("check/run-tree-budget-without-draft", [*RUN, "--tree-budget", "22"], 2, [], "--tree-budget"),
    ("check/accept-tree-budgets-not-numbers", [*ACCEPT, "--tree-budget", "4,x"], 2, [],
     "expected node counts separated by commas"),
    ("check/accept-tree-budget-twice", [*ACCEPT, "--tree-budget", "4,22,4"], 2, [], "a budget given twice"),
    ("check/accept-tree-budget-zero", [*ACCEPT, "--tree-budget", "0,4"], 2, [], "at least one node"),
    ("check/accept-tree-top-k-without-budget", [*ACCEPT, "--tree-top-k", "4"], 2, [],
     "--tree-top-k needs --tree-budget"),
    ("check/accept-tree-top-k-beyond-vocabulary", [*ACCEPT, "--tree-budget", "4", "--tree-top-k", "4096"], 2, [],
     "--tree-top-k 4096: must lie in 1..2048"),
    # 7. bounds: every request is refused up front when it cannot fit, naming the limit
    ("bounds/run-beyond-context", ["run", "--target", "{target}", "--prompt-ids", "1,2,3", "-n", "100000"], 2, [],
     "context length"),
    *[(f"bounds/{cmd[0]}-n-beyond-context", [*cmd, "-n", "100000"], 2, [], "context length 512")
      for cmd in (ACCEPT, ["demo", "--skip-requant"])],
    ("bounds/accept-prompt-of-newlines", [*ACCEPT, "--prompts", "{prompts_newlines}"], 2, [],
     "newlines.jsonl:1: the prompt (500000 bytes) takes at least"),
    ("bounds/accept-prompt-of-a-1mb-word", [*ACCEPT, "--prompts", "{prompts_word}"], 2, [],
     "word.txt:1: the prompt (1048576 bytes) takes at least"),
    *[(f"bounds/{cmd[0]}-threads", [*cmd, "--threads", "100000"], 2, [], "--threads: 100000 is more than")
      for cmd in (RUN, ACCEPT, ["demo", "--skip-requant"])],
    *[(f"bounds/{cmd[0]}-ring-cap-beyond-memory", [*cmd, "--ring-cap", "1000000000"], 2, [],
       "a ring of --ring-cap 1000000000 slots")
      for cmd in (["run", "--target", "{target}", "--draft", "{drafter}", "--prompt-ids", "1,2"], ACCEPT,
                  ["demo", "--skip-requant"])],
    *[(f"bounds/{cmd[0]}-block-size-beyond-memory", cmd, 2, [], "4294967295")
      for cmd in (["run", "--target", "{target}", "--draft", "{drafter_huge_block}", "--prompt-ids", "1,2"],
                  ["accept", "--target", "{target}", "--draft", "{drafter_huge_block}", "-q", "-n", "4"])],
    # issue 39 (Trust III) A: a draft tree has at most k + k^2 + ... + k^n_max nodes (k ranks, --tree-top-k or
    # lucebox's 8, at each of n_max positions): a budget beyond is refused, on each drafter family (DFlash v1 n_max 7;
    # DSpark anchor-first n_max 8; DFlash2 k = its selector's top 4), and so is one whose verify would not fit the
    # memory (its masks grow with the square of the nodes); counts are C ints, 400 digits refused as they are parsed
    *[(f"bounds/run-tree-budget-beyond-a-tree-{name}", [*RUN_DRAFT, "{%s}" % name, "--tree-budget", str(most + 1)], 2,
       [], f"--tree-budget {most + 1}: more than the {most} nodes")
      for name, most in (("drafter", 2396744), ("ds_gguf", 19173960), ("dflash2", 21844))],
    ("bounds/run-tree-budget-beyond-the-chain", [*RUN_DRAFT, "{drafter}", "--tree-budget", "8", "--tree-top-k", "1"],
     2, [], "--tree-budget 8: more than the 7 nodes"),
    ("bounds/accept-tree-budget-beyond-a-tree", ["accept", "--target", "{target}", "--draft", "{dflash2}", "-q", "-n",
                                                 "4", "--tree-budget", "4,21845"], 2, [], "more than the 21844 nodes"),
    *[(f"bounds/{cmd[0]}-tree-budget-beyond-memory", [*cmd, "--tree-budget", budgets], 2, [],
       "--tree-budget 1000000: verifying a draft tree of 1000000 nodes")
      for cmd, budgets in (([*RUN_DRAFT, "{drafter}"], "1000000"), (ACCEPT, "4,1000000"))],
    ("bounds/run-dspark-tree-budget-beyond-memory", [*RUN_DRAFT, "{ds_gguf}", "--tree-budget", "1000000"], 2, [],
     "verifying a draft tree of 1000000 nodes"),
    *[(f"bounds/{cmd[0]}{option}-400-digits", [*cmd, option, value], 2, [], "(400 digits) is more than 2147483647")
      for cmd in ([*RUN_DRAFT, "{drafter}"], ACCEPT)
      for option, value in (("--tree-budget", "9" * 400), ("--ring-cap", "9" * 400), ("--tree-top-k", "9" * 400),
                            ("--n-max", "9" * 400), ("-n", "9" * 400), ("--threads", "9" * 400))],
    ("bounds/accept-tree-budget-list-400-digits", [*ACCEPT, "--tree-budget", "4," + "9" * 400], 2, [],
     "(400 digits) is more than 2147483647"),
    ("bounds/accept-tree-budget-list-5000-digits", [*ACCEPT, "--tree-budget", "9" * 5000], 2, [],
     "(5000 digits) is more than 2147483647"),
    *[(f"bounds/demo{option}-400-digits", ["demo", "--skip-requant", option, "9" * 400], 2, [],
       "(400 digits) is more than 2147483647") for option in ("--ring-cap", "-n", "--threads", "--rounds")],
    # issue 42: sampling options that cannot mean anything, refused before anything runs
    ("sampling/run-chain-option-at-temp-0", [*RUN, "--top-k", "5"], 2, [], "needs --temp above 0"),
    ("sampling/run-temp-beyond-float", [*RUN, "--temp", "1e308"], 2, [], "is not a finite 32-bit float"),
    ("sampling/run-unknown-sampler", [*RUN, "--temp", "1", "--samplers", "top_k;bogus"], 2, [],
     "unknown sampler 'bogus'"),
    ("sampling/run-draft-unsupported-sampler", [*RUN_DRAFT, "{drafter}", "--temp", "1", "--samplers", "infill"], 2,
     [], "not supported by ggtools' runtime"),
    ("sampling/run-seed-of-a-random-seed", [*RUN, "--temp", "1", "--seed", "4294967295"], 2, [], "--seed"),
    # issue 42 part 4 (test_accept.py's class): accept's temperatures and seeds, refused before anything is decoded
    ("sampling/accept-temp-nan", [*ACCEPT, "--temp", "0,nan"], 2, [], "nan is not a finite number"),
    ("sampling/accept-temp-negative", [*ACCEPT, "--temp", "0,-0.5"], 2, [], "-0.5 is not in the range x>=0"),
    ("sampling/accept-temp-twice-in-a-list", [*ACCEPT, "--temp", "0.6,0,0.6"], 2, [], "a temperature given twice"),
    ("sampling/accept-temp-twice-as-options", [*ACCEPT, "--temp", "0,0.6", "--temp", "0.6"], 2, [],
     "--temp: 0.6: a temperature given twice"),
    ("sampling/accept-temp-beyond-float", [*ACCEPT, "--temp", "0,1e308"], 2, [], "is not a finite 32-bit float"),
    ("sampling/accept-seeds-zero", [*ACCEPT, "--temp", "0.8", "--seeds", "0"], 2, [], "0 is not in the range 1<=x<=1000"),
    ("sampling/accept-seeds-huge", [*ACCEPT, "--temp", "0.8", "--seeds", "1001"], 2, [], "1<=x<=1000"),
    ("sampling/accept-seeds-400-digits", [*ACCEPT, "--temp", "0.8", "--seeds", "9" * 400], 2, [],
     "(400 digits) is more than 1000"),
    ("sampling/accept-seeds-past-the-largest-seed", [*ACCEPT, "--temp", "0.8", "--seed", "4294967294", "--seeds", "2"],
     2, [], "the seeds 4294967294..4294967295 pass 4294967294"),
    ("sampling/accept-chain-option-at-temp-0", [*ACCEPT, "--temp", "0", "--top-k", "5"], 2, [], "needs --temp above 0"),
    *[(f"sampling/accept{option}-at-temp-0", [*ACCEPT, option, "3"], 2, [], f"{option} 3: needs --temp above 0")
      for option in ("--seed", "--seeds")],
    ("sampling/accept-tree-without-greedy", [*ACCEPT, "--temp", "0.8", "--tree-budget", "4"], 2, [],
     "draft trees are measured with greedy decoding"),
    ("sampling/accept-target-sampling-key", ["accept", "--target", "{t_sampling_sequence}", "--draft", "{drafter}", "-q",
                                            "-n", "4", "--temp", "0.8"], 2, [], "general.sampling.sequence"),
    # issue 41 part 6 (test_accept.py's class): --draft mtp on a target without an MTP block, in llama.cpp's words
    *[(f"mtp/accept-draft-mtp-{name}", ["accept", "--target", "{%s}" % name, "--draft", "mtp", "-q", "-n", "4"], 2, [],
       "context type MTP requested but model doesn't contain MTP layers") for name in ("target", "q35")],
    # 10. a gate that cannot fail is refused: NaN compares false with everything
    ("gate/run-min-acceptance-nan", [*RUN, "--draft", "{drafter}", "--min-acceptance", "nan"], 2, [], "finite"),
    ("gate/run-p-min-nan", [*RUN, "--draft", "{drafter}", "--cut", "prob", "--p-min", "nan"], 2, [], "finite"),
    ("gate/accept-max-drop-nan", [*ACCEPT, "--max-drop", "nan"], 2, [], "finite"),
    ("gate/accept-min-tau-inf", [*ACCEPT, "--min-tau", "inf"], 2, [], "finite"),
    ("gate/accept-min-acceptance-nan", [*ACCEPT, "--min-acceptance", "nan"], 2, [], "finite"),
    ("gate/accept-min-acceptance-above-1", [*ACCEPT, "--min-acceptance", "1.5"], 2, [], "1.5"),
    ("gate/accept-p-min-nan", [*ACCEPT, "--p-min", "nan"], 2, [], "finite"),
    # 11. outputs: never one output over another, never an existing file without --force
    ("output/accept-report-and-plot-same-file", [*ACCEPT, "--report", "{root}/x.svg", "--plot", "{root}/x.svg"], 2,
     [], "--report and --plot name the same file"),
    ("output/accept-existing-report", [*ACCEPT, "--report", "{afile}"], 2, [],
     "output exists; pass --force to overwrite it (--report)"),
    ("output/accept-existing-plot", [*ACCEPT, "--plot", "{existing_svg}"], 2, [], "pass --force"),
    ("output/demo-work-dir-of-an-earlier-demo", ["demo", "--work-dir", "{demo_earlier}"], 2, [],
     "holds moe/ (an earlier demo's files): pass --force"),
    # 12. text: command-line text must be UTF-8 (paths may be any bytes), prompts files Unicode, lines end at \n
    ("text/run-prompt-not-utf8", [*RUN[:3], "--prompt", "x\udcff"], 2, [], "not UTF-8 text: byte 0xff"),
    ("text/convert-name-not-utf8", [*CONVERT, "-o", "{root}/d.gguf", "--name", "\udcfe"], 2, [], "not UTF-8 text"),
    ("text/patch-value-not-utf8", ["patch", "set", "{good}", "x.y=str:\udcff", "-o", "{root}/p.gguf"], 2, [],
     "not UTF-8 text"),
    ("text/patch-key-not-utf8", ["patch", "rm", "{good}", "x.\udcff", "-o", "{root}/p.gguf"], 2, [],
     "not UTF-8 text"),
    ("text/quantize-scheme-not-utf8", ["quantize", "{good}", "-o", "{root}/q.gguf", "--scheme", "q8\udcff"], 2, [],
     "not UTF-8 text"),
    ("text/inspect-path-not-utf8", ["inspect", "{root}/\udcff.gguf"], 2, [], "not found"),
    ("text/accept-prompt-lone-surrogate", [*ACCEPT, "--prompts", "{prompts_surrogate}"], 2, [],
     "surrogate.jsonl:1: \"prompt\" holds a lone surrogate U+D800"),
    ("text/accept-id-lone-surrogate", [*ACCEPT, "--prompts", "{prompts_surrogate_id}"], 2, [],
     "\"id\" holds a lone surrogate U+DFFF"),
    ("text/accept-prompts-deep-json", [*ACCEPT, "--prompts", "{prompts_deep}"], 2, [], "nested too deeply"),
    ("text/accept-prompts-line-separators", [*ACCEPT, "--prompts", "{prompts_separators}"], 0, [], None),
    # 13. messages name the file, the option and the value
    ("message/accept-target-is-a-directory", ["accept", "--target", "{outdir}", "--draft", "{drafter}"], 2, [],
     "is a directory, not a regular file (--target)"),
    # 8. one exit-code policy: plan-time refusals, nothing left behind
    ("policy/quantize-override-unwritable-type", ["quantize", "{good}", "-o", "{root}/q.gguf", *Q8,
                                                  "--tensor-type", "x=mxfp4"], 2, [], "cannot write MXFP4"),
    ("policy/requant-to-unwritable-type", ["requant-trunk", "{set}", "-o", "{root}/rq", "--to", "mxfp4"], 2, [],
     "cannot write MXFP4"),
    ("policy/unknown-command", ["frobnicate"], 2, [], "No such command"),
    # 10. DSpark: every refusal of convert (llama.cpp's converter's and ggtools' own), of a layout move, and the checks
    *[(f"dspark/convert-{case}", ["convert", "dflash", "{ds_%s}" % case, "--target-gguf", "{target}", "-o",
                                  "{root}/d.gguf"], 2, [], fragment) for case, fragment in (
        ("markov-type", "unsupported markov_head_type 'gated' (only 'vanilla' is supported)"),
        ("no-d2t", "draft_vocab_size 512 < vocab_size 2048 but no d2t table found"),
        ("d2t-size", "d2t size 509 does not match draft_vocab_size 512"),
        ("d2t-duplicate", "d2t contains duplicate target ids"),
        ("d2t-range", "d2t target ids out of range for target vocab size 2048"),
        ("d2t-bool", "dtype BOOL"), ("d2t-fraction", "not whole numbers"),
        ("no-markov", "without its Markov head"), ("w1-vocab", "vocab_size 2048 x markov rank"),
        ("w2-rank", "the rank of markov_head.markov_w1.weight"), ("rank-config", "says markov_rank 64"),
        ("conf-shape", "hidden_size 128 + markov rank 32"), ("conf-bias-only", "without confidence_head.proj.weight"),
        ("reduced-no-head", "no lm_head.weight [512, 128]"), ("draft-vocab-too-big", "exceeds vocab_size 2048"),
        ("anchor-not-bool", "is not true or false"), ("tlc-not-object", "transformer_layer_config"),
        ("aux-zero", "each is at least 1"), ("int-weight", "a weight must be one of"),
        ("scale-size", "the scale of markov_w2 is one value"), ("gemma4", "Gemma 4 backbone"),
        ("no-vocab", "vocab_size: missing (a DSpark drafter's Markov head"), ("draft-vocab-type", "'512' is not a "),
        ("w1-1d", "the Markov embedding is [vocab_size, rank]"),
        ("vocab-4096", "differs from the target's vocabulary"))],
    *[(f"dspark/convert-lucebox-{case}", ["convert", "dflash", "{ds_%s}" % case, "--profile", "lucebox", "-o",
                                          "{root}/d.gguf"], 2, [], fragment) for case, fragment in (
        ("base", "bonus-anchor blocks only"), ("reduced-bonus", "draft vocabulary is smaller"),
        ("scaled-bonus", "markov_w2 has a scale"))],
    *[(f"dspark/gguf-layout-{case}", ["convert", "gguf-layout", "{%s}" % src, "--to", "lucebox", "-o",
                                      "{root}/l.gguf"], 2, [], fragment) for case, src, fragment in (
        ("anchor-first", "ds_gguf", "bonus-anchor blocks only"), ("d2t", "ds_red_gguf", "draft vocabulary is smaller"),
        ("no-bias", "ds_nobias_gguf", "confidence head has no bias"),
        ("heads-without-markov-w1", "ds_now1_gguf", "nothing says the Markov rank"))],
    ("check/gguf-layout-writes-nothing-validate-fails", ["convert", "gguf-layout", "{d_block0}", "--to", "lucebox",
                                                         "-o", "{root}/l.gguf"], 2, [],
     "refusing to write an output that ggtools validate would fail"),
    ("dspark/doctor-to-lucebox", ["doctor", "{ds_gguf}", "--fix", "--to", "lucebox", "-o", "{root}/l.gguf"], 2, [],
     "bonus-anchor blocks only"),
    ("dspark/validate-no-block-size", ["validate", "{ds_nobs_gguf}"], 1, [], None),
    ("dspark/doctor-no-block-size", ["doctor", "{ds_nobs_gguf}"], 1, [], None),
    # issue 41: EAGLE3 drafters (hostile_corpus.EAGLE3_HF_CASES, EAGLE3_GGUF_CASES): convert drafter refuses, before
    # writing, each checkpoint llama.cpp's converter or loader refuses (in its words) or cannot draft with; validate,
    # doctor and quantize refuse the broken files; pair-check fails a pair llama.cpp cannot draft
    *[(f"eagle3/convert-{case}", ["convert", "drafter", "{e3_hf_%s}" % case, "--target-gguf", "{target}",
                                  *E3_OUT], 2, [], fragment) for case, (_, fragment) in EAGLE3_HF_CASES.items()],
    ("eagle3/convert-no-target", ["convert", "drafter", "{e3_hf}", *E3_OUT], 2, [], "pass --target-gguf"),
    ("eagle3/convert-pickle", ["convert", "drafter", "{e3_hf_bin}", "--target-gguf", "{target}", *E3_OUT], 2, [],
     "pytorch_model.bin: a pickled PyTorch checkpoint"),
    ("eagle3/convert-lucebox", ["convert", "drafter", "{e3_hf}", "--target-gguf", "{target}", "--profile", "lucebox",
                                *E3_OUT], 2, [], "no EAGLE3 loader"),
    ("eagle3/convert-over-checkpoint", ["convert", "drafter", "{e3_hf}", "--target-gguf", "{target}", "-o",
                                        "{e3_hf}/model.safetensors", "--force"], 2, [], "is an input"),
    ("eagle3/convert-good", ["convert", "drafter", "{e3_hf}", "--target-gguf", "{target}", "-q", "-o",
                             "{root}/e3_out.gguf"], 0, ["{root}/e3_out.gguf"], None),
    *[(f"eagle3/validate-{case}", ["validate", "{e3_%s}" % case], 1, [], fragment)
      for case, (*_, fragment) in EAGLE3_GGUF_CASES.items()],
    *[(f"eagle3/doctor-{case}", ["doctor", "{e3_%s}" % case], 1, [], fragment)
      for case, (*_, fragment) in EAGLE3_GGUF_CASES.items()],
    *[(f"eagle3/quantize-{case}", ["quantize", "{e3_%s}" % case, "-o", "{root}/q.gguf", *Q8], 2, [], fragment)
      for case, (*_, fragment) in EAGLE3_GGUF_CASES.items()],
    ("eagle3/pair-check-other-model", ["pair-check", "{good}", "{e3_gguf}"], 1, [], "target_hidden_size"),
    ("eagle3/doctor-fix", ["doctor", "{e3_gguf}", "--fix", "-o", "{root}/f.gguf"], 2, [], "an EAGLE3 drafter"),
    ("eagle3/doctor-lucebox", ["doctor", "{e3_gguf}", "--runtime", "lucebox"], 2, [], "no EAGLE3 drafting"),
    # issue 39 (Trust III), convert A: every number of config.json is read through one checked reader (its type,
    # finite, the range of what it becomes), on each layout and path (convert both profiles, accept --draft HF_DIR,
    # doctor --hf): one line naming config.json, the key where it is kept and the rule (hostile_corpus.HF_NUMBER_CASES)
    *[(f"config/convert-{case}", [*CONVERT_TO, "{hf_%s}" % case, *TO_D], 2, [], fragment) for case, fragment in (
        ("v1_block_2p32", "config.json: key 'dflash_config.block_size': 4294967296 is outside 0..4294967295"),
        ("v1_layers_1e9", "config.json: key 'num_hidden_layers': 1000000000 is outside 1..512"),
        ("v1_theta_str", "config.json: key 'rope_parameters.rope_theta': 'abc' is not a number"),
        ("v1_eps_nan", "config.json: key 'rms_norm_eps': nan is not a finite number"),
        ("v1_ctx_fraction", "config.json: key 'max_position_embeddings': 512.5 is not an integer"),
        ("v1_ids_2p40", "config.json: key 'dflash_config.target_layer_ids[1]': 1099511627776 is outside 0..511"),
        ("v1_mask_2p32", "config.json: key 'dflash_config.mask_token_id': 4294967296 is outside 0..4294967295"),
        ("v1_rope_scaling_list", "config.json: key 'rope_parameters': [1, 2] is not a JSON object"),
        ("v1_digits", "config.json: cannot read as JSON: Exceeds the limit (4300 digits)"),
        ("v2_rank_2p32", "config.json: key 'dflash_config.selector_rank': 4294967296 is outside 0..4294967295"),
        ("v2_theta_inf", "config.json: key 'rope_parameters.rope_theta': inf is not a finite number"),
        ("flat_theta_str", "config.json: key 'rope_parameters.rope_theta': 'abc' is not a number"),
        ("flat_block_2p32", "config.json: key 'block_size': 4294967296 is outside 0..4294967295"),
        ("flat_draft_vocab_2p40", "config.json: key 'draft_vocab_size': 1099511627776 is outside 0..4294967295"),
        ("spec_theta_str", "key 'transformer_layer_config.rope_parameters.rope_theta': 'abc' is not a number"),
        ("spec_theta_nan", "key 'transformer_layer_config.rope_parameters.rope_theta': nan is not a finite number"),
        ("spec_layers_1e9", "key 'transformer_layer_config.num_hidden_layers': 1000000000 is outside 1..512"),
        ("spec_aux_2p33", "key 'aux_hidden_state_layer_ids[1]': 8589934592 is outside 1..512"))],
    *[(f"config/convert-lucebox-{case}", ["convert", "dflash", "{hf_%s}" % case, "--profile", "lucebox", *TO_D], 2, [],
       fragment) for case, fragment in (
        ("v1_eps_nan", "config.json: key 'rms_norm_eps': nan is not a finite number"),
        ("v1_theta_str", "config.json: key 'rope_theta': 'abc' is not a number"),
        ("v1_layers_1e9", "config.json: key 'num_hidden_layers': 1000000000 is outside 1..512"))],
    *[(f"config/accept-draft-hf-{case}", ["accept", "--target", "{target}", "--draft", "{hf_%s}" % case, "-q", "-n",
                                          "4"], 2, [], fragment) for case, fragment in (
        ("v1_theta_str", "key 'rope_parameters.rope_theta': 'abc' is not a number"),
        ("spec_theta_str", "key 'transformer_layer_config.rope_parameters.rope_theta': 'abc' is not a number"),
        ("v1_layers_1e9", "key 'num_hidden_layers': 1000000000 is outside 1..512"),
        ("v1_block_1", "refusing to write an output that ggtools validate would fail: is 1: a drafter's block"),
        ("ds_overlap", "overlap tensor 'markov_head.markov_w1.weight'"))],
    *[(f"config/doctor-hf-{case}", ["doctor", "{%s}" % drafter, "--hf", "{hf_%s}" % case], 2, [], fragment)
      for drafter, case, fragment in (
        ("drafter", "v1_theta_str", "config.json: key 'rope_theta': 'abc' is not a number"),
        ("drafter", "v1_eps_nan", "config.json: key 'rms_norm_eps': nan is not a finite number"),
        ("drafter", "v1_block_2p32", "key 'dflash_config.block_size': 4294967296 is outside 0..4294967295"),
        ("ds_gguf", "flat_theta_str", "config.json: key 'rope_theta': 'abc' is not a number"))],
    # issue 39 (Trust III), convert B: a value of the right type the model-file rules refuse is refused before anything
    # is written, in validate's words (before: exit 0 and a drafter validate fails; a block of 1 drafts nothing)
    *[(f"config/convert-{case}", [*CONVERT_TO, "{hf_%s}" % case, *TO_D], 2, [], f"key '{key}': {REFUSED}{rule}")
      for case, key, rule in (
        ("v1_block_1", "dflash.block_size", "is 1: a drafter's block is the anchor and at least one mask (2 or more)"),
        ("v1_block_2p31", "dflash.block_size", "is 2147483648, above the drafter's context_length 512"),
        ("v1_eps_negative", "dflash.attention.layer_norm_rms_epsilon", "is -"),
        ("v2_block_1", "dflash.block_size", "is 1: a drafter's block is the anchor"),
        ("flat_block_1", "dflash.block_size", "is 1: a drafter's block is the anchor"),
        ("spec_block_1", "dflash.block_size", "is 1: a drafter's block is the anchor"),
        ("spec_block_2p31", "dflash.block_size", "is 2147483648, above the drafter's context_length 512"))],
    ("config/convert-lucebox-v1_block_1", ["convert", "dflash", "{hf_v1_block_1}", "--profile", "lucebox", *TO_D], 2,
     [], f"key 'qwen35-dflash-draft.dflash.block_size': {REFUSED}is 1: a drafter's block is the anchor"),
    # issue 39 (Trust III), convert C: safetensors tensors whose byte ranges overlap (safetensors' reader: invalid offset)
    ("config/convert-overlapping-markov-heads", [*CONVERT_TO, "{hf_ds_overlap}", *TO_D], 2, [],
     "model.safetensors: tensor 'markov_head.markov_w2.weight': data_offsets"),
]


def _fill(items, corpus):
    return [x.format(**corpus) for x in items]


@pytest.mark.parametrize("row", ROWS, ids=[r[0] for r in ROWS])
def test_hostile(corpus, row):
    _, args, code, outputs, fragment = row
    args, outputs = _fill(args, corpus), _fill(outputs, corpus)
    check_run(corpus["root"], args, code, outputs, fragment)
    if code and args[0] in COMMANDS_WITH_JSON:
        result = check_run(corpus["root"], _with_json(args), code, outputs, fragment)
        data = json.loads(result.stdout)
        assert (data["error"], data["exit_code"]) == (result.stderr[len("error: "):].strip(), code)


def _with_json(args):
    """--json right after the command (before any positional path), so the subcommand takes it."""
    n = 2 if args[0] in ("patch", "convert") else 1
    return args[:n] + ["--json"] + args[n:]


COMMANDS_WITH_JSON = {"inspect", "validate", "convert", "pair-check", "patch", "quantize", "requant-trunk", "run",
                      "demo", "doctor", "accept"}


def test_resume_is_suggested_only_where_it_exists(corpus):
    result = check_run(corpus["root"], _fill(["quantize", "{good}", "-o", "{afile}", *Q8], corpus), 2)
    assert "--resume" not in result.stderr


def test_every_command_has_rows():
    """A new command must come with its rows (the CLI's command table is the list)."""
    from ggtools.cli import COMMANDS
    covered = {r[1][0] for r in ROWS}
    assert set(COMMANDS) - covered == set(), set(COMMANDS) - covered


def test_nan_rope_base_is_named_as_such(corpus):
    """A NaN RoPE base is not "a separate RoPE base for sliding-window layers" (NaN != NaN): the finite rule speaks."""
    result = check_run(corpus["root"], _fill(["run", "--target", "{t_base_nan}", *FEW], corpus), 2)
    assert "must be a finite number" in result.stderr and "sliding-window" not in result.stderr


def test_the_reproductions_name_the_rope_rule(corpus):
    """The original reproductions (rope.dimension_count 999, or twice the head size) on every arch: one clean line
    with the rule (these crashed the process with SIGSEGV or "double free or corruption" before it)."""
    for name in ("t_rot999", "t_rot128", "q35_rot999", "q35_rot32", "oss_rot999", "oss_rot32"):
        result = check_run(corpus["root"], _fill(["run", "--target", "{%s}" % name, *FEW], corpus), 2)
        assert "the head size is" in result.stderr, name
    for name in ("d_rot999", "d_rot128"):
        result = check_run(corpus["root"], _fill(["run", "--target", "{target}", "--draft", "{%s}" % name, *FEW],
                                                 corpus), 2)
        assert "the head size is 64" in result.stderr, name


# issue 39 (Trust III) C: every environment setting ggtools reads (ggtools/environment.py) refuses a value it does not
# know, misspelt or with a trailing space, naming the variable, the value and the accepted values (it ran as auto)
@pytest.mark.parametrize("name, value", [("GGTOOLS_EXPERT_PAGING", "bogus"), ("GGTOOLS_EXPERT_PAGING", "off "),
                                         ("GGTOOLS_CHECK_DIRECT_CALLS", "2"), ("GGTOOLS_CHECK_DIRECT_CALLS", "yes!")])
@pytest.mark.parametrize("command", [RUN, [*RUN_DRAFT, "{drafter}"], ACCEPT, ["demo", "--skip-requant"]],
                         ids=["run", "run-draft", "accept", "demo"])
def test_misspelt_environment_setting_is_refused(corpus, monkeypatch, name, value, command):
    monkeypatch.setenv(name, value)
    check_run(corpus["root"], _fill(command, corpus), 2, [], f"environment variable {name}={value!r}: not one of")


@pytest.mark.parametrize("value", ["on", "OFF", "auto", "1", "no", ""])
def test_every_accepted_environment_value_runs(corpus, monkeypatch, value):
    monkeypatch.setenv("GGTOOLS_EXPERT_PAGING", value)
    check_run(corpus["root"], _fill(RUN, corpus), 0)


def test_corpus_makes_no_files_outside_its_directory(corpus):
    assert all(os.path.abspath(p).startswith(corpus["root"]) for k, p in corpus.items() if k != "root")
