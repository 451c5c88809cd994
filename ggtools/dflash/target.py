"""TargetInfo: what a drafter needs to know about its target model, read from the target's GGUF (any shard of a set)."""

from dataclasses import dataclass, field

from ggtools.gguf import KV, GGUFFile, ShardSet


@dataclass
class TargetInfo:
    path: str
    arch: str | None
    n_layer: int | None
    hidden: int | None
    vocab: int | None
    uses_mrope: bool
    file: GGUFFile = field(repr=False)
    paths: list[str] = field(default_factory=list, repr=False)     # every file of the target's set

    @property
    def has_tokenizer(self) -> bool:
        return "tokenizer.ggml.tokens" in self.file.kv

    @property
    def tokenizer_kvs(self) -> list[KV]:
        """The target's tokenizer (tokenizer.*), in its order; valid while the target stays open."""
        return [kv for kv in self.file.kvs if kv.key.startswith("tokenizer.")]


class OpenTarget:
    """Context manager: `with OpenTarget(path) as target:` reads a target GGUF and keeps it open."""

    def __init__(self, path):
        self.shards = ShardSet(path)

    def __enter__(self) -> TargetInfo:
        f = self.shards.first
        arch = f.architecture
        tokens = f.kv.get("tokenizer.ggml.tokens")
        vocab = tokens.count if tokens is not None else _int(f.get(f"{arch}.vocab_size"))
        return TargetInfo(f.path, arch, _int(f.get(f"{arch}.block_count")), _int(f.get(f"{arch}.embedding_length")),
                          vocab, f"{arch}.rope.dimension_sections" in f.kv, f, list(self.shards.paths))

    def __exit__(self, *exc):
        self.shards.close()


def _int(v):
    """A count the target states (None for a value of another type: the model-file rules report it)."""
    return int(v) if isinstance(v, int) and not isinstance(v, bool) else None
