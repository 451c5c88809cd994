"""The trained DSpark drafters of the demo target (ggtools/data/demo/dspark-*, scripts/demo_pair/
make_dspark_drafters.py), converted by llama.cpp's own converter (fixture unit dspark-demo).

- The checkpoints are what they claim: the DeepSpec and speculators layouts, a reduced vocabulary, small.
- On held-out prompts, the runtime's drafted tokens per step, acceptance lengths and τ are those of libllama's
  DSpark graph under llama.cpp's draft-dspark rule, without and with the confidence cut (tests/dspark_replay.py).
- The heads matter: the same drafter with its Markov head zeroed has a lower τ; the confidence cut offers fewer
  drafts and accepts a larger share of them.
"""

import json
from pathlib import Path

import pytest

from ggtools.jobs.accept import Candidate, measure
from ggtools.jobs.demo import demo_data, held_out_prompts
from ggtools.runtime import DraftSettings, Drafter, TargetModel, Tokenizer, acceptance_stats
from ggtools.runtime.speculative import speculative_generate
from tests.dspark_replay import accepted_lengths, agreeing_rows, libllama_blocks, llama_cpp_drafts, logit_bound, \
    record_run

DEMO = Path(demo_data())
N = 64
P_MIN = 0.5


def test_checkpoints():
    anchor = json.loads((DEMO / "dspark-anchor" / "config.json").read_text())
    spec = json.loads((DEMO / "dspark-speculators" / "config.json").read_text())
    assert anchor["architectures"] == ["DSparkDraftModel"] and "target_layer_ids" in anchor
    assert spec["architectures"] == ["DSparkSpeculator"] and "transformer_layer_config" in spec
    assert spec["aux_hidden_state_layer_ids"] == [i + 1 for i in anchor["target_layer_ids"]]
    assert spec["draft_vocab_size"] < spec["vocab_size"] == anchor["vocab_size"]
    size = sum(p.stat().st_size for d in ("dspark-anchor", "dspark-speculators") for p in (DEMO / d).iterdir())
    assert size < 4 * 2 ** 20
    made = json.loads((DEMO / "dspark.json").read_text())
    rows = made["eval"]["rows"]
    for name in ("dspark-anchor", "dspark-speculators"):          # what the script measured and the docs quote
        assert rows[name]["tau_zlab"] > rows[f"{name}-no-markov"]["tau_zlab"]


@pytest.fixture(scope="module")
def target():
    model = TargetModel(str(DEMO / "target.gguf"), threads=1)
    yield model
    model.close()


@pytest.fixture(scope="module")
def prompts(target):
    return [ids for _, ids in held_out_prompts(Tokenizer.from_gguf(target.weights.meta), 6)]


@pytest.fixture(scope="module")
def eog(target):
    return Tokenizer.from_gguf(target.weights.meta).eog


@pytest.mark.oracle
@pytest.mark.slow
@pytest.mark.parametrize("cut", ["none", "confidence"])
@pytest.mark.parametrize("name", ["dspark-anchor", "dspark-speculators"])
def test_tau_equals_libllama(dspark_demo, target, prompts, eog, name, cut):
    """Every step's drafts as llama.cpp drafts them with libllama's graph; so the acceptance lengths and τ."""
    path = dspark_demo[name]
    d = Drafter(path, target)
    settings = DraftSettings(cut=cut, p_min=P_MIN if cut == "confidence" else 0.0)
    outs, runs = [], []
    for p in prompts:
        out, rec = record_run(lambda *a, **k: speculative_generate(target, *a, **k), d, d.new_kv(None), p, N,
                              eog, settings)
        outs.append(out)
        runs.append(rec)
    theirs_accepted, near_ties = [], 0
    for prompt, out, rec, ref in zip(prompts, outs, runs, libllama_blocks(target.path, path, runs)):
        drafts = []
        for step, b, (logits, conf) in zip(out.steps, rec.blocks, ref):
            theirs = llama_cpp_drafts(logits, conf, settings.p_min)
            if agreeing_rows(b.chain.tokens, b.biased, logits, logit_bound(logits)) < len(theirs):
                near_ties += 1
                theirs = b.chain.tokens[:step.drafted]
            assert step.drafted == len(theirs)
            assert b.chain.tokens[:len(theirs)] == theirs
            drafts.append(theirs)
        accepted = accepted_lengths(out.tokens, len(prompt), rec.blocks, drafts, N, eog)
        assert [s.accepted for s in out.steps] == accepted
        theirs_accepted.append(accepted)
    assert near_ties <= 0.02 * sum(len(o.steps) for o in outs)
    ours = acceptance_stats([o.steps for o in outs], d.max_drafts + 1)
    tau = sum(1 + sum(a) / len(a) for a in theirs_accepted) / len(theirs_accepted)
    assert ours["tau_zlab"] == pytest.approx(tau, rel=1e-12) and tau > 1.5
    d.close()


@pytest.mark.oracle
@pytest.mark.parametrize("name", ["dspark-anchor", "dspark-speculators"])
def test_heads_change_acceptance(dspark_demo, target, prompts, eog, name):
    """The Markov head raises τ (the same drafter with markov_w2 zeroed drafts worse); the confidence cut drafts
    less and accepts a larger share of what it drafts."""
    plain = measure(target, [Candidate(n, str(dspark_demo[n]), None) for n in (name, f"{name}-no-markov")],
                    prompts, N, settings=DraftSettings(), stop_ids=eog)
    cut = measure(target, [Candidate(name, str(dspark_demo[name]), None)], prompts, N,
                  settings=DraftSettings(cut="confidence", p_min=P_MIN), stop_ids=eog)
    with_head, without, with_cut = plain.runs[0], plain.runs[1], cut.runs[0]
    assert all(r.outputs_match_target for r in (with_head, without, with_cut))
    assert with_head.stats["tau_zlab"] > without.stats["tau_zlab"] + 0.1
    assert with_cut.stats["drafted_tokens"] < 0.8 * with_head.stats["drafted_tokens"]
    assert with_cut.stats["acceptance_rate"] > with_head.stats["acceptance_rate"] + 0.05
