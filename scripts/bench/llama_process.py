#!/usr/bin/env python3
"""llama.cpp (llama-cpp-python) in a child process, driven over pipes: the benchmarks' reference runtime.

One child per (build, model, threads). A child started with `lib` set loads that directory's libllama
(LLAMA_CPP_LIB_PATH, the native build of scripts/bench/native_llama.py); without it, the installed
llama-cpp-python's own (the test oracle, GGML_NATIVE=OFF). Two builds cannot share one process (both export
the same symbols), so every anchor gets its own, and ours runs in the parent. Timings are taken inside the
child, so the pipe costs nothing measured.

Requests and answers are JSON lines: {"op": "prompt" | "decode" | "step_cost" | "tokenize" | "system_info", ...}.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# a step's cost is the best of at least MIN_TRIES, and of as many more as fill STEP_SAMPLE_S (at most MAX_TRIES): on
# the 2-vCPU VM a 2 ms tiny batch on 2 threads measured 2.38 ms as the best of 5 rounds x 3 tries and 1.82 ms as the
# best of 30 in one process
MIN_TRIES, MAX_TRIES, STEP_SAMPLE_S = 3, 30, 0.05


def best_step_cost(once) -> float:
    """The best of once()'s seconds over MIN_TRIES, or as many tries as the first says fill STEP_SAMPLE_S."""
    first = once()
    tries = max(MIN_TRIES, min(MAX_TRIES, int(STEP_SAMPLE_S / max(first, 1e-6))))
    return min([first] + [once() for _ in range(tries - 1)])


class LlamaProcess:
    """LlamaProcess(path, threads, lib=None, label="llama.cpp"): the same calls as the benchmark's Ours."""

    def __init__(self, path, threads: int, lib: Path | None = None, label: str = "llama.cpp", n_ctx: int = 1024):
        env = dict(os.environ)
        env.pop("LLAMA_CPP_LIB_PATH", None)
        if lib is not None:
            env["LLAMA_CPP_LIB_PATH"] = str(lib)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        self.label = label
        self.proc = subprocess.Popen([sys.executable, "-m", "scripts.bench.llama_process", str(path), str(threads),
                                      str(n_ctx)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True,
                                     cwd=REPO)
        self._ask({"op": "ready"})

    def _ask(self, request: dict):
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.label} child exited (code {self.proc.wait()})")
        answer = json.loads(line)
        if "error" in answer:
            raise RuntimeError(f"{self.label}: {answer['error']}")
        return answer["result"]

    def tokenize(self, text: str, add_bos: bool) -> list:
        return self._ask({"op": "tokenize", "text": text, "add_bos": add_bos})

    def system_info(self) -> str:
        return self._ask({"op": "system_info"})

    def prompt(self, ids) -> float:
        """Seconds for the prompt (one batch, after a cache reset)."""
        return self._ask({"op": "prompt", "ids": list(ids)})

    def decode(self, ids, n):
        """(tok/s of greedy decoding after the prompt, the n tokens)."""
        rate, tokens = self._ask({"op": "decode", "ids": list(ids), "n": n})
        return rate, tokens

    def step_cost(self, ids, n_batch) -> float:
        """Seconds for one batch of n_batch tokens (all logits) after the prompt (best_step_cost)."""
        return self._ask({"op": "step_cost", "ids": list(ids), "n_batch": n_batch})

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait()


# ---- the child ----------------------------------------------------------------------------------

def _serve(path, threads, n_ctx):
    import llama_cpp
    llm = llama_cpp.Llama(path, n_ctx=n_ctx, n_batch=512, n_threads=threads, n_threads_batch=threads,
                          logits_all=True, verbose=False)

    def prompt(ids):
        llm.reset()
        t = time.perf_counter()
        llm.eval(ids)
        return time.perf_counter() - t

    def decode(ids, n):
        tokens = []
        gen = llm.generate(ids, temp=0.0, reset=True)
        tokens.append(int(next(gen)))        # the prompt's token
        t = time.perf_counter()
        for token in gen:
            tokens.append(int(token))
            if len(tokens) == n:
                break
        return (n - 1) / (time.perf_counter() - t), tokens

    def step_cost(ids, n_batch):
        def once():
            llm.reset()
            llm.eval(ids)
            t = time.perf_counter()
            llm.eval(ids[:n_batch])
            return time.perf_counter() - t
        return best_step_cost(once)

    ops = {
        "ready": lambda r: True,
        "tokenize": lambda r: llm.tokenize(r["text"].encode(), add_bos=r["add_bos"], special=True),
        "system_info": lambda r: llama_cpp.llama_print_system_info().decode(),
        "prompt": lambda r: prompt(r["ids"]),
        "decode": lambda r: decode(r["ids"], r["n"]),
        "step_cost": lambda r: step_cost(r["ids"], r["n_batch"]),
    }
    for line in sys.stdin:
        request = json.loads(line)
        try:
            answer = {"result": ops[request["op"]](request)}
        except Exception as e:  # noqa: BLE001 - reported to the parent
            answer = {"error": f"{type(e).__name__}: {e}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))
