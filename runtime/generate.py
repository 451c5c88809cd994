"""Greedy decoding with a TargetModel, and `run`: the one call behind `ggtools run`.

Timing excludes numba's one-time compilation: `warm_up` runs a 2-token batch and a 1-token step
first (compiled kernels are cached on disk, so this is quick after the first use).
"""

import resource
import time
from dataclasses import asdict, dataclass

import numpy as np

from ggtools.runtime.errors import ModelError
from ggtools.runtime.target.model import TargetModel
from ggtools.runtime.tokenizer import Tokenizer


@dataclass
class RunResult:
    prompt_ids: list
    generated_ids: list
    text: str | None             # the continuation, when the vocabulary can be decoded
    stop: str                    # "length" or "end-of-generation"
    prompt_seconds: float
    generate_seconds: float
    prompt_tokens_per_second: float
    generate_tokens_per_second: float  # over the one-token steps (all generated tokens but the first)
    rss_bytes: int               # resident memory after the run (includes the touched, mapped weights)
    peak_rss_bytes: int
    threads: int
    backend: str = "numba"       # "numba" | "torch"
    device: str = "cpu"
    dtype: str = "f32"           # the compute dtype

    def to_dict(self) -> dict:
        return asdict(self)


def warm_up(model: TargetModel) -> None:
    """Compile (or load from numba's cache) the batch and one-token kernels, outside any timing."""
    n = model.kv.n_tokens
    model.forward([0, 0], logits="all")
    model.forward([0], logits="last")
    model.kv.crop(n)


def greedy(model: TargetModel, prompt_ids, n: int, stop_ids=()) -> tuple[list, str]:
    """Greedy continuation of prompt_ids by up to n tokens (appending to model.kv).
    Returns (generated ids, "length" or "end-of-generation")."""
    logits, _ = model.forward(prompt_ids, logits="last")
    return continue_greedy(model, logits, n, stop_ids)


def continue_greedy(model: TargetModel, logits, n: int, stop_ids=(), progress=None) -> tuple[list, str]:
    """Greedy tokens from the last row of logits on, one forward step per token after the first.
    progress(k): called with the number of new tokens as they come."""
    out = []
    while len(out) < n:
        token = int(np.argmax(logits[-1]))
        out.append(token)
        if progress:
            progress(1)
        if token in stop_ids:
            return out, "end-of-generation"
        if len(out) < n:
            logits, _ = model.forward([token], logits="last")
    return out, "length"


def check_context(model: TargetModel, n_prompt: int, n: int, n_ctx: int | None = None):
    """Refuse a prompt plus n new tokens beyond the context (default: the model's trained context length)."""
    limit = n_ctx or model.hp.n_ctx_train
    if n_prompt + n > limit:
        raise ModelError(f"{model.path}: the prompt ({n_prompt} tokens) plus -n {n} is {n_prompt + n} tokens, beyond "
                         f"the context length {limit}" + ("" if n_ctx else " the model was trained for (pass "
                                                          "--context-length N to allow more)"))


def run(target, prompt: str | None = None, prompt_ids=None, n: int = 64, threads: int | None = None,
        stop_at_eog: bool = True, n_ctx: int | None = None, progress=None, backend: str = "numba",
        device: str | None = None, dtype: str | None = None) -> RunResult:
    """Load a target GGUF, greedily continue a prompt (text or token ids), and measure it. n_ctx: the most
    tokens allowed (default: the model's context length); progress(k): k new tokens generated; backend, device
    and dtype choose what runs it (TargetModel)."""
    if (prompt is None) == (prompt_ids is None):
        raise ValueError("give exactly one of prompt and prompt_ids")
    model = TargetModel(target, threads=threads, backend=backend, device=device, dtype=dtype)
    try:
        tokenizer = load_tokenizer(model, required=prompt is not None)
        ids = tokenizer.encode(prompt) if prompt is not None else [int(i) for i in prompt_ids]
        if not ids:
            raise ModelError("the prompt has no tokens")
        check_context(model, len(ids), n, n_ctx)
        stop_ids = tokenizer.eog if (tokenizer and stop_at_eog) else set()
        warm_up(model)

        t0 = time.perf_counter()
        logits, _ = model.forward(ids, logits="last")
        t1 = time.perf_counter()
        generated, stop = continue_greedy(model, logits, n, stop_ids, progress)
        t2 = time.perf_counter()
        steps = max(0, len(generated) - 1)
        return RunResult(
            prompt_ids=ids, generated_ids=generated,
            text=tokenizer.decode(generated) if tokenizer else None, stop=stop,
            prompt_seconds=t1 - t0, generate_seconds=t2 - t1,
            prompt_tokens_per_second=len(ids) / (t1 - t0),
            generate_tokens_per_second=steps / (t2 - t1) if steps else 0.0,
            rss_bytes=current_rss(), peak_rss_bytes=peak_rss(), threads=model.threads, **backend_fields(model))
    finally:
        model.close()


def backend_fields(model: TargetModel) -> dict:
    """What ran a model, for a report: backend, device, compute dtype."""
    return {"backend": model.ops.name, "device": model.ops.device, "dtype": model.ops.dtype}


def load_tokenizer(model: TargetModel, required: bool) -> Tokenizer | None:
    """The GGUF's tokenizer; None when there is none and only token ids are used."""
    try:
        return Tokenizer.from_gguf(model.weights.meta)
    except ModelError:
        if required:
            raise
        return None


def current_rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
