"""Model-file rules: which hyperparameters a GGUF must hold, as llama.cpp's loader checks them, plus what it misses
(NaN and inf, zeros it divides by, RoPE sizes ggml asserts on). One place that `validate`, `doctor` and the
runtime's loaders (runtime/model/hparams.py, runtime/drafter/hparams.py) all apply; each caller turns a
Violation into its own report or error (a Problem, a Finding, a ModelError), in the same words.

    violations = model_violations(gguf)      # target or drafter, by general.architecture
    for v in violations: print(f"{gguf.path}: {v}")    # "m.gguf: key 'qwen3.rope.dimension_count': is 999, ..."

Once the keys pass, the tensors' shapes are checked against them (tensor_shapes.py: what llama.cpp's loader asks
of each tensor, "tensor 'blk.0.attn_q.weight': has wrong shape; expected [...], got [...]"); for a split model,
pass `locate` so that the tensors of every shard are seen.

A DSpark drafter's heads and a reduced draft vocabulary's d2t table have rules of their own (dspark.py:
`dspark_violations`), which doctor and validate report as DSpark findings and the drafter loader applies too.
A model's MTP (NextN) blocks have theirs (mtp.py): nextn_predict_layers among the target's keys, each block's nextn
tensors among its tensors (both through model_violations), and, for drafting with MTP, `mtp_draft_violations` (the
model holds an MTP block) and `mtp_pair_violations` (a sidecar belongs to its target).
An EAGLE3 drafter (arch eagle3) has its own keys and tensors (eagle3.py: through model_violations) and pair rules
(`eagle3_pair_violations`: the drafter against its target).

What the runtime cannot run although the file is valid (a separate RoPE base for sliding-window layers, key and
value heads of different sizes, ...) is the runtime's own refusal, not a rule here.
"""

from ggtools.dflash.eagle3 import is_eagle3_arch
from ggtools.dflash.profiles import profile_of
from ggtools.hparam_rules.drafter import drafter_violations
from ggtools.hparam_rules.dspark import dspark_violations
from ggtools.hparam_rules.mtp import mtp_draft_violations, mtp_pair_violations, mtp_tensor_violations
from ggtools.hparam_rules.eagle3 import eagle3_pair_violations, eagle3_tensor_violations, eagle3_violations
from ggtools.hparam_rules.target import ARCHS, target_violations
from ggtools.hparam_rules.required_tensors import missing_tensor_violations
from ggtools.hparam_rules.tensor_shapes import tensor_shape_violations
from ggtools.hparam_rules.violation import MISSING, TYPE, VALUE, Violation

__all__ = ["ARCHS", "MISSING", "TYPE", "VALUE", "Violation", "drafter_violations", "dspark_violations",
           "eagle3_pair_violations", "eagle3_tensor_violations", "eagle3_violations",
           "model_violations", "mtp_draft_violations", "mtp_pair_violations", "mtp_tensor_violations",
           "target_violations", "tensor_shape_violations"]


def model_violations(gguf, locate=None, mask_id: int | None = None) -> list[Violation]:
    """The rules of the file's arch: a DFlash drafter's, else a target's (`gguf`: a GGUFFile, shard 1 of a set),
    then, once its keys pass, its tensors' shapes. locate(name) -> (GGUFFile, TensorInfo) or None: where a tensor
    lies in the model's files (default: in gguf); mask_id: a drafter's mask id given instead of the stored one."""
    if profile_of(gguf.architecture) is not None:
        keys = drafter_violations(gguf, mask_id)
    elif is_eagle3_arch(gguf.architecture):
        keys = eagle3_violations(gguf)
    else:
        keys = target_violations(gguf)
    return keys or (tensor_shape_violations(gguf, locate) + missing_tensor_violations(gguf, locate)
                    + mtp_tensor_violations(gguf, locate) + eagle3_tensor_violations(gguf, locate))
