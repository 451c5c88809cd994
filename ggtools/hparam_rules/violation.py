"""Violation: one model-file rule a GGUF breaks, in the words every user of the rules prints."""

from dataclasses import dataclass

MISSING, TYPE, VALUE = "missing", "type", "value"


@dataclass(frozen=True)
class Violation:
    key: str | None           # the key that breaks the rule (None: a tensor's rule, or one over the file as a whole)
    rule: str                 # what is wrong, with the values
    says: str | None = None   # what llama.cpp's loader says refusing it (None: it loads the file and misbehaves)
    kind: str = VALUE         # MISSING | TYPE | VALUE
    check: str = "hparams"    # doctor's finding class for it (hparams, keys, mask_token_id, block_size, ...)
    symptom: str | None = None  # what llama.cpp then does, where its words alone do not say it
    tensor: str | None = None   # the tensor that breaks the rule (a table of ids: DSpark's d2t)

    @property
    def where(self) -> str:
        if self.tensor:
            return f"tensor '{self.tensor}'"
        return f"key '{self.key}'" if self.key else "hyperparameters"

    def __str__(self):
        return f"{self.where}: {self.rule}"
