"""EAGLE3 and MTP drafting through the one speculative loop (runtime/drafter/autoregressive.py, eagle3.py, mtp.py):
the output is always the target's greedy decoding, whatever the family, the layout, the quantization, the
settings (n_max, the prob cut, n_min, draft trees) and the backend; committed rows are batch-invariant; torch in f32
drafts exactly as numba does; what cannot draft is refused in one line.

The graphs against libllama's and the whole loop against llama-speculative-simple: test_eagle3_mtp_oracle.py.
"""

import numpy as np
import pytest

from ggtools.errors import GGToolsError
from ggtools.gguf import GGUFFile
from ggtools.jobs.run import run_speculative
from ggtools.runtime import DraftSettings, ModelError, TargetModel, greedy, open_drafter, speculative_generate
from ggtools.runtime.drafter.autoregressive import PairKV
from ggtools.runtime.errors import SettingsError
from gguf import GGUFValueType as VT
from tests.speculative_checks import Recording
from tests.test_convert_support import rewrite_gguf

PROMPTS = [[1, 415, 29, 88, 301, 7], [5, 9, 200, 17, 33, 44, 100, 12, 640]]
N = 20
LAYOUTS = ("llama-eagle3", "specforge", "speculators", "draft-model", "eagle3.1")


@pytest.fixture(scope="module")
def pairs(tiny_target, eagle3_drafters, eagle3_demo, mtp_targets):
    """name -> (target GGUF, --draft): every EAGLE3 layout for the tiny qwen3 target (f16; llama-eagle3 also q8_0
    and llama.cpp's Q2_K), the demo target's EAGLE3 drafter, each MTP target's own block and its sidecar."""
    from ggtools.jobs.demo import demo_data
    out = {f"eagle3/{layout}": (tiny_target.gguf["f16"], eagle3_drafters(layout, "f16")) for layout in LAYOUTS}
    out["eagle3/llama-eagle3-q8_0"] = (tiny_target.gguf["f32"], eagle3_drafters("llama-eagle3", "q8_0"))
    out["eagle3/llama-eagle3-Q2_K"] = (tiny_target.gguf["f16"], eagle3_drafters.quants["llama-eagle3/Q2_K"])
    out["eagle3/demo"] = (demo_data() / "target.gguf", eagle3_demo["ref"])
    for arch, t in mtp_targets.items():
        out[f"mtp/{arch}"] = (t("default", "f16"), "mtp")
        out[f"mtp/{arch}-q8_0"] = (t("default", "q8_0"), "mtp")
        out[f"mtp/{arch}-sidecar"] = (t("no-mtp", "f16"), t("mtp", "f16"))
    out["mtp/qwen35moe-mxfp4"] = (mtp_targets["qwen35moe"].gguf["mxfp4_moe"], "mtp")
    return out


_loaded = {}


def _load(pairs, name, backend="numba"):
    key = (name, backend)
    if key not in _loaded:
        target, draft = pairs[name]
        model = TargetModel(target, backend=backend)
        _loaded[key] = (model, open_drafter(draft, model))
    return _loaded[key]


def _references(model, n=N):
    out = []
    for p in PROMPTS:
        model.kv.clear()
        out.append(greedy(model, p, n)[0])
    return out


SETTINGS = {"default": DraftSettings(), "n_max 1": DraftSettings(n_max=1), "n_max 6": DraftSettings(n_max=6),
            "prob cut": DraftSettings(n_max=5, cut="prob", p_min=0.5, n_min=2),
            "margin cut": DraftSettings(n_max=4, cut="margin", p_min=0.3),
            "tree": DraftSettings(n_max=4, tree_budget=10, tree_top_k=3)}
NAMES = [f"eagle3/{layout}" for layout in LAYOUTS] + [
    "eagle3/llama-eagle3-q8_0", "eagle3/llama-eagle3-Q2_K", "eagle3/demo", "mtp/qwen35", "mtp/qwen35-q8_0",
    "mtp/qwen35-sidecar", "mtp/qwen35moe", "mtp/qwen35moe-q8_0", "mtp/qwen35moe-sidecar", "mtp/qwen35moe-mxfp4"]


@pytest.mark.parametrize("name", NAMES)
def test_output_equals_greedy(pairs, name):
    """Every family and layout, every setting, the draft KV full and as a ring over the whole context."""
    model, drafter = _load(pairs, name)
    want = _references(model)
    for setting, s in SETTINGS.items():
        for prompt, ref in zip(PROMPTS, want):
            kv = drafter.new_kv(None if setting != "default" else 64)
            out = speculative_generate(model, drafter, kv, prompt, N, settings=s)
            assert out.tokens == ref, (name, setting)
            n_max = s.n_max or 3
            assert all(step.drafted <= (s.tree_budget or n_max) for step in out.steps)
            assert sum(step.produced for step in out.steps) == N - 1


def test_drafts_stop_where_the_prob_cut_says(pairs):
    """--cut prob --p-min: the drafts offered are the chain up to its first p < p_min (llama.cpp stops drafting
    there), and fewer than n_min drafts are none."""
    model, drafter = _load(pairs, "eagle3/specforge")
    rec = Recording(drafter)
    s = DraftSettings(n_max=5, cut="prob", p_min=0.6, n_min=2)
    out = speculative_generate(model, rec, drafter.new_kv(), PROMPTS[1], N, settings=s)
    assert len(rec.chains) == len(out.steps)
    cut = 0
    for chain, step in zip(rec.chains, out.steps):
        keep = next((i for i, v in enumerate(chain.p) if v < s.p_min), len(chain.p))
        assert step.drafted == (keep if keep >= s.n_min else 0)
        cut += keep < len(chain.tokens)
    assert cut, "no chain was cut: the test proves nothing"


def test_a_tree_of_one_rank_is_the_chain(pairs):
    """A draft tree reads each chain row's top K; with K = 1 and a budget of n_max it is the chain, step for step."""
    model, drafter = _load(pairs, "mtp/qwen35")
    chain = speculative_generate(model, drafter, drafter.new_kv(), PROMPTS[0], N, settings=DraftSettings(n_max=4))
    tree = speculative_generate(model, drafter, drafter.new_kv(), PROMPTS[0], N,
                                settings=DraftSettings(n_max=4, tree_budget=4, tree_top_k=1))
    assert tree.steps == chain.steps and tree.tokens == chain.tokens


@pytest.mark.parametrize("name", ["eagle3/speculators", "mtp/qwen35moe"])
def test_committed_rows_do_not_depend_on_their_batch(pairs, name):
    """The decoder KV appended a step at a time (prefill rows, then each step's accepted rows) holds the same bits as
    the same rows appended in one batch: a row is what llama.cpp's one-row decode of it gives, wherever it came."""
    model, drafter = _load(pairs, name)
    calls = []

    class Logged(PairKV):
        def begin_step(self, committed, features, tokens):
            calls.append((committed, features.copy(), list(tokens)))
            super().begin_step(committed, features, tokens)

    kv = Logged(drafter)
    speculative_generate(model, drafter, kv, PROMPTS[1], N, settings=DraftSettings(n_max=3))
    committed, _, tokens = calls[-1]
    # every position's features, each from the step that committed it
    rows = np.zeros((committed, calls[0][1].shape[1]), np.float32)
    for c, f, _ in calls:
        rows[c - len(f):c] = f
    whole = PairKV(drafter)
    whole.begin_step(committed, rows, tokens)
    n = kv.rows
    assert n == whole.rows == committed - drafter.shift
    assert np.array_equal(kv.cache.k[0][:, :n], whole.cache.k[0][:, :n])
    assert np.array_equal(kv.cache.v[0][:, :, :n], whole.cache.v[0][:, :, :n])
    assert np.array_equal(kv.tail, whole.tail)


@pytest.mark.parametrize("name", ["eagle3/speculators", "mtp/qwen35",
                                  pytest.param("eagle3/eagle3.1", marks=pytest.mark.slow),
                                  pytest.param("mtp/qwen35moe-sidecar", marks=pytest.mark.slow)])
def test_torch_drafts_as_numba_does(pairs, name):
    """torch in f32 on the CPU: the same chains (tokens and p, from bit-equal logits), steps and output as numba."""
    pytest.importorskip("torch")
    runs = []
    for backend in ("numba", "torch"):
        model, drafter = _load(pairs, name, backend)
        rec = Recording(drafter)
        out = speculative_generate(model, rec, drafter.new_kv(), PROMPTS[0], 8, settings=DraftSettings(n_max=4))
        runs.append(([(c.tokens, c.p) for c in rec.chains], out.steps, out.tokens))
    assert runs[0] == runs[1]


def test_run_job_reports_the_family(pairs):
    """run_speculative: output checked against target-only decoding, the family and kind named, n_max 3 by default
    (llama.cpp's --spec-draft-n-max), the decoder KV's bytes."""
    target, draft = pairs["mtp/qwen35-sidecar"]
    run = run_speculative(str(target), str(draft), PROMPTS, N, ring_cap=None, stop_at_eog=False)
    assert run.outputs_match_target and run.family == "mtp" and run.drafter_kind == "MTP (sidecar)"
    assert run.settings["n_max"] == 3 and run.draft_kv == "full" and run.draft_kv_bytes > 0
    target, draft = pairs["eagle3/speculators"]
    run = run_speculative(str(target), str(draft), PROMPTS[:1], N, ring_cap=4096, stop_at_eog=False)
    assert run.outputs_match_target and run.family == "eagle3" and run.draft_kv == "ring:4096"


# ---- refusals ---------------------------------------------------------------------------------------------------

def _refused(target, draft, fragment, error=ModelError):
    model = TargetModel(target)
    try:
        with pytest.raises(error) as e:
            open_drafter(draft, model)
    finally:
        model.close()
    assert fragment in str(e.value)
    assert "\n" not in str(e.value)


def test_mtp_without_an_mtp_block_is_refused(mtp_targets, tiny_target):
    _refused(mtp_targets["qwen35"]("no-mtp", "f16"), "mtp", "qwen35.nextn_predict_layers is absent or 0: context type "
             "MTP requested but model doesn't contain MTP layers (llama.cpp): the model holds no MTP block")
    _refused(tiny_target.gguf["f16"], "mtp", "qwen3.nextn_predict_layers is absent or 0: context type MTP requested "
             "but model doesn't contain MTP layers")


def test_a_sidecar_of_another_model_is_refused(mtp_targets, tiny_target, tmp_path):
    sidecar = mtp_targets["qwen35"]("mtp", "f16")
    _refused(mtp_targets["qwen35moe"]("no-mtp", "f16"), sidecar, "'qwen35' differs from the target's 'qwen35moe'")
    _refused(tiny_target.gguf["f16"], sidecar, "'qwen35' differs from the target's 'qwen3'")
    other = rewrite_gguf(sidecar, tmp_path / "other.gguf", set_keys=[("qwen35.rope.freq_base", VT.FLOAT32, 5e5, None)])
    _refused(mtp_targets["qwen35"]("no-mtp", "f16"), other, "key 'qwen35.rope.freq_base': is 500000.0, the target's is")


def test_an_eagle3_drafter_of_another_target_is_refused(eagle3_drafters):
    from ggtools.jobs.demo import demo_data
    _refused(demo_data() / "target.gguf", eagle3_drafters("specforge", "f16"), "target_hidden_size")


def test_a_last_output_tap_is_refused_where_llama_cpp_never_writes_it(tiny_target, eagle3_drafters, tmp_path):
    """id == the target's n_layer taps llama.cpp's t_h_nextn: the qwen3 graph never writes it (stale features)."""
    bad = rewrite_gguf(eagle3_drafters("specforge", "f16"), tmp_path / "last.gguf",
                       set_keys=[("eagle3.target_layers", VT.ARRAY, [1, 3, 8], VT.INT32)])
    _refused(tiny_target.gguf["f16"], bad, "never writes it")


def test_a_mask_id_or_a_short_ring_is_refused(pairs):
    target, draft = pairs["eagle3/speculators"]
    model = TargetModel(target)
    with pytest.raises(SettingsError, match="--mask-id 5"):
        open_drafter(draft, model, mask_id=5)
    with pytest.raises(GGToolsError, match="--ring-cap 8: an EAGLE3 drafter attends to every committed position"):
        run_speculative(model, draft, PROMPTS[:1], N, ring_cap=8)
    model.close()


def test_family_detection_reads_the_architecture(pairs):
    for name, (target, draft) in pairs.items():
        if draft == "mtp":
            continue
        with GGUFFile(draft) as f:
            arch = f.architecture
        model, drafter = _load(pairs, name)
        assert drafter.family == ("eagle3" if arch == "eagle3" else "mtp"), name
