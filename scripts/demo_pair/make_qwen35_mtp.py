#!/usr/bin/env python
"""Make the demo's Qwen3.5 target with a trained MTP block (scripts/demo_pair/qwen35_mtp.py): the trunk trained on the
demo corpus as the demo target was (scripts/demo_pair/target.py), self-distillation data from it, the MTP block
trained with the unrolled draft chain (scripts/demo_pair/ttt.py), the Hugging Face checkpoint, llama.cpp's own
conversion of it (the committed GGUF: the target with its MTP block) and the acceptance the ggtools runtime measures
with `--draft mtp` on the demo's held-out prompts. Torch on the CPU, one thread, fixed seeds; about 10 minutes.
The convert stage needs the llama.cpp source tree (scripts/fixtures/llama_cpp_src.py).

    python -m scripts.demo_pair.make_qwen35_mtp       # writes ggtools/data/demo/qwen35-mtp/, qwen35-mtp.gguf, .json
    python -m scripts.demo_pair.make_qwen35_mtp --from mtp

Intermediate results are cached in $DEMO_PAIR_WORK (default /tmp/ggtools-demo-pair)/qwen35-mtp.
"""

import json
import platform
import tempfile

import numpy as np
import torch

from scripts.demo_pair.common import EOS_TOKEN, OUT_DIR, SEED, WORK_DIR, corpus_files, read_text
from scripts.demo_pair.qwen35_mtp import GGUF, HF_DIR, NAME, QWEN35
from scripts.demo_pair.stages import accept_row, log, self_distillation_data, stage_main, training_stream

THREADS = 1
STAGES = ["target", "data", "mtp", "convert", "eval", "write"]

TARGET_TRAIN = dict(steps=700, batch=8, seq_len=256, lr=4e-3)
DATA = dict(n_generated=384, prompt_len=128, new_tokens=128, n_text=128, seq_len=256)
MTP_TRAIN = dict(steps=500, batch=8, lr=3e-3, decay=0.8, ttt_steps=3)
EVAL = dict(prompts=18, prompt_tokens=128, new_tokens=64)

WORK = WORK_DIR / NAME



def _tokenizer():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(OUT_DIR / "tokenizer.json"))
    return tok, tok.token_to_id(EOS_TOKEN)


def _round_to_checkpoint(model):
    """Every parameter rounded to bf16, what the checkpoint stores (llama.cpp's converter reads bf16 as f32)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(p.bfloat16().float())
    return model


def _trunk():
    from transformers import Qwen3_5ForCausalLM
    from scripts.demo_pair.qwen35_mtp import qwen35_config
    model = Qwen3_5ForCausalLM(qwen35_config())
    model.load_state_dict(torch.load(WORK / "target.pt"))
    model.tie_weights()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def stage_target(state):
    from scripts.demo_pair.qwen35_mtp import new_target
    from scripts.demo_pair.target import eval_loss, train_target
    tok, eos = _tokenizer()
    tokens = training_stream(eos, tok)
    model = train_target(tokens, seed=SEED + 41, log=log, make_model=lambda: new_target(SEED + 41), **TARGET_TRAIN)
    _round_to_checkpoint(model)
    torch.save(model.state_dict(), WORK / "target.pt")
    _, held = corpus_files()
    held_stream = np.array([t for p in held for t in tok.encode(read_text(p)).ids], dtype=np.int64)
    state["target_heldout_loss"] = round(eval_loss(model, held_stream, 256), 4)
    state["target_train_loss"] = round(eval_loss(model, tokens[:200_000].astype(np.int64), 256), 4)
    log(f"qwen35 target: train loss {state['target_train_loss']:.3f}, held-out {state['target_heldout_loss']:.3f}")


@torch.no_grad()
def _final_states(target, seqs, batch: int = 32):
    """(the target's last state after its final norm [N, L, H], its argmax [N, L]) of every position."""
    states, preds = [], []
    for i in range(0, len(seqs), batch):
        h = target.model(input_ids=seqs[i:i + batch]).last_hidden_state
        states.append(h)
        preds.append(target.lm_head(h).argmax(-1))
    return torch.cat(states), torch.cat(preds)


def stage_data(state):
    target = _trunk()
    _, eos = _tokenizer()
    seqs = self_distillation_data(target, DATA, eos, SEED + 42, log)
    feats, preds = _final_states(target, seqs)
    torch.save({"seqs": seqs, "feats": feats, "preds": preds}, WORK / "data.pt")


def stage_mtp(state):
    from scripts.demo_pair import ttt
    from scripts.demo_pair.qwen35_mtp import MtpBlock, save_checkpoint
    target = _trunk()
    data = torch.load(WORK / "data.pt")
    torch.manual_seed(SEED + 43)
    block = MtpBlock(target)
    block.init_from_target(target)
    params = [p for p in block.parameters() if p.requires_grad]
    ttt.train(block, params, data["seqs"], data["feats"], data["preds"], shift=0, seed=SEED + 44, name="mtp",
              log=log, **MTP_TRAIN)
    save_checkpoint(target, block, HF_DIR)
    log(f"{NAME}: checkpoint written to {HF_DIR}")


def stage_convert(state):
    """llama.cpp's converter on the checkpoint: the committed GGUF (tests/test_demo_drafters.py checks it is
    exactly what the converter writes)."""
    from scripts.demo_pair.qwen35_mtp import convert_with_llama_cpp
    from scripts.fixtures.llama_cpp_src import llama_cpp_src
    with tempfile.TemporaryDirectory() as tmp:
        convert_with_llama_cpp(HF_DIR, GGUF, llama_cpp_src(), tmp)
    log(f"{GGUF.name}: {GGUF.stat().st_size} bytes")


def stage_eval(state):
    state["eval"] = accept_row(GGUF, "mtp", EVAL, "mtp", log)


def stage_write(state):
    import transformers
    files = sorted(HF_DIR.iterdir()) + [GGUF]
    sizes = {str(p.relative_to(OUT_DIR)): p.stat().st_size for p in files}
    meta = {"made_by": "scripts/demo_pair/make_qwen35_mtp.py", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED,
            "target": {"config": QWEN35, "train": TARGET_TRAIN, "train_loss": state.get("target_train_loss"),
                       "heldout_loss": state.get("target_heldout_loss")},
            "gguf": f"{GGUF.name}: llama.cpp's convert_hf_to_gguf.py on {NAME}/ (+ tokenizer.json), --outtype f16",
            "data": DATA, "mtp_train": MTP_TRAIN, "eval_settings": EVAL, "eval": state.get("eval"),
            "seconds": state.get("seconds"), "cpu_seconds": state.get("cpu_seconds"), "sizes_bytes": sizes}
    (OUT_DIR / f"{NAME}.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"{NAME}.json written; {sum(sizes.values()) / 1e6:.2f} MB")


def _smoke():
    TARGET_TRAIN.update(steps=3)
    DATA.update(n_generated=8, n_text=8)
    MTP_TRAIN.update(steps=3)
    EVAL.update(prompts=2, new_tokens=16)


if __name__ == "__main__":
    stage_main(__doc__, globals(), STAGES, WORK, _smoke, THREADS)
