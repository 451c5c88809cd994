"""llama.cpp (llama-cpp-python) oracle for target.gguf: tokenizer and greedy decoding."""

import numpy as np


def load(path, n_ctx=512):
    import llama_cpp
    return llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=n_ctx, n_threads=2, verbose=False, logits_all=True,
                           seed=0)


def llama_greedy(llm, prompt: list, n_new: int) -> list:
    """Token ids in, greedy ids out (argmax of llama.cpp's logits, one token at a time)."""
    llm.reset()
    llm.eval(prompt)
    out = []
    for _ in range(n_new):
        tok = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        out.append(tok)
        llm.eval([tok])
    return out


def llama_tokenize(llm, text: str) -> list:
    return llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)
