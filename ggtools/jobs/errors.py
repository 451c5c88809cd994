"""JobError: what a job refuses to do (each job has its own kind), and UsageError: an option value, or a
combination of options, that cannot work. A file the job reads may also raise its own layer's error
(GGUFError, CheckpointError, ...)."""

from ggtools.errors import GGToolsError, located


class JobError(GGToolsError):
    exit_code = 2


class UsageError(JobError):
    """Names the option (or the path it was given) and the rule."""

    def __init__(self, option, rule: str):
        super().__init__(located(option, rule))
