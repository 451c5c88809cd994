"""EngineError: the engine's errors (an output it may not write, cannot fit or could not verify; a run
interrupted; a resume manifest it cannot use)."""

from ggtools.byte_sizes import human_bytes
from ggtools.errors import GGToolsError, located


class EngineError(GGToolsError):
    exit_code = 2


class RewriteError(EngineError):
    """A rewrite whose output failed verification."""

    exit_code = 1


class NonFiniteError(EngineError):
    """Source data with NaN or inf values (or scales) that the rewrite would write or hide."""

    def __init__(self, path, tensor, row, what):
        super().__init__(f"{path}: tensor '{tensor}': row {row}: {what}; pass --allow-nonfinite to write it "
                         "anyway (counted and reported)")


class DiskSpaceError(EngineError):
    """The outputs of a run would not fit on their file system."""

    def __init__(self, directory, need: int, free: int):
        super().__init__(located(directory, f"not enough disk space: the output needs {human_bytes(need)}, "
                                            f"{human_bytes(free)} are free"))


class ManifestError(EngineError):
    """A resume manifest that is not one (never overwritten)."""

    def __init__(self, path, rule: str, where: str | None = None):
        super().__init__(located(path, rule, where))


class ShardFailed(EngineError):
    """One or more shards failed; the exit code is the worst of theirs."""

    def __init__(self, message, exit_code):
        super().__init__(message)
        self.exit_code = exit_code


class Interrupted(EngineError):
    exit_code = 130
