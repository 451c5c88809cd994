"""Speculative decoding at temperature > 0 against llama.cpp's own loop: `llama-speculative-simple --temp T --seed S`
(scripts/fixtures/llama_speculative.py; these tests skip until it is built) with the demo's trained drafters (the
EAGLE3 drafter of target.gguf converted at f32, the MTP block of qwen35-mtp.gguf), on held-out prompts.

- The output: the example on the prompt and ggtools' `speculative_generate` with the sampler `ggtools run --temp T
  --seed S` builds (jobs.sampling.sampling_params; every setting of the chain is also given to the example) emit
  the same tokens. Both verify with the exact-match rule (common_sampler_sample_and_accept_n): one draw of the same
  std::mt19937 per emitted token, in order, whatever was drafted.
- The steps: both drafters draft greedily at any temperature (llama.cpp: rank 0 of a top-k(10) sampler whose own
  draw is never used; ggtools: the argmax), so each step's drafted tokens and accepted count are equal too. The
  example keeps its prompt's last token as its first anchor, while ggtools' loop samples its first token from
  prefill; so for the steps ggtools runs on the prompt less its last token, with a sampler that gives that token
  as its first without a draw: the same state and the same draws as the example's from then on.

Where the comparison stops: llama.cpp verifies a step in one batch (tinyBLAS for 2+ rows of float weights),
ggtools row by row (the one-row kernels, so that its output is plain decoding's). Their logits differ by up to
about 7e-3 on these targets, which now and then changes a draw, legitimately. So both kinds of rows are computed
here with ggtools' kernels (its batch kernels are llama.cpp's bit for bit: the parity tests): its own (prefill,
then one-token steps) and llama.cpp's (the example's prompt less its last token as one batch, then each verify
batch its log shows, the cache cropped to the accepted rows). A prompt is compared up to the first draw that picks
different tokens from the two, instead of within a guessed margin of a probability boundary; the example's tokens
must all be what the second set draws, which checks that stand-in. A drafter's near tie ends the step comparison
as in the greedy test (tests/test_eagle3_mtp_oracle.py). Penalties stay off: ggtools accepts the prompt into the
penalties' window (as llama-server does), the example does not.
"""

import numpy as np
import pytest

from ggtools.jobs.demo import demo_data, held_out_prompts
from ggtools.jobs.sampling import sampling_params
from ggtools.runtime import DraftSettings, TargetModel, Tokenizer, open_drafter, speculative_generate
from ggtools.runtime.sampling import Sampler
from scripts.fixtures import llama_speculative
from tests.test_eagle3_mtp_oracle import Recording, _near_tie, example, trained_eagle3  # noqa: F401 (fixtures)

pytestmark = pytest.mark.oracle

N = 48                 # tokens per prompt
PROMPTS = 6            # held-out prompts (64 tokens each)
MIN_TOKENS = 200       # tokens compared at least per family and temperature, over the prompts
MIN_STEPS = 60         # steps compared at least
MIN_ACCEPTED = 30      # drafts accepted in them at least
SETTINGS = DraftSettings(n_max=3)
SEED = 1               # the first prompt's seed, the next prompt's SEED + 1, ...


class GivenFirst(Sampler):
    """A sampler whose first token (the prefill's) is given, without a draw: the example's prompt ends with it."""

    def __init__(self, params, n_vocab, first: int):
        super().__init__(params, n_vocab)
        self.first = first

    def sample(self, logits) -> int:
        if self.first is None:
            return super().sample(logits)
        first, self.first = self.first, None
        return first


def _rows_ggtools(model, prompt, tokens) -> np.ndarray:
    """The target rows ggtools' loop samples tokens from: prefill's last row, then one-token steps (its stepwise
    verify rows are bit-identical to those)."""
    model.kv.clear()
    logits, _ = model.forward(list(prompt), logits="last")
    rows = [logits[-1]]
    for token in tokens[:-1]:
        logits, _ = model.forward([token], logits="last")
        rows.append(logits[-1])
    return np.array(rows)


def _rows_llama(model, prompt, run, n) -> np.ndarray:
    """The target rows the example sampled its first n tokens from: its prompt less the last token as one batch,
    then each step's verify batch [id_last, drafts] through the batch kernels (one row: the one-row ones, as
    llama.cpp), the cache cropped to the accepted positions."""
    model.kv.clear()
    model.forward(list(prompt[:-1]), logits="none")
    kept, last, rows = len(prompt) - 1, prompt[-1], []
    for step in run.steps:
        if len(rows) >= n:
            break
        logits, _ = model.forward([last] + step.drafts, logits="all")
        rows += list(logits[:step.accepted + 1])
        kept += step.accepted + 1
        model.kv.crop(kept)
        last = step.last
    return np.array(rows[:n])


def _same_draws(params, n_vocab, ours, theirs) -> int:
    """How many leading draws of the seed give the same token from both sets of rows (two samplers in step)."""
    a, b = Sampler(params, n_vocab), Sampler(params, n_vocab)
    n = min(len(ours), len(theirs))
    return next((j for j in range(n) if a.sample(ours[j]) != b.sample(theirs[j])), n)


def _draws(params, n_vocab, rows) -> list:
    sampler = Sampler(params, n_vocab)
    return [sampler.sample(row) for row in rows]


def _chain_options(params) -> dict:
    """The chain's settings as the example's options (every one, so neither side falls back on its own default)."""
    return {name: getattr(params, name) for name in llama_speculative.SAMPLING_FLAGS}


def _compare(binary, target, draft, spec_type, temp, seed):
    """Per held-out prompt (seeds seed, seed + 1, ...): the outputs, then the steps (see the module docstring).
    Prompts whose output holds an end of generation are skipped. Returns the tokens compared, the tokens left out
    after a draw the two kinds of rows disagree on, the steps compared, the drafts accepted in them."""
    model = TargetModel(target)
    drafter = open_drafter(draft or "mtp", model)
    tokenizer = Tokenizer.from_gguf(model.weights.meta)
    tokens = left_out = steps = accepted = 0
    for i, (_, window) in enumerate(held_out_prompts(tokenizer, PROMPTS)):
        text = tokenizer.decode(window[:64])
        ids = tokenizer.encode(text)
        params = sampling_params(model, {}, temp, seed + i)
        run = llama_speculative.run(binary, target, text, N, spec_type, draft, n_max=SETTINGS.n_max, n_ctx=512,
                                    temp=temp, seed=params.seed, **_chain_options(params))
        out = speculative_generate(model, drafter, drafter.new_kv(), ids, N, settings=SETTINGS,
                                   sampler=Sampler(params, model.n_vocab))
        if any(t in tokenizer.eog for t in out.tokens + run.tokens[:N]):
            continue
        theirs = _rows_llama(model, ids, run, N)
        assert _draws(params, model.n_vocab, theirs) == run.tokens[:N], "the stand-in for llama.cpp's rows"
        # the output, from the same prompt and seed
        sure = _same_draws(params, model.n_vocab, _rows_ggtools(model, ids, out.tokens), theirs)
        assert out.tokens[:sure] == run.tokens[:sure], (text, params.seed)
        tokens, left_out = tokens + sure, left_out + N - sure
        # the steps, from the prompt less its last token, which the sampler gives as the first
        rec = Recording(drafter)
        out = speculative_generate(model, rec, drafter.new_kv(), ids[:-1], N, settings=SETTINGS,
                                   sampler=GivenFirst(params, model.n_vocab, ids[-1]))
        sure = _same_draws(params, model.n_vocab, _rows_ggtools(model, ids[:-1], out.tokens)[1:], theirs)
        assert out.tokens[1:sure + 1] == run.tokens[:sure], (text, params.seed)
        # the last step: ggtools keeps only the tokens -n still wants, which may cut its accepted count
        ends = np.cumsum([1] + [s.produced for s in out.steps])[1:]        # tokens known after each step
        n_steps = next((k for k, (c, s) in enumerate(zip(rec.chains, out.steps))
                        if _near_tie(c, s, SETTINGS.p_min) or ends[k] > sure + 1), len(out.steps) - 1)
        ours = [(chain.tokens[:step.drafted], step.accepted) for chain, step in zip(rec.chains, out.steps)][:n_steps]
        assert ours == [(step.drafts, step.accepted) for step in run.steps[:n_steps]], (text, params.seed)
        steps += n_steps
        accepted += sum(a for _, a in ours)
    drafter.close()
    model.close()
    return tokens, left_out, steps, accepted


@pytest.mark.slow
@pytest.mark.parametrize("temp", [0.6, 1.0])
@pytest.mark.parametrize("family", ["eagle3", "mtp"])
def test_sampled_speculation_equals_llama_speculative_simple(example, trained_eagle3, family, temp):
    demo = demo_data()
    target, draft = (demo / "target.gguf", trained_eagle3) if family == "eagle3" else (demo / "qwen35-mtp.gguf", None)
    tokens, left_out, steps, accepted = _compare(example, target, draft, f"draft-{family}", temp, SEED)
    print(f"{family} T={temp}: {tokens} tokens compared ({left_out} after a draw the kernels disagree on), "
          f"{steps} steps, {accepted} drafts accepted")
    assert tokens >= MIN_TOKENS and steps >= MIN_STEPS, (tokens, steps)
    assert accepted >= MIN_ACCEPTED, "the drafts are accepted often enough to show a wrong acceptance"
