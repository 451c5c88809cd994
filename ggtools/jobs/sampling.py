"""The sampler a decoding job runs with: the model's sampling defaults (general.sampling.*, as llama.cpp takes them),
the user's options over them, a temperature and a seed. Temperature 0 is greedy decoding: no sampler at all.

A seed not given is drawn at random (llama.cpp's LLAMA_DEFAULT_SEED does the same) and always reported, so that
every sampled run can be replayed with --seed.
"""

import secrets

from ggtools.hparam_rules.sampling import sampling_defaults
from ggtools.jobs.errors import UsageError
from ggtools.runtime.errors import SettingsError
from ggtools.runtime import sampling
from ggtools.runtime.sampling import MAX_SEED, SamplingParams

__all__ = ["MAX_SEED", "new_seed", "sampler_names", "sampling_params"]


def sampler_names(text: str) -> tuple[str, ...]:
    """A --samplers value as llama.cpp's canonical names."""
    try:
        return sampling.sampler_names(text)
    except SettingsError as e:
        raise UsageError("--samplers", str(e).removeprefix("--samplers: ")) from None


def new_seed() -> int:
    return secrets.randbelow(MAX_SEED + 1)


def sampling_params(model, options: dict, temp: float, seed: int) -> SamplingParams | None:
    """The chain for decoding `model` at `temp` (None at 0: greedy); options: SamplingParams fields the user gave.
    The model's keys are checked by its loader's rules (hparam_rules.sampling) before this reads them."""
    if temp == 0:
        return None
    defaults, _ = sampling_defaults(model.weights.meta)
    params = SamplingParams(**defaults).with_options(**options, temp=temp, seed=seed)
    try:
        params.check()
    except SettingsError as e:
        raise UsageError(model.path, str(e)) from None
    return params
