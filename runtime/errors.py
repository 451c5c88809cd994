"""The runtime's error class, ModelError, and its kinds (TokenizerError lives with the tokenizer). Nothing in the
runtime raises another layer's error for its own refusals."""

from ggtools.errors import GGToolsError


class ModelError(GGToolsError):
    """What the runtime refuses: a model it cannot run (unsupported architecture, missing key or tensor), bad
    input, or settings it cannot run with (SettingsError)."""


class NonFiniteError(ModelError):
    """A forward pass gave NaN or inf (logits, a layer's output): the message names the model file, the layer or
    tensor that made them. Nothing is decided from such values."""


class SettingsError(ModelError):
    """A backend, device, compute dtype or draft setting that cannot run (here, or with this drafter); the message
    names the option."""


def refuse_violations(path, violations: list) -> None:
    """ModelError naming the first model-file rule the file breaks (ggtools.hparam_rules' Violations) and how many
    more, if any: the runtime never reads a value those rules have not passed."""
    if violations:
        more = f" ({len(violations) - 1} more: see ggtools validate)" if len(violations) > 1 else ""
        raise ModelError(f"{path}: {violations[0]}{more}")
