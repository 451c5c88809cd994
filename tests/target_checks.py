"""Checks on a target model that the tests of several archs share: crop then generate equals never going further
(the KV cache and a recurrent state rolled back), and `ggtools run` refusing a file with a patched key in one
line."""

import numpy as np

from ggtools.runtime import greedy


def assert_crop_equals_never_going_further(model, ids) -> None:
    """Crop back into the generated tokens and into the prompt, then go on: the same logits, bit for bit, as a fresh
    run that made the same calls up to there."""
    model.kv.clear()
    generated, _ = greedy(model, ids, 12)     # the prompt as one batch, then one-token steps

    def run_to(keep):
        model.kv.clear()
        model.forward(ids[:keep], logits="none")
        for token in generated[:max(0, keep - len(ids))]:
            model.forward([token], logits="none")

    for keep in (len(ids) + 5, len(ids) - 3, 2):
        model.kv.crop(keep)
        after_crop = model.forward([7, 8, 9])[0]
        continued, _ = greedy(model, [10], 6)
        run_to(keep)
        assert np.array_equal(after_crop, model.forward([7, 8, 9])[0])
        assert continued == greedy(model, [10], 6)[0]
        run_to(len(ids) + 11)


def assert_run_refuses_patched(source, edit: str, message: str, tmp_path) -> None:
    """`ggtools patch set` applies `edit` to a copy of source; `ggtools run` on it names the file and the rule
    (`message`) in one line and exits 2, no traceback; the source is not modified."""
    from click.testing import CliRunner

    from ggtools.cli import main as cli

    before = source.stat().st_mtime_ns
    bad = tmp_path / "bad.gguf"
    patched = CliRunner().invoke(cli, ["patch", "set", str(source), edit, "-o", str(bad)])
    assert patched.exit_code == 0, patched.output
    result = CliRunner().invoke(cli, ["run", "--target", str(bad), "--prompt-ids", "1,2,3", "-n", "2"])
    assert result.exit_code == 2, result.output
    assert message in result.output and str(bad) in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert source.stat().st_mtime_ns == before
