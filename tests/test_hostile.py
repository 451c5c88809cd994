"""The hostile corpus over every command: one row per (case class, command invocation).

Each row runs in-process against one corpus directory and checks the four properties (hostile_corpus.py):
the exit code, one line on stderr without a traceback, every input unchanged, no new file but the intended
output. A new command is one more row. Rows that fail get the same run with --json, which must print
{"error": ..., "exit_code": ...} on stdout.
"""

import json
import os

import pytest

from tests.hostile_corpus import HOSTILE_MANIFESTS, build_corpus, check_run


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return build_corpus(tmp_path_factory.mktemp("corpus"))


CONVERT = ["convert", "dflash", "{hf}", "--target-gguf", "{target}"]
Q8 = ["--scheme", "q8_0"]

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
     "out of range"),
    *[(f"input/run-kimi-k3-{case}", ["run", "--target", "{k3_%s}" % case, "--prompt-ids", "1"], 2, [], fragment)
      for case, fragment in [("kv_heads", "'kimi-k3.attention.head_count_kv' holds [0, 2]"),
                             ("kv_heads_count", "'kimi-k3.attention.head_count_kv' has 3 entries for 2 layers"),
                             ("gating", "'kimi-k3.expert_gating_func' is not 2 (sigmoid)"),
                             ("key_length", "'kimi-k3.attention.key_length' is not kv_lora_rank + rope"),
                             ("rope", "'kimi-k3.rope.dimension_count' is not below attention.key_length_mla"),
                             ("situ", "'kimi-k3.activation.situ_beta' is 0"),
                             ("used", "5 experts used of 4"),
                             ("no_kda_head_dim", "missing key 'kimi-k3.kda.head_dim'")]],
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
    ("message/quantize-existing-output", ["quantize", "{good}", "-o", "{afile}", *Q8], 2, [],
     "output exists; pass --force to overwrite it"),
    ("message/requant-existing-output", ["requant-trunk", "{set}", "-o", "{outdir_link}", "-q"], 2, [],
     "or --resume to continue"),
    # 5. a check never passes what it did not check; nothing is written that validate rejects
    ("check/validate-empty-manifest", ["validate", "--manifest", "{manifest_empty}", "{good}"], 1, [], None),
    ("check/validate-manifest-lists-none", ["validate", "--manifest", "{manifest_other}", "{good}"], 1, [], None),
    ("check/requant-split-count-disagrees", ["requant-trunk", "{badsplit}", "-o", "{root}/rq", "-q"], 2, [],
     "split.count"),
    ("check/patch-rm-architecture", ["patch", "rm", "{good}", "general.architecture", "-o", "{root}/p.gguf"], 2, [],
     "general.architecture"),
    ("check/patch-split-count-on-single-file", ["patch", "set", "{good}", "split.count=u16:5", "-o",
                                                "{root}/p.gguf"], 2, [], "split.count"),
    ("check/patch-alignment-not-a-power-of-two", ["patch", "set", "{good}", "general.alignment=u32:48", "-o",
                                                  "{root}/p.gguf"], 2, [], None),
    ("check/convert-target-without-tokenizer", ["convert", "dflash", "{hf}", "--target-gguf", "{notok}", "-o",
                                                "{root}/d.gguf"], 2, [], "no tokenizer"),
    # 6. non-finite values are never hidden
    ("nonfinite/quantize-nan-weights", ["quantize", "{nan_f32}", "-o", "{root}/q.gguf", *Q8], 2, [], "row 2"),
    ("nonfinite/quantize-nan-weights-allowed", ["quantize", "{nan_f32}", "-o", "{root}/q.gguf", *Q8,
                                                "--allow-nonfinite"], 0, ["{root}/q.gguf", "{root}/q.ggtools.json"],
     None),
    ("nonfinite/requant-nan-scale", ["requant-trunk", "{nan_q8}", "-o", "{root}/rq", "-q"], 2, [], "row 1"),
    ("nonfinite/requant-copied-nan-scale", ["requant-trunk", "{nan_q8_copy}", "-o", "{root}/rq", "-q"], 2, [],
     "refusing to copy them as verified"),
    # 7. bounds
    ("bounds/run-beyond-context", ["run", "--target", "{target}", "--prompt-ids", "1,2,3", "-n", "100000"], 2, [],
     "context length"),
    # 8. one exit-code policy: plan-time refusals, nothing left behind
    ("policy/quantize-override-unwritable-type", ["quantize", "{good}", "-o", "{root}/q.gguf", *Q8,
                                                  "--tensor-type", "x=mxfp4"], 2, [], "cannot write MXFP4"),
    ("policy/requant-to-unwritable-type", ["requant-trunk", "{set}", "-o", "{root}/rq", "--to", "mxfp4"], 2, [],
     "cannot write MXFP4"),
    ("policy/unknown-command", ["frobnicate"], 2, [], "No such command"),
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


def test_corpus_makes_no_files_outside_its_directory(corpus):
    assert all(os.path.abspath(p).startswith(corpus["root"]) for k, p in corpus.items() if k != "root")
