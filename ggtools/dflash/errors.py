"""DFlashError: the dflash package's errors (a checkpoint that cannot be read or breaks a rule; a drafter a
layout cannot hold)."""

from ggtools.errors import GGToolsError, located


class DFlashError(GGToolsError):
    exit_code = 2


class CheckpointError(DFlashError):
    """A Hugging Face checkpoint that cannot be read or breaks a rule; names the file, the place, the rule."""

    def __init__(self, path, rule: str, where: str | None = None):
        super().__init__(located(path, rule, where))


class RewriteRefused(DFlashError):
    """The destination layout cannot hold something the drafter has."""
