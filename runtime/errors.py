"""The runtime's error class, ModelError, and its kinds (TokenizerError lives with the tokenizer). Nothing in the
runtime raises another layer's error for its own refusals."""

from ggtools.errors import GGToolsError


class ModelError(GGToolsError):
    """What the runtime refuses: a model it cannot run (unsupported architecture, missing key or tensor), bad
    input, or settings it cannot run with (SettingsError)."""


class SettingsError(ModelError):
    """A backend, device, compute dtype or draft setting that cannot run (here, or with this drafter); the message
    names the option."""
