"""The runtime's error class."""

from ggtools.errors import GGToolsError


class ModelError(GGToolsError):
    """A model the runtime cannot run: unsupported architecture, missing key or tensor, bad input."""
