"""A drafter GGUF still to be written, put through the rules `validate` applies before a byte of it is written: no
command writes a drafter its own validate rejects (convert dflash, convert gguf-layout, doctor --fix).

The planned file is what a reader of the finished file will see: its header parsed from the bytes the writer will
write (GGUFFile.from_header), and a tensor's data the bytes the plan writes for it, produced when a rule asks for
them (the rules read small tables only: DSpark's d2t).

    header = planned_header(shard_plan, source_gguf)        # ggtools.engine, or a GGUFWriter(None)'s header_bytes()
    refuse_invalid_drafter(header, lambda name: bytes_of(name), source=path, what="the repaired drafter")
"""

from collections.abc import Callable

import numpy as np

from ggtools.dflash.draftfile import DraftFile
from ggtools.dflash.errors import DFlashError
from ggtools.dflash.findings import FAILING
from ggtools.dflash.loaders import dspark_findings
from ggtools.gguf import GGUFFile, TensorInfo
from ggtools.gguf.check import check_file, errors
from ggtools.hparam_rules import model_violations


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


def validate_errors(f: GGUFFile) -> list[str]:
    """What `ggtools validate` reports as errors for a drafter (`place: rule` each): the container rules, the
    model-file rules (hyperparameters), and, when those hold, the DSpark rules of its runtime's loader."""
    container = errors(check_file(f))
    out = [f"{p.where}: {p.rule}" for p in container]
    reported = {p.where for p in container}
    out += [str(v) for v in model_violations(f) if v.where not in reported]
    if not out:
        out += [x.message for x in dspark_findings(DraftFile.read(f)) if x.severity in FAILING]
    return out


def refuse_invalid_drafter(header: GGUFFile, tensor_bytes: Callable[[str], bytes], source, what: str):
    """Raise a DFlashError (exit 2) when the drafter about to be written would fail `ggtools validate`, with the
    broken rule in validate's words; source: the input the values come from; what: the drafter, in words."""
    broken = validate_errors(PlannedFile.of(header, tensor_bytes))
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise DFlashError(f"{source}: nothing written: {what} would fail ggtools validate: {broken[0]}{more}")
