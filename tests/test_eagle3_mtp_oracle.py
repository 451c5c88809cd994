"""EAGLE3 and MTP drafting against llama.cpp's own:

- the graphs: libllama's EAGLE3 encoder and decoder and its qwen35 / qwen35moe MTP graph, stepped through the
  llama-cpp-python bindings as common/speculative.cpp steps them (scripts/fixtures/llama_autoregressive.py: the
  target's taps or h_nextn from libllama's own target context, committed rows decoded one per call, then draft
  steps fed their own hidden state). The runtime's draft logits are bit-identical where its kernels compute llama.cpp's
  one-row products bit for bit (F32, F16, Q8_0, Q4_0, MXFP4: numba, and torch in f32); for BF16 and Q2_K / Q3_K
  (runtime/kernels/matmul.py: within float rounding) the drafts are the same tokens and the logits agree to rounding.
- the loop: llama.cpp's `llama-speculative-simple --spec-type draft-eagle3 | draft-mtp --temp 0`, built from the
  vendored source (scripts/fixtures/llama_speculative.py; these tests skip until it is built): per step the drafted
  tokens, the accepted count and the target's token, and so the output, equal ggtools' on prompts whose drafts have
  clear margins (llama.cpp verifies with batch kernels, the runtime with one-row ones: logits differ by up to about
  7e-3 on the demo target, features by float rounding, which only a near tie (MARGIN 1e-2) could turn into another
  draft).

The example tokenizes a text prompt and keeps its last token as the first id_last; ggtools' loop takes its first
token from prefill. So the example gets the prompt followed by ggtools' first token (as text that tokenizes back to
exactly those ids), and both then run the same steps.
"""

import numpy as np
import pytest

from ggtools.runtime import DraftSettings, TargetModel, Tokenizer, open_drafter, speculative_generate
from scripts.fixtures import llama_autoregressive, llama_speculative
from tests.speculative_checks import Recording

pytestmark = pytest.mark.oracle

PROMPT, ANCHOR, STEPS = [1, 5, 9, 200, 17, 33, 44, 100], 77, 4
# the weight types whose one-row products the runtime computes as llama.cpp does, bit for bit
EXACT = ("f32", "f16", "q8_0", "Q8_0", "Q4_0", "mxfp4_moe")
LAYOUTS = ("llama-eagle3", "specforge", "speculators", "draft-model", "eagle3.1")


def _graph_cases(tiny_target, eagle3_drafters, eagle3_demo, mtp_targets):
    """name -> (family, target, draft, exact)."""
    from ggtools.jobs.demo import demo_data
    cases = {}
    for layout in LAYOUTS:
        for outtype in ("f32", "f16", "bf16", "q8_0"):
            target = tiny_target.gguf["f16" if outtype == "f16" else "f32"]
            cases[f"eagle3/{layout}/{outtype}"] = ("eagle3", target, eagle3_drafters(layout, outtype), outtype in EXACT)
        for quant in ("Q8_0", "Q4_0", "Q2_K"):
            cases[f"eagle3/{layout}/{quant}"] = ("eagle3", tiny_target.gguf["f32"],
                                                 eagle3_drafters.quants[f"{layout}/{quant}"], quant in EXACT)
    cases["eagle3/demo"] = ("eagle3", demo_data() / "target.gguf", eagle3_demo["ref"], True)
    for arch, t in mtp_targets.items():
        for outtype in ("f16", "q8_0"):
            cases[f"mtp/{arch}/{outtype}"] = ("mtp", t("default", outtype), None, True)
            cases[f"mtp/{arch}/sidecar-{outtype}"] = ("mtp", t("no-mtp", outtype), t("mtp", outtype), True)
    cases["mtp/qwen35moe/mxfp4_moe"] = ("mtp", mtp_targets["qwen35moe"].gguf["mxfp4_moe"], None, True)
    return cases


@pytest.fixture(scope="module")
def graphs(tiny_target, eagle3_drafters, eagle3_demo, mtp_targets, tmp_path_factory):
    """name -> (case, libllama's .npz): every case stepped by libllama in one child process."""
    pytest.importorskip("llama_cpp")
    cases = _graph_cases(tiny_target, eagle3_drafters, eagle3_demo, mtp_targets)
    out = tmp_path_factory.mktemp("autoregressive")
    jobs = [{"family": family, "target": str(target), "draft": draft and str(draft), "prompt": PROMPT,
             "anchor": ANCHOR, "n_steps": STEPS, "out": str(out / f"{i}.npz")}
            for i, (family, target, draft, _) in enumerate(cases.values())]
    results = llama_autoregressive.run_subprocess(jobs)
    return {name: (case, job["out"], result) for (name, case), job, result in zip(cases.items(), jobs, results)}


def _ours(family, target, draft, backend="numba"):
    """The runtime's (target rows, logits and hidden rows of STEPS draft steps), as the oracle steps them."""
    model = TargetModel(target, backend=backend)
    drafter = open_drafter(draft or "mtp", model)
    _, features = model.forward(PROMPT, taps=drafter.taps, logits="none")
    features = features.reshape(len(PROMPT), -1)
    kv = drafter.new_kv()
    kv.begin_step(len(PROMPT), features, PROMPT + [ANCHOR])
    logits, hidden = [], []
    token, feature, position = ANCHOR, kv.tail, len(PROMPT) - drafter.shift
    for _ in range(STEPS):
        row, feature = drafter.decode(kv.cache, [token], feature, np.array([position]), need_logits=True)
        logits.append(row[0])
        hidden.append(model.ops.host(feature)[0])
        token, position = int(np.argmax(row[0])), position + 1
    rows = model.ops.host(features)
    drafter.close()
    model.close()
    return rows, np.array(logits), np.array(hidden)


def _case_names():
    families = [f"eagle3/{layout}/{t}" for layout in LAYOUTS for t in ("f32", "f16", "bf16", "q8_0", "Q8_0", "Q4_0",
                                                                       "Q2_K")]
    mtp = [f"mtp/{a}/{k}" for a in ("qwen35", "qwen35moe") for k in ("f16", "q8_0", "sidecar-f16", "sidecar-q8_0")]
    return families + ["eagle3/demo"] + mtp + ["mtp/qwen35moe/mxfp4_moe"]


@pytest.mark.parametrize("name", _case_names())
def test_draft_steps_equal_libllama(graphs, name):
    (family, target, draft, exact), path, result = graphs[name]
    assert result["ok"], result
    theirs = np.load(path)
    rows, logits, hidden = _ours(family, target, draft)
    assert np.array_equal(rows, theirs["target"])          # the taps / h_nextn the drafter reads
    assert np.array_equal(np.argmax(logits, axis=1), theirs["tokens"])
    finite = np.isfinite(theirs["logits"])
    assert np.array_equal(finite, np.isfinite(logits))     # d2t: -inf outside the draft vocabulary
    if exact:
        assert np.array_equal(logits, theirs["logits"]) and np.array_equal(hidden, theirs["hidden"])
    else:
        scale = np.abs(theirs["logits"][finite]).max()
        assert np.abs(logits[finite] - theirs["logits"][finite]).max() <= 1e-5 * scale


@pytest.mark.parametrize("name", ["eagle3/speculators/f32", "eagle3/eagle3.1/q8_0", "mtp/qwen35/sidecar-f16",
                                  "mtp/qwen35moe/q8_0"])
def test_torch_draft_steps_equal_libllama(graphs, name):
    pytest.importorskip("torch")
    (family, target, draft, _), path, result = graphs[name]
    theirs = np.load(path)
    rows, logits, hidden = _ours(family, target, draft, backend="torch")
    assert np.array_equal(logits, theirs["logits"]) and np.array_equal(hidden, theirs["hidden"])


# ---- the loop against llama-speculative-simple -------------------------------------------------------------------

TEXTS = ["def quantize(n=42): return n", "import numpy as np", "Once upon a time", "hello world", "class Model:",
         "while True:", "for i in range(10): print(i)", "The answer is", "if x > 0:", "return None",
         "print('done')", "a = b + c"]
N = 24
MARGIN = 1e-2          # a draft this close to its runner-up (logits) is a near tie: its step and later ones are not compared
MIN_STEPS = 20         # steps compared at least, over the prompts


@pytest.fixture(scope="module")
def example():
    binary = llama_speculative.built_binary()
    if binary is None:
        pytest.skip(f"llama-speculative-simple is not built: {llama_speculative.BUILD_COMMAND}")
    return binary


def _compare_with_example(binary, target, draft, spec_type, settings: DraftSettings, texts=TEXTS, n=N):
    """Per prompt: ggtools' output and steps (drafted tokens, accepted count) against the example's, the steps up to
    the first one that holds a near tie (_near_tie: where the batch kernels' rounding could make another draft; later steps still run on
    the same committed tokens, but a different acceptance would shift the steps); prompts whose text does not tokenize
    back or that end the generation early are skipped. Returns the steps compared and the drafts accepted in them."""
    model = TargetModel(target)
    drafter = open_drafter(draft or "mtp", model)
    tokenizer = Tokenizer.from_gguf(model.weights.meta)
    compared = accepted = 0
    for text in texts:
        ids = tokenizer.encode(text)
        rec = Recording(drafter)
        out = speculative_generate(model, rec, drafter.new_kv(), ids, n, settings=settings)
        shown = tokenizer.decode(ids + out.tokens[:1]).removeprefix(" ")
        if tokenizer.encode(shown) != ids + out.tokens[:1] or any(t in tokenizer.eog for t in out.tokens):
            continue
        run = llama_speculative.run(binary, target, shown, n, spec_type, draft, n_max=settings.n_max,
                                    p_min=settings.p_min, n_min=settings.n_min, n_ctx=512)
        sure = _clear_tokens(model, ids, out.tokens)
        assert out.tokens[1:sure] == run.tokens[:sure - 1], text
        # the last step: ggtools keeps only the tokens -n still wants, which may cut its accepted count
        ends = np.cumsum([1] + [s.produced for s in out.steps])[1:]        # tokens known after each step
        steps = next((i for i, (c, s) in enumerate(zip(rec.chains, out.steps))
                      if _near_tie(c, s, settings.p_min) or ends[i] > sure), len(out.steps) - 1)
        ours = [(chain.tokens[:step.drafted], step.accepted) for chain, step in zip(rec.chains, out.steps)][:steps]
        assert ours == [(step.drafts, step.accepted) for step in run.steps[:steps]], text
        compared += steps
        accepted += sum(a for _, a in ours)
    drafter.close()
    model.close()
    return compared, accepted


def _clear_tokens(model, prompt, tokens) -> int:
    """How many of the target's tokens are clear of a near tie (top1 - top2 logit >= MARGIN): llama.cpp verifies with
    batch kernels whose sums depend on the batch, so its greedy token can differ where two logits almost tie."""
    model.kv.clear()
    logits, _ = model.forward(list(prompt) + tokens[:-1], logits="all")
    top2 = np.sort(logits[len(prompt) - 1:], axis=1)[:, -2:]
    # tokens[0] comes from ggtools' prefill and is given to the example as part of its prompt
    return next((j for j in range(1, len(tokens)) if top2[j, 1] - top2[j, 0] < MARGIN), len(tokens))


def _near_tie(chain, step, p_min) -> bool:
    """Whether a draft the step reads (up to and including the first one not offered) is within MARGIN of its
    runner-up, or its probability within MARGIN of p_min."""
    read = slice(0, step.drafted + 1)
    return min(chain.margin[read], default=1) < MARGIN or bool(p_min) and min(
        (abs(p - p_min) for p in chain.p[read]), default=1) < MARGIN


def _settings(p_min):
    return DraftSettings(n_max=3, cut="prob" if p_min else "none", p_min=p_min)


@pytest.mark.parametrize("p_min", [0.0, 0.5])
@pytest.mark.parametrize("layout", ["llama-eagle3", "speculators", "eagle3.1"])
def test_eagle3_steps_equal_llama_speculative_simple(example, tiny_target, eagle3_drafters, layout, p_min):
    compared, _ = _compare_with_example(example, tiny_target.gguf["f32"], eagle3_drafters(layout, "f32"),
                                        "draft-eagle3", _settings(p_min))
    assert compared >= MIN_STEPS


def test_eagle3_demo_steps_equal_llama_speculative_simple(example, eagle3_demo):
    from ggtools.jobs.demo import demo_data
    texts = ["def main():\n    ", "import os\nimport sys\n", "class Queue:\n    def __init__(self):", "x = [1, 2, 3]",
             "for key, value in items:", "try:\n    import json", "return self._data", "with open(path) as f:"]
    compared, _ = _compare_with_example(example, demo_data() / "target.gguf", eagle3_demo["ref"], "draft-eagle3",
                                        _settings(0.0), texts)
    assert compared >= MIN_STEPS


@pytest.mark.parametrize("p_min", [0.0, 0.3])
@pytest.mark.parametrize("arch", ["qwen35", "qwen35moe"])
@pytest.mark.parametrize("source", ["own", "sidecar"])
def test_mtp_steps_equal_llama_speculative_simple(example, mtp_targets, arch, source, p_min):
    t = mtp_targets[arch]
    target, draft = (t("default", "f16"), None) if source == "own" else (t("no-mtp", "f16"), t("mtp", "f16"))
    compared, _ = _compare_with_example(example, target, draft, "draft-mtp", _settings(p_min))
    assert compared >= MIN_STEPS


@pytest.fixture(scope="module")
def trained_eagle3(tmp_path_factory):
    """The demo's trained EAGLE3 drafter (ggtools/data/demo/eagle3/, docs/demo_pair.md), converted at f32."""
    from ggtools.jobs.convert_drafter import convert_drafter
    from ggtools.jobs.demo import demo_data
    out = tmp_path_factory.mktemp("trained") / "eagle3-f32.gguf"
    convert_drafter(demo_data() / "eagle3", out, target=str(demo_data() / "target.gguf"), outtype="f32")
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family", ["eagle3", "mtp"])
def test_trained_drafters_steps_equal_llama_speculative_simple(example, trained_eagle3, family):
    """The demo's trained drafters (EAGLE3 for the demo target, the MTP block of qwen35-mtp.gguf), which accept most
    of their drafts: the accepted lengths step by step, not only the drafts, equal llama.cpp's."""
    from ggtools.jobs.demo import demo_data, held_out_prompts
    demo = demo_data()
    target, draft = (demo / "target.gguf", trained_eagle3) if family == "eagle3" else (demo / "qwen35-mtp.gguf", None)
    model = TargetModel(target)
    tokenizer = Tokenizer.from_gguf(model.weights.meta)
    model.close()
    texts = [tokenizer.decode(ids[:64]) for _, ids in held_out_prompts(tokenizer, 6)]
    compared, accepted = _compare_with_example(example, target, draft, f"draft-{family}", _settings(0.0), texts, 48)
    assert compared >= 10 and accepted >= compared, (compared, accepted)
