"""libllama's own sampler chain (llama-cpp-python's bindings of src/llama-sampler.cpp) as the oracle of
runtime/sampling.py: the chain common_sampler_init builds from the same settings, applied to the same float32 logits.
Each call of `sample` is one common_sampler_sample + common_sampler_accept: a fresh candidate array in token-id
order (set_logits), the chain with its dist, the selected token accepted into the chain (the penalties' history)."""

import ctypes

import numpy as np

from ggtools.runtime.sampling import SamplingParams


class LlamaSampler:
    def __init__(self, llama_cpp, params: SamplingParams, n_vocab: int):
        self.l, self.n_vocab = llama_cpp, n_vocab
        self.chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        for sampler in self._samplers(params):
            llama_cpp.llama_sampler_chain_add(self.chain, sampler)

    def _samplers(self, p: SamplingParams):
        l = self.l
        out = []
        if p.suppress:
            biases = (l.llama_logit_bias * len(p.suppress))(*[l.llama_logit_bias(t, float("-inf")) for t in p.suppress])
            out.append(l.llama_sampler_init_logit_bias(self.n_vocab, len(p.suppress), biases))
        make = {"penalties": lambda: l.llama_sampler_init_penalties(self.n_vocab, p.penalty_last_n, p.penalty_repeat,
                                                                   p.penalty_freq, p.penalty_present),
                "top_n_sigma": lambda: l.llama_sampler_init_top_n_sigma(p.top_n_sigma),
                "top_k": lambda: l.llama_sampler_init_top_k(p.top_k),
                "typ_p": lambda: l.llama_sampler_init_typical(p.typ_p, p.min_keep),
                "top_p": lambda: l.llama_sampler_init_top_p(p.top_p, p.min_keep),
                "min_p": lambda: l.llama_sampler_init_min_p(p.min_p, p.min_keep),
                "temperature": lambda: l.llama_sampler_init_temp_ext(p.temp, 0.0, 1.0)}
        out += [make[name]() for name in p.samplers if name in make]      # dry and xtc: off at their defaults
        out.append(l.llama_sampler_init_dist(p.seed))
        return out

    def accept(self, token: int) -> None:
        self.l.llama_sampler_accept(self.chain, int(token))

    def sample(self, logits) -> int:
        return self.sample_with_candidates(logits)[0]

    def sample_with_candidates(self, logits) -> tuple[int, np.ndarray, np.ndarray]:
        """(the token, the candidates' ids and dist's normalized float probabilities, in the chain's final order)."""
        logits = np.asarray(logits, dtype=np.float32)
        data = (self.l.llama_token_data * logits.size)()
        for i, x in enumerate(logits.tolist()):
            data[i].id, data[i].logit, data[i].p = i, x, 0.0
        array = self.l.llama_token_data_array(data, logits.size, -1, False)
        self.l.llama_sampler_apply(self.chain, ctypes.byref(array))
        token = data[array.selected].id
        self.accept(token)
        kept = data[:array.size]
        return (token, np.array([d.id for d in kept], np.int32), np.array([d.p for d in kept], np.float32))

    def __del__(self):
        if getattr(self, "chain", None):
            self.l.llama_sampler_free(self.chain)
