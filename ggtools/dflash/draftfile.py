"""DraftFile: a drafter GGUF read through the profile its arch names, as values that mean the same in every
profile (target layer ids in the HF convention, the mask id wherever the file keeps it, tensors by HF name)."""

from dataclasses import dataclass

from ggtools.dflash.profiles import Profile, profile_of
from ggtools.gguf import GGUFFile


@dataclass
class DraftFile:
    file: GGUFFile
    profile: Profile | None          # None: an arch no DFlash loader takes

    @classmethod
    def read(cls, f: GGUFFile) -> "DraftFile":
        return cls(f, profile_of(f.architecture))

    @property
    def path(self) -> str:
        return self.file.path

    @property
    def arch(self) -> str | None:
        return self.file.architecture

    def key(self, role: str) -> str:
        return self.profile.key(role, self.arch)

    def value(self, role: str):
        """The stored value of a role (None when absent or this profile has no key for it)."""
        if not self.profile.has_key(role):
            return None
        return self.file.get(self.key(role))

    def int_value(self, role: str) -> int | None:
        v = self.value(role)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def stored_ids(self) -> list[int] | None:
        kv = self.file.kv.get(self.key("target_ids"))
        if kv is None or not kv.is_array or kv.elem_type.name not in ("INT32", "UINT32"):
            return None
        return [int(v) for v in kv.value]

    @property
    def hf_ids(self) -> list[int] | None:
        stored = self.stored_ids
        return self.profile.hf_ids(stored) if stored is not None else None

    @property
    def mask(self) -> tuple[int | None, str | None]:
        """(mask id, the key it was found under): the profile's key first, then where older files kept it."""
        for key in (self.key("mask"), *self.profile.legacy_mask_keys):
            v = self.file.get(key)
            if v is not None:
                return v, key
        return None, None

    @property
    def n_vocab(self) -> int | None:
        """The size of the drafter's own tokenizer (llama.cpp profile), None without one."""
        kv = self.file.kv.get("tokenizer.ggml.tokens")
        return kv.count if kv is not None and kv.is_array else None

    def tensor(self, hf_name: str):
        """The TensorInfo the loader takes for a canonical HF tensor name (aliases included), or None."""
        name = self.profile.gguf_name(hf_name)
        found = self.profile.find_tensor(self.file.tensor, name) if name else None
        return self.file.tensor[found] if found else None

    @property
    def fc_in(self) -> int | None:
        fc = self.tensor("fc.weight")
        return int(fc.ne[0]) if fc is not None else None

    @property
    def is_dflash2(self) -> bool:
        return self.tensor("candidate_selector.hidden_projection.weight") is not None
