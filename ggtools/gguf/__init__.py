"""The gguf layer: GGUF bytes, not models. Parse (GGUFFile), write (GGUFWriter), find shards (ShardSet)."""

from ggtools.gguf.reader import DEFAULT_ALIGNMENT, KV, GGUFError, GGUFFile, TensorInfo, ggml_type_name, pad
from ggtools.gguf.shards import ShardSet, parse_shard_name, shard_path
from ggtools.gguf.writer import GGUFWriter

__all__ = ["DEFAULT_ALIGNMENT", "KV", "GGUFError", "GGUFFile", "GGUFWriter", "ShardSet", "TensorInfo",
           "ggml_type_name", "pad", "parse_shard_name", "shard_path"]
