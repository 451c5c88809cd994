"""Speculative decoding checks that the tests of several targets share: a target with its drafters, prompts and
the greedy reference; the output equals greedy decoding with rejections in most steps; and a drafter that knows
the answer but errs at scattered positions, so verification accepts every length from 0 up and the target cache
(a recurrent state with it) is cropped after most steps; a drafter that records the chains it drafts."""

import types
from dataclasses import dataclass

import numpy as np

from ggtools.runtime import Drafter, TargetModel, greedy, speculative_generate


class KnowingDrafter:
    """Drafts the target's known greedy continuation, wrong at a fixed scatter of positions, so that
    verification accepts lengths from 0 up and the target cache is cropped after most steps. wrong(i): whether
    the draft for output position i is wrong."""

    def __init__(self, drafter, prompt_len, want, wrong=lambda i: i * 5 % 7 < 2):
        self.taps, self.block_size, self.max_drafts = drafter.taps, drafter.block_size, drafter.max_drafts
        self.prompt_len, self.want, self.wrong = prompt_len, want, wrong

    def draft(self, kv, anchor, n_drafts):
        start = kv.committed - self.prompt_len + 1
        tokens = [(t + 1) % 1000 if self.wrong(start + j) else t
                  for j, t in enumerate(self.want[start:start + n_drafts])]
        return types.SimpleNamespace(tokens=tokens)


class Recording:
    """A drafter that keeps every chain it drafts (tokens, p, margin, ...), delegating everything else."""

    def __init__(self, drafter):
        self.drafter, self.chains = drafter, []

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def draft(self, kv, anchor, n_drafts):
        chain = self.drafter.draft(kv, anchor, n_drafts)
        self.chains.append(chain)
        return chain


@dataclass
class SpeculativePair:
    model: TargetModel
    drafters: dict              # name -> Drafter
    prompts: list
    reference: list             # each prompt's greedy continuation of n tokens
    n: int

    def close(self):
        for d in self.drafters.values():
            d.close()
        self.model.close()


def speculative_pair(target_path, drafter_paths: dict, n: int) -> SpeculativePair:
    """The target (2 threads), its drafters, 3 random prompts of 7 to 29 tokens and their greedy continuations."""
    model = TargetModel(target_path, threads=2)
    drafters = {name: Drafter(path, model) for name, path in drafter_paths.items()}
    prompts = [[1] + np.random.default_rng(seed).integers(3, 1000, 6 + 11 * seed).tolist() for seed in range(3)]
    reference = []
    for ids in prompts:
        model.kv.clear()
        reference.append(greedy(model, ids, n)[0])
    return SpeculativePair(model, drafters, prompts, reference, n)


def assert_output_equals_greedy(pair: SpeculativePair, name: str, ring_cap) -> None:
    """Drafter `name` with a ring of ring_cap context slots (None: the full draft KV): every output equals greedy
    decoding, the steps account for every token, and most steps reject a draft (random drafters of a random
    target: the cache and the recurrent state roll back in most steps)."""
    kv = pair.drafters[name].new_kv(ring_cap)
    outs = [speculative_generate(pair.model, pair.drafters[name], kv, ids, pair.n) for ids in pair.prompts]
    assert [o.tokens for o in outs] == pair.reference
    steps = [s for o in outs for s in o.steps]
    assert all(sum(s.produced for s in o.steps) + 1 == len(o.tokens) for o in outs)
    assert sum(s.drafted > s.accepted for s in steps) > len(steps) // 2


def assert_rollback_to_every_prefix(pair: SpeculativePair, name: str) -> None:
    """A KnowingDrafter in drafter `name`'s shape, wrong at outputs 0, 1, 5, 6, 10, 11, ... (after a rejection at 5k
    the next draft is wrong at once): the output equals greedy decoding with accepted lengths from 0 to 3 or more."""
    accepted = set()
    for ids, want in zip(pair.prompts, pair.reference):
        knowing = KnowingDrafter(pair.drafters[name], len(ids), want, wrong=lambda i: i % 5 < 2)
        out = speculative_generate(pair.model, knowing, pair.drafters[name].new_kv(8), ids, pair.n)
        assert out.tokens == want
        accepted |= {s.accepted for s in out.steps}
    assert 0 in accepted and max(accepted) >= 3, accepted
