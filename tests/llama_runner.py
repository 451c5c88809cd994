"""llama.cpp through llama-cpp-python's `Llama` as the runtime's oracle: its defaults (flash attention off, f16
KV cache), 2 threads, all logits kept; only for the AVX2 CPU backend, whose arithmetic the runtime reproduces."""

import numpy as np
import pytest


def avx2_llama_cpp():
    """The llama_cpp module, or pytest.skip when it is missing or its CPU backend is not the AVX2 build."""
    module = pytest.importorskip("llama_cpp")
    info = module.llama_print_system_info().decode()
    if "AVX2 = 1" not in info or "AVX512 = 1" in info:
        pytest.skip(f"llama.cpp's CPU backend is not the AVX2 build the runtime reproduces: {info}")
    return module


class LlamaCpp:
    def __init__(self, llama_cpp, path, **kwargs):
        self.llm = llama_cpp.Llama(str(path), n_ctx=512, n_threads=2, n_threads_batch=2, logits_all=True,
                                   verbose=False, **kwargs)

    def prompt_logits(self, ids):
        self.llm.reset()
        self.llm.eval(list(ids))
        return np.array(self.llm.scores[:len(ids)], dtype=np.float32)

    def greedy(self, ids, n):
        out = []
        for token in self.llm.generate(list(ids), temp=0.0, reset=True):
            out.append(int(token))
            if len(out) == n:
                return out
        return out

    def greedy_logits(self, ids, n):
        """(greedy tokens, the logits row each was chosen from (n, n_vocab)): one-token steps after the prompt."""
        out = self.greedy(ids, n)
        return out, np.array(self.llm.scores[len(ids) - 1:len(ids) - 1 + len(out)], dtype=np.float32)


def assert_prompt_logits_identical(oracle: LlamaCpp, model, prompts, label: str) -> None:
    """Every row of each prompt's logits from the runtime (a fresh cache) equals llama.cpp's, bit for bit; the
    largest difference is printed."""
    for ids in prompts:
        model.kv.clear()
        ours, _ = model.forward(ids)
        want = oracle.prompt_logits(ids)
        print(f"{label}: {len(ids)} prompt tokens, max abs logit difference {np.abs(ours - want).max()}")
        assert np.array_equal(ours, want)
