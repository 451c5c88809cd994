"""GGUFError: the gguf layer's one error, for files and paths; it names the file, the place and the rule."""

from ggtools.errors import GGToolsError, located


class GGUFError(GGToolsError):
    """A GGUF file or path that cannot be used: unreadable, breaking a rule, or an output that must not be
    written. Names the file and the byte offset, tensor or key."""

    def __init__(self, path, rule: str, offset: int | None = None, where: str | None = None):
        self.path, self.rule, self.offset, self.where = str(path), rule, offset, where
        place = where if where is not None else (f"byte {offset}" if offset is not None else None)
        super().__init__(located(self.path, rule, place))

    def __reduce__(self):       # rebuilt from its fields when it crosses a process boundary
        return type(self), (self.path, self.rule, self.offset, self.where)
