"""ggtools.runtime: CPU runtime for target + DFlash drafter pairs (numpy + numba).

Numerics are llama.cpp's CPU backend's, bit for bit for the types its tests cover (see ggmlmath).

    from ggtools.runtime import TargetModel, Tokenizer, greedy
    model = TargetModel("target.gguf", threads=2)
    logits, features = model.forward(ids, taps=[1, 5])   # appends to model.kv
    model.kv.crop(n)                                     # roll back to n tokens
"""

from ggtools.runtime.generate import RunResult, continue_greedy, greedy, run, warm_up
from ggtools.runtime.hparams import HParams, ModelError
from ggtools.runtime.kvcache import KVCache
from ggtools.runtime.model import TargetModel
from ggtools.runtime.tokenizer import Tokenizer, TokenizerError

__all__ = ["HParams", "KVCache", "ModelError", "RunResult", "TargetModel", "Tokenizer", "TokenizerError",
           "continue_greedy", "greedy", "run", "warm_up"]
