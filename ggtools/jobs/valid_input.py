"""The input a rewriting job that stands for llama-quantize (quantize, requant-trunk) takes: one `ggtools validate`
passes. A command never writes what its own validate rejects, and the output of a model that breaks a model-file
rule (a d2t id outside the vocabulary, a block size of 0, a flag that is not a BOOL) would break it too."""

from ggtools.gguf import ShardSet
from ggtools.gguf.check import refuse
from ggtools.jobs.validate import validate


def require_valid_model(shards: ShardSet):
    """Refuse (exit 2) a model `ggtools validate` fails, naming the file, the place and the first rule broken:
    every file's container rules, the set's, and the model-file rules (hyperparameters, tensors against them, a
    DSpark drafter's heads and d2t), whatever validate applies. Its --deep scan aside: the rewrite refuses NaN/inf
    data itself (or counts it, --allow-nonfinite)."""
    shards.require_complete()
    refuse(validate([shards.paths[0]]).problems, "refusing an invalid input")
