"""DraftFile: a drafter GGUF read through the profile its arch names, as values that mean the same in every
profile (target layer ids in the HF convention, the mask id wherever the file keeps it, tensors by HF name;
a DSpark drafter's heads, rank, vocabularies and block layout)."""

from dataclasses import dataclass

from ggtools.dflash.profiles import (CONF_B, CONF_W, D2T, DSPARK_HEADS, MARKOV_W1, MARKOV_W2, MARKOV_W2_SCALE,
                                     Profile, profile_of)
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

    # ---- DSpark ---------------------------------------------------------------------------------------------
    @property
    def is_dspark(self) -> bool:
        """Any DSpark head tensor (or lucebox's enabled key): what makes each runtime's loader take the heads."""
        if self.profile is None:
            return False
        return any(self.tensor(n) is not None for n in DSPARK_HEADS) or bool(self.int_value("dspark_enabled"))

    @property
    def markov_rank(self) -> int | None:
        w1 = self.tensor(MARKOV_W1)
        return int(w1.ne[0]) if w1 is not None else None

    @property
    def draft_vocab(self) -> int | None:
        """Rows of the draft head: d2t's length (llama.cpp), else the drafter's vocabulary."""
        d2t = self.tensor(D2T)
        return int(d2t.ne[0]) if d2t is not None else self.n_vocab or self.int_value("vocab_size")

    @property
    def sample_from_anchor(self) -> bool:
        """The block layout the runtime drafts with: llama.cpp's key (absent: true); lucebox: bonus anchor."""
        if not self.profile.has_key("sample_from_anchor"):
            return False
        return self.value("sample_from_anchor") is not False

    @property
    def has_confidence(self) -> bool:
        return self.tensor(CONF_W) is not None

    def dspark_summary(self) -> str | None:
        if not self.is_dspark:
            return None
        heads = "Markov + confidence" if self.has_confidence else "Markov"
        if self.tensor(MARKOV_W2) is None or self.markov_rank is None:
            heads += " (incomplete)"
        V = self.n_vocab or self.int_value("dspark_vocab_size") or (self.tensor(MARKOV_W1).ne[1]
                                                                    if self.tensor(MARKOV_W1) is not None else None)
        vocab = (f"draft vocabulary {self.draft_vocab} of {V} (d2t)" if self.tensor(D2T) is not None
                 else f"full vocabulary {V}")
        scale = ", markov_w2 scaled" if self.tensor(MARKOV_W2_SCALE) is not None else ""
        bias = "" if not self.has_confidence or self.tensor(CONF_B) is not None else ", no confidence bias"
        anchor = "anchor-first" if self.sample_from_anchor else "bonus anchor"
        return f"DSpark: {heads} head, rank {self.markov_rank}, {anchor} blocks, {vocab}{scale}{bias}"
