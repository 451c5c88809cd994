"""ShardSet: a model split into `<prefix>-%05d-of-%05d.gguf` files (1-based in the name, split.no 0-based)."""

import os
import re
from dataclasses import dataclass

from ggtools.gguf.errors import GGUFError
from ggtools.gguf.inputs import regular_file
from ggtools.gguf.reader import GGUFFile

SHARD_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
KEY_NO, KEY_COUNT, KEY_TENSORS = "split.no", "split.count", "split.tensors.count"


def shard_path(prefix: str, index: int, count: int) -> str:
    """Path of shard `index` (0-based), as llama_split_path formats it."""
    return f"{prefix}-{index + 1:05d}-of-{count:05d}.gguf"


@dataclass
class ShardName:
    prefix: str
    index: int      # 0-based
    count: int


def parse_shard_name(path) -> ShardName | None:
    m = SHARD_NAME.match(os.fspath(path))
    if not m:
        return None
    return ShardName(m["prefix"], int(m["no"]) - 1, int(m["count"]))


class ShardSet:
    """All files of a model: one plain file, or every shard of a split set, found from any one shard's name.

    `paths` lists every expected shard in order; `missing_indices` those that do not exist. The path given
    must exist and be a regular file; files are opened lazily.
    """

    def __init__(self, path):
        path = os.fspath(path)
        regular_file(path)
        name = parse_shard_name(path)
        if name is None or name.count < 1:
            self.prefix, self.paths = None, [path]
        else:
            self.prefix = name.prefix
            self.paths = [shard_path(name.prefix, i, name.count) for i in range(name.count)]
        self.missing_indices = [i for i, p in enumerate(self.paths) if not os.path.exists(p)]
        self._files: dict[int, GGUFFile] = {}

    @property
    def missing(self) -> list[str]:
        return [self.paths[i] for i in self.missing_indices]

    @property
    def present_indices(self) -> list[int]:
        gone = set(self.missing_indices)
        return [i for i in range(self.count) if i not in gone]

    def require_complete(self):
        """Raise naming the first missing shard, if any."""
        if self.missing_indices:
            i = self.missing_indices[0]
            more = len(self.missing_indices) - 1
            raise GGUFError(self.paths[i], f"shard {i + 1} of {self.count} is missing"
                            + (f" (and {more} more)" if more else ""))

    @property
    def is_split(self) -> bool:
        return self.prefix is not None

    @property
    def count(self) -> int:
        return len(self.paths)

    def file(self, index: int) -> GGUFFile:
        if index not in self._files:
            self._files[index] = GGUFFile(self.paths[index])
        return self._files[index]

    @property
    def files(self) -> list[GGUFFile]:
        self.require_complete()
        return [self.file(i) for i in range(self.count)]

    @property
    def first(self) -> GGUFFile:
        """Shard 0, which carries the model metadata."""
        return self.file(0)

    def tensor_shards(self) -> dict[str, int]:
        """Tensor name → index of the shard that holds it (first occurrence)."""
        where = {}
        for i, f in enumerate(self.files):
            for t in f.tensors:
                where.setdefault(t.name, i)
        return where

    def close(self):
        for f in self._files.values():
            f.close()
        self._files.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
