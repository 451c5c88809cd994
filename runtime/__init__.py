"""ggtools.runtime: runtime for target + DFlash drafter pairs: numpy + numba on the CPU (the default), or torch on
the CPU or a CUDA GPU (`TargetModel(path, backend="torch", device="cuda")`; docs/torch.md).

numba's target numerics are llama.cpp's CPU backend's, bit for bit for the types its tests cover (see ggmlmath),
and so are torch's in f32 (torch_backend/ggml_math.py); torch in bf16 / f16 is not (`numerics_note`).

    from ggtools.runtime import TargetModel, Tokenizer, greedy
    model = TargetModel("target.gguf", threads=2)
    logits, features = model.forward(ids, taps=[1, 5])   # appends to model.kv
    model.kv.crop(n)                                     # roll back to n tokens

    drafter = Drafter("drafter.gguf", model)              # DFlash v1 / DFlash2, llama.cpp or lucebox profile
    drafter = open_drafter("eagle3.gguf", model)          # any family: DFlash, DSpark, EAGLE3, MTP ("mtp": the target's)
    out = speculative_generate(model, drafter, drafter.new_kv(ring_cap=4096), ids, 64)   # = greedy output
    acceptance_stats([out.steps], drafter.block_size)    # the statistics, named as in stats.DEFINITIONS
    speculative_generate(..., settings=DraftSettings(tree_budget=22))   # verify a draft tree (DDTree, ddtree.py)

The runtime computes: forward, greedy decoding, speculative decoding, statistics. Loading a pair from paths,
warming up, timing and measuring memory is the jobs' work (ggtools.jobs.run: run, run_speculative).
"""

from ggtools.runtime.backends import numerics_note
from ggtools.runtime.drafter import Drafter
from ggtools.runtime.drafter.draft_kv import FullKV, RingKV
from ggtools.runtime.drafter.families import open_drafter
from ggtools.runtime.errors import ModelError
from ggtools.runtime.greedy_decoding import continue_greedy, greedy
from ggtools.runtime.model.hparams import HParams
from ggtools.runtime.model.kvcache import KVCache
from ggtools.runtime.model.model import TargetModel
from ggtools.runtime.speculative import (DraftSettings, SpecOutput, Step, check_settings, speculative_generate,
                                         tree_top_k)
from ggtools.runtime.stats import DEFINITIONS, acceptance_stats
from ggtools.runtime.tokenizer import Tokenizer, TokenizerError

__all__ = ["DEFINITIONS", "DraftSettings", "Drafter", "FullKV", "HParams", "KVCache", "ModelError", "RingKV",
           "SpecOutput", "Step", "TargetModel", "Tokenizer", "TokenizerError", "acceptance_stats", "check_settings",
           "continue_greedy", "greedy", "numerics_note", "open_drafter", "speculative_generate", "tree_top_k"]
