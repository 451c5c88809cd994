"""DraftConfig: the hyperparameters of a DFlash drafter, resolved from config.json with explicit rules.

- mask_token_id: an explicit override, else `dflash_config.mask_token_id`, else the top-level
  `mask_token_id` (llama.cpp's converter reads only the former, lucebox's only the latter).
- block_size: `dflash_config.block_size`, else top-level `block_size` / `draft_block_size`, else 16 (as
  llama.cpp's converter).
- target_layer_ids: `dflash_config.target_layer_ids`, else top-level `target_layer_ids`. z-lab's
  `build_target_layer_ids` guess for a missing list is wrong for many published drafters (z-lab/dflash#156),
  so it is used only when explicitly allowed.
- DSpark: the config normalized by dflash/dspark.py (a speculators layout's ids are its
  aux_hidden_state_layer_ids - 1), and the heads' facts in `dspark`.
"""

from dataclasses import dataclass, field

from ggtools.dflash.checkpoint import Checkpoint
from ggtools.dflash.config_reader import F32, LAYER_ID, LAYERS, U32, ConfigReader
from ggtools.dflash.dspark import DSparkConfig, dspark_config
from ggtools.dflash.errors import CheckpointError

DEFAULT_BLOCK_SIZE = 16
V2_KEYS = ("conv_kernel_size", "conv_group_size", "selector_rank", "selector_top_k")


@dataclass
class DraftConfig:
    version: int
    hidden: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    vocab: int | None
    block_size: int
    block_size_from: str
    mask_token_id: int | None
    mask_from: str
    target_layer_ids: list[int]
    ids_from: str
    num_target_layers: int | None          # the target's depth, as config.json states it
    attention_bias: bool = False
    v2: dict = field(default_factory=dict)  # conv_kernel_size, conv_group_size, selector_rank, selector_top_k
    dspark: DSparkConfig | None = None      # a DSpark drafter's heads

    @property
    def fc_in(self) -> int:
        return len(self.target_layer_ids) * self.hidden


def draft_config(ckpt: Checkpoint, *, mask_token_id: int | None = None,
                 guess_target_layers: bool = False) -> DraftConfig:
    c, dc, where, n = ckpt.config, ckpt.dflash_config, ckpt.config_path, ckpt.numbers
    hidden = n.require(c, "hidden_size", U32)
    n_head = n.require(c, "num_attention_heads", U32)
    n_head_kv = n.get(c, "num_key_value_heads", U32, n_head)
    head_dim = n.get(c, "head_dim", U32, hidden // n_head if n_head else 0)
    n_layer = n.require(c, "num_hidden_layers", LAYERS)
    num_target = n.get(c, "num_target_layers", LAYERS)
    mask, mask_from = _mask(dc, c, mask_token_id, n)
    ids, ids_from = _target_ids(dc, c, where, num_target, n_layer, guess_target_layers, n)
    if ckpt.dspark is not None and ckpt.dspark.ids_from:     # a dflash_config built from the layout's own keys
        ids_from = ckpt.dspark.ids_from if ids_from == "dflash_config.target_layer_ids" else ids_from
        mask_from = ckpt.dspark.mask_from if mask_from == "dflash_config.mask_token_id" else mask_from
    block, block_from = _block_size(dc, c, n)
    v2 = {}
    if ckpt.version == 2:
        missing = [k for k in V2_KEYS if k not in dc]
        if missing:
            raise CheckpointError(where, f"a DFlash2 drafter needs {', '.join(missing)} in dflash_config",
                                  "dflash_config")
        v2 = {k: n.require(dc, k, U32, prefix="dflash_config.") for k in V2_KEYS}
    vocab = n.get(c, "vocab_size", U32)
    return DraftConfig(
        version=ckpt.version, hidden=hidden, n_layer=n_layer, n_head=n_head, n_head_kv=n_head_kv,
        head_dim=head_dim, n_ff=n.require(c, "intermediate_size", U32),
        vocab=vocab, block_size=block, block_size_from=block_from,
        mask_token_id=mask, mask_from=mask_from, target_layer_ids=ids, ids_from=ids_from,
        num_target_layers=num_target, attention_bias=bool(c.get("attention_bias", False)), v2=v2,
        dspark=dspark_config(ckpt, ckpt.dspark, hidden, vocab) if ckpt.dspark else None)


def rope_base(ckpt: Checkpoint) -> tuple[float | None, str]:
    """The RoPE base config.json states (rope_theta, else rope_parameters' or rope_scaling's) and where; (None, what
    was looked for) when it states none."""
    c, n = ckpt.config, ckpt.numbers
    for parent in (None, "rope_parameters", "rope_scaling"):
        d, reader = (c, n) if parent is None else (n.table(c, parent) or {}, n.within(parent))
        if (theta := reader.get(d, "rope_theta", F32)) is not None:
            return float(theta), reader.place("rope_theta")
    return None, "neither rope_theta nor rope_parameters.rope_theta"


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """z-lab's guess (dflash/model.py) for a checkpoint without target_layer_ids."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    start, end = 1, num_target_layers - 3
    return [round(start + (i * (end - start)) / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def _mask(dc, c, override, n: ConfigReader):
    if override is not None:
        return override, "--mask-token-id"
    for d, prefix in ((dc, "dflash_config."), (c, "")):
        mask = n.get(d, "mask_token_id", U32, prefix=prefix)
        if mask is not None:
            return mask, prefix + "mask_token_id"
    return None, "missing"


def _block_size(dc, c, n: ConfigReader):
    for d, key, prefix in ((dc, "block_size", "dflash_config."), (c, "block_size", ""), (c, "draft_block_size", "")):
        block = n.get(d, key, U32, prefix=prefix)
        if block is not None:
            return block, prefix + key
    return DEFAULT_BLOCK_SIZE, "default (16, as llama.cpp's converter)"


def _target_ids(dc, c, where, num_target, n_layer, allow_guess, n: ConfigReader):
    for d, key in ((dc, "dflash_config.target_layer_ids"), (c, "target_layer_ids")):
        ids = d.get("target_layer_ids")
        if ids is None:
            continue
        if not isinstance(ids, list) or not ids:
            n.refuse(key, f"{ids!r} is not a non-empty list of layer ids")
        ids = n.numbers(ids, key, LAYER_ID)
        if len(set(ids)) != len(ids):
            n.refuse(key, f"{ids}: a layer id appears twice")
        if num_target is not None and max(ids) >= num_target:
            n.refuse(key, f"{ids}: id {max(ids)} is not a layer of a {num_target}-layer target (num_target_layers = "
                          f"{num_target}; ids run 0..{num_target - 1})")
        return ids, key
    if not allow_guess:
        raise CheckpointError(where, "missing: without it z-lab's build_target_layer_ids guess is used, which is "
                                     "wrong for many published drafters (z-lab/dflash#156); add the ids the "
                                     "drafter was trained with, or pass --guess-target-layers to accept the guess",
                              "dflash_config.target_layer_ids")
    if num_target is None:
        raise CheckpointError(where, "missing, and so is num_target_layers: nothing to guess the target layer "
                                     "ids from", "dflash_config.target_layer_ids")
    return build_target_layer_ids(num_target, n_layer), "guessed (build_target_layer_ids)"
