"""Which drafter a `--draft` names: `mtp` (the target's own nextn block), an `eagle3` GGUF, a GGUF of a target arch
(an MTP sidecar: mtp.py refuses one without nextn layers), else a DFlash / DFlash2 / DSpark drafter (model.py, which
refuses what is not one). One speculative loop drafts with each (speculative.py)."""

from ggtools.gguf.reader import GGUFFile
from ggtools.dflash.eagle3 import ARCH as EAGLE3_ARCH
from ggtools.runtime.drafter.eagle3 import Eagle3Drafter
from ggtools.runtime.drafter.model import Drafter
from ggtools.runtime.drafter.mtp import TARGET_FILE, MtpDrafter
from ggtools.runtime.errors import SettingsError
from ggtools.runtime.model.archs import ARCHS


def open_drafter(path, target, mask_id: int | None = None):
    """The drafter `path` holds (TARGET_FILE: the target's MTP block), bound to the TargetModel `target`. mask_id
    overrides a DFlash drafter's mask token (the other families have none)."""
    if str(path) == TARGET_FILE:
        arch = TARGET_FILE
    else:
        with GGUFFile(path) as f:
            arch = f.architecture
    if arch != EAGLE3_ARCH and arch != TARGET_FILE and arch not in ARCHS:
        return Drafter(path, target, mask_id=mask_id)
    if mask_id is not None:
        family = "EAGLE3" if arch == EAGLE3_ARCH else "MTP"
        raise SettingsError(f"--mask-id {mask_id}: {path} is an {family} drafter, which drafts from the token it "
                            "drafted before, not from mask tokens")
    return Eagle3Drafter(path, target) if arch == EAGLE3_ARCH else MtpDrafter(path, target)
