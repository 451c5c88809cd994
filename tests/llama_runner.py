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


def greedy_logits(model, ids, n: int, prompt_logits: str = "all") -> tuple[list[int], np.ndarray]:
    """The runtime's side of LlamaCpp.greedy_logits: greedy tokens by one-token steps after the prompt (a fresh
    cache) and the logits row each was chosen from; prompt_logits "all" computes every prompt row, as llama.cpp's
    logits_all does (a one-row output matmul of float weights has other bits than a batch's)."""
    model.kv.clear()
    logits, _ = model.forward(ids, logits=prompt_logits)
    tokens, rows = [], []
    for _ in range(n):
        rows.append(logits[-1])
        tokens.append(int(logits[-1].argmax()))
        logits, _ = model.forward([tokens[-1]], logits="last")
    return tokens, np.array(rows)


def top2_margin(rows) -> float:
    """The smallest top-1 minus top-2 logit over the rows."""
    top = np.sort(rows, axis=1)[:, -2:]
    return float((top[:, 1] - top[:, 0]).min())


def assert_greedy_identical(oracle: LlamaCpp, model, ids, n: int, min_margin: float, label: str) -> None:
    """The runtime's greedy tokens and each step's logits equal llama.cpp's, bit for bit, on a prompt whose
    llama.cpp path keeps a top-1/top-2 margin of min_margin (so no float-level difference could decide a token);
    the margin and the largest difference are printed."""
    want, want_rows = oracle.greedy_logits(ids, n)
    ours, rows = greedy_logits(model, ids, n)
    margin = top2_margin(want_rows)
    print(f"{label}: {len(ids)} + {n} tokens, min top-1/top-2 margin {margin:.4f}, "
          f"max abs logit difference {np.abs(rows - want_rows).max()}")
    assert margin >= min_margin, "the prompt no longer has a clear margin on llama.cpp's path: choose another"
    assert ours == want
    assert np.array_equal(rows, want_rows)


def assert_one_call_steps_identical(monkeypatch, oracle: LlamaCpp, model, ids, n: int, one_calls, label: str,
                                    shared: bool = False) -> None:
    """One-token steps that take the pieces' one-call paths: one_calls, (module, function name, calls per step), are
    the numba functions each step must call that often (through their pieces' DirectCall); the logits of every step
    along llama.cpp's greedy path are its bits (the tokens are followed whatever their margin). shared: whether some
    of those calls must have shared a matmul with the workers (the pool's job generation moved during the call:
    matmul.plan_rows posted it), or none may have."""
    from ggtools.runtime.kernels import workers
    from ggtools.runtime.kernels.direct_call import DirectCall

    control = workers.pool().control
    kernels = {getattr(module, name): name for module, name, _ in one_calls}
    calls, sharing = {name: 0 for name in kernels.values()}, []

    def counted(direct_call, *args, call=DirectCall.__call__):
        name = kernels.get(direct_call.kernel)
        if name is None:
            return call(direct_call, *args)
        calls[name] += 1
        generation = control[workers.GEN]
        out = call(direct_call, *args)
        sharing.append(control[workers.GEN] != generation)
        return out
    monkeypatch.setattr(DirectCall, "__call__", counted)
    want, want_rows = oracle.greedy_logits(ids, n)
    ours, rows = greedy_logits(model, ids, n)
    print(f"{label}: {len(ids)} + {n} tokens, max abs logit difference {np.abs(rows - want_rows).max()}, "
          f"{sum(sharing)} of {len(sharing)} calls shared a matmul with the workers")
    assert calls == {name: per_step * n for _, name, per_step in one_calls}
    assert any(sharing) == shared
    assert ours == want
    assert np.array_equal(rows.view(np.uint32), want_rows.view(np.uint32))
