"""The shard sets the disk benches generate: a Kimi-like set of about N GB (MXFP4 experts, a Q8_0 trunk of about 7 %
of the bytes, F32 norms) and a small set of the same shape, whose times the benches take off the large set's to
leave what the bytes cost beyond start-up."""

from ggtools.samples import write_moe_set

HIDDEN, FFN, EXPERTS, VOCAB = 1024, 512, 128, 32000


def layers_for(gb):
    per_layer = 3 * HIDDEN * FFN * EXPERTS * 17 / 32 + (2 * HIDDEN * HIDDEN + 3 * HIDDEN * FFN) * 34 / 32
    return max(1, round((gb * 1e9 - 2 * HIDDEN * VOCAB * 34 / 32) / per_layer))


def kimi_like_set(prefix, gb, shards) -> list[str]:
    """About gb GB in `shards` shards; returns their paths."""
    return write_moe_set(prefix, layers=layers_for(gb), hidden=HIDDEN, ffn=FFN, experts=EXPERTS, vocab=VOCAB,
                         shards=shards)


def small_set(prefix, shards) -> list[str]:
    """The same layers' shapes and shard count, with 4 experts and a 1000-token vocabulary: about 33 MB."""
    return write_moe_set(prefix, layers=shards, hidden=HIDDEN, ffn=FFN, experts=4, vocab=1000, shards=shards)
