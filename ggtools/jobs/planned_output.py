"""A GGUF about to be written, put through the rules `ggtools validate` applies to one file before a byte of it is
written: a command never writes what its own validate rejects (convert dflash; convert gguf-layout and doctor --fix
can call the same check).

The planned file is what a reader of the finished file will see: its header parsed from the bytes the writer will
write (GGUFFile.from_header), and a tensor's data the bytes the plan writes for it, produced when a rule asks for
them (the model-file rules read small tables only: DSpark's d2t).

    header = planned_header(shard_plan, source_gguf)        # ggtools.engine; or GGUFWriter(None).header_bytes()
    refuse_invalid_output(header, lambda name: bytes_of(name))
"""

from collections.abc import Callable

import numpy as np

from ggtools.gguf import GGUFFile, TensorInfo
from ggtools.gguf.check import refuse
from ggtools.jobs.validate import file_problems

REFUSAL = "refusing to write an output that ggtools validate would fail"     # patch's words for its own check


class PlannedFile(GGUFFile):
    """A GGUF parsed from the header it will have; tensor_data(t) is the data the plan writes for t."""

    tensor_bytes: Callable[[str], bytes]

    @classmethod
    def of(cls, header: GGUFFile, tensor_bytes: Callable[[str], bytes]) -> "PlannedFile":
        """header: the file's header parsed from its bytes (GGUFFile.from_header); tensor_bytes(name): the bytes
        the plan writes for the tensor of that name."""
        f = cls.from_header(header.path, bytes(header.buf), header.file_size - len(header.buf))
        f.tensor_bytes = tensor_bytes
        return f

    def tensor_data(self, t: TensorInfo | str) -> np.ndarray:
        name = t if isinstance(t, str) else t.name
        return np.frombuffer(self.tensor_bytes(name), np.uint8)


def refuse_invalid_output(header: GGUFFile, tensor_bytes: Callable[[str], bytes]):
    """Refuse (exit 2) the file about to be written when it would fail `ggtools validate`, naming the file, the place
    and the first broken rule in validate's words: `d.gguf: key 'dflash.block_size': refusing to write an output that
    ggtools validate would fail: is 1: ...`."""
    refuse(file_problems(PlannedFile.of(header, tensor_bytes)), REFUSAL)
