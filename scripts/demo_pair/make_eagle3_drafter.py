#!/usr/bin/env python
"""Make the demo target's EAGLE3 drafter: self-distillation data from the demo target (the DSpark drafters' recipe:
greedy continuations of training-text prompts plus training windows), one EAGLE3 layer trained with the unrolled
draft chain (scripts/demo_pair/ttt.py), ggtools' conversion (byte for byte llama.cpp's) and the acceptance the ggtools
runtime measures on the demo's held-out prompts. Torch on the CPU, one thread, fixed seeds; a few minutes.

    python -m scripts.demo_pair.make_eagle3_drafter            # writes ggtools/data/demo/eagle3/ and eagle3.json
    python -m scripts.demo_pair.make_eagle3_drafter --from eval

Intermediate results are cached in $DEMO_PAIR_WORK (default /tmp/ggtools-demo-pair)/eagle3.
"""

import json
import platform
import shutil

import torch

from scripts.demo_pair.common import EOS_TOKEN, OUT_DIR, SEED, WORK_DIR
from scripts.demo_pair.eagle3 import DRAFT_VOCAB, TARGET_LAYERS
from scripts.demo_pair.stages import accept_row, log, self_distillation_data, stage_main

THREADS = 1
STAGES = ["data", "train", "eval", "write"]
NAME = "eagle3"

DATA = dict(n_generated=384, prompt_len=128, new_tokens=128, n_text=128, seq_len=256)
MODEL = dict(intermediate=256, heads=4, kv_heads=2)
TRAIN = dict(steps=600, batch=8, lr=3e-3, decay=0.8, ttt_steps=3)
# evaluation: the demo's held-out prompts (jobs/demo.py held_out_prompts), the ggtools runtime (numba), n_max 3
EVAL = dict(prompts=18, prompt_tokens=128, new_tokens=64)

WORK = WORK_DIR / NAME



def _eos():
    from tokenizers import Tokenizer
    return Tokenizer.from_file(str(OUT_DIR / "tokenizer.json")).token_to_id(EOS_TOKEN)


def _target():
    from scripts.demo_pair.gguf_io import load_target_from_gguf
    target = load_target_from_gguf(OUT_DIR / "target.gguf")
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def stage_data(state):
    """The target's hidden states entering layers TARGET_LAYERS (HF hidden_states[i]) and its argmax everywhere."""
    from scripts.demo_pair.drafter import target_features
    target = _target()
    seqs = self_distillation_data(target, DATA, _eos(), SEED + 31, log)
    feats, preds = target_features(target, seqs, [i - 1 for i in TARGET_LAYERS])   # it reads hidden_states[i + 1]
    torch.save({"seqs": seqs, "feats": feats, "preds": preds}, WORK / "data.pt")


def stage_train(state):
    from scripts.demo_pair import ttt
    from scripts.demo_pair.dspark import draft_vocabulary
    from scripts.demo_pair.eagle3 import Eagle3Drafter, eagle3_config, save_checkpoint
    target = _target()
    eos = _eos()
    data = torch.load(WORK / "data.pt")
    draft_ids = draft_vocabulary(data["preds"], DRAFT_VOCAB, eos)
    coverage = torch.isin(data["preds"], draft_ids).float().mean().item()
    log(f"draft vocabulary: {DRAFT_VOCAB} ids cover {coverage:.4f} of the target's greedy tokens in the data")
    state["draft_vocab_coverage"] = round(coverage, 4)
    torch.manual_seed(SEED + 32)
    drafter = Eagle3Drafter(eagle3_config(target.config, eos=eos, **MODEL), target, draft_ids)
    to_draft = torch.full((target.config.vocab_size,), -1, dtype=torch.long)
    to_draft[draft_ids] = torch.arange(len(draft_ids))
    params = [p for p in drafter.parameters() if p.requires_grad]
    ttt.train(drafter, params, data["seqs"], data["feats"], data["preds"], shift=1, seed=SEED + 33,
              to_draft=to_draft, name=NAME, log=log, **TRAIN)
    out = OUT_DIR / NAME
    if out.exists():
        shutil.rmtree(out)
    save_checkpoint(drafter, out)
    log(f"{NAME}: written to {out}")


def stage_eval(state):
    """ggtools' conversion (llama.cpp's bytes), then τ on the held-out prompts with the ggtools runtime."""
    from ggtools.jobs.convert_drafter import convert_drafter
    gguf = WORK / f"{NAME}-bf16.gguf"
    convert_drafter(OUT_DIR / NAME, gguf, target=str(OUT_DIR / "target.gguf"), force=True)
    state["eval"] = accept_row(OUT_DIR / "target.gguf", str(gguf), EVAL, NAME, log)


def stage_write(state):
    import transformers
    sizes = {f"{NAME}/{p.name}": p.stat().st_size for p in sorted((OUT_DIR / NAME).iterdir())}
    meta = {"made_by": "scripts/demo_pair/make_eagle3_drafter.py", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED,
            "layout": "LlamaForCausalLMEagle3 (midlayer.*, own lm_head over a reduced vocabulary, d2t / t2d)",
            "target": "target.gguf", "target_layers": TARGET_LAYERS, "draft_vocab": DRAFT_VOCAB,
            "draft_vocab_coverage": state.get("draft_vocab_coverage"), "model": MODEL, "data": DATA,
            "train": TRAIN, "eval_settings": EVAL, "eval": state.get("eval"), "seconds": state.get("seconds"),
            "cpu_seconds": state.get("cpu_seconds"), "sizes_bytes": sizes}
    (OUT_DIR / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"{NAME}.json written; checkpoint {sum(sizes.values()) / 1e6:.2f} MB")


def _smoke():
    DATA.update(n_generated=8, n_text=8)
    TRAIN.update(steps=3)
    EVAL.update(prompts=2, new_tokens=16)


if __name__ == "__main__":
    stage_main(__doc__, globals(), STAGES, WORK, _smoke, THREADS)
