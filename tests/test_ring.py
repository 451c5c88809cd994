"""The draft-KV ring (reference §9): geometry, slots, explicit mask, appends of only the new committed rows,
bulk appends, reset on rewind; with cap >= context bit-identical drafts and statistics to the full draft KV;
with a smaller cap, on long prompts that wrap it many times, bit-identical drafts to recomputing the window
from scratch every step; batch-invariant context K/V for every drafter variant."""

import numpy as np
import pytest

from ggtools.jobs.demo import build_drafters, demo_data, held_out_prompts
from ggtools.runtime import TargetModel, Tokenizer, greedy
from ggtools.runtime.drafter.draft_kv import BULK_CHUNK, FullKV, RingKV
from ggtools.runtime.drafter import Drafter
from ggtools.runtime.speculative import DraftSettings, speculative_generate

EOS = 2046
N_LAYER, N_KV, D, Q = 2, 2, 4, 8


# ---- the ring on its own, with a projection that records what it is asked for -------------------------------

class Projection:
    """K and V rows that encode their position (so a slot's content says which position it holds)."""

    def __init__(self):
        self.calls = []

    def __call__(self, features, positions):
        self.calls.append(list(positions))
        rows = np.broadcast_to(np.asarray(positions, np.float32)[:, None, None], (len(positions), N_KV, D))
        return [(rows.copy(), -rows.copy()) for _ in range(N_LAYER)]


def features(first, last):
    return np.zeros((last - first, 3), np.float32)


def test_ring_geometry_and_memory():
    ring = RingKV(Projection(), N_LAYER, N_KV, D, Q, cap=100)
    assert ring.kv_total == 128                      # align32(cap + q + 1)
    assert ring.nbytes == 2 * N_LAYER * N_KV * D * 128 * 2
    assert RingKV(Projection(), N_LAYER, N_KV, D, Q, cap=100, kv_type="f32").nbytes == 2 * ring.nbytes


def test_ring_slots_mask_and_appends():
    proj = Projection()
    ring = RingKV(proj, N_LAYER, N_KV, D, Q, cap=16)
    ring.begin_step(10, features(0, 10))
    assert proj.calls == [list(range(10))]
    assert ring.mask.tolist() == [0.0] * 10 + [-np.inf] * 6      # empty slots are masked
    ring.begin_step(13, features(10, 13))             # only the newly committed rows
    assert proj.calls[-1] == [10, 11, 12]
    ring.begin_step(21, features(13, 21))             # wraps: positions 16..20 go to slots 0..4
    assert proj.calls[-1] == list(range(13, 21))
    assert list(ring.slot_pos) == [16, 17, 18, 19, 20, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15]
    assert ring.mask.tolist() == [0.0] * 16                         # window [21 - 16, 21) = 5..20
    ring.write_noise(0, np.zeros((3, N_KV, D), np.float32), np.zeros((3, N_KV, D), np.float32))
    k, v, rows, positions = ring.visible(0)
    assert positions.tolist() == list(range(5, 21)) + [21, 22, 23]
    assert rows.tolist() == [(p % 16) for p in range(5, 21)] + [16, 17, 18]
    assert all(k[r, 0, 0] == p for r, p in zip(rows[:16], positions[:16]))


def test_ring_bulk_append_takes_only_the_window_in_chunks():
    proj = Projection()
    ring = RingKV(proj, N_LAYER, N_KV, D, Q, cap=3000)
    ring.begin_step(5000, features(0, 5000))
    assert [c[0] for c in proj.calls] == [2000, 2000 + BULK_CHUNK, 2000 + 2 * BULK_CHUNK]
    assert sum(len(c) for c in proj.calls) == 3000 and max(len(c) for c in proj.calls) == BULK_CHUNK


def test_ring_resets_on_rewind_and_needs_the_features():
    proj = Projection()
    ring = RingKV(proj, N_LAYER, N_KV, D, Q, cap=8)
    ring.begin_step(20, features(0, 20))
    ring.begin_step(12, features(0, 12))              # rewind: rebuilt from the features given
    assert proj.calls[-1] == list(range(4, 12))
    assert sorted(ring.slot_pos.tolist()) == list(range(4, 12))
    ring.begin_step(4, features(0, 4))                # rewind below the window: stale slots are masked
    assert ring.mask.tolist().count(0.0) == 4 and sorted(ring.visible(0)[3].tolist()) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="leave positions"):
        ring.begin_step(30, features(25, 30))         # a gap the features do not cover
    with pytest.raises(ValueError):
        ring.begin_step(0, features(0, 0))


def test_full_kv_keeps_every_position():
    proj = Projection()
    full = FullKV(proj, N_LAYER, N_KV, D, Q)
    full.begin_step(300, features(0, 300))
    full.begin_step(303, features(300, 303))
    assert proj.calls[-1] == [300, 301, 302]
    _, _, rows, positions = full.visible(0)
    assert rows.tolist() == positions.tolist() == list(range(303))
    assert full.nbytes == full.bytes_for(303) == 2 * N_LAYER * N_KV * D * 512 * 2


# ---- on the demo pair -----------------------------------------------------------------------------------------

class Recording:
    """A drafter that keeps the normed hidden states of every block it drafts."""

    def __init__(self, drafter):
        self.drafter, self.hidden, self.chains = drafter, [], []
        self.taps, self.block_size, self.max_drafts = drafter.taps, drafter.block_size, drafter.max_drafts

    def draft(self, kv, anchor, n_drafts):
        hidden = self.drafter.forward_block(kv, [anchor] + [self.drafter.hp.mask_id] * n_drafts)
        self.hidden.append(hidden)
        self.chains.append(self.drafter.propose(hidden[1:], anchor))
        return self.chains[-1]


class WindowRecompute:
    """Reference for a ring of `cap` slots: every step, the context K/V of the window [committed - cap, committed)
    computed from scratch in one batch from the stored features; noise rows after it."""

    def __init__(self, drafter, cap):
        self.drafter, self.cap, self.features, self.committed, self.nbytes = drafter, cap, {}, 0, 0

    def reset(self):
        self.features, self.committed = {}, 0

    def begin_step(self, committed, features, tokens=None):
        first = committed - len(features)
        self.features.update({first + i: row for i, row in enumerate(features)})
        lo = committed - min(committed, self.cap)
        rows = self.drafter.context_kv(np.stack([self.features[p] for p in range(lo, committed)]),
                                       np.arange(lo, committed))
        pad = np.zeros((self.drafter.block_size,) + rows[0][0].shape[1:], np.float32)
        self.k = [np.concatenate([k, pad]).astype(np.float16) for k, _ in rows]
        self.v = [np.concatenate([v, pad]).astype(np.float16) for _, v in rows]
        self.positions, self.committed = np.arange(lo, committed), committed

    def write_noise(self, layer, k, v):
        win = len(self.positions)
        self.k[layer][win:win + len(k)] = k
        self.v[layer][win:win + len(v)] = v
        self.n_noise = len(k)

    def visible(self, layer):
        win = len(self.positions)
        return (self.k[layer], self.v[layer], np.arange(win + self.n_noise),
                np.concatenate([self.positions, self.committed + np.arange(self.n_noise)]))


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    target_path = str(demo_data() / "target.gguf")
    paths = {v.name: v.path for v in build_drafters(tmp_path_factory.mktemp("demo"), target_path)}
    target = TargetModel(target_path, threads=1)
    yield target, paths
    target.close()


@pytest.fixture(scope="module")
def long_prompts(pair):
    """Windows of 400 held-out tokens: with 64 new tokens a ring of 16 wraps about 29 times."""
    return [ids for _, ids in held_out_prompts(Tokenizer.from_gguf(pair[0].weights.meta), 2, 400)]


def _record(target, drafter, kv, prompts, n, settings=None):
    rec = Recording(drafter)
    outs = [speculative_generate(target, rec, kv, p, n, {EOS}, settings) for p in prompts]
    return rec, outs


@pytest.mark.parametrize("name", ["f16", "q2_k"])
@pytest.mark.parametrize("cap", [464 + 8, 4096])
def test_ring_with_cap_at_least_context_equals_full_kv(pair, long_prompts, name, cap):
    target, paths = pair
    drafter = Drafter(paths[name], target)
    full, full_outs = _record(target, drafter, drafter.new_kv(None), long_prompts, 64)
    ring, ring_outs = _record(target, drafter, drafter.new_kv(cap), long_prompts, 64)
    assert len(full.hidden) == len(ring.hidden) > 20
    assert all(np.array_equal(a, b) for a, b in zip(full.hidden, ring.hidden))
    assert [c.tokens for c in full.chains] == [c.tokens for c in ring.chains]
    assert [o.steps for o in full_outs] == [o.steps for o in ring_outs]
    assert [o.tokens for o in full_outs] == [o.tokens for o in ring_outs]


@pytest.mark.parametrize("name, cap, settings", [("f16", 16, None), ("f16", 24, DraftSettings(cut="margin", p_min=0.35, n_min=1)),
                                                 ("f16", 64, None), ("q8_0", 16, None), ("q2_k", 40, None)])
def test_small_ring_equals_recomputing_the_window(pair, long_prompts, name, cap, settings):
    target, paths = pair
    drafter = Drafter(paths[name], target)
    ring, ring_outs = _record(target, drafter, drafter.new_kv(cap), long_prompts, 64, settings)
    ref, ref_outs = _record(target, drafter, WindowRecompute(drafter, cap), long_prompts, 64, settings)
    assert len(ring.hidden) == len(ref.hidden) > 20
    assert all(np.array_equal(a, b) for a, b in zip(ring.hidden, ref.hidden))
    assert [o.steps for o in ring_outs] == [o.steps for o in ref_outs]
    for p, o in zip(long_prompts, ring_outs):
        target.kv.clear()
        assert o.tokens == greedy(target, p, 64, {EOS})[0]


@pytest.mark.parametrize("name", ["f16", "q8_0", "q4-mix", "q2_k"])
def test_context_kv_is_batch_invariant(pair, long_prompts, name):
    target, paths = pair
    drafter = Drafter(paths[name], target)
    target.kv.clear()
    _, feats = target.forward(long_prompts[0][:40], taps=drafter.taps, logits="none")
    feats = feats.reshape(40, -1)
    whole = drafter.context_kv(feats, np.arange(40))
    for parts in ([(i, i + 1) for i in range(40)], [(0, 3), (3, 17), (17, 18), (18, 40)]):
        pieces = [drafter.context_kv(feats[a:b], np.arange(a, b)) for a, b in parts]
        for layer in range(drafter.hp.n_layer):
            for kv in (0, 1):
                assert np.array_equal(whole[layer][kv], np.concatenate([p[layer][kv] for p in pieces]))
