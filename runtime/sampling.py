"""Sampling at temperature > 0: llama.cpp's sampler chain (src/llama-sampler.cpp, common/sampling.cpp), bit for bit.

A `Sampler` holds what llama.cpp's `common_sampler` holds for one sequence: the chain's settings, the token history
the penalties read, and the `std::mt19937` the final `dist` step draws from. `sample(logits)` runs the chain on one
row of float32 logits and draws; `accept(token)` appends to the history (prompt tokens too, as llama-server does).

The chain, in `SamplingParams.samplers` order (llama.cpp's default: penalties, dry, top_n_sigma, top_k, typ_p, top_p,
min_p, xtc, temperature), then dist. Each step works on a candidate list (ids, logits, probabilities, a `sorted`
flag) exactly as llama.cpp's does, since the order of the candidates decides float sums and which token a draw
lands on:
- top_k: the k highest logits, sorted (k <= 0: off);
- top_p, min_p, typ_p, top_n_sigma: llama.cpp's float32 arithmetic, in its order, on logits before temperature;
- temperature: logit / temp;
- dist: p_i = expf(l_i - max) in float, their sum in double, r from uniform_real_distribution<double> (two 32-bit
  draws of mt19937, libstdc++'s generate_canonical), the first candidate whose running double sum reaches sum * r.
expf and logf are glibc's (numba calls the C library). Ties between equal logits are ordered by token id; llama.cpp's
std::partial_sort leaves their order unspecified, so a draw that falls between two exactly equal logits may pick the
other one of the pair.

Disabled steps are no-ops as in llama.cpp (top_k <= 0, top_p >= 1, min_p <= 0, typ_p >= 1, top_n_sigma <= 0,
penalties with last_n 0 or neutral values; dry and xtc, whose settings ggtools does not take, are always off).
Temperature 0 is greedy decoding (the argmax), which the runtime does without a sampler.
"""

from collections import Counter, deque
from contextlib import contextmanager
from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from ggtools.hparam_rules.sampling import ALIASES, CANONICAL
from ggtools.runtime.errors import SettingsError

F32 = np.float32
EXACT = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")

DEFAULT_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
UNSUPPORTED = {"infill": "the infill sampler (fill-in-the-middle)",
               "adaptive_p": "the adaptive-p sampler (it replaces dist)"}
MAX_SEED = 0xFFFFFFFE              # 0xFFFFFFFF is LLAMA_DEFAULT_SEED: llama.cpp draws a random seed for it


def sampler_names(text: str) -> tuple[str, ...]:
    """A `--samplers` value (names separated by ';', as llama.cpp's) as canonical names; unknown names refused."""
    names = []
    for name in text.split(";"):
        canonical = ALIASES.get(name.strip().lower())
        if canonical is None:
            raise SettingsError(f"--samplers: unknown sampler '{name}' (llama.cpp's names: {', '.join(CANONICAL)})")
        if canonical in UNSUPPORTED:
            raise SettingsError(f"--samplers: {UNSUPPORTED[canonical]} is not supported by ggtools' runtime")
        names.append(canonical)
    return tuple(names)


@dataclass(frozen=True)
class SamplingParams:
    """llama.cpp's common_params_sampling, the fields its default chain reads (defaults: common/common.h)."""
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    typ_p: float = 1.0
    top_n_sigma: float = -1.0
    penalty_last_n: int = 64
    penalty_repeat: float = 1.0
    penalty_freq: float = 0.0
    penalty_present: float = 0.0
    min_keep: int = 0
    seed: int = 0
    samplers: tuple[str, ...] = DEFAULT_SAMPLERS
    suppress: tuple[int, ...] = ()           # tokenizer.ggml.suppress_tokens: logit bias -inf
    # what ggtools' runtime does not run, taken from a model's general.sampling.* keys only to refuse them
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    xtc_probability: float = 0.0
    xtc_threshold: float = 0.1

    @property
    def greedy(self) -> bool:
        return self.temp <= 0

    def with_options(self, **options) -> "SamplingParams":
        """These params with every option that is not None in place of its value."""
        return replace(self, **{k: v for k, v in options.items() if v is not None})

    def check(self) -> None:
        """llama.cpp's own refusals (common_sampler_init) and the values the chain cannot mean."""
        for name in ("temp", "top_p", "min_p", "typ_p", "top_n_sigma", "penalty_repeat", "penalty_freq",
                     "penalty_present"):
            value = getattr(self, name)
            with np.errstate(over="ignore"):
                if not np.isfinite(F32(value)):
                    raise SettingsError(f"--{_option(name)}: {value} is not a finite 32-bit float (llama.cpp reads "
                                        "it as a float)")
        with np.errstate(over="ignore"):
            inverse = F32(1.0) / F32(self.penalty_repeat) if self.penalty_repeat else np.inf
        if self.penalty_repeat <= 0 or not np.isfinite(inverse):
            raise SettingsError(f"--repeat-penalty {self.penalty_repeat}: penalty_repeat must be finite and greater "
                                "than 0 (llama.cpp)")
        if self.penalty_last_n < 0:
            raise SettingsError(f"--repeat-last-n {self.penalty_last_n}: must be 0 (off) or more")
        if not 0 <= self.seed <= MAX_SEED:
            raise SettingsError(f"--seed {self.seed}: must lie in 0..{MAX_SEED} (llama.cpp reads {MAX_SEED + 1} as "
                                "'a random seed')")
        for name in self.samplers:
            if name in UNSUPPORTED:
                raise SettingsError(f"sampler sequence: {UNSUPPORTED[name]} is not supported by ggtools' runtime")
        if self.mirostat:
            raise SettingsError(f"mirostat {self.mirostat} (general.sampling.mirostat): mirostat sampling is not "
                                "supported by ggtools' runtime; pass --mirostat 0")
        if self.xtc_probability > 0 and "xtc" in self.samplers:
            raise SettingsError(f"xtc_probability {self.xtc_probability:g} (general.sampling.xtc_probability): the "
                                "XTC sampler is not supported by ggtools' runtime; pass --xtc-probability 0")

    def as_dict(self) -> dict:
        return {"temp": self.temp, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
                "typ_p": self.typ_p, "top_n_sigma": self.top_n_sigma, "repeat_last_n": self.penalty_last_n,
                "repeat_penalty": self.penalty_repeat, "frequency_penalty": self.penalty_freq,
                "presence_penalty": self.penalty_present, "seed": self.seed, "samplers": ";".join(self.samplers),
                "chain": self.describe()}

    def describe(self) -> str:
        """The active chain in one line, as a user reads it (disabled steps left out)."""
        steps = [s for s in (_describe(self, name) for name in self.samplers) if s]
        return " -> ".join(steps + [f"dist (seed {self.seed})"])


def _option(name: str) -> str:
    return {"penalty_repeat": "repeat-penalty", "penalty_freq": "frequency-penalty",
            "penalty_present": "presence-penalty"}.get(name, name.replace("_", "-"))


def _describe(p: SamplingParams, name: str) -> str:
    active = {"top_k": (p.top_k > 0, f"top_k {p.top_k}"), "top_p": (p.top_p < 1, f"top_p {p.top_p:g}"),
              "min_p": (p.min_p > 0, f"min_p {p.min_p:g}"), "typ_p": (p.typ_p < 1, f"typ_p {p.typ_p:g}"),
              "top_n_sigma": (p.top_n_sigma > 0, f"top_n_sigma {p.top_n_sigma:g}"),
              "temperature": (True, f"temp {p.temp:g}"),
              "penalties": (_penalties_on(p), f"penalties (last {p.penalty_last_n}: repeat {p.penalty_repeat:g}, "
                                              f"frequency {p.penalty_freq:g}, presence {p.penalty_present:g})")}
    on, text = active.get(name, (False, ""))
    return text if on else ""


def _penalties_on(p: SamplingParams) -> bool:
    return p.penalty_last_n != 0 and not (F32(p.penalty_repeat) == 1 and F32(p.penalty_freq) == 0
                                          and F32(p.penalty_present) == 0)


class MT19937:
    """std::mt19937 (the C++ standard's Mersenne Twister, seeded by init_genrand) and libstdc++'s
    uniform_real_distribution<double>(0, 1): generate_canonical<double, 53> over two 32-bit draws."""

    def __init__(self, seed: int):
        self._state = np.random.RandomState(seed)     # init_genrand(seed) for a 32-bit seed, as std::mt19937(seed)

    def next_u32(self) -> int:
        return int(self._state.randint(0, 1 << 32, dtype=np.uint64))   # one genrand_int32 (full range: no rejection)

    def canonical(self) -> float:
        lo = float(self.next_u32())
        total = lo + float(self.next_u32()) * 4294967296.0
        r = total / 18446744073709551616.0
        return r if r < 1.0 else np.nextafter(1.0, 0.0)


@njit(**EXACT)
def _expf_shifted(logits, shift):
    """expf(logit - shift) for each logit (glibc's expf), float32."""
    out = np.empty(logits.size, np.float32)
    for i in range(logits.size):
        out[i] = np.exp(logits[i] - shift)
    return out


@njit(**EXACT)
def _sum_f32(values):
    total = np.float32(0.0)
    for v in values:
        total += v
    return total


@njit(**EXACT)
def _sum_f64(values):
    total = 0.0
    for v in values:
        total += np.float64(v)
    return total


@njit(**EXACT)
def _first_reaching(values, target):
    """The first index whose running double sum of values reaches target (the last one if none does)."""
    run = 0.0
    for i in range(values.size):
        run += np.float64(values[i])
        if run >= target:
            return i
    return values.size - 1


@njit(**EXACT)
def _logf(values):
    out = np.empty(values.size, np.float32)
    for i in range(values.size):
        out[i] = np.log(values[i])
    return out


@dataclass
class Candidates:
    """llama_token_data_array: ids, logits and probabilities in the chain's current order."""
    ids: np.ndarray
    logits: np.ndarray
    p: np.ndarray = None
    sorted: bool = False

    def take(self, order) -> None:
        self.ids, self.logits = self.ids[order], self.logits[order]
        self.p = self.p[order] if self.p is not None else None

    def sort(self, n: int | None = None) -> None:
        """The n highest logits (all: None), highest first, ties by token id (partial_sort_inplace)."""
        keys = -self.logits
        if n is not None and n < keys.size:
            part = np.argpartition(keys, n - 1)[:n]
            order = part[np.lexsort((self.ids[part], keys[part]))]
        else:
            order = np.lexsort((self.ids, keys))
        self.take(order)
        self.sorted = True

    def softmax(self, do_sort: bool) -> None:
        """llama_sampler_softmax_impl: float32 probabilities, normalized by their float sum in the current order."""
        if do_sort and not self.sorted:
            self.sort()
        top = self.logits[0] if self.sorted else self.logits.max()
        p = _expf_shifted(self.logits, top)
        self.p = p / _sum_f32(p)


class Sampler:
    """One sequence's sampler: the chain, the penalties' token window and the RNG (llama.cpp's common_sampler)."""

    def __init__(self, params: SamplingParams, n_vocab: int):
        params.check()
        self.params, self.n_vocab = params, n_vocab
        self.rng = MT19937(params.seed)
        self.history = deque(maxlen=max(params.penalty_last_n, 1))     # the last penalty_last_n accepted tokens
        self._steps = [getattr(self, "_" + name) for name in params.samplers if hasattr(self, "_" + name)]

    def accept(self, token: int) -> None:
        if self.params.penalty_last_n:
            self.history.append(int(token))

    def accept_tokens(self, tokens) -> None:
        """A prompt's tokens, into the penalties' history (llama-server accepts the prompt before sampling)."""
        for token in tokens:
            self.accept(token)

    def candidates(self, logits) -> Candidates:
        """The chain's input: every token with its logit (the suppressed tokens at -inf: llama.cpp's logit bias)."""
        logits = np.array(logits, dtype=np.float32)
        if self.params.suppress:
            logits[list(self.params.suppress)] = -np.inf
        return Candidates(np.arange(logits.size, dtype=np.int32), logits)

    def distribution(self, logits) -> Candidates:
        """The candidates after the chain, with dist's unnormalized probabilities expf(l - max) as p."""
        c = self.candidates(logits)
        for step in self._steps:
            step(c)
        top = c.logits[0] if c.sorted else c.logits.max()
        c.p = _expf_shifted(c.logits, top)
        return c

    @staticmethod
    def total(c: Candidates) -> float:
        """dist's normalizer: the double sum of the candidates' float probabilities, in order."""
        return _sum_f64(c.p)

    def sample(self, logits) -> int:
        """One token from one row of logits (llama_sampler_dist_apply after the chain); draws once, always."""
        c = self.distribution(logits)
        r = self.rng.canonical()
        if c.ids.size == 1:
            return int(c.ids[0])
        return int(c.ids[_first_reaching(c.p, self.total(c) * r)])

    def probabilities(self, logits) -> np.ndarray:
        """The probability that sample(logits) gives each token (0 where the chain cuts it), float64, without
        drawing."""
        c = self.distribution(logits)
        out = np.zeros(len(logits), np.float64)
        out[c.ids] = c.p / self.total(c)
        return out

    @contextmanager
    def trial(self):
        """Accept tokens for a while (what-if distributions: the penalties' history), then forget them."""
        saved = self.history.copy()
        try:
            yield self
        finally:
            self.history = saved

    # the chain's steps, named as llama.cpp's samplers

    def _penalties(self, c: Candidates) -> None:
        p = self.params
        if not _penalties_on(p):
            return
        counts = Counter(self.history)
        repeat, freq, present = F32(p.penalty_repeat), F32(p.penalty_freq), F32(p.penalty_present)
        for i in np.flatnonzero(np.isin(c.ids, list(counts))):
            x = c.logits[i]
            x = x * repeat if x <= 0 else x / repeat
            c.logits[i] = x - (F32(counts[int(c.ids[i])]) * freq + F32(1.0) * present)
        c.sorted = False

    def _top_k(self, c: Candidates) -> None:
        k = self.params.top_k
        if k <= 0:
            return
        k = min(k, c.ids.size)
        if not c.sorted:
            c.sort(k)
        c.take(slice(0, k))

    def _top_p(self, c: Candidates) -> None:
        p = self.params
        if p.top_p >= 1:
            return
        c.softmax(do_sort=False)
        if not c.sorted:
            c.sort()
        cum = np.cumsum(c.p, dtype=np.float32)        # a float running sum, in order
        keep = np.flatnonzero((cum >= F32(p.top_p)) & (np.arange(1, cum.size + 1) >= p.min_keep))
        c.take(slice(0, int(keep[0]) + 1 if keep.size else c.ids.size))

    def _min_p(self, c: Candidates) -> None:
        p = self.params
        if p.min_p <= 0 or not c.ids.size:
            return
        log_p = _logf(np.array([p.min_p], np.float32))[0]
        if not c.sorted:
            kept = np.flatnonzero(c.logits >= c.logits.max() + log_p)
            if kept.size and kept.size >= p.min_keep:
                c.take(kept)
                return
            c.sort()
        floor = c.logits[0] + log_p
        i = 1
        while i < c.ids.size and not (c.logits[i] < floor and i >= p.min_keep):
            i += 1
        c.take(slice(0, i))

    def _typ_p(self, c: Candidates) -> None:
        p = self.params
        if p.typ_p >= 1:
            return
        c.softmax(do_sort=True)
        with np.errstate(invalid="ignore", divide="ignore"):
            log_probs = _logf(c.p)
            entropy = _sum_f32(-c.p * log_probs)
            shifted = np.abs(-log_probs - entropy)
        order = np.argsort(shifted, kind="stable")
        cum = np.cumsum(c.p[order], dtype=np.float32)
        i = np.arange(cum.size)
        keep = np.flatnonzero((cum > F32(p.typ_p)) & ((p.min_keep == 0) | (i >= p.min_keep - 1)))
        c.take(order[:int(keep[0]) + 1 if keep.size else order.size])
        c.sorted = False

    def _top_n_sigma(self, c: Candidates) -> None:
        n = self.params.top_n_sigma
        if n <= 0 or c.ids.size <= 1:
            return
        valid = c.logits[c.logits != -np.inf]
        top = max(c.logits[0], valid.max()) if valid.size else c.logits[0]
        mean = _sum_f32(valid) / F32(valid.size) if valid.size else F32(0.0)
        acc = F32(0.0)
        for x in valid:
            d = np.float64(F32(x - mean))
            acc = F32(np.float64(acc) + d * d)
        std = np.sqrt(acc / F32(valid.size)) if valid.size else F32(0.0)
        c.logits[c.logits < top - F32(n) * std] = -np.inf

    def _temperature(self, c: Candidates) -> None:
        temp = F32(self.params.temp)
        if temp <= 0:                                     # the first highest logit stays, the others are -inf
            best = int(np.argmax(c.logits))
            keep = c.logits[best]
            c.logits[:] = -np.inf
            c.logits[best] = keep
            return
        c.logits = c.logits / temp
