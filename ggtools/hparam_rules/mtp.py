"""MTP (NextN) blocks: where a model file keeps them, and what llama.cpp asks of them.

llama.cpp (llama-cpp-python 0.3.36): `<arch>.nextn_predict_layers` (u32, default 0) counts the MTP blocks stored
after the trunk and inside `block_count`: the trunk is blocks 0..n_layer()-1 (n_layer() = n_layer_all -
n_layer_nextn, llama-hparams.cpp), the MTP blocks are `blk.{n_layer()}.*` on. An MTP block of the Qwen archs
(llama.cpp's converter's Qwen MTP mixin: qwen35, qwen35moe, qwen3next) is a full-attention decoder block plus
`nextn.eh_proj` {2E, E}, `nextn.enorm`, `nextn.hnorm` and, optional, `nextn.embed_tokens`, `nextn.shared_head_head`,
`nextn.shared_head_norm` (src/models/qwen35.cpp: load_block_mtp). Their loader requires the block's tensors (a missing
one: "check_tensor_dims: tensor '...' not found"), and their MTP graph runs exactly one block, asserting its nextn
tensors ("MTP block missing nextn.eh_proj": the tensors of a model loaded without load_mtp, the trunk's loader, are
skipped) and, on the MoE archs, its router.

An MTP sidecar (convert_hf_to_gguf.py --mtp) is such a model without the trunk's blocks: the target's keys,
token_embd, output_norm, output and the MTP blocks. llama.cpp loads it as a draft model (with no
`blk.0.attn_norm.weight` the trunk's tensors are not required, qwen35.cpp). Drafting with MTP from a model without
MTP blocks (a --no-mtp conversion) gets no MTP context: "context type MTP requested but model doesn't contain MTP
layers" (llama-context.cpp), and a draft whose width is not the target's trips "MTP input row width must match the
target h_nextn width" (common/speculative.cpp).

Applied by validate and doctor (the key and tensor rules through model_violations; the drafting and pair rules
through doctor's MTP check, jobs/mtp_doctor.py) and by ggtools' runtime loaders, in these words.
"""

import re
from dataclasses import dataclass

from ggtools.hparam_rules.keys import Keys
from ggtools.hparam_rules.violation import MISSING, Violation

NEXTN_KEY = "nextn_predict_layers"
MTP_PART = "MTP block"                                  # how plans list an MTP block's tensors apart
NEXTN_TENSORS = ("eh_proj", "enorm", "hnorm")            # what every MTP graph asserts of its block
MISSING_TENSOR = "check_tensor_dims: tensor '{}' not found"     # llama-model-loader.cpp, a required tensor absent
NO_MTP_LAYERS = "llama_init_from_model: context type MTP requested but model doesn't contain MTP layers"
ROW_WIDTH = 'GGML_ASSERT(n_embd == llama_model_n_embd_out(llama_get_model(ctx_tgt)) && "MTP input row width must ' \
            'match the target h_nextn width") failed'
DRAFTS_WRONG = "drafts with it: drafts of another model, acceptance near 0"
BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class MtpArch:
    graph: str              # its MTP graph's name in the asserts ("QWEN35 MTP currently only supports ...")
    routed: bool            # the MTP block routes to experts: the graph asserts its ffn_gate_inp


MTP_ARCHS = {"qwen35": MtpArch("QWEN35", False), "qwen35moe": MtpArch("QWEN35MOE", True),
             "qwen3next": MtpArch("QWEN3NEXT", True)}


@dataclass(frozen=True)
class MtpBlocks:
    """A model's blocks as llama.cpp counts them: block_count (trunk and MTP blocks) and the MTP blocks among them."""
    arch: str
    n_layer_all: int
    n_nextn: int

    @property
    def n_layer(self) -> int:
        """The trunk's blocks: the MTP blocks start at this index."""
        return self.n_layer_all - self.n_nextn

    @property
    def ids(self) -> range:
        return range(self.n_layer, self.n_layer_all)

    def holds(self, tensor_name: str) -> bool:
        """Whether the tensor belongs to an MTP block (blk.i.* with i an MTP block's index)."""
        m = BLOCK.match(tensor_name)
        return m is not None and int(m.group(1)) in self.ids

    def required(self, i: int) -> list[str]:
        """The tensors of MTP block i the MTP graph asserts (loaded: the loader requires them too)."""
        names = [f"blk.{i}.nextn.{n}.weight" for n in NEXTN_TENSORS]
        return names + ([f"blk.{i}.ffn_gate_inp.weight"] if MTP_ARCHS[self.arch].routed else [])


def mtp_blocks(f) -> MtpBlocks | None:
    """The blocks of a model (f: its GGUFFile, shard 1 of a set), or None where its keys do not say (the key rules
    report those)."""
    arch = f.architecture
    if arch is None:
        return None
    n_all, n_nextn = f.get(f"{arch}.block_count"), f.get(f"{arch}.{NEXTN_KEY}", 0)
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in (n_all, n_nextn)) or n_nextn > n_all:
        return None
    return MtpBlocks(arch, n_all, n_nextn)


def nextn_rules(k: Keys, n_layer_all: int | None):
    """nextn_predict_layers: MTP blocks after a trunk of at least one layer; one block where llama.cpp's MTP graph runs
    one."""
    nextn = k.uint(NEXTN_KEY, 0)
    if n_layer_all is None or nextn is None:
        return
    if not k.check(NEXTN_KEY, nextn < n_layer_all,
                   f"is {nextn} of {n_layer_all} layers (block_count): it leaves no trunk layer to run"
                   + (" (llama.cpp asserts n_layer_nextn <= n_layer_all)" if nextn > n_layer_all else ""),
                   "GGML_ASSERT(hparams.n_layer_nextn <= hparams.n_layer_all) failed" if nextn > n_layer_all else None):
        return
    arch = MTP_ARCHS.get(k.f.architecture)
    if arch is not None and nextn > 1:
        k.fail(NEXTN_KEY, f"is {nextn}: llama.cpp's {arch.graph} MTP graph runs a single MTP block (the model loads; "
               "drafting with MTP aborts)",
               f'GGML_ASSERT(hparams.n_layer_nextn == 1 && "{arch.graph} MTP currently only supports a single MTP '
               'block") failed', check="mtp")


def mtp_tensor_violations(f, locate=None) -> list[Violation]:
    """The nextn tensors (and, MoE, the router) each MTP block must hold; f: the model's GGUFFile (shard 1: its
    keys); locate(name) -> (GGUFFile, TensorInfo) or None over the model's files (default: f's tensors)."""
    blocks = mtp_blocks(f)
    if blocks is None or blocks.arch not in MTP_ARCHS:
        return []
    locate = locate or (lambda name: (f, f.tensor[name]) if name in f.tensor else None)
    out = []
    for i in blocks.ids:
        for name in blocks.required(i):
            if locate(name) is None:
                piece = name[len(f"blk.{i}."):-len(".weight")]
                out.append(Violation(None, f"missing: MTP block {i} has no {piece} (llama.cpp's MTP graph asserts it: "
                                     f'"MTP block missing {piece}")', MISSING_TENSOR.format(name), MISSING, "mtp",
                                     tensor=name))
    return out


def mtp_draft_violations(f) -> list[Violation]:
    """What stops drafting with MTP from this model (a target with its MTP block, or a sidecar): an MTP arch without
    MTP blocks. The model's own rules (model_violations) come first."""
    blocks = mtp_blocks(f)
    if blocks is None or blocks.n_nextn or blocks.arch not in MTP_ARCHS:
        return []
    key = f"{blocks.arch}.{NEXTN_KEY}"
    state = "is 0" if key in f.kv else "is absent"
    return [Violation(key, f"{state}: the model holds no MTP block to draft with (a --no-mtp conversion; convert the "
                      "checkpoint without --no-mtp, or draft with its MTP sidecar)", NO_MTP_LAYERS, check="mtp")]


def mtp_pair_violations(draft, target) -> list[Violation]:
    """Whether an MTP draft (a sidecar, or a model with its MTP block) belongs to the target it drafts for: the same
    arch, width, trunk, keys and vocabulary (its MTP block was trained on that trunk's hidden states). A target
    converted with --no-mtp has the sidecar's keys but for block_count and nextn_predict_layers."""
    arch = draft.architecture
    if target.architecture != arch:
        return [Violation("general.architecture", f"'{arch}' differs from the target's '{target.architecture}' "
                          f"({target.path}): this MTP block belongs to another model", check="mtp_pair",
                          symptom=DRAFTS_WRONG)]
    d, t = mtp_blocks(draft), mtp_blocks(target)
    out = []
    if d is not None and t is not None and d.n_layer != t.n_layer:
        out.append(Violation(f"{arch}.block_count", f"gives a trunk of {d.n_layer} blocks ({d.n_layer_all} less "
                             f"{d.n_nextn} MTP), the target's has {t.n_layer} ({target.path}): this MTP block "
                             "belongs to another model", check="mtp_pair", symptom=DRAFTS_WRONG))
    for key, mine, theirs in _differing_keys(draft, target, arch, d, t):
        width = key == f"{arch}.embedding_length"
        out.append(Violation(key, f"is {_shown(mine)}, the target's is {_shown(theirs)} ({target.path}): this MTP "
                             "block belongs to another model", ROW_WIDTH if width else None, check="mtp_pair",
                             symptom=None if width else DRAFTS_WRONG))
    return out


PAIRED_GLOBAL = ("tokenizer.ggml.model", "tokenizer.ggml.tokens")      # the vocabulary: token ids must mean the same
PER_LAYER = ("attention.recurrent_layers",)                            # sized by block_count: compared on the trunk


def _differing_keys(draft, target, arch, d: MtpBlocks | None, t: MtpBlocks | None):
    """(key, draft's value, target's value) of every `<arch>.*` key (less the block counts) and vocabulary key that
    the two hold differently; a per-layer array over the trunk's blocks only."""
    skip = {f"{arch}.block_count", f"{arch}.{NEXTN_KEY}"}
    for kv in draft.kvs:
        key = kv.key
        if key in skip or not (key.startswith(arch + ".") or key in PAIRED_GLOBAL):
            continue
        theirs = target.kv.get(key)
        if theirs is None:
            yield key, kv.value, None
        elif key[len(arch) + 1:] in PER_LAYER and kv.is_array and theirs.is_array and None not in (d, t):
            if list(kv.value[:d.n_layer]) != list(theirs.value[:t.n_layer]):
                yield key, kv.value[:d.n_layer], theirs.value[:t.n_layer]
        elif kv.vtype != theirs.vtype or bytes(kv.raw) != bytes(theirs.raw):
            yield key, kv.value, theirs.value


def _shown(value) -> str:
    if value is None:
        return "absent"
    if hasattr(value, "__len__") and not isinstance(value, str) and len(value) > 8:
        return f"an array of {len(value)}"
    return repr(value.tolist() if hasattr(value, "tolist") else value)
