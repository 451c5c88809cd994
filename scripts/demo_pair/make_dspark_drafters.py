#!/usr/bin/env python
"""Make the demo target's DSpark drafters: self-distillation data from the demo target, two drafters (scripts/
demo_pair/dspark.py), their llama.cpp conversions, and τ measured by the ggtools runtime with and without the Markov
head and the confidence cut. Torch on the CPU, one thread, fixed seeds; a few minutes.

    python -m scripts.demo_pair.make_dspark_drafters            # writes ggtools/data/demo/dspark-*/ and dspark.json
    python -m scripts.demo_pair.make_dspark_drafters --from eval

  dspark-anchor        DeepSpec layout: anchor-first block (block_size drafts), Markov head, confidence head
  dspark-speculators   speculators layout: bonus anchor, reduced draft vocabulary (d2t), Markov head, confidence head

Intermediate results are cached in $DEMO_PAIR_WORK (default /tmp/ggtools-demo-pair)/dspark.
"""

import json
import platform
import shutil

import torch

from scripts.demo_pair.common import EOS_TOKEN, MASK_TOKEN, OUT_DIR, SEED, TARGET_LAYER_IDS, WORK_DIR
from scripts.demo_pair.stages import log, self_distillation_data, stage_main

THREADS = 1
STAGES = ["data", "anchor", "speculators", "eval", "write"]

DATA = dict(n_generated=384, prompt_len=128, new_tokens=128, n_text=128, seq_len=256)
MARKOV_RANK = 32
DRAFTERS = {
    "dspark-anchor": dict(anchor_first=True, draft_vocab=None, confidence=True),
    "dspark-speculators": dict(anchor_first=False, draft_vocab=512, confidence=True),
}
TRAIN = dict(steps=300, batch=8, anchors_per_seq=24, lr=2e-3, gamma=4.0, conf_weight=0.5)
# evaluation: the demo's held-out prompts (jobs/demo.py held_out_prompts), the ggtools runtime (numba), full draft KV
EVAL = dict(prompts=18, prompt_tokens=128, new_tokens=64, p_min=0.5)

WORK = WORK_DIR / "dspark"



def _tokenizer():
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(OUT_DIR / "tokenizer.json"))
    return tok, tok.token_to_id(EOS_TOKEN), tok.token_to_id(MASK_TOKEN)


def _target():
    from scripts.demo_pair.gguf_io import load_target_from_gguf
    target = load_target_from_gguf(OUT_DIR / "target.gguf")
    for p in target.parameters():
        p.requires_grad_(False)
    return target


def stage_data(state):
    """Greedy continuations of training-text prompts by the demo target plus plain training windows; one frozen
    target pass gives the feature taps and the target's argmax at every position (drafter.py's recipe)."""
    from scripts.demo_pair.drafter import target_features
    _, eos, _ = _tokenizer()
    target = _target()
    seqs = self_distillation_data(target, DATA, eos, SEED + 11, log)
    feats, preds = target_features(target, seqs, TARGET_LAYER_IDS)
    torch.save({"seqs": seqs, "feats": feats, "preds": preds}, WORK / "data.pt")


def _train(name, state):
    from dflash import DFlashDraftModel
    from scripts.demo_pair.dspark import DSparkHeads, draft_vocabulary, save_checkpoint, train
    spec = DRAFTERS[name]
    _, eos, mask = _tokenizer()
    target = _target()
    data = torch.load(WORK / "data.pt")
    backbone = DFlashDraftModel.from_pretrained(OUT_DIR / "drafter", dtype=torch.bfloat16).float()
    cfg = backbone.config
    draft_ids = draft_vocabulary(data["preds"], spec["draft_vocab"], eos) if spec["draft_vocab"] else None
    heads = DSparkHeads(cfg.vocab_size, cfg.hidden_size, MARKOV_RANK, draft_ids, spec["confidence"],
                        target.get_input_embeddings().weight.detach(), seed=SEED + 21)
    torch.manual_seed(SEED + 22)
    train(backbone, heads, target, data["seqs"], data["feats"], data["preds"], anchor_first=spec["anchor_first"],
          seed=SEED + 23, log=log, **TRAIN)
    out = OUT_DIR / name
    if out.exists():
        shutil.rmtree(out)
    save_checkpoint(backbone, heads, out, anchor_first=spec["anchor_first"], target_layer_ids=TARGET_LAYER_IDS,
                    mask_id=mask, rank=MARKOV_RANK, eos=eos)
    log(f"{name}: written to {out}")


def stage_anchor(state):
    _train("dspark-anchor", state)


def stage_speculators(state):
    _train("dspark-speculators", state)


def stage_eval(state):
    """llama.cpp's conversions; τ on the held-out prompts with the ggtools runtime: the DFlash demo drafter (the
    baseline), each DSpark drafter, each with its Markov head zeroed, each with the confidence cut."""
    from ggtools.jobs.accept import Candidate, measure
    from ggtools.jobs.convert import convert_dflash
    from ggtools.jobs.demo import held_out_prompts
    from ggtools.runtime import DraftSettings, TargetModel, Tokenizer
    from scripts.fixtures import llama_cpp_src, tiny_models
    convert_demo_drafters = tiny_models.dspark_drafters.convert_demo_drafters
    conv = WORK / "gguf"
    if conv.exists():
        shutil.rmtree(conv)
    conv.mkdir(parents=True)
    paths = convert_demo_drafters(llama_cpp_src.llama_cpp_src(), {n: OUT_DIR / n for n in DRAFTERS}, conv)
    paths["dflash"] = conv / "dflash-f16.gguf"
    convert_dflash(OUT_DIR / "drafter", paths["dflash"], profile="llama.cpp", target=str(OUT_DIR / "target.gguf"),
                   outtype="f16", force=True)
    model = TargetModel(str(OUT_DIR / "target.gguf"), threads=1)
    try:
        tokenizer = Tokenizer.from_gguf(model.weights.meta)
        chosen = held_out_prompts(tokenizer, EVAL["prompts"], EVAL["prompt_tokens"])
        prompts = [ids for _, ids in chosen]
        names = ["dflash"] + [k for n in DRAFTERS for k in (n, f"{n}-no-markov")]
        report = {"prompts": [n for n, _ in chosen], "new_tokens": EVAL["new_tokens"], "rows": {}}
        for cut in ("none", "confidence"):
            settings = DraftSettings(cut=cut, p_min=EVAL["p_min"] if cut == "confidence" else 0.0)
            chosen_names = names if cut == "none" else list(DRAFTERS)
            m = measure(model, [Candidate(n, str(paths[n]), None) for n in chosen_names], prompts, EVAL["new_tokens"],
                        settings=settings, stop_ids=tokenizer.eog)
            for n, run in zip(chosen_names, m.runs):
                assert run.outputs_match_target, n
                s = run.stats
                key = n if cut == "none" else f"{n} --cut confidence --p-min {EVAL['p_min']:g}"
                report["rows"][key] = {k: s[k] for k in ("tau_zlab", "mean_accepted_length_incl_bonus",
                                                        "acceptance_rate", "drafted_tokens", "accepted_tokens",
                                                        "steps", "per_position_accept_rate")} | {
                    "n_max": run.settings["n_max"], "kind": run.drafter_kind}
                log(f"{key}: tau {s['tau_zlab']:.3f}, mean len {s['mean_accepted_length_incl_bonus']:.3f}, "
                    f"acceptance {s['acceptance_rate']:.3f} ({s['accepted_tokens']}/{s['drafted_tokens']})")
        state["eval"] = report
    finally:
        model.close()


def stage_write(state):
    import transformers
    sizes = {f"{n}/{p.name}": p.stat().st_size for n in DRAFTERS for p in sorted((OUT_DIR / n).iterdir())}
    meta = {"made_by": "scripts/demo_pair/make_dspark_drafters.py", "python": platform.python_version(),
            "torch": torch.__version__, "transformers": transformers.__version__, "seed": SEED,
            "backbone_init": "ggtools/data/demo/drafter (the DFlash demo drafter)", "markov_rank": MARKOV_RANK,
            "drafters": DRAFTERS, "data": DATA, "train": TRAIN, "eval_settings": EVAL, "eval": state.get("eval"),
            "seconds": state.get("seconds"), "cpu_seconds": state.get("cpu_seconds"), "sizes_bytes": sizes}
    (OUT_DIR / "dspark.json").write_text(json.dumps(meta, indent=1) + "\n")
    log(f"dspark.json written; checkpoints {sum(sizes.values()) / 1e6:.2f} MB")


def _smoke():
    DATA.update(n_generated=8, n_text=8)
    TRAIN.update(steps=3)
    EVAL.update(prompts=2, new_tokens=16)


if __name__ == "__main__":
    stage_main(__doc__, globals(), STAGES, WORK, _smoke, THREADS, start="data", stop="write")
